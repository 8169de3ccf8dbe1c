"""The baseline of bench_harbor.py: a Harbor provider with nothing but a local process.

``LocalProcessEnvironment`` gives each trial a root directory on this machine (the host's
``/usr``, ``/etc``, ``/bin``... bound into it at each command, everything else a private
directory) and runs each command as ``unshare --mount`` + ``chroot`` + ``bash -c``: no
instance, no runtime, no engine, no isolation beyond the chroot. The Dockerfile is mapped as
aenv-ray maps it (``aenv_harbor.dockerfile``: ``WORKDIR``, ``ENV``, ``RUN`` at start; ``COPY``
is left out: the benchmark's task has none). Files are copied straight into and out of the
root directory. It needs root (``unshare``, ``mount``, ``chroot``) and
Harbor (Python 3.12+); it is a yardstick, never a way to run untrusted agents.

May import: harbor, aenv_harbor.dockerfile, the standard library.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

from aenv_harbor.dockerfile import DEFAULT_PATH, DockerPlan, parse_dockerfile

SYSTEM = ("usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "dev", "proc")


class LocalProcessEnvironment(BaseEnvironment):
    """A Harbor environment that is a directory and a process on this machine."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._root: Path | None = None
        self._plan = DockerPlan()
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "local-process"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        dockerfile = Path(self.environment_dir) / "Dockerfile"
        self._plan = parse_dockerfile(dockerfile.read_text(), where=str(dockerfile))

    def _inside(self, path: str) -> Path:
        assert self._root is not None
        return self._root / path.lstrip("/")

    async def start(self, force_build: bool) -> None:
        root = Path(tempfile.mkdtemp(prefix="harbor-local-"))
        for name in SYSTEM:
            source = Path("/") / name
            if source.is_symlink():
                (root / name).symlink_to(os.readlink(source))
            elif source.is_dir():
                (root / name).mkdir()
        for name in ("tmp", "root", self._plan.workdir.lstrip("/")):
            (root / name).mkdir(parents=True, exist_ok=True)
        self._root = root
        for step in self._plan.steps:
            if step.kind == "run":
                done = await self.exec(step.argument, cwd=step.workdir)
                if done.return_code != 0:
                    raise RuntimeError(f"RUN {step.argument}: {done.stderr}")
        await self.ensure_dirs(self._mount_targets(writable_only=True))

    async def stop(self, delete: bool) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        assert self._root is not None
        root = str(self._root)
        mounts = " && ".join(
            f"mount --rbind /{name} {shlex.quote(root)}/{name}"
            for name in SYSTEM
            if (self._root / name).is_dir() and not (self._root / name).is_symlink()
        )
        variables = {
            "PATH": DEFAULT_PATH,
            "HOME": "/root",
            **self._plan.env,
            **(self._merge_env(env) or {}),
        }
        inner = shlex.join(
            [
                "/usr/sbin/chroot",
                root,
                "/usr/bin/env",
                "-i",
                *(f"{k}={v}" for k, v in variables.items()),
                "/bin/bash",
                "-c",
                f"cd {shlex.quote(cwd or self._plan.workdir)} && {command}",
            ]
        )
        proc = await asyncio.create_subprocess_exec(
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            f"{mounts} && exec {inner}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_sec)
        except TimeoutError:
            os.killpg(proc.pid, 9)
            raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
        return ExecResult(
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            return_code=proc.returncode or 0,
        )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = self._inside(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_path, target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        shutil.copytree(source_dir, self._inside(target_dir), dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(self._inside(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        shutil.copytree(self._inside(source_dir), target_dir, dirs_exist_ok=True)
