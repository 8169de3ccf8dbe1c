"""The engine conformance kit (``aenv_ray.testing.check_sandbox_engine``) over every engine:
the engine daemon's client, a real hub's ``RemoteEngine`` and the Kubernetes engine on a real
API server (the local engine's run is docs/testing.md's example, run by the docs' tests); and
the kit itself catching an engine that breaks the contract.

Each (engine, check) pair is one test, so a failure names both.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import InstanceInfo, InstanceSpec, InstanceState, NotSupportedError, Route
from aenv_ray.engine import SandboxEngine, named_engine
from aenv_ray.hub import HubClient, RemoteEngine
from aenv_ray.testing import ENGINE_CHECKS, ConformanceError, check_sandbox_engine
from local_backend import LocalEngine
from local_backend.client import DaemonEngine
from tests._k8s import KubeCluster

_K8S = [pytest.mark.k8s, pytest.mark.timeout(2400)]


@pytest.fixture(scope="module")
def daemon_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="aenv-k-"))  # short: it holds a Unix socket
    yield path
    asyncio.run(DaemonEngine(path).shutdown())
    shutil.rmtree(path, ignore_errors=True)


# The local engine's run of the kit is docs/testing.md's example, which the docs' tests run as
# it is written (a pytest module, every check in one call, one engine):
# test_the_docs_run_the_kit_over_the_local_engine keeps it there.
@pytest.fixture(params=["daemon", "hub", pytest.param("kubernetes", marks=_K8S)])
def factory(
    request: pytest.FixtureRequest,
) -> Callable[[], SandboxEngine]:
    if request.param == "daemon":
        state = request.getfixturevalue("daemon_dir")
        return lambda: DaemonEngine(state)
    if request.param == "kubernetes":
        cluster: KubeCluster = request.getfixturevalue("kube_cluster")
        namespace = cluster.namespace("conformance")
        return lambda: cluster.engine(namespace)
    # the session's hub without auth: the kit's checks hold on a hub other tests use too
    url = request.getfixturevalue("open_hub").url
    return lambda: RemoteEngine(HubClient(url))


@pytest.mark.parametrize("check", ENGINE_CHECKS)
async def test_engine_keeps_the_contract(factory: Callable[[], SandboxEngine], check: str) -> None:
    assert await check_sandbox_engine(factory, only=[check]) == [check]


def test_the_docs_run_the_kit_over_the_local_engine() -> None:
    """docs/testing.md's example is the local engine's conformance run (tests/
    test_docs_examples.py runs it, a pytest module): every check, the engine itself."""
    from tests.test_docs_examples import RUNNING

    runs = [
        block
        for block in RUNNING
        if block.page == "docs/testing.md"
        and "pytest" in block.setups
        and "check_sandbox_engine(LocalEngine) == list(ENGINE_CHECKS)" in block.code
    ]
    assert len(runs) == 1, [block.id for block in RUNNING if block.page == "docs/testing.md"]


# -- the kit catches what it should -------------------------------------------------------------


class _Lying:
    """A local engine that breaks one rule of the contract, chosen by ``lie``: the session's
    warm one (its mini-terminal template serves every lie), closed as a client of its own
    would be (what it made is deleted); an engine of its own where closing is the lie."""

    name = "lying"

    def __init__(self, lie: str) -> None:
        self.own = lie == "keeps_instances"
        self.inner: SandboxEngine = LocalEngine() if self.own else named_engine("local")
        self.lie = lie
        self.closes_instances = lie != "keeps_instances"
        self.made: list[str] = []

    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        info = await self.inner.create(spec, timeout=timeout)
        self.made.append(info.id)
        return info

    async def get(self, instance_id: str) -> InstanceInfo:
        info = await self.inner.get(instance_id)
        if self.lie == "revives" and info.state is InstanceState.TERMINATED:
            return InstanceInfo(info.id, info.env_ref, InstanceState.RUNNING, url=info.url)
        return info

    async def route(self, info: InstanceInfo) -> Route:
        return await self.inner.route(info)

    async def list(self, *, env_ref: str | None = None) -> list[InstanceInfo]:
        found = await self.inner.list(env_ref=env_ref)
        return found[::-1] if self.lie == "oldest_first" else found

    async def delete(self, instance_id: str) -> InstanceInfo:
        if self.lie == "delete_twice_fails":
            info = await self.inner.get(instance_id)
            if info.state is InstanceState.TERMINATED:
                raise RuntimeError("already deleted")
        return await self.inner.delete(instance_id)

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        if self.lie == "renew_ignored":
            return await self.inner.get(instance_id)
        return await self.inner.renew(instance_id, ttl)

    async def fork(self, instance_id: str, n: int, *, timeout: float = 60.0) -> list[InstanceInfo]:
        if self.lie == "fork_refused_untyped":
            raise RuntimeError("no forks here")
        if self.lie == "fork_refused":
            raise NotSupportedError("this engine cannot fork")
        if self.lie == "fork_fresh":  # children that start from nothing, not from the parent
            parent = await self.inner.get(instance_id)
            spec = InstanceSpec(parent.env_ref, ttl=600.0)
            fresh = [await self.create(spec, timeout=timeout) for _ in range(n)]
            return [_with_parent(i, instance_id) for i in fresh]
        children = await self.inner.fork(instance_id, n, timeout=timeout)
        self.made.extend(c.id for c in children)
        return children

    async def aclose(self) -> None:
        if self.own:
            await self.inner.aclose()
            return
        made, self.made = self.made, []
        for iid in made:  # the shared engine stays open: what this client made goes
            await self.inner.delete(iid)


def _with_parent(info: InstanceInfo, parent: str) -> InstanceInfo:
    fields: dict[str, Any] = {k: getattr(info, k) for k in info.__dataclass_fields__}
    return InstanceInfo(**{**fields, "parent": parent})


@pytest.mark.parametrize(
    ("lie", "check", "says"),
    [
        ("revives", "delete", "came back as InstanceState.RUNNING"),
        ("oldest_first", "list", "is not newest first"),
        ("delete_twice_fails", "delete", "already deleted"),
        ("renew_ignored", "renew", "is not about now \\+ 3600"),
        ("fork_refused_untyped", "fork", "no forks here"),
        ("fork_fresh", "fork", "lost its state"),
        ("keeps_instances", "aclose", "yet another engine does not find"),
    ],
)
async def test_the_kit_names_the_broken_rule(lie: str, check: str, says: str) -> None:
    with pytest.raises(ConformanceError, match=says) as caught:
        await check_sandbox_engine(lambda: _Lying(lie), only=[check])
    assert str(caught.value).startswith(f"{check}:")


async def test_a_typed_fork_refusal_conforms() -> None:
    assert await check_sandbox_engine(lambda: _Lying("fork_refused"), only=["fork"]) == ["fork"]


async def test_unknown_check_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown checks \\['forks'\\]"):
        await check_sandbox_engine(LocalEngine, only=["forks"])
