"""tests/_realnode.prune_images: the tests' tree-keyed images of other trees leave the kit's
store (each new tree adds ~2-3 GB), and nothing else does. On a store of empty stand-in archives
(``REALNODE_IMAGES``), no node: nothing to remove from a containerd."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests import _realnode
from tests._realnode import prune_images

HOUR = 3600.0


def _image(store: Path, tags: list[str], age: float) -> Path:
    name = tags[0].replace("/", "_").replace(":", "_") + ".tar"
    archive = store / name
    archive.write_bytes(b"")
    archive.with_name(name + ".ref").write_text("\n".join(tags) + "\n")
    then = time.time() - age
    os.utime(archive, (then, then))
    return archive


def test_of_each_family_the_newest_and_the_recent_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REALNODE_IMAGES", str(tmp_path))
    forgotten: list[list[str]] = []
    monkeypatch.setattr(_realnode, "_forget", forgotten.append)
    repo = "realnode.local/aenv"
    runtime = [
        _image(tmp_path, [f"{repo}/aenv-ray:0.1.0-{i:016x}"], age=(10 - i) * HOUR) for i in range(6)
    ]  # the newest is i=5
    variant = [
        _image(tmp_path, [f"{repo}/aenv-ray:0.1.0-{i:016x}-f72832da"], age=(10 - i) * HOUR)
        for i in range(2)
    ]
    recent = [_image(tmp_path, [f"{repo}/mini-program:{i:016x}"], age=i * 60.0) for i in range(5)]
    published = _image(
        tmp_path, [f"{repo}/aenv-ray:0.1.0-{99:016x}", "ghcr.io/aenv-ray/aenv-ray:0.1.0"], 20 * HOUR
    )
    tasks = [_image(tmp_path, [f"{repo}/harbor-task:{i:016x}"], 20 * HOUR) for i in range(5)]
    own = _image(tmp_path, [f"{repo}/mini-terminal:1.0.0"], 20 * HOUR)

    removed = prune_images(keep=3, older_than=2 * HOUR)

    # the runtime family: the 3 newest stay, the 3 oldest go (the published one is not counted)
    assert sorted(removed) == sorted(f"{repo}/aenv-ray:0.1.0-{i:016x}" for i in range(3))
    assert forgotten == [removed]
    assert [a.exists() for a in runtime] == [False] * 3 + [True] * 3
    assert not any(a.with_name(a.name + ".ref").exists() for a in runtime[:3])
    # another family (a variant: its packages' digest is part of its name): 2 builds, both kept
    assert all(a.exists() for a in variant)
    # 5 builds, but all of the last two hours: another checkout's session may be using them
    assert all(a.exists() for a in recent)
    # a build that also carries the published tag, images keyed by a task, an environment's own
    assert published.exists()
    assert own.exists()
    assert all(a.exists() for a in tasks)

    assert prune_images(keep=3, older_than=2 * HOUR) == []  # nothing more to do
    assert forgotten == [removed]
