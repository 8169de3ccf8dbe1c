"""An instance: how a template's fork becomes one, serves, and forks itself.

:func:`become_instance` runs in the process the template forked into a new pid namespace
(``_template.spawn_into_pid_namespace``). Isolated, it enters its own mount, ipc, uts and network
namespaces (``_sandbox.enter_instance_sandbox``), drops into a user namespace of its own (its
template writes the id maps), and only then says ``hello`` to the zygote, which reads its pid
from the kernel (``SCM_CREDENTIALS``), moves it into its cgroup and answers ``go`` with what the
runtime needs to name its limits. Then the runtime serves on the socket the zygote bound for it.

A fork of a running instance (:func:`fork_children`, asked by the zygote, run on the runtime's
main thread between jobs) goes through a throw-away child that starts the fork in a new pid
namespace of its own, under its own pid 1: the fork cannot see or signal its parent or its
siblings (``kill(-1)`` reaches nothing of theirs). The fork copies the workspace and ``/tmp`` into
mounts of its own, keeps none of its parent's sockets (the parent's listening socket least of
all: it must never answer the parent's calls) and reopens the files its parent had open there in
its copies (``_fds.neutralize``), then drops into a user namespace of its own as well.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from local_backend import _channel
from local_backend._fds import neutralize

if TYPE_CHECKING:
    from local_backend._template import _State

__all__ = ["BASE_ENV", "become_instance", "fork_children"]

log = logging.getLogger("local_backend.instance")

BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}
_MAX_FORKS = 64  # children one fork request may ask for


def _hostname(iid: str) -> str:
    return f"aenv-{iid[:16]}"


def _asker(map_w: int, go_r: int) -> Any:
    """``wait_for_maps`` for :func:`~_sandbox.drop_to_new_user_namespace`: ask the parent."""

    def wait_for_maps() -> None:
        os.write(map_w, b"m")
        if os.read(go_r, 1) != b"g":
            os._exit(1)
        os.close(map_w)
        os.close(go_r)

    return wait_for_maps


def become_instance(
    state: _State,
    message: dict[str, Any],
    listen_fd: int,
    channel_fd: int,
    map_w: int,
    go_r: int,
) -> NoReturn:
    """In the template's child: become the instance ``message`` asks for (never returns)."""
    code = 1
    try:
        context = state.context
        iid = str(message["id"])
        neutralize(keep={listen_fd, channel_fd, map_w, go_r})
        if context.isolated:
            from local_backend import _sandbox

            _sandbox.enter_instance_sandbox(
                hostname=_hostname(iid),
                own_network=not context.network,
                tmp_bytes=int(message.get("tmp_bytes") or 64 << 20),
                workspace_bytes=int(message.get("workspace_bytes") or 1 << 30),
                keep_under_tmp=context.keep_under_tmp,
                workspace=context.workspace,
            )
            _sandbox.drop_to_new_user_namespace(_asker(map_w, go_r), dumpable=False)
            workspace = context.workspace
        else:
            workspace = str(message["workspace"])
            Path(workspace).mkdir(parents=True, exist_ok=True)
        os.setsid()  # without cgroups, its process group is how it is killed
        channel = socket.socket(fileno=channel_fd)
        limits = _handshake(channel, iid)
        os.chdir(workspace)
        environ = dict(BASE_ENV)
        environ.update(
            HOME=workspace, TMPDIR="/tmp", AENV_WORKSPACE=workspace, AENV_INSTANCE_ID=iid
        )
        environ.update({str(k): str(v) for k, v in (message.get("env") or {}).items()})
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = ["sandbox_runtime", *[str(a) for a in message.get("arguments") or []]]
        server = state.server
        server.set_token(message.get("token"))
        server.listen_on([socket.socket(fileno=listen_fd)])
        _serve(state, server, channel, limits)
        code = 0
    except BaseException:
        log.exception("instance set-up failed", extra={"instance": message.get("id")})
    finally:
        os._exit(code)


def _handshake(channel: socket.socket, iid: str) -> dict[str, Any]:
    """``hello`` to the zygote (it reads our pid and places us in our cgroup); its ``go``."""
    _channel.send(channel, {"op": "hello", "id": iid})
    reply = _channel.receive(channel, max_fds=9, block=True)
    if reply.message is None or reply.message.get("op") != "go":
        os._exit(1)
    names = [str(n) for n in reply.message.get("fds") or []]
    fds = dict(zip(names, reply.fds, strict=False))
    return {
        "memory": reply.message.get("memory"),
        "pids": reply.message.get("pids"),
        "enforced": bool(reply.message.get("enforced")),
        "memory_events": fds.get("memory_events"),
        "pids_events": fds.get("pids_events"),
        **_work_limits(reply.message, names, reply.fds),
    }


