"""EnvHub's load-check record: a bundle that passed the sandboxed load check is not loaded
again by any hub of the same store under the same checker, and only then.

Real control planes (``envhub.control.ControlPlane``) over a real SQLite store and the local
engine, with bundles made by ``aenv init`` + ``build_bundle``; whether a check ran is told by
the store's records and the control plane's log line.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aenv_cli._scaffold import module_name, write_project
from aenv_ray.bundle import Bundle, build_bundle
from aenv_ray.engine import named_engine
from aenv_ray.errors import DefinitionError
from aenv_ray.loadcheck import checker_fingerprint
from envhub.control import LOAD_CHECKS, ControlPlane, load_check_key
from envhub.registry import VersionRegistry
from envhub.store import Store, open_store

SKIPPED = "load check passed before; not repeated"


def _bundle(root: Path, tail: str = "") -> Bundle:
    project = root / f"demo-{abs(hash(tail))}"
    write_project(project, "demo")
    module = project / "src" / f"{module_name('demo')}.py"
    module.write_text(module.read_text() + tail)
    return build_bundle(project)


def _control(store: Store, data_dir: Path, timeout: float = 120.0) -> ControlPlane:
    engine = named_engine("local")  # the process's warm local engine
    return ControlPlane(store, engine, VersionRegistry(store), data_dir, startup_timeout=timeout)


def _skipped(caplog: pytest.LogCaptureFixture) -> int:
    return sum(r.getMessage() == SKIPPED for r in caplog.records if r.name == "envhub.control")


async def test_a_bundle_is_load_checked_once_per_store_and_checker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/hub.db")
    try:
        first = _control(store, tmp_path / "first")
        bundle = _bundle(tmp_path)
        with caplog.at_level(logging.INFO, logger="envhub.control"):
            manifest = await first.check_loads(bundle.data, bundle.digest)
            assert manifest is not None
            assert manifest["tools"], manifest
            assert _skipped(caplog) == 0
            records = await store.list(LOAD_CHECKS)
            checker = checker_fingerprint(first.engine, first.startup_timeout)
            assert list(records) == [load_check_key(bundle.digest, checker)]
            assert records[load_check_key(bundle.digest, checker)]["manifest"] == manifest

            # the same bundle again: from the record, by this hub and by another of the store
            # (which still gets the bundle unpacked where its instances will look)
            assert await first.check_loads(bundle.data, bundle.digest) == manifest
            second = _control(store, tmp_path / "second")
            assert await second.check_loads(bundle.data, bundle.digest) == manifest
            assert _skipped(caplog) == 2
            unpacked = tmp_path / "second" / "bundles" / bundle.digest.replace(":", "-")
            assert (unpacked / ".aenv-digest").read_text().strip() == bundle.digest

            # a changed bundle is checked, and so is the same one under another checker
            changed = _bundle(tmp_path, "\n# changed\n")
            assert changed.digest != bundle.digest
            assert await first.check_loads(changed.data, changed.digest) is not None
            shorter = _control(store, tmp_path / "shorter", timeout=60.0)
            assert await shorter.check_loads(bundle.data, bundle.digest) == manifest
            assert _skipped(caplog) == 2
            assert len(await store.list(LOAD_CHECKS)) == 3
    finally:
        await store.aclose()


async def test_a_bundle_that_fails_the_check_is_never_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(f"sqlite:///{tmp_path}/hub.db")
    try:
        control = _control(store, tmp_path / "hub")
        broken = _bundle(tmp_path, "\nraise RuntimeError('boom at import')\n")
        with caplog.at_level(logging.INFO, logger="envhub.control"):
            for _ in range(2):  # checked, and refused, each time
                with pytest.raises(DefinitionError, match="boom at import"):
                    await control.check_loads(broken.data, broken.digest)
        assert _skipped(caplog) == 0
        assert await store.list(LOAD_CHECKS) == {}
        assert not (tmp_path / "hub" / "bundles" / broken.digest.replace(":", "-")).exists()
    finally:
        await store.aclose()


def test_the_checker_fingerprint_names_the_engine_isolation_and_timeout() -> None:
    class Engine:
        def __init__(self, isolation: str) -> None:
            self.isolation = isolation

    class Other(Engine): ...

    plain = checker_fingerprint(Engine("none"), 120.0)
    assert plain == checker_fingerprint(Engine("none"), 120.0)
    assert plain != checker_fingerprint(Engine("namespaces"), 120.0)
    assert plain != checker_fingerprint(Other("none"), 120.0)
    assert plain != checker_fingerprint(Engine("none"), 121.0)
