"""``DaemonEngine``: the local engine in a process of its own, as a :class:`SandboxEngine`.

EnvHub (and anything else that restarts while its instances should not) talks to the local
engine daemon (``daemon.py``) over its Unix socket ``STATE_DIR/engine.sock`` instead of
embedding a :class:`~local_backend.LocalEngine`. The first call that finds nothing
answering there starts the daemon (detached, in a session of its own, logging to
``STATE_DIR/daemon.log``) and waits for it.

**The daemon and its instances outlive this object.** :meth:`DaemonEngine.aclose` closes the
client's HTTP sessions and nothing else: the instances keep running, and a new
``DaemonEngine`` on the same state directory (in this process or the next one) sees them and
can call them. They end when deleted, when their TTL runs out, or with the daemon, which exits
after ``idle_exit`` seconds without a running instance or a request, or when
:meth:`DaemonEngine.shutdown` stops it (tests, ``aenv serve`` teardown).

    engine = DaemonEngine("/var/lib/aenv/engine")
    info = await engine.create(InstanceSpec("mini-terminal@1.0.0"))
    await engine.aclose()  # info.id still runs; DaemonEngine(...).get(info.id) finds it

A create cancelled while under way (an episode's timeout) leaves no instance: the daemon
deletes what it made for a caller that is gone, and this client sends the cancelled create
again with its idempotency key (answered by the instance the first one made) and deletes
that, in the background; :meth:`DaemonEngine.aclose` waits for those deletions.

Errors come back as the :mod:`aenv_ray.errors` class the daemon raised (its ``type``); a daemon
that dies during a call is :class:`~aenv_ray.errors.InstanceBrokenError` (retryable: the next call
starts a new daemon, without the old one's instances).

May import: ``aenv_ray`` (engine contract, errors), ``sandbox_runtime``, platformdirs, and aiohttp
(the HTTP client over the daemon's Unix socket; the daemon serves with aiohttp too).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from aenv_ray.engine import InstanceInfo, InstanceSpec, InstanceState, Route, info_from_json
from aenv_ray.errors import (
    AEnvError,
    CallTimeoutError,
    CapacityError,
    ClosedError,
    ConfigurationError,
    InstanceBrokenError,
    InstanceNotFoundError,
    ProtocolError,
    StartupTimeoutError,
    decode_error,
)
from local_backend.daemon import IDEMPOTENCY_HEADER, SOCKET_NAME
from local_backend.engine import host_warnings

__all__ = ["DaemonEngine", "daemon_engine", "default_state_dir"]

log = logging.getLogger("local_backend.client")

LOG_NAME = "daemon.log"
_ABANDONED_WAIT = 60.0  # seconds aclose waits for the deletions of cancelled creates' instances
_BASE = "http://engine"  # the host is ignored: every connection goes to the Unix socket
_CALL_TIMEOUT = 60.0  # get, list, delete, renew: seconds (a delete waits for the kill)
_MARGIN = 15.0  # on top of a create's or fork's own timeout, for the HTTP exchange
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, the last one a NUL
# when a daemon's answer names no class this module knows: by HTTP status
_BY_STATUS: dict[int, type[AEnvError]] = {
    400: ConfigurationError,
    404: InstanceNotFoundError,
    503: CapacityError,
    504: StartupTimeoutError,
}


@dataclass
class _LoopState:
    """What one event loop uses: an aiohttp session, and a lock so one task starts the daemon."""

    session: aiohttp.ClientSession
    starting: asyncio.Lock


class DaemonEngine:
    """The local engine daemon of ``state_dir``, started on demand. See the module docstring.

    ``env_path`` is where :meth:`create` looks up a name without a ``project`` (besides the
    built-ins; a spec's own ``env_path`` wins): the lookup happens here, in the caller's
    process, and the daemon gets the project directory, so a daemon started by a command with
    another ``AENV_ENV_PATH`` serves this one's. ``None`` leaves names to the daemon's own
    ``--env-path`` (set from ``env_path`` when this object starts it). ``idle_exit`` is the
    daemon's ``--idle-exit`` when this object starts it (a daemon already running keeps its
    own). ``start_timeout`` bounds the wait for a daemon to answer after starting it.
    """

    name = "local-daemon"
    closes_instances = False  # the daemon keeps them: that is what it is for

    def __init__(
        self,
        state_dir: str | Path,
        *,
        env_path: str | None = None,
        idle_exit: float = 600.0,
        start_timeout: float = 60.0,
    ) -> None:
        self.state_dir = Path(state_dir).expanduser().absolute()
        self.env_path = env_path
        self.idle_exit = idle_exit
        self.start_timeout = start_timeout
        if len(os.fsencode(self.socket_path)) > _MAX_SOCKET_PATH:
            raise ConfigurationError(
                f"state directory {self.state_dir} is too long a path for the daemon's Unix "
                f"socket (at most {_MAX_SOCKET_PATH} bytes with /{SOCKET_NAME}); use a shorter one"
            )
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._warned = False
        self._abandoned: set[asyncio.Task[None]] = set()  # deletions of given-up creates

    @property
    def socket_path(self) -> Path:
        """Where the daemon answers."""
        return self.state_dir / SOCKET_NAME

    @property
    def log_path(self) -> Path:
        """Where a daemon this object starts writes its log."""
        return self.state_dir / LOG_NAME

    def __repr__(self) -> str:
        return f"DaemonEngine({str(self.state_dir)!r})"

    async def __aenter__(self) -> DaemonEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- SandboxEngine -------------------------------------------------------------------------
    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        """Have the daemon start an instance of ``spec``; return once it answers calls.

        A name without a ``project`` is looked up here (in ``spec.env_path``, else this
        object's ``env_path``) when either is set, else by the daemon. Relative ``project``,
        ``datasource`` and ``storage`` paths are made absolute here (the daemon runs in ``/``).
        A create cancelled while under way has its instance deleted (see the module docstring).
        """
        project = spec.project
        env_path = spec.env_path if spec.env_path is not None else self.env_path
        if project is None and env_path is not None:  # looked up here, where the caller is
            from aenv_ray.resolve import resolve_environment

            ref, found = resolve_environment(spec.env_ref, env_path)
            spec, project = replace(spec, env_ref=ref), str(found)
        body = {
            "env": spec.env_ref,
            "project": _absolute(project),
            "ttl": spec.ttl,
            "timeout": timeout,
            "environment_variables": dict(spec.environment_variables),
            "arguments": list(spec.arguments),
            "datasource": _absolute(spec.datasource),
            "storage": _absolute(spec.storage),
            "owner": spec.owner,
            "labels": dict(spec.labels),
        }
        if not self._warned:  # what the daemon's engine cannot do here, told to our user once
            self._warned = True
            await asyncio.to_thread(host_warnings)
        key = secrets.token_hex(16)
        try:
            data = await self._send_create(body, key, timeout)
        except asyncio.CancelledError:
            task = asyncio.get_running_loop().create_task(self._delete_abandoned(body, key))
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            raise
        return _info(data)

    async def _send_create(self, body: dict[str, Any], key: str, timeout: float) -> Any:
        return await self._request(
            "POST",
            "/v1/instances",
            body,
            timeout=timeout + _MARGIN,
            env_name=str(body["env"]),
            headers={IDEMPOTENCY_HEADER: key},
        )

    async def _delete_abandoned(self, body: dict[str, Any], key: str) -> None:
        """Delete the instance a cancelled create with idempotency key ``key`` made: the same
        create sent again answers that instance, waiting for it if it is still starting (or,
        if the first never reached the daemon, makes one, deleted as well)."""
        try:
            info = _info(await self._send_create(body, key, float(body["timeout"])))
            if info.state is not InstanceState.TERMINATED:
                await self.delete(info.id)
        except AEnvError as exc:
            log.warning(
                "the instance of a cancelled create could not be deleted; it ends at its TTL",
                extra={"env": body["env"], "error": str(exc)},
            )

    async def get(self, instance_id: str) -> InstanceInfo:
        """The instance's current state, as the daemon knows it."""
        return _info(await self._request("GET", _path(instance_id), instance_id=instance_id))

    async def route(self, info: InstanceInfo) -> Route:
        """The instance's own address and token (the daemon's instances run on this machine)."""
        return Route.direct(info)

    async def list(self, *, env_ref: str | None = None) -> list[InstanceInfo]:
        """The daemon's instances, newest first, optionally of one definition."""
        path = "/v1/instances" + (f"?env={quote(env_ref, safe='@')}" if env_ref else "")
        data = await self._request("GET", path)
        return [_info(item) for item in _items(data)]

    async def delete(self, instance_id: str) -> InstanceInfo:
        """Terminate the instance (idempotent); its final state."""
        path = _path(instance_id)
        return _info(await self._request("DELETE", path, instance_id=instance_id))

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        """Expire ``ttl`` seconds from now."""
        path = _path(instance_id, "renew")
        data = await self._request("POST", path, {"ttl": ttl}, instance_id=instance_id)
        return _info(data)

    async def fork(
        self, instance_id: str, n: int, *, timeout: float = 60.0
    ) -> builtins.list[InstanceInfo]:
        """``n`` copies of a running instance (see :meth:`LocalEngine.fork`)."""
        data = await self._request(
            "POST",
            _path(instance_id, "fork"),
            {"n": n, "timeout": timeout},
            timeout=timeout + _MARGIN,
            instance_id=instance_id,
        )
        return [_info(item) for item in _items(data)]

    async def inspect(self, project: str, *, timeout: float = 60.0) -> dict[str, Any]:
        """What ``project`` registers, loaded in a sandbox (see :meth:`LocalEngine.inspect`)."""
        body = {"project": _absolute(project), "timeout": timeout}
        data = await self._request("POST", "/v1/inspect", body, timeout=timeout + _MARGIN)
        if not isinstance(data, dict):
            raise ProtocolError(f"the local engine daemon sent no manifest: {data!r:.200}")
        return data

    async def aclose(self) -> None:
        """Close this client's HTTP sessions. Idempotent.

        **The daemon and its instances keep running** (that is what this engine is for); stop
        them with :meth:`shutdown`. Calls after this raise :class:`~aenv_ray.errors.ClosedError`.
        First waits (a create's time at most) for the deletions of this loop's cancelled
        creates' instances.
        """
        current = asyncio.get_running_loop()
        mine = {task for task in self._abandoned if task.get_loop() is current}
        if mine:
            await asyncio.wait(mine, timeout=_ABANDONED_WAIT)
        self._closed = True
        with self._lock:
            states = list(self._loops.items())
            self._loops.clear()
        for loop, state in states:
            if loop is current or not loop.is_running():
                # its connections are closed after each request (force_close): nothing of the
                # closed or idle loop is touched
                await state.session.close()
            else:  # a loop running in another thread closes its own
                future = asyncio.run_coroutine_threadsafe(state.session.close(), loop)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.wrap_future(future), timeout=5)

    async def shutdown(self, *, timeout: float = 30.0) -> None:
        """Stop the daemon (SIGTERM; SIGKILL after ``timeout``) and with it every instance.

        Returns once the daemon's process is gone (it stops its instances' template processes
        on the way out; their instances die with them). Closes this client too. For tests and
        ``aenv serve`` teardown; a daemon that is not running is no error.
        """
        await self.aclose()
        # found by their command line, not the pid file alone: one still starting has none yet,
        # and a stale file (a daemon killed by SIGKILL) may name another process by now
        pids = self._daemon_pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        alive = await _wait_gone(pids, timeout)
        for pid in alive:  # its template processes notice its end and kill their instances
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await _wait_gone(alive, 10.0)

    # -- the daemon ----------------------------------------------------------------------------
    def _daemon_pids(self) -> builtins.list[int]:
        """Live daemon processes of this state directory (running, or starting)."""
        return sorted(pid for pid, args in _processes() if _is_daemon_of(args, self.state_dir))

    async def _answers(self) -> bool:
        try:
            _, writer = await asyncio.open_unix_connection(str(self.socket_path))
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    def _spawn(self) -> int:
        """Start a daemon, detached: not our child, in a session of its own. Its pid."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        command = [
            sys.executable,
            "-m",
            "local_backend.daemon",
            "--state-dir",
            str(self.state_dir),
            "--idle-exit",
            repr(float(self.idle_exit)),
            "--env-path",
            self.env_path or "",
        ]
        # sh starts it in the background and exits: the daemon is reparented, so no child of
        # ours is left to reap (nor a subprocess.Popen to warn about it); $0 is the log
        script = '"$@" </dev/null >>"$0" 2>&1 & echo $!'
        try:
            launched = subprocess.run(
                ["/bin/sh", "-c", script, str(self.log_path), *command],
                capture_output=True,
                text=True,
                timeout=30,
                start_new_session=True,
                cwd="/",  # as the engine's zygotes: -m puts the working directory on sys.path
                check=True,
            )
            return int(launched.stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise AEnvError(
                f"cannot start the local engine daemon in {self.state_dir}: {exc}"
            ) from exc

    async def _start(self, state: _LoopState) -> None:
        """Start the daemon unless it answers by now; return once it does."""
        async with state.starting:
            if await self._answers():
                return  # another task (or process) started it meanwhile
            pid = await asyncio.to_thread(self._spawn)
            deadline = time.monotonic() + self.start_timeout
            while not await self._answers():
                if time.monotonic() > deadline:
                    raise StartupTimeoutError(
                        f"the local engine daemon (pid {pid}) did not answer on {self.socket_path}"
                        f" within {self.start_timeout:g} s; see {self.log_path}{self._log_tail()}",
                        timeout=self.start_timeout,
                    )
                # ours may have left because another daemon holds the state directory's lock
                if not _is_alive(pid) and not self._daemon_pids():
                    raise AEnvError(
                        f"the local engine daemon exited as it started; see {self.log_path}"
                        f"{self._log_tail()}"
                    )
                await asyncio.sleep(0.05)

    def _log_tail(self, lines: int = 10) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        tail = text.strip().splitlines()[-lines:]
        return ":\n" + "\n".join(tail) if tail else ""

    # -- requests ------------------------------------------------------------------------------
    async def _state(self) -> _LoopState:
        if self._closed:
            raise ClosedError(
                f"{self!r} is closed; create a new DaemonEngine (the daemon and its instances "
                "live on)"
            )
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loops.get(loop)
            stale = [old for old in self._loops if old.is_closed()]
            gone = [self._loops.pop(old) for old in stale]
            if state is None:
                _check_owner(self.state_dir)
                # a connection per request: nothing stays open on a loop that ends (asyncio.run)
                connector = aiohttp.UnixConnector(path=str(self.socket_path), force_close=True)
                session = aiohttp.ClientSession(connector=connector)
                state = self._loops[loop] = _LoopState(session, asyncio.Lock())
        for old_state in gone:  # sessions of loops that have ended since
            await old_state.session.close()
        return state

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout: float = _CALL_TIMEOUT,
        instance_id: str | None = None,
        env_name: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        state = await self._state()
        what = f"{method} {path}"
        started = False
        while True:
            try:
                async with state.session.request(
                    method,
                    _BASE + path,
                    json=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout),
                ) as reply:
                    status, raw = reply.status, await reply.read()
                break
            except (aiohttp.ClientConnectorError, FileNotFoundError) as exc:
                # nothing listens (never started, exited idle, or killed): nothing was sent
                if started:
                    raise InstanceBrokenError(
                        f"the local engine daemon in {self.state_dir} started but refused {what};"
                        f" see {self.log_path}",
                        instance_id=instance_id,
                    ) from exc
                await self._start(state)
                started = True
            except TimeoutError as exc:
                raise CallTimeoutError(
                    f"the local engine daemon in {self.state_dir} did not answer {what} within "
                    f"{timeout:g} s; see {self.log_path}",
                    timeout=timeout,
                    instance_id=instance_id,
                ) from exc
            except aiohttp.ClientError as exc:
                raise InstanceBrokenError(
                    f"the local engine daemon in {self.state_dir} went away during {what} "
                    f"({type(exc).__name__}); its instances are gone with it, and the next call "
                    f"starts a new daemon; see {self.log_path}",
                    instance_id=instance_id,
                ) from exc
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError(
                f"the local engine daemon answered {what} with HTTP {status} and no JSON: "
                f"{raw[:200]!r}"
            ) from exc
        if status >= 400:
            raise _error(data, status, instance_id=instance_id, env_name=env_name)
        return data


def default_state_dir() -> Path:
    """Where the engine daemon of this user lives when nothing names one: ``AENV_STATE_DIR``,
    else ``engine`` in the user state directory (``aenv instance`` and ``new_engine("daemon")``
    share it)."""
    from aenv_ray.settings import get_settings

    configured = get_settings().state_dir
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_state_dir("aenv-ray")) / "engine"


def daemon_engine(state_dir: str | Path | None = None, **options: Any) -> DaemonEngine:
    """``new_engine("daemon")`` (registered under ``daemon`` in the ``aenv_ray.engines`` entry
    points): a :class:`DaemonEngine` on ``state_dir`` (default :func:`default_state_dir`), its
    ``env_path`` the ``AENV_ENV_PATH`` setting unless ``options`` give one."""
    if "env_path" not in options:
        from aenv_ray.settings import get_settings

        options["env_path"] = get_settings().env_path
    return DaemonEngine(default_state_dir() if state_dir is None else state_dir, **options)


def _check_owner(state_dir: Path) -> None:
    """Refuse a state directory of another user: its daemon is theirs (its instances run as
    them), even where the permissions would let us in (root)."""
    advice = "every user needs a daemon of their own; unset AENV_STATE_DIR, or point it at a "
    advice += "directory of yours"
    try:
        owner = state_dir.stat().st_uid
    except PermissionError:
        raise ConfigurationError(
            f"the engine state directory {state_dir} is not this user's (permission denied): "
            f"{advice}"
        ) from None
    except OSError:
        return  # not there yet: the daemon we start creates it
    if owner != os.geteuid():
        raise ConfigurationError(
            f"the engine state directory {state_dir} belongs to uid {owner}, not to this user "
            f"(uid {os.geteuid()}): {advice}"
        )


def _error(data: Any, status: int, *, instance_id: str | None, env_name: str | None) -> AEnvError:
    """The daemon's error envelope as the :mod:`aenv_ray.errors` class it names."""
    return decode_error(
        data,
        status,
        fallback=_BY_STATUS.get(status),
        instance_id=instance_id,
        env_name=env_name,
    )


def _info(data: Any) -> InstanceInfo:
    try:
        return info_from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"the local engine daemon sent no instance: {data!r:.200}") from exc


def _items(data: Any) -> list[Any]:
    items = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ProtocolError(f"the local engine daemon sent no instance list: {data!r:.200}")
    return items


def _path(instance_id: str, action: str = "") -> str:
    if not instance_id:
        raise InstanceNotFoundError("an empty instance id names no instance", instance_id="")
    path = f"/v1/instances/{quote(instance_id, safe='')}"
    return f"{path}/{action}" if action else path


def _absolute(path: str | None) -> str | None:
    return str(Path(path).expanduser().absolute()) if path else None


def _processes() -> list[tuple[int, list[str]]]:
    """Live processes' pids and arguments (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if raw:
            found.append((int(entry.name), [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]))
    return found


def _is_daemon_of(args: list[str], state_dir: Path) -> bool:
    if "local_backend.daemon" not in args or "--state-dir" not in args:
        return False
    given = args[args.index("--state-dir") + 1 :][:1]
    return bool(given) and Path(given[0]).absolute() == state_dir


async def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs, ``timeout`` seconds at most; those still running."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [pid for pid in pids if _is_alive(pid)]
        if not alive or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(0.05)


def _is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