def _work_limits(message: dict[str, Any], names: list[str], fds: list[int]) -> dict[str, Any]:
    """From ``go``: the limits of the processes the instance's calls start, and the fds of
    their cgroup (:meth:`~local_backend._cgroups.InstanceGroup.work_fds`)."""
    named = list(zip(names, fds, strict=False))
    return {
        "work_memory": message.get("work_memory"),
        "work_pids": message.get("work_pids"),
        "work_procs": tuple(fd for name, fd in named if name == "work_procs"),
        "work_memory_events": next((fd for n, fd in named if n == "work_memory_events"), None),
        "work_pids_events": next((fd for n, fd in named if n == "work_pids_events"), None),
        "memory_usage": next((fd for n, fd in named if n == "memory_usage"), None),
    }


def _serve(state: _State, server: Any, channel: socket.socket, limits: dict[str, Any]) -> NoReturn:
    _install_limits(limits)
    _protect(isolated=state.context.isolated)

    def report_broken(reason: str) -> None:  # the runtime cannot recover: say why, then exit
        with contextlib.suppress(OSError, _channel.ProtocolViolation):
            _channel.send(channel, {"op": "broken", "reason": reason[:2000]}, block=False)

    server.on_broken = report_broken
    _Control(state, server, channel).start()
    server.run()
    os._exit(0)


def _install_limits(limits: dict[str, Any]) -> None:
    """Tell the runtime its limits and where their events show (to name them in results)."""
    from sandbox_runtime import InstanceLimits, install_limits

    install_limits(
        InstanceLimits(
            memory=limits.get("memory"),
            pids=limits.get("pids"),
            memory_events=limits.get("memory_events"),
            pids_events=limits.get("pids_events"),
            enforced=bool(limits.get("enforced")),
            work_memory=limits.get("work_memory"),
            work_pids=limits.get("work_pids"),
            work_procs=tuple(limits.get("work_procs") or ()),
            work_memory_events=limits.get("work_memory_events"),
            work_pids_events=limits.get("work_pids_events"),
            memory_usage=limits.get("memory_usage"),
        )
    )


def _protect(*, isolated: bool) -> None:
    """Keep tool code away from this runtime (``sandbox_runtime.contain``): after the limits
    (which open ``/proc/self`` files a non-dumpable process could not open again), before any
    call. Plain mode, which kills its process group on the way out, gets no signal filter."""
    from sandbox_runtime import contain

    contain.protect(filter_signals=isolated)


class _Control(threading.Thread):
    """In a runtime: the zygote's requests (``fork``); its end closing means it is gone."""

    def __init__(self, state: _State, server: Any, channel: socket.socket) -> None:
        super().__init__(name="aenv-control", daemon=True)
        self.state = state
        self.server = server
        self.channel = channel

    def run(self) -> None:
        while True:
            try:
                received = _channel.receive(self.channel, max_fds=3 * _MAX_FORKS, block=True)
            except (OSError, _channel.ProtocolViolation):
                received = _channel.Received(None)
            message = received.message
            if message is None:  # the zygote closed our channel: it is gone, or deleted us
                if not self.state.context.isolated:
                    os.killpg(0, signal.SIGKILL)  # plain processes: take our group with us
                os._exit(0)
            items = message.get("items")
            if (
                message.get("op") != "fork"
                or not isinstance(items, list)
                or len(received.fds) != 3 * len(items)
            ):
                received.close_fds()
                continue
            self.server.ready.wait(30)  # fork a serving runtime, never one still starting
            self.server.runner.call_between_jobs(
                functools.partial(fork_children, self.state, items, received.fds)
            )


def fork_children(state: _State, items: list[dict[str, Any]], fds: list[int]) -> None:
    """On the runtime's main thread: start one fork per item, then close the passed fds."""
    from sandbox_runtime import contain

    tracker = contain.calls()
    try:
        with tracker.spared() if tracker is not None else contextlib.nullcontext():
            _start_forks(state, items, fds)
    finally:
        for fd in fds:
            os.close(fd)


def _start_forks(state: _State, items: list[dict[str, Any]], fds: list[int]) -> None:
    for index, item in enumerate(items):
        listen_fd, channel_fd, init_fd = fds[3 * index : 3 * index + 3]
        try:
            _start_fork(state, item, listen_fd, channel_fd, init_fd)
        except Exception:
            log.exception("fork failed", extra={"instance": item.get("id")})


