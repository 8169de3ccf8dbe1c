"""``envhub.limits``: the operator's limits file and the pure checks the control plane runs."""

from __future__ import annotations

import dataclasses
import doctest
import json
import pickle
from pathlib import Path

import pytest

import envhub.guard
import envhub.limits
import envhub.names
from aenv_ray.config import DeployConfig
from aenv_ray.errors import ConfigurationError, PermissionDeniedError, QuotaExceededError
from envhub.limits import (
    GIB,
    Limits,
    TenantLimits,
    check_deploy,
    check_per_request,
    check_ttl,
    instance_ttl,
    load_limits,
)


@pytest.mark.parametrize("module", [envhub.limits, envhub.names, envhub.guard])
def test_the_docstring_examples_run(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.attempted > 0
    assert result.failed == 0


def test_the_file_names_every_limit_a_tenant_has() -> None:
    names = {f.name for f in dataclasses.fields(TenantLimits)}
    assert names == set(envhub.limits._Entry.model_fields)
    table = envhub.limits.__doc__ or ""
    for name in names:
        assert f"``{name}``" in table, name


def test_defaults_are_safe_for_a_shared_hub() -> None:
    limits = load_limits(None)
    default = limits.for_tenant("anyone")
    assert default.network is False
    assert default.memory == 4 * GIB
    assert default.ttl == 24 * 3600
    # mini-terminal (the built-in) fits the defaults
    assert DeployConfig(cpu="1C", memory="2G", ttl="30m").pids <= default.pids
    assert load_limits(None, allow_network=True).for_tenant("anyone").network is True


def test_a_file_sets_defaults_and_tenants_override_field_by_field(tmp_path: Path) -> None:
    path = tmp_path / "limits.json"
    path.write_text(
        json.dumps(
            {
                "default": {"instances": 3, "memory": "2G", "ttl": "1h", "bundle_bytes": "1M"},
                "tenants": {"ci": {"instances": 50, "network": True, "cpu": "500m"}},
            }
        )
    )
    limits = load_limits(path)
    alice, ci = limits.for_tenant("alice"), limits.for_tenant("ci")
    assert (alice.instances, alice.memory, alice.ttl, alice.bundle_bytes) == (
        3,
        2 * GIB,
        3600.0,
        1024**2,
    )
    assert alice.network is False
    assert (ci.instances, ci.network, ci.cpu) == (50, True, 0.5)
    assert (ci.memory, ci.ttl) == (2 * GIB, 3600.0)  # the file's defaults, not the built-in ones
    # --allow-network changes the default, a tenant may still say no
    path.write_text(json.dumps({"tenants": {"locked": {"network": False}}}))
    opened = load_limits(path, allow_network=True)
    assert opened.for_tenant("alice").network is True
    assert opened.for_tenant("locked").network is False


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"default": {"instances": "many"}}, "default.instances"),
        ({"default": {"instances": -1}}, "default.instances"),
        ({"default": {"instances": True}}, "default.instances"),
        ({"default": {"memory": "lots"}}, "default.memory"),
        ({"default": {"ttl": "soon"}}, "default.ttl"),
        ({"default": {"network": "yes"}}, "default.network"),
        ({"default": {"instancs": 3}}, "default.instancs"),
        ({"tenants": {"ci": {"cpu": "x"}}}, "tenants.ci.cpu"),
        ({"everyone": {}}, "everyone"),
    ],
)
def test_a_bad_file_names_the_field(tmp_path: Path, data: object, where: str) -> None:
    path = tmp_path / "limits.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigurationError, match=f"`{where}`") as bad:
        load_limits(path)
    assert str(path) in str(bad.value)


def test_an_unreadable_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read"):
        load_limits(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="not JSON"):
        load_limits(tmp_path / "broken.json")


def test_check_deploy_refuses_each_resource_over_its_cap() -> None:
    caps = TenantLimits(memory=2 * GIB, cpu=2.0, pids=256)
    check_deploy(caps, "alice", "fits@1.0.0", DeployConfig(memory="2G", cpu="2", pids=256))
    for deploy, limit, requested in [
        (DeployConfig(memory="8G"), "memory", 8 * GIB),
        (DeployConfig(cpu="16"), "cpu", 16.0),
        (DeployConfig(pids=100_000), "pids", 100_000),
    ]:
        with pytest.raises(QuotaExceededError) as refused:
            check_deploy(caps, "alice", "big@1.0.0", deploy)
        error = refused.value
        assert (error.limit, error.requested, error.allowed) == (
            limit,
            requested,
            getattr(caps, limit),
        )
        assert f"deployConfig.{limit}" in str(error)
        assert "`big@1.0.0`" in str(error)
        assert "tenant `alice`" in str(error)
        assert error.retryable is False
        clone = pickle.loads(pickle.dumps(error))
        assert (clone.limit, clone.requested, clone.allowed) == (limit, requested, error.allowed)


def test_the_network_needs_the_operators_consent() -> None:
    with pytest.raises(PermissionDeniedError, match="allow-network") as refused:
        check_deploy(TenantLimits(), "alice", "net@1.0.0", DeployConfig(network=True))
    assert not isinstance(refused.value, QuotaExceededError)
    check_deploy(TenantLimits(network=True), "alice", "net@1.0.0", DeployConfig(network=True))


def test_ttl_asked_over_the_cap_is_refused_the_definitions_own_is_clamped() -> None:
    caps = TenantLimits(ttl=3600.0)
    assert instance_ttl(caps, "a", "x@1", 600.0, DeployConfig(ttl="2h")) == (600.0, [])
    with pytest.raises(QuotaExceededError, match="ttl") as refused:
        instance_ttl(caps, "a", "x@1", 7200.0, DeployConfig())
    assert (refused.value.limit, refused.value.requested, refused.value.allowed) == (
        "ttl",
        7200.0,
        3600.0,
    )
    ttl, warnings = instance_ttl(caps, "a", "x@1", None, DeployConfig(ttl="7d"))
    assert ttl == 3600.0
    assert len(warnings) == 1
    assert "7d" not in warnings[0]  # written as hours
    assert "168h" in warnings[0]
    assert "1h" in warnings[0]
    assert instance_ttl(caps, "a", "x@1", None, DeployConfig(ttl="30m")) == (1800.0, [])
    assert instance_ttl(caps, "a", "x@1", None, DeployConfig()) == (1800.0, [])  # the default
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigurationError, match="positive"):
            check_ttl(caps, "a", bad)


def test_per_request() -> None:
    caps = TenantLimits(per_request=4)
    check_per_request(caps, "a", 4)
    with pytest.raises(QuotaExceededError, match="per_request") as refused:
        check_per_request(caps, "a", 5)
    assert (refused.value.requested, refused.value.allowed) == (5, 4)


def test_limits_parse_reports_its_source() -> None:
    with pytest.raises(ConfigurationError, match=r"^limits is invalid"):
        Limits.parse({"default": {"pids": "x"}})
