"""Ray at the edges: a loopback-only local cluster, bounded waits, Ray errors translated once.

Local Ray must not advertise the machine's address: :func:`init_local` starts it on 127.0.0.1
without the dashboard, and must not outlive this process: it starts a reaper first
(:func:`start_reaper`, :mod:`rollout._reaper`). :func:`get` is the library's only way to wait
on a Ray object: it always has a timeout and turns Ray's failures into the
:mod:`aenv_ray.errors` tree.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar, overload

import ray
import ray.exceptions as rex

from aenv_ray.errors import AEnvError, AEnvTimeoutError, LeaseLostError
from rollout.failures import RayStartError

__all__ = [
    "DEFAULT_GET_TIMEOUT",
    "alive_nodes",
    "ensure_ray",
    "get",
    "init_local",
    "loopback_only",
    "start_reaper",
    "translate",
]

log = logging.getLogger("rollout.ray")
T = TypeVar("T")

DEFAULT_GET_TIMEOUT = 120.0
"""Seconds :func:`get` waits when not told otherwise: finite, as every wait in this library."""

_ACTOR_GONE = (rex.RayActorError, rex.ActorUnavailableError)
_INFRA = (rex.WorkerCrashedError, rex.ObjectLostError, rex.NodeDiedError, rex.OwnerDiedError)


def init_local(num_cpus: int | None = None, **kwargs: Any) -> None:
    """Start a local Ray on loopback only, without the dashboard (or join one: ``address=``,
    or the ``RAY_ADDRESS`` environment variable).

    A new local Ray is started even when another runs on this machine (Ray's own ``ray.init()``
    would join the last one started there). ``num_cpus`` sizes a Ray it starts (one it joins
    has its own CPUs: ignored there, where Ray would refuse it); further keyword arguments go
    to :func:`ray.init`; ``include_dashboard`` can be turned back on. Does nothing if Ray is
    already initialized. A Ray that does not start, or cannot be joined, is
    :class:`~rollout.failures.RayStartError` (one line: what failed and Ray's own first line;
    the whole of Ray's exception in ``__cause__``); an ``address`` (or ``RAY_ADDRESS``) where
    nothing answers is one at once, not after Ray's minutes of retries.
    """
    if ray.is_initialized():
        return
    if not os.environ.get("RAY_ADDRESS"):
        kwargs.setdefault("address", "local")
    if kwargs.get("address") == "local":
        start_reaper()  # this process starts Ray's processes: they must not outlive it
    else:
        num_cpus = None  # joining: the cluster's CPUs are its own
    loopback_only()
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("_node_ip_address", "127.0.0.1")
    kwargs.setdefault("log_to_driver", False)
    kwargs.setdefault("configure_logging", False)
    address = kwargs.get("address") or os.environ.get("RAY_ADDRESS")
    what = "Ray did not start" if address == "local" else f"could not join the Ray at {address}"
    _check_answers(address, what)
    try:
        ray.init(num_cpus=num_cpus, **kwargs)
    except Exception as exc:  # Ray raises plain exceptions (ConnectionError, Exception, ...)
        cause = next((line for line in str(exc).splitlines() if line.strip()), "")
        if _refused_unauthenticated(exc):
            raise RayStartError(
                f"{what}: it asks for token authentication and this process did not offer it "
                "(a Ray that `ray.init` or `ray start` starts asks for it by default since Ray "
                "2.60): set RAY_AUTH_MODE=token, with the cluster's token in ~/.ray/auth_token, "
                "RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN"
            ) from exc
        raise RayStartError(f"{what}: {type(exc).__name__}: {cause[:300]}") from exc
    log.info("local ray started", extra={"num_cpus": num_cpus, "address": "127.0.0.1"})


def _refused_unauthenticated(exc: BaseException) -> bool:
    """Whether Ray's exception (or one it was raised from) is the cluster refusing a driver
    that offered no token; Ray's own message says so three exceptions down."""
    seen: BaseException | None = exc
    for _ in range(10):  # a chain, not a loop: bounded all the same
        if seen is None:
            return False
        if isinstance(seen, rex.AuthenticationError) or "InvalidAuthToken" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _check_answers(address: str | None, what: str, timeout: float = 5.0) -> None:
    """Something answers at ``address`` (``HOST:PORT`` or ``ray://HOST:PORT``), else
    :class:`~rollout.failures.RayStartError` at once: Ray itself would try to reach a GCS
    that is not there for minutes, printing a warning every few seconds. ``local``, ``auto``
    and what is not ``HOST:PORT`` are left to Ray."""
    import socket

    where = (address or "").removeprefix("ray://")
    host, sep, port = where.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayStartError(f"{what}: nothing answers there ({type(exc).__name__}: {exc})") from exc


_reaper: tuple[int, int] | None = None  # the reaper's pid, our end of its pipe


def start_reaper() -> None:
    """Make sure the Ray processes this process starts die with it, even by ``kill -9``.

    Starts :mod:`rollout._reaper` once per process: a small stdlib-only process, in a session of
    its own, that follows this process's Ray children and SIGKILLs them when this process is
    gone, however it went. Without it Ray's dashboard and runtime-env agents outlive a killed
    driver by a minute. Children this process *forks* without exec (``multiprocessing``'s
    fork) hold the pipe it watches too: the reaper waits for them as well.
    """
    global _reaper
    if _reaper is not None and _is_running(_reaper[0]):
        return
    read, write = os.pipe()  # the write end closes on exec: no process but this one holds it
    os.set_inheritable(read, True)  # whoever else gets the read end cannot hold the pipe open
    script = Path(__file__).with_name("_reaper.py")
    ray_dir = str(Path(ray.__file__).resolve().parent) + os.sep
    argv = [sys.executable, "-I", "-S", str(script), str(read), str(os.getpid()), ray_dir]
    try:
        # posix_spawn, not subprocess: a Popen object of a child meant to outlive this process
        # would warn at exit that it is still running
        pid = os.posix_spawn(
            sys.executable,
            argv,
            dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
            ],
            setsid=True,  # a Ctrl-C of the driver's terminal does not reach it
        )
    finally:
        os.close(read)
    if _reaper is not None:
        os.close(_reaper[1])
    _reaper = (pid, write)
    log.info("ray reaper started", extra={"reaper_pid": pid})