def _start_fork(
    state: _State, item: dict[str, Any], listen_fd: int, channel_fd: int, init_fd: int
) -> None:
    from local_backend._template import map_one, spawn_into_pid_namespace

    def child(map_w: int, go_r: int) -> NoReturn:
        become_fork(state, item, listen_fd, channel_fd, map_w, go_r)

    if not state.context.isolated:
        spawn_into_pid_namespace(
            state.context, init_fd, child, own_pid_namespace=None, label=str(item.get("id"))
        )
        return
    from sandbox_runtime.contain import runtime_fork

    with runtime_fork():  # the runtime's own (helper and fork): not a tool's, not confined
        helper = os.fork()  # a new pid namespace is for good: start it from a throw-away child
        if helper == 0:
            code = 1
            try:
                # the runtime is not dumpable (contain): its fork must be, until it has its id maps
                # (their files in /proc/<pid> belong to a dumpable process's own user)
                _set_dumpable()
                pid, maps = spawn_into_pid_namespace(
                    state.context, init_fd, child, own_pid_namespace=None, label=str(item.get("id"))
                )
                if maps is not None:
                    map_one(pid, *maps)
                code = 0
            except BaseException:
                log.exception("fork failed", extra={"instance": item.get("id")})
            finally:
                os._exit(code)
    os.waitpid(helper, 0)


def _set_dumpable() -> None:
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 1, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")


def become_fork(
    state: _State,
    item: dict[str, Any],
    listen_fd: int,
    channel_fd: int,
    map_w: int,
    go_r: int,
) -> NoReturn:
    """In a fork of a running instance: own copies, own namespaces, then serve (no return)."""
    code = 1
    try:
        from sandbox_runtime import RuntimeServer

        context = state.context
        iid = str(item["id"])
        os.setsid()
        # placed in its own cgroup first: the copies below are charged to it, not to its parent
        channel = socket.socket(fileno=channel_fd)
        limits = _handshake(channel, iid)
        given = {
            limits[k]
            for k in (
                "memory_events",
                "pids_events",
                "work_memory_events",
                "work_pids_events",
                "memory_usage",
            )
            if limits[k] is not None
        }
        given.update(limits["work_procs"])
        if context.isolated:
            from local_backend import _sandbox

            copied = {os.stat(context.workspace).st_dev, os.stat("/tmp").st_dev}
            _private_copies(
                hostname=_hostname(iid),
                own_network=not context.network,
                keep_under_tmp=context.keep_under_tmp,
                workspace=context.workspace,
            )
            keep = {listen_fd, channel_fd, map_w, go_r, *given}
            neutralize(keep=keep, copied_devices=copied)
            _sandbox.drop_to_new_user_namespace(_asker(map_w, go_r), dumpable=False)
            workspace = context.workspace
        else:
            workspace = str(item["workspace"])  # the zygote's, removed with the fork
            shutil.copytree(
                os.environ.get("AENV_WORKSPACE", os.getcwd()),
                workspace,
                symlinks=True,
                dirs_exist_ok=True,
            )
            neutralize(keep={listen_fd, channel_fd, *given})
        os.chdir(workspace)
        os.environ["AENV_WORKSPACE"] = workspace
        os.environ["AENV_INSTANCE_ID"] = iid
        server = RuntimeServer(
            state.server.project,
            sockets=[socket.socket(fileno=listen_fd)],
            default_timeout=context.default_timeout,
            token=item.get("token"),
            # this memory ran its parent's calls: a judge reward's seed is a fresh interpreter,
            # with the variables the parent started with
            judge_environment=state.server.judge_environment or {},
        )
        _serve(state, server, channel, limits)
        code = 0
    except BaseException:
        log.exception("fork set-up failed", extra={"instance": item.get("id")})
    finally:
        os._exit(code)


def _private_copies(
    *, hostname: str, own_network: bool, keep_under_tmp: tuple[str, ...], workspace: str
) -> None:
    """In a fork (root of its parent's user namespace): its own namespaces; mounts of the
    workspace and ``/tmp`` holding copies of the parent's; its own ``/proc``."""
    from local_backend import _linux, _sandbox

    flags = _linux.CLONE_NEWNS | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS
    if own_network:
        flags |= _linux.CLONE_NEWNET
    _linux.unshare(flags)
    for path, mode in ((workspace, "755"), ("/tmp", "1777")):
        old = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            size = os.statvfs(path)
            limit = size.f_blocks * size.f_frsize
            if path == "/tmp":
                _sandbox.private_tmp(limit, keep=keep_under_tmp)
            else:
                _linux.mount(
                    "tmpfs",
                    path,
                    "tmpfs",
                    _linux.MS_NOSUID | _linux.MS_NODEV,
                    f"mode={mode},size={limit}",
                )
            source = f"/proc/self/fd/{old}"
            device = os.fstat(old).st_dev

            def elsewhere(directory: str, names: list[str], device: int = device) -> list[str]:
                # mount points below (the runtime's paths bound into /tmp) are not copied
                return [n for n in names if os.lstat(os.path.join(directory, n)).st_dev != device]

            shutil.copytree(source, path, symlinks=True, dirs_exist_ok=True, ignore=elsewhere)
        finally:
            os.close(old)
    _sandbox.mount_own_proc()
    if own_network:
        _linux.loopback_up()
    _linux.sethostname(hostname)
    os.chdir(os.getcwd())  # re-resolve the working directory on the new mount
