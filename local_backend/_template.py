"""A template: the sandboxed process that imports one environment and forks its instances.

The zygote (``zygote.py``) forks a template process for each variant of a definition (its
datasource and storage directories) and never imports the environment itself. The fork, still
the zygote's trusted code, builds its sandbox first (:func:`become_template`):

1. it keeps no descriptor of the zygote's but its own channel (``_fds.neutralize``) and waits
   until the zygote has placed it in its cgroup;
2. isolated: its namespaces and mounts (a private copy of the project, ``/tmp``, ``/data``,
   ``/storage``; ``_sandbox.enter_template_sandbox``), then a user namespace whose root is
   ``nobody`` on a root host (the zygote writes its id maps), no new privileges; then it forks
   the template proper as pid 1 of a pid namespace of its own and only waits for it;
3. the template mounts its ``/proc``, **imports the environment** (the first environment code
   to run, inside all of the above), builds the runtime server once, reports ``loaded`` with
   the manifest (tools, functions, reward, health) or ``failed`` with the load error, and then
   serves ``spawn`` requests.

An instance (``_instance.py``) is forked by the template into a new pid namespace whose pid 1 is
the compiled ``init.c`` (or a Python stand-in, :func:`python_init`), with one end of a socket to
the zygote as its fd 3: the zygote ends the whole pid namespace by closing its end. The template
writes the id maps of the user namespace each instance then creates.

Everything here after the import may be the environment's code in disguise: the zygote trusts
no message from a template or an instance, and each process here holds only what its own
sandbox allows.
"""

from __future__ import annotations

import gc
import logging
import os
import selectors
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from local_backend import _channel, _linux
from local_backend._fds import neutralize

__all__ = ["TemplateContext", "become_template", "python_init", "spawn_into_pid_namespace"]

log = logging.getLogger("local_backend.template")

MAP_DEADLINE = 30.0  # seconds a child may take to ask for its id maps


@dataclass(frozen=True)
class TemplateContext:
    """What a template and its instances need to know (inherited through ``fork``)."""

    project: str
    owner: str  # the engine's id: on every process's command line (ps, the tests' counts)
    isolated: bool
    privileged: bool
    network: bool
    keep_under_tmp: tuple[str, ...] = ()
    workspace: str = "/workspace"  # deployConfig.workspace: mounted there, the working directory
    init_path: str | None = None
    default_timeout: float = 600.0
    host_env: tuple[tuple[str, str], ...] = ()  # a built-in's host data (builtin_envs.host_data)
    datasource: str | None = None
    storage: str | None = None
    cgroup_procs: tuple[int, ...] = ()  # write-only cgroup.procs of the template's own groups


@dataclass
class _State:
    """The template's loaded project and server, for the instances it forks."""

    context: TemplateContext
    server: Any = None  # the RuntimeServer every instance starts from
    own_pid_namespace: int | None = None  # fd: where the template returns after each spawn
    pending_maps: dict[int, tuple[int, int]] = field(default_factory=dict)  # map_r -> (pid, go_w)


STATE: _State | None = None  # set in the template; instances read it after fork


def become_template(context: TemplateContext, channel: socket.socket, go: int) -> NoReturn:
    """In the zygote's fork: build the sandbox, then become the template (never returns)."""
    code = 1
    try:
        neutralize(keep={channel.fileno(), go, *context.cgroup_procs})
        if os.read(go, 1) != b"g":  # the zygote placed us in our cgroup
            os._exit(1)
        os.close(go)
        _linux.set_parent_death_signal(signal.SIGKILL)
        if context.isolated:
            _enter_sandbox(context, channel)
            _linux.unshare(_linux.CLONE_NEWPID)
            pid = os.fork()
            if pid != 0:  # stay outside, wait: the zygote's child, the template's parent
                channel.close()
                os.closerange(3, 1 << 16)
                _, status = os.waitpid(pid, 0)
                exit_code = os.waitstatus_to_exitcode(status)
                os._exit(exit_code if exit_code >= 0 else 128 - exit_code)
            _linux.set_parent_death_signal(signal.SIGKILL)
            from local_backend._sandbox import mount_own_proc

            mount_own_proc()
        _run(context, channel)
        code = 0
    except BaseException:
        log.exception("template set-up failed")
    finally:
        os._exit(code)


def _enter_sandbox(context: TemplateContext, channel: socket.socket) -> None:
    from local_backend import _sandbox

    _sandbox.enter_template_sandbox(
        project=context.project,
        network=context.network,
        keep_under_tmp=context.keep_under_tmp,
        root_uid=_sandbox.instance_root(context.privileged),
        datasource=context.datasource,
        storage=context.storage,
    )

    def wait_for_maps() -> None:
        _channel.send(channel, {"op": "map"})
        reply = _channel.receive(channel, block=True)
        if reply.message is None or reply.message.get("op") != "mapped":
            os._exit(1)

    _sandbox.drop_to_new_user_namespace(wait_for_maps, dumpable=True)


