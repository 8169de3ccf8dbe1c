"""``LocalEngine``: the embedded default :class:`~aenv_ray.engine.SandboxEngine`.

Instances are forked from one zygote per environment definition (``zygote.py``), isolated with
Linux namespaces where the host allows it (as root, or through unprivileged user namespaces) and
limited by cgroups as root (or in a cgroup subtree delegated to the user), as plain processes
(with a loud warning) where it does not. The
engine runs its own event loop on a daemon thread, so its async methods work from any event loop
and any number of ``asyncio.run`` calls in one process.

    engine = LocalEngine()
    info = await engine.create(InstanceSpec("mini-terminal@1.0.0"))
    info.url  # 'http://127.0.0.1:40123'
    await engine.delete(info.id)

Owner death: the zygotes watch their control socket; when this process dies, even by SIGKILL,
they kill every instance and exit.

Warm zygotes: the engine's first zygote is exec'd cold and forks a launcher once the runtime is
imported (``_launcher.py``); the engine's later zygotes (other definitions, a definition started
again after an ``inspect``) fork from it instead of importing the runtime again.

Host directories: ``InstanceSpec.datasource`` is bound read-only at ``/data``,
``InstanceSpec.storage`` read-write at ``/storage`` (shared by every instance given it, forks
included; it outlives them). Instances write there as their root, which is ``nobody`` (65534)
on the host when the engine runs as root, the invoking user otherwise: give them the directory
(``chown 65534 DIR``) as a Kubernetes volume is given to a pod. Without namespaces nothing is
mounted: ``AENV_DATASOURCE`` and ``AENV_STORAGE`` carry the host paths.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import enum
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aenv_ray.config import EnvConfig, parse_cpu, parse_memory
from aenv_ray.engine import (
    DEFAULT_TTL,
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    Route,
    TerminationReason,
    instance_ttl,
)
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    CapacityError,
    ClosedError,
    ConfigurationError,
    DefinitionError,
    InstanceNotFoundError,
    StartupTimeoutError,
)
from aenv_ray.resolve import resolve_environment
from local_backend._channel import MAX_MESSAGE
from local_backend._launcher import Launcher, LauncherGone

__all__ = ["ZYGOTE_VARIABLES", "Isolation", "LocalEngine", "host_warnings", "zygote_environment"]

log = logging.getLogger("local_backend")
T = TypeVar("T")

_KEEP_TERMINATED = 1000
_MAX_TMP = 256 << 20


class Isolation(enum.Enum):
    """How instances are separated from the host and from each other."""

    AUTO = "auto"  # namespaces where possible, else plain processes with a warning
    NAMESPACES = "namespaces"  # namespaces or fail
    NONE = "none"  # plain processes (for development on machines without namespaces)


@dataclass
class _Record:
    info: InstanceInfo
    zygote: _Zygote
    expiry: asyncio.TimerHandle | None = None
    workspace: str | None = None  # plain-process mode: a host directory to remove


class _Process(Protocol):
    """A zygote's process: a ``subprocess.Popen`` (cold) or a launched one (warm)."""

    pid: int

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def kill(self) -> None: ...