def _is_running(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def loopback_only() -> None:
    """Make this process and the Ray processes it starts resolve their address to 127.0.0.1.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` when it is imported; for this process,
    already past that, the constant it was read into is set as well. Without this Ray
    advertises the machine's address, and ``ray.init(address="127.0.0.1:PORT")`` is turned
    into that address too.
    """
    from ray._private import ray_constants  # read by Ray's address resolution at each call

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def ensure_ray() -> None:
    """Initialize Ray on loopback (:func:`init_local`) unless it already runs here."""
    if not ray.is_initialized():
        init_local()


def alive_nodes() -> list[str]:
    """Node ids (hex) of the cluster's alive nodes, the head first."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    nodes.sort(key=lambda n: not n.get("IsHead", False))  # head first; stable otherwise
    return [str(n["NodeID"]) for n in nodes]


def translate(exc: BaseException, *, what: str = "a pool call") -> BaseException:
    """The :mod:`aenv_ray.errors` view of an exception from :func:`ray.get`.

    An aenv-ray error raised inside a pool actor comes back as itself (not Ray's wrapper); a
    dead or unreachable pool actor is :class:`~aenv_ray.errors.LeaseLostError`; Ray's get
    timeout is :class:`~aenv_ray.errors.AEnvTimeoutError`. Anything else is returned as is.
    """
    if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, BaseException):
        return exc.cause
    if isinstance(exc, _ACTOR_GONE):
        return LeaseLostError(
            f"{what} failed: the pool actor that owns the instance is gone ({type(exc).__name__})"
            "; its leases are lost, acquire a new one"
        )
    if isinstance(exc, _INFRA):
        return LeaseLostError(f"{what} failed: Ray lost a process or node ({type(exc).__name__})")
    if isinstance(exc, rex.GetTimeoutError):
        return AEnvTimeoutError(f"{what} did not finish in time: {exc}")
    return exc


@overload
def get(refs: ray.ObjectRef[T], *, timeout: float = ..., what: str = ...) -> T: ...
@overload
def get(refs: Sequence[ray.ObjectRef[T]], *, timeout: float = ..., what: str = ...) -> list[T]: ...
def get(
    refs: ray.ObjectRef[Any] | Sequence[ray.ObjectRef[Any]],
    *,
    timeout: float = DEFAULT_GET_TIMEOUT,
    what: str = "a pool call",
) -> Any:
    """:func:`ray.get` with a finite ``timeout`` and errors translated (:func:`translate`).

    A timeout raises :class:`~aenv_ray.errors.AEnvTimeoutError`; the objects stay computable.
    """
    try:
        return ray.get(refs, timeout=timeout)
    except (rex.RayError, AEnvError) as exc:
        translated = translate(exc, what=what)
        if translated is exc:
            raise
        raise translated from exc