def _run(context: TemplateContext, channel: socket.socket) -> NoReturn:
    """The template proper: import the environment (inside the sandbox), then serve."""
    global STATE
    from sandbox_runtime import RuntimeServer, load_project

    try:
        # the engine's environment (API keys, the user's variables) is not the environment's
        # business: its import sees the base variables and its definition's own
        from aenv_ray.config import EnvConfig
        from local_backend._instance import BASE_ENV

        os.environ.clear()
        os.environ.update(BASE_ENV, HOME="/tmp", TMPDIR="/tmp")
        os.environ.update(EnvConfig.load(context.project).deploy_config.env)
        os.environ.update(context.host_env)  # what the engine resolved on its host
        project = load_project(context.project)
    except BaseException as exc:
        _channel.send(
            channel,
            {
                "op": "failed",
                "message": str(exc)[:8000],
                "type": type(exc).__name__,
                "location": str(getattr(exc, "location", "") or "")[:1000],
            },
        )
        os._exit(2)
    STATE = _State(context)
    STATE.server = RuntimeServer(project, sockets=[], default_timeout=context.default_timeout)
    registry = project.registry
    manifest = {
        "ref": project.config.ref,
        "tools": [entry.describe() for entry in registry.tools.values()],
        "functions": sorted(registry.functions),
        "reward": registry.reward.name if registry.reward else None,
        "health": registry.health.name if registry.health else None,
        # what the reward and functions take, for callers' checks before any instance starts
        "calls": {
            "reward": registry.reward.describe() if registry.reward else None,
            "functions": [entry.describe() for entry in registry.functions.values()],
        },
    }
    # Everything imported so far lives as long as the template: keep the garbage collector from
    # walking (and so copying, page by page) those objects in every instance.
    gc.collect()
    gc.freeze()
    try:
        _channel.send(channel, {"op": "loaded", "manifest": manifest})
    except ValueError:  # a manifest over the message limit
        _channel.send(channel, {"op": "failed", "message": "its tool list is too large"})
        os._exit(2)
    if context.isolated:
        STATE.own_pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)
    _serve(STATE, channel)


def _serve(state: _State, channel: socket.socket) -> NoReturn:
    """Answer ``spawn`` requests until the zygote's end closes; reap children meanwhile."""
    selector = selectors.DefaultSelector()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector.register(channel, selectors.EVENT_READ, "zygote")
    selector.register(wake_read, selectors.EVENT_READ, "wake")
    while True:
        for key, _ in selector.select():
            if key.data == "zygote":
                received = _channel.receive(channel, max_fds=6)
                if received.message is None:
                    os._exit(0)  # the zygote is gone: everything in our pid namespace dies
                _spawn(state, selector, received, channel)
            elif key.data == "wake":
                os.read(wake_read, 512)
            else:
                _map(state, selector, key.fd)
        _linux.reap_children()


def _spawn(
    state: _State, selector: selectors.BaseSelector, received: _channel.Received, channel: Any
) -> None:
    message = received.message or {}
    fds = received.fds
    iid = str(message.get("id"))
    try:
        if message.get("op") != "spawn" or not 3 <= len(fds) <= 6:
            raise ValueError(f"unexpected request {message.get('op')!r}")
        from local_backend import _instance

        listen_fd, channel_fd, init_fd, *placement = fds

        def instance(map_w: int, go_r: int) -> NoReturn:
            _instance.become_instance(state, message, listen_fd, channel_fd, map_w, go_r)

        # fork from inside the instance's cgroups: its pid 1 and runtime are born there, and
        # what they touch is charged to them, never to the template
        _move_self(placement)
        try:
            child, maps = spawn_into_pid_namespace(
                state.context,
                init_fd,
                instance,
                own_pid_namespace=state.own_pid_namespace,
                label=iid,
            )
        finally:
            _move_self(state.context.cgroup_procs)
        if maps is not None:
            selector.register(maps[0], selectors.EVENT_READ, "map")
            state.pending_maps[maps[0]] = (child, maps[1])
    except Exception as exc:
        # the engine hears of it (below) and raises it to the create's caller; here one line,
        # not a traceback on the terminal the engine shares (an interrupted run ends many
        # starts at once)
        log.warning("spawn failed: %s", exc, extra={"instance": iid})
        log.debug("spawn failed", exc_info=True, extra={"instance": iid})
        try:
            _channel.send(channel, {"op": "error", "id": iid, "message": str(exc)[:2000]})
        except OSError:
            os._exit(0)
    finally:
        received.close_fds()


