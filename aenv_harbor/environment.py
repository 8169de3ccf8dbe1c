"""``AenvRayEnvironment``: Harbor's environment provider on aenv-ray instances.

``harbor run -p TASK_DIR -a oracle --env aenv_harbor:AenvRayEnvironment`` runs each trial in an
instance on the engine named by ``--ek engine=NAME`` (else ``AENV_ENGINE``, else ``local``): the
same names as everywhere in aenv-ray (``local``, ``daemon``, ``kubernetes``).

- On the local engines, an instance of ``harbor-box@1.0.0`` (this package's ``box/`` project):
  the task's ``environment/Dockerfile`` is mapped by :mod:`aenv_harbor.dockerfile` onto a box
  in the instance; what cannot be mapped is refused before an instance starts
  (:class:`~aenv_harbor.dockerfile.UnmappableTaskError`).
- On Kubernetes the pod is the box: an instance of ``harbor-pod@1.0.0`` (``pod/``), whose
  second container runs the task's own image, derived and built by the operator's builder
  (:mod:`aenv_harbor.kube`); ``--ek builder=...`` and ``--ek registry=...`` (else
  ``AENV_HARBOR_BUILDER`` and ``AENV_HARBOR_REGISTRY``, else ``AENV_K8S_IMAGE_PREFIX``).

May import: aenv_ray, harbor, the standard library (after ``require_extra("harbor")``).
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import shlex
import tarfile
import uuid
from pathlib import Path, PurePosixPath
from typing import Any

from aenv_ray.extras import require_extra

require_extra("harbor", "aenv_harbor's Harbor provider (Python 3.12+)")

from harbor.environments.base import BaseEnvironment, ExecResult  # noqa: E402
from harbor.environments.capabilities import EnvironmentCapabilities  # noqa: E402
from harbor.models.task.config import NetworkMode, TaskOS  # noqa: E402

from aenv_harbor.dockerfile import (  # noqa: E402
    DEFAULT_PATH,
    DockerPlan,
    UnmappableTaskError,
    parse_dockerfile,
)
from aenv_harbor.kube import (  # noqa: E402
    BUILDER_VARIABLE,
    REGISTRY_VARIABLE,
    build_image,
    derived_dockerfile,
    derived_tag,
    seed_command,
)
from aenv_ray import Environment  # noqa: E402
from aenv_ray.engine import SandboxEngine, new_engine  # noqa: E402
from aenv_ray.errors import AEnvError  # noqa: E402
from aenv_ray.settings import get_settings  # noqa: E402

__all__ = ["AenvRayEnvironment", "CommandTimeoutError", "TaskBuildError"]

BOX = "harbor-box@1.0.0"
BOX_DIR = Path(__file__).resolve().parent / "box"
POD = "harbor-pod@1.0.0"
POD_DIR = Path(__file__).resolve().parent / "pod"
POD_USER = 65534  # the Kubernetes engine's pods run as this user, never as root
CHUNK = 6 << 20  # raw bytes per call (base64 makes 8 MiB, under the runtime's request limit)
NO_LIMIT = 86400.0  # a day: the most a call may take
_engines: dict[str, SandboxEngine] = {}


class CommandTimeoutError(AEnvError, RuntimeError):
    """A command ran past its ``timeout_sec``: its processes were killed. A ``RuntimeError``
    saying "Command timed out after N seconds", as Harbor's Docker provider raises."""


class TaskBuildError(UnmappableTaskError):
    """A ``RUN`` line (or a ``COPY``) of the task's Dockerfile failed in the instance at
    ``start``: the message names the line and what it printed."""


def _pack(members: list[tuple[Path, str]], *, recursive: bool = True) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, name in members:
            archive.add(path, arcname=name, recursive=recursive)
    return buffer.getvalue()