@dataclass
class _Zygote:
    root: Path
    process: _Process
    sock: socket.socket
    isolated: bool
    name: str  # its cgroup subtree: aenv-<owner>/<name>
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: dict[str, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    ready: asyncio.Future[dict[str, Any]] | None = None
    manifest: dict[str, Any] = field(default_factory=dict)
    host_data: dict[str, str] = field(default_factory=dict)  # builtin_envs.host_data(root)


class LocalEngine:
    """Instances on this machine, forked from warm templates. See the module docstring."""

    name = "local"
    closes_instances = True  # its instances are its processes

    def __init__(
        self,
        *,
        isolation: Isolation | str = Isolation.AUTO,
        max_instances: int = 4096,
        default_timeout: float = 600.0,
        env_path: str | None = None,
    ) -> None:
        self.isolation = Isolation(isolation)
        self.env_path = env_path  # where names are looked up; None: the AENV_ENV_PATH setting
        self.max_instances = max_instances
        self.default_timeout = default_timeout
        self.owner = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._zygotes: dict[Path, _Zygote] = {}
        self._zygote_locks: dict[Path, asyncio.Lock] = {}  # one start per definition at a time
        self._zygote_numbers = iter(range(1, 1 << 62))
        self._launcher: Launcher | None = None  # forked by the first zygote (_launcher.py)
        self._buffer = bytearray(MAX_MESSAGE + 1)  # one zygote message (a manifest: up to 1 MiB)
        self._closed = False
        self._warned_storage: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="aenv-engine", daemon=True
        )
        self._thread.start()
        self._isolated = self._decide_isolation()
        self._limits_told = os.geteuid() == 0  # root's cgroup warnings come from its zygotes

    # -- isolation -----------------------------------------------------------------------------
    def _decide_isolation(self) -> bool:
        from local_backend._sandbox import namespaces_available

        why_not = "isolation='none' was asked for" if self.isolation is Isolation.NONE else None
        why_not = why_not or namespaces_available()
        if why_not is None:
            return True
        if self.isolation is Isolation.NAMESPACES:
            raise ConfigurationError(
                f"isolation=namespaces was asked for but {why_not}; run as root, or as a user "
                "on a Linux kernel that allows unprivileged user namespaces, or use "
                "isolation='none' for plain processes"
            )
        warning = _not_isolated(why_not)  # said by every such engine: each chose it or met it
        log.warning("local engine: %s", warning)
        with _warned_lock:
            _warned.add(warning)
        return False

    @property
    def is_isolated(self) -> bool:
        """True when instances run in their own namespaces."""
        return self._isolated

    # -- the engine thread ---------------------------------------------------------------------
    async def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClosedError(
                f"the local engine {self.owner} is closed (its instances were deleted); create "
                "a new LocalEngine"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    # -- SandboxEngine -------------------------------------------------------------------------
    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        """Fork an instance of ``spec`` from its definition's zygote (started on first use)."""
        if not self._limits_told:  # said with the first instance (not for inspect: a build)
            self._limits_told = True
            from local_backend._cgroups import missing_limits

            for warning in missing_limits():
                _warn_once(warning)
        return await self._call(self._create(spec, timeout))

    async def get(self, instance_id: str) -> InstanceInfo:
        """The instance's current state."""
        return await self._call(self._get(instance_id))

    async def route(self, info: InstanceInfo) -> Route:
        """The instance's own address and token (this machine reaches it directly)."""
        return Route.direct(info)

    async def list(self, *, env_ref: str | None = None) -> list[InstanceInfo]:
        """Known instances, newest first."""
        return await self._call(self._list(env_ref))

    async def delete(self, instance_id: str) -> InstanceInfo:
        """Kill the instance (idempotent)."""
        return await self._call(self._delete(instance_id, TerminationReason.DELETED, ""))

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        """Expire ``ttl`` seconds from now."""
        return await self._call(self._renew(instance_id, ttl))

    async def fork(
        self, instance_id: str, n: int, *, timeout: float = 60.0
    ) -> builtins.list[InstanceInfo]:
        """``n`` copies of a running instance (Python state and workspace, copy-on-write)."""
        return await self._call(self._fork(instance_id, n, timeout))

    async def aclose(self) -> None:
        """Kill every instance and zygote; stop the engine thread. Idempotent."""
        if self._closed:
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop))
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def close(self) -> None:
        """Blocking twin of :meth:`aclose`, for atexit and sync code."""
        if self._closed:
            return
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout=10)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- implementation (engine thread) --------------------------------------------------------
    async def _create(self, spec: InstanceSpec, timeout: float) -> InstanceInfo:
        project = spec.project
        if project is None:  # a name: the built-ins, then env_path (AENV_ENV_PATH)
            where = spec.env_path if spec.env_path is not None else self.env_path
            ref, found = resolve_environment(spec.env_ref, where)
            project = str(found)
            spec = replace(spec, env_ref=ref, project=project)
        running = sum(
            1 for r in self._records.values() if r.info.state is not InstanceState.TERMINATED
        )
        if running >= self.max_instances:
            raise CapacityError(
                f"the local engine already runs {running} instances (max_instances="
                f"{self.max_instances}); release some or raise the limit",
                env_name=spec.env_ref,
            )
        root, config = _load_config(project)
        deadline = time.monotonic() + timeout
        zygote = await self._zygote(root, deadline)
        iid = uuid.uuid4().hex[:12]
        token = secrets.token_urlsafe(24)
        ttl = instance_ttl(spec.ttl, config.deploy_config)
        # a built-in's host data last: the directories the zygote bound, under their variables
        env = {**config.deploy_config.env, **dict(spec.environment_variables), **zygote.host_data}
        resources = _resources(config)
        memory = resources["memory"]
        message: dict[str, Any] = {
            "op": "spawn",
            "id": iid,
            "token": token,
            "env": env,
            "arguments": list(spec.arguments),
            # the workspace's path is the zygote's (set when it starts), never a message's
            **{k: v for k, v in resources.items() if k != "workspace"},
            "timeout": timeout,
            **_tmpfs_sizes(memory),
            "datasource": _host_directory(spec.datasource, "datasource", "/data (read-only)"),
            "storage": _host_directory(spec.storage, "storage", "/storage (read-write)"),
        }
        workspace = None
        if not zygote.isolated:
            workspace = tempfile.mkdtemp(prefix=f"aenv-instance-{self.owner}-{iid}-")
            message["workspace"] = workspace
            # no mounts without namespaces: say where the directories are
            if message["datasource"]:
                env.setdefault("AENV_DATASOURCE", message["datasource"])
            if message["storage"]:
                env.setdefault("AENV_STORAGE", message["storage"])
        elif message["storage"]:
            self._check_storage_owner(message["storage"])
        try:
            reply = await self._request(zygote, iid, message, deadline)
        except BaseException:
            # it may have started after all (a slow handshake): leave nothing behind
            with contextlib.suppress(Exception):
                await self._send(zygote, {"op": "kill", "id": iid})
            if workspace is not None:
                shutil.rmtree(workspace, ignore_errors=True)
            raise
        now = time.time()
        info = InstanceInfo(
            id=iid,
            env_ref=config.ref,
            state=InstanceState.RUNNING,
            url=f"http://127.0.0.1:{reply['port']}",
            created_at=now,
            expires_at=now + ttl,
            owner=spec.owner,
            labels=dict(spec.labels),
            token=token,
        )
        record = _Record(info, zygote, workspace=workspace)
        self._remember(record)
        self._schedule_expiry(record, ttl)
        log.info("instance created", extra={"instance": iid, "env": config.ref, "ttl": ttl})
        return info

    def _check_storage_owner(self, storage: str) -> None:
        """Warn (once per directory) when an isolated instance's root cannot write ``storage``."""
        if os.geteuid() != 0 or storage in self._warned_storage:
            return  # unprivileged, instances' root is the invoking user
        from local_backend._sandbox import NOBODY

        if not _writable_by(Path(storage), NOBODY):
            self._warned_storage.add(storage)
            log.warning(
                "storage %s is not writable by instances: their root is nobody (%d) on this "
                "host; give it to them (chown %d %s) or writes to /storage fail",
                storage,
                NOBODY,
                NOBODY,
                storage,
            )

    async def _get(self, instance_id: str) -> InstanceInfo:
        return self._record(instance_id).info

    async def _list(self, env_ref: str | None) -> builtins.list[InstanceInfo]:
        infos = [r.info for r in reversed(self._records.values())]
        if env_ref is not None:
            infos = [i for i in infos if EnvRef.parse(i.env_ref).is_selected_by(env_ref)]
        return infos

    async def _delete(
        self, instance_id: str, reason: TerminationReason, detail: str
    ) -> InstanceInfo:
        record = self._record(instance_id)
        if record.info.state is InstanceState.TERMINATED:
            return record.info
        self._terminate(record, reason, detail)
        await self._kill(record)
        return record.info

    async def _kill(self, record: _Record) -> None:
        """Have the zygote kill the instance; return once it is dead (or the zygote is)."""
        zygote = record.zygote
        if zygote.process.poll() is not None:
            return
        done = self._loop.create_future()
        zygote.waiting[record.info.id] = done
        try:
            await self._send(zygote, {"op": "kill", "id": record.info.id})
            await asyncio.wait_for(done, timeout=10)
        except (OSError, TimeoutError):
            log.warning("instance kill unconfirmed", extra={"instance": record.info.id})
        finally:
            zygote.waiting.pop(record.info.id, None)

    async def _renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        if ttl <= 0:
            raise ConfigurationError(f"ttl must be positive seconds, got {ttl!r}")
        record = self._record(instance_id)
        if record.info.state is InstanceState.TERMINATED:
            raise InstanceNotFoundError(
                f"{record.info.describe_end()}; create a new instance", instance_id=instance_id
            )
        record.info = replace(record.info, expires_at=time.time() + ttl)
        self._schedule_expiry(record, ttl)
        return record.info

    async def _fork(self, instance_id: str, n: int, timeout: float) -> builtins.list[InstanceInfo]:
        if n < 1:
            raise ConfigurationError(f"fork needs n >= 1, got {n}")
        parent = self._record(instance_id)
        if parent.info.state is not InstanceState.RUNNING:
            raise InstanceNotFoundError(
                f"cannot fork: {parent.info.describe_end()}", instance_id=instance_id
            )
        zygote = parent.zygote
        _, config = _load_config(str(zygote.root))
        ids = [uuid.uuid4().hex[:12] for _ in range(n)]
        tokens = {child_id: secrets.token_urlsafe(24) for child_id in ids}
        deadline = time.monotonic() + timeout
        message = {
            "op": "fork",
            "id": instance_id,
            "new_ids": ids,
            "tokens": tokens,
            **_resources(config),
        }
        replies = await self._request_many(zygote, ids, message, deadline)
        infos = []
        ttl = max(1.0, (parent.info.expires_at or time.time() + DEFAULT_TTL) - time.time())
        for child_id in ids:
            now = time.time()
            info = replace(
                parent.info,
                id=child_id,
                url=f"http://127.0.0.1:{replies[child_id]['port']}",
                created_at=now,
                parent=instance_id,
                token=tokens[child_id],
            )
            record = _Record(info, zygote)
            self._remember(record)
            self._schedule_expiry(record, ttl)
            infos.append(info)
        return infos

    async def _shutdown(self) -> None:
        zygotes = list(self._zygotes.values())
        self._zygotes.clear()
        for zygote in zygotes:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(zygote.sock.fileno())
            with contextlib.suppress(OSError):
                zygote.sock.close()  # each zygote kills its instances and exits on its own
        running = sum(1 for r in self._records.values() if r.info.is_running)
        # waited for here, not in the default executor: at interpreter exit (atexit close) it
        # takes no more work. They exit together, so waiting in turn costs the slowest one.
        for zygote in zygotes:
            self._stop_zygote(zygote, running)
        if self._launcher is not None:
            self._launcher.close()  # after the zygotes: none is forked while they stop
            self._launcher = None
        for record in self._records.values():
            if record.info.state is not InstanceState.TERMINATED:
                self._terminate(record, TerminationReason.DELETED, "the engine closed")

    def _stop_zygote(self, zygote: _Zygote, instances: int) -> None:
        """Wait for a zygote whose socket we closed to exit (it takes its instances down with
        it), killing it if it takes too long; then remove whatever it left in its cgroups."""
        _stop_process(zygote.process, grace=5.0 + 0.01 * instances)
        from local_backend._cgroups import remove_tree  # not root: a delegated subtree's

        left = remove_tree(self.owner, zygote.name)
        if left:
            log.warning("cgroups left behind", extra={"groups": ",".join(left)})

    # -- zygotes -------------------------------------------------------------------------------
    async def inspect(self, project: str | Path, *, timeout: float = 60.0) -> dict[str, Any]:
        """Load ``project`` inside a sandbox and return what it registers (never outside one).

        The manifest: ``{"ref", "tools": [{"name", "description", "inputSchema"}, ...],
        "functions": [...], "reward", "health"}``. A project that does not load raises
        :class:`~aenv_ray.errors.DefinitionError` naming the file and line.
        """
        root, _ = _load_config(str(project))
        return await self._call(self._inspect(root, timeout))

    async def _inspect(self, root: Path, timeout: float) -> dict[str, Any]:
        warm = self._zygotes.get(root)
        zygote = await self._zygote(root, time.monotonic() + timeout)
        manifest = dict(zygote.manifest)
        if warm is None and not any(r.zygote is zygote for r in self._records.values()):
            await self._drop_zygote(zygote)  # started for this question only
        return manifest

    async def _drop_zygote(self, zygote: _Zygote) -> None:
        """Stop a zygote no instance uses (it exits when its socket closes); wait for it."""
        if self._zygotes.get(zygote.root) is zygote:
            del self._zygotes[zygote.root]
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(zygote.sock.fileno())
        zygote.sock.close()
        await asyncio.to_thread(self._stop_zygote, zygote, 0)

    async def _zygote(self, root: Path, deadline: float) -> _Zygote:
        """The warm template of ``root``, started if need be. One caller at a time per
        definition: concurrent first creates share one template (were each to start its own,
        the last would replace the others in ``_zygotes``, leaving them running, unowned,
        their sockets open until the interpreter exits)."""
        lock = self._zygote_locks.setdefault(root, asyncio.Lock())
        left = deadline - time.monotonic()
        try:
            async with asyncio.timeout(max(0.0, left)):
                await lock.acquire()
        except TimeoutError as exc:
            raise StartupTimeoutError(
                f"the template of {root.name} did not start in time", timeout=left
            ) from exc
        try:
            return await self._warm_zygote(root, deadline)
        finally:
            lock.release()

    async def _warm_zygote(self, root: Path, deadline: float) -> _Zygote:
        host_data = _host_data(root)
        zygote = self._zygotes.get(root)
        if zygote is not None and zygote.process.poll() is None:
            if zygote.host_data == host_data:
                assert zygote.ready is not None
                await _wait(zygote.ready, deadline, f"the template of {root.name}")
                return zygote
            await self._replace_zygote(zygote, host_data)
        elif zygote is not None:  # exited, its socket's end not read yet: clean up as then
            self._on_zygote_gone(zygote)
        _, config = _load_config(str(root))
        resources = _resources(config)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        name = f"z{next(self._zygote_numbers)}"
        arguments = [
            str(root),
            "--isolation",
            "namespaces" if self._isolated else "none",
            "--owner",
            self.owner,
            "--cgroup-name",
            name,
            "--default-timeout",
            str(self.default_timeout),
            *(["--network"] if resources["network"] else []),
            *(["--workspace", resources["workspace"]] if resources["workspace"] else []),
            *(["--memory", str(resources["memory"])] if resources["memory"] else []),
            *(["--pids", str(resources["pids"])] if resources["pids"] else []),
            *(["--cpu", str(resources["cpu"])] if resources["cpu"] else []),
            *(f"--host-data={variable}={path}" for variable, path in host_data.items()),
        ]
        try:
            process = await self._start_zygote(arguments, theirs.fileno(), deadline)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.setblocking(False)
        zygote = _Zygote(root, process, ours, self._isolated, name, host_data=host_data)
        zygote.ready = self._loop.create_future()
        self._zygotes[root] = zygote
        self._loop.add_reader(ours.fileno(), self._on_message, zygote)
        try:
            reply = await _wait(zygote.ready, deadline, f"the template of {root.name}")
        except BaseException:
            await self._drop_zygote(zygote)
            raise
        if reply.get("op") == "failed":
            await self._drop_zygote(zygote)
            if reply.get("type") in ("DefinitionError", "ConfigurationError"):
                raise DefinitionError(
                    str(reply.get("message")), location=reply.get("location") or None
                )
            raise AEnvError(f"cannot start instances of {root}: {reply.get('message')}")
        zygote.manifest = dict(reply.get("manifest") or {})
        if os.geteuid() == 0:  # without root, create() says what its zygotes would
            for warning in reply.get("warnings") or []:
                _warn_once(str(warning))
        return zygote

    async def _start_zygote(
        self, arguments: builtins.list[str], control: int, deadline: float
    ) -> _Process:
        """A zygote with ``arguments`` and ``control`` as its socket: forked by this engine's
        launcher when it has one, else exec'd cold (the first cold one forks a launcher)."""
        environment = zygote_environment()
        launcher = self._launcher
        if launcher is not None and not launcher.gone and launcher.environment == environment:
            try:
                return await launcher.launch(arguments, control, deadline)
            except LauncherGone as exc:
                log.info("zygote launcher gone, starting cold", extra={"reason": str(exc)})
        if launcher is not None and (launcher.gone or launcher.environment != environment):
            self._launcher = None
            await asyncio.to_thread(launcher.close)
        command = [sys.executable, "-m", "local_backend.zygote", *arguments]
        command += ["--control-fd", str(control)]
        if self._launcher is not None:
            return _start_process(command, [control], environment)
        ours, theirs = _channel_pair()
        try:
            command += ["--launcher-fd", str(theirs.fileno())]
            process = _start_process(command, [control, theirs.fileno()], environment)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._launcher = Launcher(ours, environment, self._loop)
        return process

    async def _replace_zygote(self, zygote: _Zygote, host_data: dict[str, str]) -> None:
        """A built-in's host data moved since its template started (``AENV_TAU2_DATA`` set or
        changed, the package installed): stop the template, so that a new one reads the data
        the library reads now; refused while instances of the old one run."""
        if any(r.zygote is zygote and r.info.is_running for r in self._records.values()):
            raise ConfigurationError(
                f"{zygote.root.name}'s data on this host changed since its instances started "
                f"({zygote.host_data} -> {host_data}); this engine's running instances read the "
                "old one: release them first, or start the new instances on another engine"
            )
        await self._drop_zygote(zygote)

    def _on_message(self, zygote: _Zygote) -> None:
        while True:
            try:
                size = zygote.sock.recv_into(self._buffer)
            except BlockingIOError:
                return
            except OSError:
                size = 0
            if not size:
                self._on_zygote_gone(zygote)
                return
            message = json.loads(self._buffer[:size])
            op = message.get("op")
            if op in ("ready", "failed") and zygote.ready is not None and not zygote.ready.done():
                zygote.ready.set_result(message)
            elif op in ("spawned", "error"):
                waiter = zygote.waiting.pop(str(message.get("id")), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
            elif op == "exited":
                waiter = zygote.waiting.pop(str(message.get("id")), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(message)
                record = self._records.get(str(message["id"]))
                if record is not None and record.info.state is not InstanceState.TERMINATED:
                    reason = TerminationReason(message.get("reason", "crashed"))
                    self._terminate(record, reason, str(message.get("detail", "")))

    def _on_zygote_gone(self, zygote: _Zygote) -> None:
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(zygote.sock.fileno())
        if self._zygotes.get(zygote.root) is zygote:
            del self._zygotes[zygote.root]
        message = {"op": "error", "message": "the instance template process exited"}
        if zygote.ready is not None and not zygote.ready.done():
            zygote.ready.set_result({"op": "failed", "message": "the template process exited"})
        for waiter in zygote.waiting.values():
            if not waiter.done():
                waiter.set_result(message)
        zygote.waiting.clear()
        for record in self._records.values():
            if record.zygote is zygote and record.info.state is not InstanceState.TERMINATED:
                self._terminate(record, TerminationReason.CRASHED, "its template process exited")
        with contextlib.suppress(OSError):
            zygote.sock.close()
        # whoever notices first cleans up: a zygote killed by SIGKILL left its cgroups behind
        task = self._loop.create_task(asyncio.to_thread(self._stop_zygote, zygote, 0))
        self._tasks.add(task)  # owned until done: no fire-and-forget
        task.add_done_callback(self._tasks.discard)

    async def _request(
        self, zygote: _Zygote, iid: str, message: dict[str, Any], deadline: float
    ) -> dict[str, Any]:
        replies = await self._request_many(zygote, [iid], message, deadline)
        return replies[iid]

    async def _request_many(
        self, zygote: _Zygote, ids: builtins.list[str], message: dict[str, Any], deadline: float
    ) -> dict[str, dict[str, Any]]:
        waiters = {iid: self._loop.create_future() for iid in ids}
        zygote.waiting.update(waiters)
        if message.get("op") == "fork":  # errors of a fork come back under the parent's id
            waiters[message["id"]] = zygote.waiting[message["id"]] = self._loop.create_future()
        await self._send(zygote, message)
        replies: dict[str, dict[str, Any]] = {}
        pending = set(waiters.values())
        try:
            while len(replies) < len(ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StartupTimeoutError(
                        f"instances of {zygote.root.name} did not start in time", timeout=left
                    )
                done, pending = await asyncio.wait(
                    pending, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                for future in done:
                    reply = future.result()
                    if reply.get("op") == "error":
                        why = reply.get("message")
                        raise AEnvError(f"cannot start an instance of {zygote.root.name}: {why}")
                    replies[str(reply["id"])] = reply
        finally:
            for iid in waiters:
                zygote.waiting.pop(iid, None)
        return replies

    async def _send(self, zygote: _Zygote, message: dict[str, Any]) -> None:
        """One request to the zygote; waits while its socket buffer is full (many at once).

        One sender at a time: concurrent ``sock_sendall`` calls on one socket replace each
        other's wake-up, and the loser would wait forever.
        """
        async with zygote.lock:
            await self._loop.sock_sendall(zygote.sock, json.dumps(message).encode())

    # -- records -------------------------------------------------------------------------------
    def _record(self, instance_id: str) -> _Record:
        record = self._records.get(instance_id)
        if record is None:
            raise InstanceNotFoundError(
                f"the local engine has no instance `{instance_id}`; `aenv instance list` shows "
                "the ones it has",
                instance_id=instance_id,
            )
        return record

    def _remember(self, record: _Record) -> None:
        self._records[record.info.id] = record
        terminated = [
            k for k, r in self._records.items() if r.info.state is InstanceState.TERMINATED
        ]
        for key in terminated[: max(0, len(terminated) - _KEEP_TERMINATED)]:
            del self._records[key]

    def _schedule_expiry(self, record: _Record, ttl: float) -> None:
        if record.expiry is not None:
            record.expiry.cancel()
        record.expiry = self._loop.call_later(ttl, self._expire, record.info.id)

    def _expire(self, instance_id: str) -> None:
        record = self._records.get(instance_id)
        if record is None or record.info.state is InstanceState.TERMINATED:
            return
        log.info("instance expired", extra={"instance": instance_id})
        self._terminate(record, TerminationReason.EXPIRED, "its TTL ran out")
        task = self._loop.create_task(self._kill(record))
        self._tasks.add(task)  # owned until done: no fire-and-forget
        task.add_done_callback(self._tasks.discard)

    def _terminate(self, record: _Record, reason: TerminationReason, detail: str) -> None:
        record.info = replace(
            record.info, state=InstanceState.TERMINATED, reason=reason, detail=detail
        )
        if record.expiry is not None:
            record.expiry.cancel()
            record.expiry = None
        if record.workspace is not None:
            shutil.rmtree(record.workspace, ignore_errors=True)
            record.workspace = None


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(warning: str) -> None:
    """Log ``warning`` loudly, once per process (every engine and zygote of it says the same)."""
    with _warned_lock:
        if warning in _warned:
            return
        _warned.add(warning)
    log.warning("local engine: %s", warning)


def _not_isolated(why_not: str) -> str:
    return (
        f"INSTANCES ARE NOT ISOLATED: {why_not}. They run as plain processes that can read the "
        "host's files and network. Use this only with code you trust."
    )


def host_warnings() -> list[str]:
    """What the local engine cannot do for this user on this machine, one loud warning each,
    logged once per process (``local engine: ...`` on the ``local_backend`` logger, which
    reaches stderr when logging is not configured); empty when instances are isolated and
    limited. For a process that uses the engine elsewhere (a Ray pool's actors, the engine
    daemon) and should tell its user: ``aenv rollout``, ``aenv instance``."""
    from local_backend._cgroups import missing_limits
    from local_backend._sandbox import namespaces_available

    why_not = namespaces_available()
    warnings = [] if why_not is None else [_not_isolated(why_not)]
    if os.geteuid() != 0:
        warnings.extend(missing_limits())
    for warning in warnings:
        _warn_once(warning)
    return warnings


def _tmpfs_sizes(memory: int) -> dict[str, int]:
    """The sizes of an instance's ``/tmp`` and workspace tmpfs: their pages count against the
    memory limit (against the calls' share when a tool's process writes them), so together they
    stay below the share of the processes calls start (three quarters of the memory at most,
    ``_cgroups.work_limits``): a full disk is ``ENOSPC`` (a typed error), never the kernel
    killing the instance. The workspace gets half the memory, ``/tmp`` an eighth."""
    return {"tmp_bytes": min(_MAX_TMP, memory // 8), "workspace_bytes": memory // 2}


def _resources(config: EnvConfig) -> dict[str, Any]:
    """What an instance of ``config`` may use: network, memory bytes, cores, processes, and
    where its workspace is (None: the default, ``/workspace``)."""
    deploy = config.deploy_config
    return {
        "network": deploy.network,
        "workspace": None if deploy.workspace == "/workspace" else deploy.workspace,
        "memory": parse_memory(deploy.memory),
        "cpu": parse_cpu(deploy.cpu),
        "pids": deploy.pids,
    }


def _load_config(project: str) -> tuple[Path, EnvConfig]:
    root = Path(project).resolve()
    return root, EnvConfig.load(root)


def _host_directory(path: str | None, what: str, where: str) -> str | None:
    """An absolute, existing directory (or None): the zygote resolves nothing itself."""
    if not path:
        return None
    absolute = Path(path).expanduser().resolve()
    if not absolute.is_dir():
        raise ConfigurationError(
            f"{what} {path} is not a directory; pass an existing directory to mount at {where}"
        )
    return str(absolute)


def _writable_by(path: Path, uid: int) -> bool:
    """Whether ``uid`` (with the same gid, no other groups) may create files in ``path``.

    Mode bits only: an ACL may allow more (then the warning this feeds is a false alarm).
    """
    st = path.stat()
    if st.st_uid == uid:
        return (st.st_mode & 0o300) == 0o300
    if st.st_gid == uid:
        return (st.st_mode & 0o030) == 0o030
    return (st.st_mode & 0o003) == 0o003


#: The engine's variables a zygote is started with; no other reaches it. Templates and
#: instances are forks of the zygote, so its initial environment block is theirs too (what
#: ``/proc/<pid>/environ`` shows, whatever ``os.environ`` later says): it must hold nothing of
#: the engine's but what Python and the zygote need to start (the interpreter's paths, the
#: locale, ``HOME`` and ``XDG_CACHE_HOME`` for the cached init, ``CC`` and ``AENV_LOCAL_INIT``
#: that build it). The engine's API keys, cloud credentials, a hub's store URL never do.
ZYGOTE_VARIABLES = frozenset(
    {
        "PATH",
        "HOME",
        "LANG",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "TMPDIR",
        "XDG_CACHE_HOME",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONUSERBASE",
        "PYTHONNOUSERSITE",
        "PYTHONSAFEPATH",
        "PYTHONDONTWRITEBYTECODE",
        "LD_LIBRARY_PATH",
        "CC",
        "AENV_LOCAL_INIT",
    }
)


def _host_data(root: Path) -> dict[str, str]:
    """What a built-in's instances read on this host (``builtin_envs.host_data``: tau2's data
    directory, resolved here, from ``AENV_TAU2_DATA`` or the installed package). Computed by
    aenv-ray's own code in the engine, never asked of the environment: a definition names no
    host path."""
    import builtin_envs

    return builtin_envs.host_data(root)


def zygote_environment(engine: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a zygote is exec'd with: the :data:`ZYGOTE_VARIABLES` of ``engine``
    (default: this process's), nothing else."""
    source = dict(os.environ) if engine is None else engine
    return {name: value for name, value in source.items() if name in ZYGOTE_VARIABLES}


def _channel_pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def _start_process(
    command: list[str], fds: list[int], environment: dict[str, str]
) -> subprocess.Popen[bytes]:
    # a quick fork+exec on the engine's own thread; the zygote's slow start is awaited apart.
    # In "/": ``-m`` puts the working directory on sys.path, and the instances' view of the host
    # holds sys.path (the user's home directory, were it started there). Exec'd with an
    # environment built for it alone: every instance inherits the zygote's environment block
    return subprocess.Popen(
        command,
        pass_fds=fds,
        stdin=subprocess.DEVNULL,
        cwd="/",
        env=environment,
    )


async def _wait(future: asyncio.Future[T], deadline: float, what: str) -> T:
    left = deadline - time.monotonic()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout=max(0.0, left))
    except TimeoutError as exc:
        raise StartupTimeoutError(f"{what} did not start in time", timeout=left) from exc


def _stop_process(process: _Process, *, grace: float) -> None:
    """Wait ``grace`` seconds for a zygote told to stop (its socket closed: it kills its
    instances, removes its cgroups and exits), then SIGKILL it (the caller cleans up after)."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)
    if process.poll() is None:
        process.kill()
        process.wait()