def spawn_into_pid_namespace(
    context: TemplateContext,
    init_fd: int,
    child: Callable[[int, int], NoReturn],
    *,
    own_pid_namespace: int | None,
    label: str = "",
) -> tuple[int, tuple[int, int] | None]:
    """Start ``child(map_w, go_r)`` in a new pid namespace (isolated) whose pid 1 watches
    ``init_fd``; plain mode: an ordinary fork. Returns the child's pid (0 if a Python pid 1
    forked it and maps it) and, when the caller must map it, ``(map_r, go_w)``: when ``map_r``
    becomes readable, write the child's id maps, then ``b"g"`` to ``go_w``.

    ``own_pid_namespace`` (an fd): where the caller returns after forking (a process that may
    not return to its own, e.g. an instance starting a fork of itself, passes None and must
    be a throw-away process). ``label`` names the instance on pid 1's command line.
    """
    map_r, map_w = os.pipe()
    go_r, go_w = os.pipe()
    if not context.isolated:
        pid = os.fork()
        if pid == 0:
            os.close(map_r)
            os.close(go_w)
            child(-1, -1)
        for fd in (map_r, map_w, go_r, go_w):
            os.close(fd)
        return pid, None
    _linux.unshare(_linux.CLONE_NEWPID)
    pid = -1
    try:
        if context.init_path is None:
            pid = os.fork()
            if pid == 0:
                for fd in (map_r, go_w):
                    os.close(fd)
                python_init(init_fd, child, map_w, go_r)
            for fd in (map_r, map_w, go_r, go_w):
                os.close(fd)
            return 0, None
        spare = os.dup(init_fd) if init_fd == 3 else None  # dup2(3, 3) keeps close-on-exec
        try:
            init_pid = os.posix_spawn(
                context.init_path,
                [context.init_path, "--owner", context.owner, "--instance", label],  # for ps
                {},
                file_actions=[(os.POSIX_SPAWN_DUP2, spare if spare is not None else init_fd, 3)],
                setsid=True,
            )
            try:
                pid = os.fork()
            except BaseException:
                os.kill(init_pid, signal.SIGKILL)
                raise
        finally:
            if spare is not None and pid != 0:
                os.close(spare)
        if pid == 0:
            os.close(map_r)
            os.close(go_w)
            child(map_w, go_r)
    finally:
        if pid != 0 and own_pid_namespace is not None:
            _linux.setns(own_pid_namespace, _linux.CLONE_NEWPID)
    os.close(map_w)
    os.close(go_r)
    return pid, (map_r, go_w)


def _map(state: _State, selector: selectors.BaseSelector, map_r: int) -> None:
    """A child asked for its id maps (or died): write them, let it go on."""
    from local_backend._sandbox import write_id_maps

    pid, go_w = state.pending_maps.pop(map_r)
    selector.unregister(map_r)
    try:
        if os.read(map_r, 1) == b"m":
            write_id_maps(pid, 0)  # its root is ours
            os.write(go_w, b"g")
    except OSError:
        log.exception("mapping a child failed", extra={"pid": pid})
    finally:
        os.close(map_r)
        os.close(go_w)


def map_one(pid: int, map_r: int, go_w: int, *, deadline: float = MAP_DEADLINE) -> None:
    """Wait (at most ``deadline`` seconds) for child ``pid`` to ask for its id maps; write them."""
    from local_backend._sandbox import write_id_maps

    try:
        ready = selectors.DefaultSelector()
        ready.register(map_r, selectors.EVENT_READ)
        if ready.select(deadline) and os.read(map_r, 1) == b"m":
            write_id_maps(pid, 0)
            os.write(go_w, b"g")
    finally:
        os.close(map_r)
        os.close(go_w)


def python_init(
    init_fd: int, child: Callable[[int, int], NoReturn], map_w: int, go_r: int
) -> NoReturn:
    """pid 1 of an instance's pid namespace without the compiled init: fork ``child``, map it,
    then reap until ``init_fd`` (the zygote's end) closes, which ends the namespace."""
    code = 1
    try:
        os.setsid()  # like the compiled init: no process group but its own can reach it
        os.close(map_w)
        os.close(go_r)
        if context_is_isolated():
            # our /proc is still our parent's pid namespace, where the pid fork() gives us
            # names someone else: see our own, in a mount namespace of our own
            from local_backend._sandbox import mount_own_proc

            _linux.unshare(_linux.CLONE_NEWNS)
            mount_own_proc()
        os.write(init_fd, b"i")  # the zygote reads our pid from it
        inner_r, inner_w = os.pipe()
        back_r, back_w = os.pipe()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        pid = os.fork()
        if pid == 0:
            for fd in (inner_r, back_w, wake_read, wake_write):
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(os.open("/dev/null", os.O_RDWR), init_fd)
            child(inner_w, back_r)
        os.close(inner_w)
        os.close(back_r)
        neutralize(keep={init_fd, inner_r, back_w, wake_read, wake_write})
        map_one(pid, inner_r, back_w)
        watch = selectors.DefaultSelector()
        watch.register(init_fd, selectors.EVENT_READ)
        watch.register(wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in watch.select():
                if key.fd == init_fd and not os.read(init_fd, 64):
                    os._exit(0)  # the zygote closed our end: the namespace ends with us
                if key.fd == wake_read:
                    os.read(wake_read, 512)
            _linux.reap_children()
    except BaseException:
        log.exception("instance pid 1 failed")
    finally:
        os._exit(code)


def context_is_isolated() -> bool:
    """True in a template (and its descendants) that runs in namespaces."""
    return STATE is not None and STATE.context.isolated


def _move_self(procs: Any) -> None:
    """Move this process into the cgroups whose ``cgroup.procs`` descriptors are ``procs``."""
    for fd in procs:
        try:
            os.write(fd, b"0")
        except OSError:
            log.warning("cannot move into a cgroup", exc_info=True)