def _write_member(data: bytes, name: str, target: Path, source: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        member = archive.getmember(name)
        if not member.isfile():
            raise IsADirectoryError(f"{source} in the instance is not a file")
        extracted = archive.extractfile(member)
        assert extracted is not None
        target.write_bytes(extracted.read())


def _extract(data: bytes, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(target, filter="data")


def _engine(name: str) -> SandboxEngine:
    """One engine per name in this process: its warm templates serve every trial."""
    if name not in _engines:
        _engines[name] = new_engine(name)
    return _engines[name]


class AenvRayEnvironment(BaseEnvironment):
    """A Harbor environment whose container is an aenv-ray instance.

    Harbor constructs it (``--env aenv_harbor:AenvRayEnvironment``; keyword ``engine`` with
    ``--ek engine=kubernetes``). ``start`` creates the instance (on the local engine: forked
    from the box's warm template) and replays the mapped Dockerfile; ``exec`` runs ``bash -c``
    in the box as root; uploads and downloads are tar streams made and unpacked in the box;
    :meth:`fork_rollouts` branches ``n`` started environments from this one's state.
    """

    def __init__(
        self,
        *args: Any,
        engine: str | None = None,
        builder: str | None = None,
        registry: str | None = None,
        **kwargs: Any,
    ) -> None:
        self._engine_name = engine or get_settings().engine or "local"
        self._builder = builder or os.environ.get(BUILDER_VARIABLE) or None
        self._registry = (
            registry or os.environ.get(REGISTRY_VARIABLE) or get_settings().k8s_image_prefix
        )
        self._plan: DockerPlan | None = None
        self._env: Environment | None = None
        self._workdir = "/"
        self.image: str | None = None  # on Kubernetes: the task's image the pod runs
        super().__init__(*args, **kwargs)

    @property
    def on_kubernetes(self) -> bool:
        """Whether the trial's box is a pod (the ``kubernetes`` engine)."""
        return self._engine_name == "kubernetes"

    @staticmethod
    def type() -> str:
        """Harbor's name for this provider."""
        return "aenv-ray"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        """No network is enforced per command on the local engines (a pod's network is the
        pod's: not on Kubernetes); no GPUs, Windows, compose or host mounts."""
        return EnvironmentCapabilities(disable_internet=not self.on_kubernetes)

    def _validate_definition(self) -> None:
        """Check that the task has a Dockerfile and nothing this provider cannot run (as
        Harbor's Docker provider checks its files here). The Dockerfile is mapped at
        :meth:`start`, so a line that cannot be mapped fails that trial, before its instance
        starts, rather than the whole job."""
        env_dir = Path(self.environment_dir)
        for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
            if (env_dir / name).exists():
                raise UnmappableTaskError(
                    f"{env_dir / name}: a Docker Compose environment (several containers) "
                    "cannot be mapped onto one aenv-ray instance"
                )
        if self.task_env_config.os == TaskOS.WINDOWS:
            raise UnmappableTaskError("a Windows task cannot run in a Linux instance")
        dockerfile = env_dir / "Dockerfile"
        if self.on_kubernetes:
            if not dockerfile.exists() and not self.task_env_config.docker_image:
                raise UnmappableTaskError(
                    f"{dockerfile} does not exist and the task names no docker_image: on "
                    "Kubernetes the task's pod runs an image made from one of them"
                )
            return
        if not dockerfile.exists():
            image = self.task_env_config.docker_image
            raise UnmappableTaskError(
                f"{dockerfile} does not exist"
                + (
                    f" and the task names a prebuilt image ({image}), which the box cannot run: "
                    "it runs the instance's own system, mapped from a Dockerfile"
                    if image
                    else ""
                )
            )

    @property
    def plan(self) -> DockerPlan:
        """The task's mapped Dockerfile."""
        assert self._plan is not None
        return self._plan

    def _box(self) -> Environment:
        if self._env is None:
            raise AEnvError(f"{self.session_id}: the environment is not started (call start)")
        return self._env

    async def start(self, force_build: bool) -> None:
        """Create the instance and replay the Dockerfile's steps (``force_build`` changes
        nothing: nothing is cached between trials but the engine's warm template). On
        Kubernetes: build the task's image (once per content; again with ``force_build``),
        create the pod, and copy the image's seed into its workspace."""
        if self.on_kubernetes:
            await self._start_pod(force_build)
            return
        dockerfile = Path(self.environment_dir) / "Dockerfile"
        text = await asyncio.to_thread(dockerfile.read_text)
        self._plan = parse_dockerfile(text, where=str(dockerfile))
        settings = get_settings()
        env_path = os.pathsep.join(filter(None, [str(BOX_DIR), settings.env_path]))
        environment = Environment(
            BOX,
            engine=_engine(self._engine_name),
            settings=settings.model_copy(update={"env_path": env_path}),
            timeout=NO_LIMIT,
        )
        await environment.initialize()
        self._env = environment
        plan = self.plan
        self._workdir = plan.workdir
        made = await self.exec(f"mkdir -p {shlex.quote(plan.workdir)}", cwd="/", user="root")
        if made.return_code != 0:
            raise TaskBuildError(f"WORKDIR {plan.workdir}: {made.stderr}")
        for step in plan.steps:
            await self._replay(step)
        # Harbor's output directories (/logs/agent, /logs/verifier, /logs/artifacts), as its
        # providers without host mounts make them
        await self.ensure_dirs(self._mount_targets(writable_only=True))

    def _image_recipe(self, force_build: bool) -> tuple[str, Path | None]:
        """The derived Dockerfile's text and its build context (None: no files): from the
        task's ``docker_image`` unless ``force_build`` and there is a Dockerfile, as Harbor's
        Docker provider chooses."""
        dockerfile = Path(self.environment_dir) / "Dockerfile"
        image = self.task_env_config.docker_image
        workdir = self.task_env_config.workdir
        paths = (workdir,) if workdir else ()  # writable too, whatever the image's WORKDIR
        if image and not (force_build and dockerfile.exists()):
            return derived_dockerfile(image=image, paths=paths), None
        text = dockerfile.read_text()
        return derived_dockerfile(text, paths=paths), Path(self.environment_dir)

    async def _start_pod(self, force_build: bool) -> None:
        text, context = await asyncio.to_thread(self._image_recipe, force_build)
        if not self._builder or not self._registry:
            missing = "builder" if not self._builder else "registry"
            raise UnmappableTaskError(
                f"on Kubernetes a Harbor task's pod runs its own image, which needs an image "
                f"{missing}: set {BUILDER_VARIABLE} (a command line with {{tag}}, "
                "{dockerfile} and {context}, e.g. `docker build -t {tag} -f {dockerfile} "
                f"{{context}} && docker push {{tag}}`) and {REGISTRY_VARIABLE} (or "
                "AENV_K8S_IMAGE_PREFIX), or --ek builder=... --ek registry=...; or run the "
                "task on the local engine (--ek engine=local)"
            )
        tag = derived_tag(self._registry, text, context)
        scratch = Path(self.environment_dir) if context is None else context
        try:
            await asyncio.to_thread(
                build_image, self._builder, tag, text, scratch, force=force_build
            )
        except RuntimeError as exc:
            raise TaskBuildError(f"building the task's image {tag} failed: {exc}") from exc
        self.image = tag
        settings = get_settings()
        env_path = os.pathsep.join(filter(None, [str(POD_DIR), settings.env_path]))
        environment = Environment(
            POD,
            datasource=tag,
            engine=_engine(self._engine_name),
            settings=settings.model_copy(update={"env_path": env_path}),
            timeout=NO_LIMIT,
            startup_timeout=600.0,
        )
        await environment.initialize()
        self._env = environment
        seeded = await self._exec_box(seed_command(), "/", {}, 600)
        if seeded.return_code != 0:
            said = (seeded.stderr or seeded.stdout).strip()[-2000:]
            raise TaskBuildError(
                f"the pod's image {tag} is not a derived Harbor image (aenv_harbor.kube.LAYER)"
                if seeded.return_code == 3
                else f"copying the image's seed into the pod's workspace failed: {said}"
            )
        self._workdir = (seeded.stdout.strip().splitlines() or ["/"])[-1]
        await self.ensure_dirs(self._mount_targets(writable_only=True))
        await self._upload_environment_dir_after_start()  # a prebuilt image's environment/

    async def _replay(self, step: Any) -> None:
        where = f"{self.environment_dir / 'Dockerfile'}:{step.line}"
        if step.kind == "copy":
            for source in step.sources:
                local = Path(self.environment_dir) / source
                if not local.exists():
                    raise TaskBuildError(f"{where}: COPY {source}: no such file in environment/")
                target = step.argument
                try:
                    if local.is_dir():
                        await self.upload_dir(local, target)
                    else:
                        if target.endswith("/") or len(step.sources) > 1:
                            target = target.rstrip("/") + "/" + local.name
                        await self.upload_file(local, target)
                except AEnvError as exc:
                    raise TaskBuildError(
                        f"{where}: COPY {source} {step.argument}: {exc} (the instance's /usr and "
                        "/etc are read-only in the box)"
                    ) from exc
                if step.chmod:
                    await self.exec(f"chmod -R {step.chmod} {shlex.quote(target)}", user="root")
            return
        result = await self._exec_box(step.argument, step.workdir, step.env, None)
        if result.return_code != 0:
            output = (result.stderr or result.stdout or "").strip()[-2000:]
            raise TaskBuildError(
                f"{where}: RUN {step.argument} exited {result.return_code} in the instance "
                f"(the instance's system stands in for the image, and no package manager "
                f"reaches a network): {output}"
            )

    async def stop(self, delete: bool) -> None:
        """Release the instance (deleted: an instance is never reused for another trial)."""
        environment, self._env = self._env, None
        if environment is not None:
            await environment.release()

    def _network_off(self) -> bool:
        return bool(self._network_policy.network_mode != NetworkMode.PUBLIC)

    async def _exec_box(
        self,
        command: str,
        cwd: str,
        env: dict[str, str],
        timeout_sec: float | None,
        *,
        stdin_key: str | None = None,
        stdout_key: str | None = None,
    ) -> ExecResult:
        box = self._box()
        if self.on_kubernetes:  # the image's own ENV, as docker exec gives it
            variables = dict(env)
        else:
            variables = {"PATH": DEFAULT_PATH, "HOME": "/root", **self.plan.env, **env}
        run_id = uuid.uuid4().hex
        arguments = {
            "command": command,
            "cwd": cwd,
            "env": variables,
            "timeout_sec": timeout_sec,
            "no_network": self._network_off() and not self.on_kubernetes,
            "stdin_key": stdin_key,
            "stdout_key": stdout_key,
            "run_id": run_id,
        }
        try:
            answer = await box.call_function("harbor_exec", arguments, timeout=NO_LIMIT)
        except asyncio.CancelledError:  # Harbor's own timeout: end the command too
            await asyncio.shield(box.call_function("harbor_kill", {"run_id": run_id}))
            raise
        if answer["timed_out"]:
            raise CommandTimeoutError(f"Command timed out after {timeout_sec} seconds")
        return ExecResult(
            stdout=answer["stdout"], stderr=answer["stderr"], return_code=answer["return_code"]
        )

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """``bash -c command`` in the box, as ``docker exec`` runs it: in ``cwd`` (else the
        task's ``workdir``, else the Dockerfile's ``WORKDIR``), with the Dockerfile's ``ENV``,
        Harbor's persistent environment and ``env``; past ``timeout_sec`` its processes are
        killed and :class:`CommandTimeoutError` is raised. ``user`` must be root (the only
        user an instance maps; on Kubernetes every command runs as the pod's user, 65534)."""
        who = self._resolve_user(user)
        if who not in (None, "root", 0, "0"):
            raise UnmappableTaskError(
                f"user {who!r}: an aenv-ray instance's user namespace maps only root, so a "
                "command cannot run as another user (set the task's agent and verifier user "
                "to root, or leave it unset)"
                if not self.on_kubernetes
                else f"user {who!r}: every command of a Kubernetes pod runs as its user "
                f"({POD_USER}: the engine's pods never run as root), so a command cannot run as "
                "another user (set the task's agent and verifier user to root, or leave it unset)"
            )
        where = cwd or self.task_env_config.workdir or self._workdir
        return await self._exec_box(command, where, self._merge_env(env) or {}, timeout_sec)

    async def _push(self, data: bytes) -> str:
        key = uuid.uuid4().hex
        box = self._box()
        for start in range(0, max(len(data), 1), CHUNK):
            chunk = base64.b64encode(data[start : start + CHUNK]).decode()
            await box.call_function(
                "harbor_stage", {"key": key, "data": chunk, "append": start > 0}
            )
        return key

    async def _pull(self, key: str) -> bytes:
        box = self._box()
        parts: list[bytes] = []
        offset = 0
        while True:
            answer = await box.call_function(
                "harbor_unstage", {"key": key, "offset": offset, "size": CHUNK}
            )
            chunk = base64.b64decode(answer["data"])
            parts.append(chunk)
            offset += len(chunk)
            if not chunk or offset >= answer["total"]:
                return b"".join(parts)

    async def _untar(self, data: bytes, target_dir: str) -> None:
        key = await self._push(data)
        try:
            quoted = shlex.quote(target_dir)
            result = await self._exec_box(
                f"mkdir -p {quoted} && tar -xf - -C {quoted} --no-same-owner",
                "/",
                {},
                None,
                stdin_key=key,
            )
        finally:
            await self._box().call_function("harbor_drop", {"key": key})
        if result.return_code != 0:
            raise AEnvError(f"unpacking into {target_dir} in the instance failed: {result.stderr}")

    async def _tar(self, command: str, what: str) -> bytes:
        key = uuid.uuid4().hex
        try:
            result = await self._exec_box(command, "/", {}, None, stdout_key=key)
            if result.return_code != 0:
                raise FileNotFoundError(f"{what} in the instance: {(result.stderr or '').strip()}")
            return await self._pull(key)
        finally:
            await self._box().call_function("harbor_drop", {"key": key})

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a local file to ``target_path`` in the box (its directory made; an existing
        file replaced), as ``docker cp`` does."""
        name = PurePosixPath(target_path).name
        data = await asyncio.to_thread(_pack, [(Path(source_path), name)], recursive=False)
        await self._untar(data, str(PurePosixPath(target_path).parent))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a local directory's contents into ``target_dir`` in the box (made if needed;
        files there are replaced, others kept), as ``docker cp DIR/. :TARGET`` does."""
        children = await asyncio.to_thread(lambda: sorted(Path(source_dir).iterdir()))
        data = await asyncio.to_thread(_pack, [(child, child.name) for child in children])
        await self._untar(data, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a file of the box to a local path (its directory made)."""
        path = PurePosixPath(source_path)
        data = await self._tar(
            f"tar -cf - -C {shlex.quote(str(path.parent))} {shlex.quote(path.name)}",
            source_path,
        )
        await asyncio.to_thread(_write_member, data, path.name, Path(target_path), source_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a directory of the box into a local one (made; files replaced), as ``docker cp
        :SOURCE/. DIR`` does."""
        data = await self._tar(f"tar -cf - -C {shlex.quote(source_dir)} .", source_dir)
        await asyncio.to_thread(_extract, data, Path(target_dir))

    async def fork_rollouts(self, n: int) -> list[AenvRayEnvironment]:
        """``n`` started environments whose boxes equal this one's now (files, and what runs
        in the instance's Python), for a GRPO group that branches from one state: the local
        engine forks the instance (copy-on-write). Stop each when done."""
        children = await self._box().fork(n)
        forks: list[AenvRayEnvironment] = []
        for child in children:
            twin = object.__new__(type(self))
            twin.__dict__.update(self.__dict__)
            twin._env = child
            forks.append(twin)
        return forks
