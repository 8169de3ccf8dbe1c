"""``InstanceSpec.storage`` on the local engine: a host directory at ``/storage``, read-write.

Instances are real (the hostile test environment's tools write and read files); with namespaces
the directory is a bind mount and the rest of the view stays read-only; without them the
instance gets the host path in ``AENV_STORAGE``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import ConfigurationError
from local_backend import Isolation, LocalEngine
from local_backend._sandbox import NOBODY, namespaces_available
from tests._hostile import call, hostile_spec

REPO = Path(__file__).resolve().parent.parent
NO_NAMESPACES = namespaces_available()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))


@pytest.fixture(scope="module")
def engine() -> Iterator[LocalEngine]:
    engine = LocalEngine(isolation=Isolation.AUTO)
    yield engine
    engine.close()


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A storage directory the instances' root may write (as root: given to nobody)."""
    path = tmp_path / "storage"
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY)
    return path


@needs_namespaces
async def test_instances_share_storage_and_the_host_sees_it(
    engine: LocalEngine, storage: Path
) -> None:
    first = await engine.create(hostile_spec(storage=str(storage)))
    second = await engine.create(hostile_spec(storage=str(storage)))
    try:
        written = await call(first, "write_file", {"path": "/storage/x", "text": "kept"})
        assert written["ok"] is True, written
        read = await call(second, "read_file", {"path": "/storage/x"})
        assert read == {"ok": True, "value": "kept"}
        assert (storage / "x").read_text() == "kept"
        (storage / "from-host").write_text("hello")
        assert (await call(first, "list_dir", {"path": "/storage"}))["value"] == [
            "from-host",
            "x",
        ]
    finally:
        await engine.delete(first.id)
        await engine.delete(second.id)
    # it outlives them: a later instance finds what they left
    third = await engine.create(hostile_spec(storage=str(storage)))
    try:
        read = await call(third, "read_file", {"path": "/storage/x"})
        assert read == {"ok": True, "value": "kept"}
    finally:
        await engine.delete(third.id)


async def test_forks_share_the_parents_storage(engine: LocalEngine, storage: Path) -> None:
    parent = await engine.create(hostile_spec(storage=str(storage)))
    try:
        (child,) = await engine.fork(parent.id, 1)
        try:
            where = "/storage" if engine.is_isolated else str(storage)
            written = await call(child, "write_file", {"path": f"{where}/child", "text": "c"})
            assert written["ok"] is True, written
            assert (await call(parent, "read_file", {"path": f"{where}/child"}))["value"] == "c"
            assert (storage / "child").read_text() == "c"
        finally:
            await engine.delete(child.id)
    finally:
        await engine.delete(parent.id)


@needs_namespaces
async def test_without_storage_the_mount_point_is_empty_and_read_only(
    engine: LocalEngine,
) -> None:
    info = await engine.create(hostile_spec())
    try:
        listed = await call(info, "list_dir", {"path": "/storage"})
        assert listed == {"ok": True, "value": []}
        written = await call(info, "write_file", {"path": "/storage/x"})
        assert written["ok"] is False
        assert "AENV_STORAGE" not in (await call(info, "identity"))["env"]
    finally:
        await engine.delete(info.id)


@needs_namespaces
async def test_writing_outside_storage_still_fails(engine: LocalEngine, storage: Path) -> None:
    info = await engine.create(hostile_spec(storage=str(storage)))
    try:
        targets = [
            "/etc/pwned",
            "/usr/pwned",
            "/pwned",
            "/bin/pwned",
            "/data/pwned",
            "/storage/../pwned",
            str(storage.parent / "pwned"),  # the host path of storage's parent
            str(REPO / "pwned.txt"),
        ]
        for target in targets:
            written = await call(info, "write_file", {"path": target})
            assert written["ok"] is False, target
        assert not (storage.parent / "pwned").exists()
        assert not (REPO / "pwned.txt").exists()
        assert (await call(info, "write_file", {"path": "/storage/ok"}))["ok"] is True
        assert os.listdir(storage) == ["ok"]
    finally:
        await engine.delete(info.id)


async def test_a_missing_storage_directory_is_a_configuration_error(
    engine: LocalEngine, tmp_path: Path
) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigurationError, match=f"storage {missing} is not a directory"):
        await engine.create(hostile_spec(storage=str(missing)))
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    with pytest.raises(ConfigurationError, match=f"storage {a_file} is not a directory"):
        await engine.create(hostile_spec(storage=str(a_file)))
    assert not [i for i in await engine.list() if i.is_running]


@needs_namespaces
@pytest.mark.skipif(os.geteuid() != 0, reason="as root only: instances' root is nobody")
async def test_storage_nobody_may_not_write_is_warned_about(
    engine: LocalEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="local_backend")
    private = tmp_path / "private"
    private.mkdir(mode=0o755)
    info = await engine.create(hostile_spec(storage=str(private)))
    try:
        assert f"chown {NOBODY} {private}" in caplog.text
        assert (await call(info, "write_file", {"path": "/storage/x"}))["ok"] is False
        assert (await call(info, "list_dir", {"path": "/storage"}))["ok"] is True
    finally:
        await engine.delete(info.id)


async def test_plain_processes_get_the_path_in_aenv_storage(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    engine = LocalEngine(isolation=Isolation.NONE)
    try:
        info = await engine.create(hostile_spec(storage=str(storage)))
        me = await call(info, "identity")
        assert me["env"]["AENV_STORAGE"] == str(storage)
        written = await call(info, "write_file", {"path": f"{storage}/x", "text": "plain"})
        assert written["ok"] is True
        assert (storage / "x").read_text() == "plain"
        plain = await engine.create(hostile_spec())
        assert "AENV_STORAGE" not in (await call(plain, "identity"))["env"]
    finally:
        await engine.aclose()
