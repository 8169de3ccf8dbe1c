"""The template process of one environment definition: imports once, forks instances fast.

``python -m sandbox_runtime.local.zygote PROJECT --control-fd N [--isolation namespaces|none]``

The engine starts one zygote per definition with one end of a ``SOCK_SEQPACKET`` pair. The zygote
imports the runtime and the project's modules, builds the template root (``_sandbox.py``), says
``ready`` and then serves the engine's requests one at a time. Started by root it is
*privileged*: instances' roots are nobody outside and cgroups limit them. Started by another user
(isolated all the same), it first enters a user namespace of its own and becomes pid 1 of a pid
namespace owned by it (``_sandbox.enter_own_user_namespace``; the process the engine started
only waits for it): instances' roots are that user outside, and there are no cgroup limits.

``spawn`` (id, limits, network, environment, arguments, datasource, storage)
    start the instance's pid 1 in a new pid namespace (``init.c``, a small program that reaps
    and exits when the zygote's end of its socket closes) and fork the runtime into that
    namespace; the runtime enters its other namespaces and drops to a user namespace whose root
    is nobody outside. Without the compiled init, a fork of the zygote is pid 1 and forks the
    runtime. The listening socket is bound here, in the host's network namespace, before any of
    that: the instance answers on the host's loopback while it cannot open a connection
    anywhere. Answer: ``spawned`` (id, port, pid).
``fork`` (id, new ids)
    the instance's runtime forks on its main thread between jobs; each child copies the
    workspace and /tmp into its own mounts and asks for its cgroup. Answer: ``spawned`` per child.
``kill`` (id)
    SIGKILL everything in the instance's cgroup (or its process group). Answer: ``exited``.

Unasked, the zygote reports ``exited`` (id, reason, detail) when an instance's channel closes:
its runtime died. When the engine's end closes (the owner died, even by SIGKILL), the zygote
kills every instance and exits; each instance's init also exits when the zygote's end closes, so
no process outlives its owner.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_runtime._loader import LoadedProject, load_project
from sandbox_runtime.local._cgroups import Cgroups, InstanceGroup, Limits

__all__ = ["Zygote", "main"]

log = logging.getLogger("sandbox_runtime.zygote")

_MAX_MESSAGE = 1 << 16
_BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONUNBUFFERED": "1",
}


# -- messages over SOCK_SEQPACKET: one JSON document per datagram, fds alongside ----------------
def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """Send one message (and file descriptors)."""
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and its fds; ``(None, [])`` at end of stream."""
    if max_fds:
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, max_fds)
    else:
        data, fds = sock.recv(_MAX_MESSAGE), []
    if not data:
        return None, []
    return json.loads(data), list(fds)


def _receive_with_pid(sock: socket.socket) -> tuple[dict[str, Any] | None, int | None]:
    """One message and the sender's pid in *our* pid namespace (SO_PASSCRED must be on)."""
    size = socket.CMSG_SPACE(struct.calcsize("3i"))
    data, ancillary, _, _ = sock.recvmsg(_MAX_MESSAGE, size)
    pid = None
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            pid = struct.unpack("3i", payload[: struct.calcsize("3i")])[0]
    return (json.loads(data) if data else None), pid


def _pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


@dataclass
class _Instance:
    id: str
    port: int
    channel: socket.socket  # the runtime's end is in the instance; EOF: the runtime is gone
    group: InstanceGroup | None
    pid: int | None = None  # pid of its runtime (Python pid 1: of that pid 1), in our namespace
    init_pid: int | None = None  # pid of its pid namespace's init (isolated only)
    group_root: str = ""  # the instance whose pid namespace this one lives in (itself or a fork's)
    killed: bool = False
    starting: bool = False  # isolated: forked, its pid 1 not yet mapped into its user namespace


class Zygote:
    """Serve one engine's requests for one environment definition."""

    def __init__(
        self,
        control: socket.socket,
        project: LoadedProject,
        *,
        isolated: bool,
        privileged: bool,
        owner: str,
        default_timeout: float = 600.0,
    ) -> None:
        self.control = control
        self.project = project
        self.isolated = isolated
        self.privileged = privileged  # really root (decided before any user namespace)
        self.owner = owner
        self.default_timeout = default_timeout
        self.cgroups: Cgroups | None = None
        self.instances: dict[str, _Instance] = {}
        self.inits: dict[str, socket.socket] = {}  # group root id -> channel to its pid 1
        # each pid 1 sits in a cgroup of its own, so that killing the first instance of a group
        # (its runtime's cgroup) leaves the pid namespace, and the instance's forks, alive
        self.init_groups: dict[str, InstanceGroup] = {}
        self.selector = selectors.DefaultSelector()
        self.warnings: list[str] = []
        self.engine_gone = False
        self.pid_namespace: int | None = None  # fd: where this process's children belong
        self.server: Any = None  # the RuntimeServer every spawned instance starts from
        self.init_path: str | None = None  # the compiled init, inside the template root

    # -- set-up --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Open cgroups, build the template root (isolated mode), warm the runtime's imports."""
        import sandbox_runtime._mcp  # noqa: F401  (imported now so that instances need not)
        from sandbox_runtime.server import warm_imports

        warm_imports()

        if self.privileged:
            self.cgroups = Cgroups.detect(self.owner)
            self.warnings.extend(self.cgroups.warnings)
        else:
            self.warnings.append(
                "NO RESOURCE LIMITS: not root, so instances get no cgroup limits; deployConfig "
                "memory, cpu and pids are not enforced (an instance can exhaust this machine)"
            )
        if self.isolated:
            from sandbox_runtime.local import _linux, _sandbox

            self.pid_namespace = os.open("/proc/self/ns/pid", os.O_RDONLY)

            from sandbox_runtime.local._init import init_binary

            init, why_not = init_binary()
            if init is None:
                log.info("instances get a Python pid 1", extra={"reason": why_not})
            self.init_path = _sandbox.enter_template_root(
                _sandbox.runtime_paths(self.project.root), init=init
            )
            _linux.set_child_subreaper()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Built once here (its MCP server, schemas, uvicorn config): an instance only adds its
        # socket and starts serving, touching (and so copying) far fewer of the template's pages.
        from sandbox_runtime.server import RuntimeServer

        self.server = RuntimeServer(self.project, sockets=[], default_timeout=self.default_timeout)
        # Everything imported so far lives as long as the template: keep the garbage collector
        # from walking (and so copying, page by page) those objects in every forked instance.
        gc.collect()
        gc.freeze()

    def _tell(self, message: dict[str, Any]) -> None:
        """Report to the engine; a closed socket means the engine is gone (checked by serve)."""
        try:
            send(self.control, message)
        except OSError:
            self.engine_gone = True

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        """Answer requests until the engine's end closes; then kill everything and return."""
        self._tell({"op": "ready", "pid": os.getpid(), "warnings": self.warnings})
        self.selector.register(self.control, selectors.EVENT_READ, None)
        try:
            while not self.engine_gone:
                for key, _ in self.selector.select():
                    if key.data is None:
                        message, fds = receive(self.control, max_fds=4)
                        if message is None:
                            return
                        self._handle(message, fds)
                    else:
                        self._on_instance_event(key.data, key.fileobj)  # type: ignore[arg-type]
        finally:
            for instance in list(self.instances.values()):
                self._kill(instance)
                self._forget(instance)
            if self.cgroups is not None:
                self.cgroups.close()

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message.get("op")
        try:
            if op == "spawn":
                self._spawn(message)
            elif op == "fork":
                self._fork(message)
            elif op == "kill":
                instance = self.instances.get(message["id"])
                if instance is None:  # gone already: confirm all the same
                    self._tell({"op": "exited", "id": message["id"], "reason": "deleted"})
                else:
                    self._kill(instance)
                    self._finish(instance, "deleted", "")
            else:
                raise ValueError(f"unknown request {op!r}")
        except Exception as exc:
            log.exception("request failed", extra={"op": op})
            self._tell({"op": "error", "id": message.get("id"), "message": str(exc)})
        finally:
            for fd in fds:
                os.close(fd)

    # -- spawn ---------------------------------------------------------------------------------
    def _spawn(self, message: dict[str, Any]) -> None:
        """Fork the instance; answer ``spawned`` now (plain) or once its pid 1 is mapped."""
        iid = str(message["id"])
        limits = Limits(
            memory=message.get("memory"), pids=message.get("pids"), cpu=message.get("cpu")
        )
        group = self.cgroups.create(f"i-{iid}", limits) if self.cgroups else None
        listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listen.bind(("127.0.0.1", 0))
        listen.listen(1024)
        ours, theirs = _pair()
        init_ours, init_theirs = _pair() if self.isolated else (None, None)
        go_read, go_write = os.pipe()
        init_pid: int | None = None
        if not self.isolated:
            mode, pid = "plain", os.fork()
        elif self.init_path is not None:
            assert init_theirs is not None
            mode = "runtime"
            init_pid, pid = self._start_init_and_fork(self.init_path, init_theirs, iid)
        else:
            mode, pid = "init", self._fork_into_new_pid_namespace()
            init_pid = pid
        if pid == 0:  # pragma: no cover - runs in the child
            if mode == "runtime":
                from sandbox_runtime.local import _linux

                _linux.set_parent_death_signal(signal.SIGKILL)
            self._in_child(
                self._first_process,
                mode,
                message,
                listen,
                theirs,
                init_theirs if mode == "init" else None,
                go_read,
                close=[ours, init_ours, go_write, *([init_theirs] if mode == "runtime" else [])],
            )
        os.close(go_read)
        theirs.close()
        if init_theirs is not None:
            init_theirs.close()
        port = listen.getsockname()[1]
        listen.close()
        try:
            if group is not None:
                if init_pid is not None and init_pid != pid:
                    group.add(init_pid)
                group.add(pid)
            os.write(go_write, b"g")
        finally:
            os.close(go_write)
        instance = _Instance(iid, port, ours, group, group_root=iid, pid=pid, init_pid=init_pid)
        self.instances[iid] = instance
        self.selector.register(ours, selectors.EVENT_READ, ("runtime", iid))
        if init_ours is None:
            self._tell({"op": "spawned", "id": iid, "port": port, "pid": pid})
            return
        # the rest: "map" (from the runtime, or from a Python pid 1), then "spawned"
        instance.starting = True
        self.inits[iid] = init_ours
        self.selector.register(init_ours, selectors.EVENT_READ, ("init", iid))

    def _fork_into_new_pid_namespace(self) -> int:
        """``os.fork()`` whose child is pid 1 of a new pid namespace; later forks are not."""
        from sandbox_runtime.local import _linux

        assert self.pid_namespace is not None
        _linux.unshare(_linux.CLONE_NEWPID)
        try:
            pid = os.fork()
        except BaseException:
            _linux.setns(self.pid_namespace, _linux.CLONE_NEWPID)
            raise
        if pid != 0:  # the child must not: it lives in the new namespace
            _linux.setns(self.pid_namespace, _linux.CLONE_NEWPID)
        return pid

    def _start_init_and_fork(
        self, init_path: str, channel: socket.socket, iid: str
    ) -> tuple[int, int]:
        """Start the compiled init as pid 1 of a new pid namespace, then ``os.fork()`` into it.

        Returns ``(init pid, fork result)``; the init's fd 3 is ``channel``. ``posix_spawn``
        shares this process's memory until the exec: no copy of the template's page tables.
        """
        from sandbox_runtime.local import _linux

        assert self.pid_namespace is not None
        fd = channel.fileno()
        spare = os.dup(fd) if fd == 3 else None  # dup2(3, 3) would keep close-on-exec
        _linux.unshare(_linux.CLONE_NEWPID)
        pid = -1
        try:
            init_pid = os.posix_spawn(
                init_path,
                [init_path, "--owner", self.owner, "--instance", iid],  # for ps; unread
                {},
                file_actions=[(os.POSIX_SPAWN_DUP2, spare if spare is not None else fd, 3)],
                setsid=True,
            )
            try:
                pid = os.fork()
            except BaseException:
                os.kill(init_pid, signal.SIGKILL)
                os.waitpid(init_pid, 0)
                raise
        finally:
            if spare is not None:
                os.close(spare)
            if pid != 0:  # the child must not: it lives in the new namespace
                _linux.setns(self.pid_namespace, _linux.CLONE_NEWPID)
        return init_pid, pid

    @property
    def _instance_root(self) -> int:
        from sandbox_runtime.local._sandbox import instance_root

        return instance_root(self.privileged)

    def _on_child_message(self, iid: str, message: dict[str, Any], sock: socket.socket) -> None:
        """``map``: write the asking process's id maps, answer ``mapped``, report ``spawned``."""
        instance = self.instances.get(iid)
        if instance is None:
            return
        if message.get("op") == "map" and instance.starting:
            from sandbox_runtime.local._sandbox import write_id_maps

            assert instance.pid is not None
            write_id_maps(instance.pid, self._instance_root)
            send(sock, {"op": "mapped"})
            instance.starting = False
            self._tell({"op": "spawned", "id": iid, "port": instance.port, "pid": instance.pid})

    def _first_process(
        self,
        mode: str,
        message: dict[str, Any],
        listen: socket.socket,
        channel: socket.socket,
        init: socket.socket | None,
        go_read: int,
    ) -> None:
        """Child of the zygote: wait for the cgroup, then become what ``mode`` says.

        ``plain``: the runtime, not isolated. ``runtime``: the runtime of an isolated instance
        (the compiled init is its pid 1). ``init``: a Python pid 1 that forks the runtime.
        """
        os.read(go_read, 1)
        os.close(go_read)
        if mode == "plain":
            os.setsid()
            workspace = Path(message["workspace"])
            workspace.mkdir(parents=True, exist_ok=True)
            self._run_runtime(message, listen, channel, workspace=str(workspace))
            return
        from sandbox_runtime.local import _sandbox

        _sandbox.enter_instance_namespaces(
            hostname=f"aenv-{message['id'][:16]}",
            network=bool(message.get("network")),
            tmp_bytes=int(message.get("tmp_bytes") or 64 << 20),
            workspace_bytes=int(message.get("workspace_bytes") or 1 << 30),
            datasource=message.get("datasource"),
            storage=message.get("storage"),
            root_uid=self._instance_root,
        )
        if mode == "init":
            assert init is not None
            self._instance_init(message, listen, channel, init)
            return

        def wait_for_maps() -> None:
            send(channel, {"op": "map"})
            reply, _ = receive(channel)
            if reply is None:
                os._exit(1)

        _sandbox.become_instance_root(wait_for_maps)
        os.setsid()  # without cgroups, its process group is how it is killed
        self._run_runtime(message, listen, channel, workspace="/workspace")

    def _instance_init(
        self,
        message: dict[str, Any],
        listen: socket.socket,
        channel: socket.socket,
        init: socket.socket,
    ) -> None:
        """pid 1 of the instance: become nobody-root, fork the runtime, reap until alone."""
        from sandbox_runtime.local import _linux, _sandbox

        def wait_for_maps() -> None:
            send(init, {"op": "map"})
            reply, _ = receive(init)
            if reply is None:
                os._exit(1)

        _sandbox.become_instance_root(wait_for_maps)
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        runtime = os.fork()
        if runtime == 0:
            os.close(wake_read)
            os.close(wake_write)
            init.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _linux.set_parent_death_signal(signal.SIGKILL)
            os.setsid()  # without cgroups, its process group is how it is killed
            self._run_runtime(message, listen, channel, workspace="/workspace")
            os._exit(0)
        listen.close()
        channel.close()
        waiter = selectors.DefaultSelector()
        waiter.register(init, selectors.EVENT_READ)
        waiter.register(wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in waiter.select():
                if key.fileobj is init:
                    request = init.recv(_MAX_MESSAGE)
                    if not request:
                        os._exit(0)  # the zygote is gone: everything in this pid namespace dies
                    if json.loads(request).get("op") == "kill-runtime":  # its forks live on
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(runtime, signal.SIGKILL)
                if key.fileobj == wake_read:
                    os.read(wake_read, 512)
            while True:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)  # reap orphans and the runtime
                except ChildProcessError:
                    os._exit(0)  # nothing left to serve
                if pid == 0:
                    break

    def _run_runtime(
        self, message: dict[str, Any], listen: socket.socket, channel: socket.socket, workspace: str
    ) -> None:
        """The instance's runtime: environment, working directory, then serve forever."""
        os.chdir(workspace)
        environ = dict(_BASE_ENV)
        environ.update(
            HOME=workspace,
            TMPDIR="/tmp",
            AENV_WORKSPACE=workspace,
            AENV_INSTANCE_ID=str(message["id"]),
        )
        environ.update({str(k): str(v) for k, v in (message.get("env") or {}).items()})
        os.environ.clear()
        os.environ.update(environ)
        sys.argv = ["sandbox_runtime", *[str(a) for a in message.get("arguments") or []]]
        server = self.server
        server.set_token(message.get("token"))
        server.listen_on([listen])
        _Control(server, channel, self).start()
        server.run()
        os._exit(0)

    # -- fork of a running instance ------------------------------------------------------------
    def _fork(self, message: dict[str, Any]) -> None:
        parent = self.instances.get(str(message["id"]))
        if parent is None:
            raise LookupError(f"no instance {message['id']}")
        root = parent.group_root or parent.id
        if self.cgroups is not None and root in self.inits and root not in self.init_groups:
            # before the first fork: the group's pid 1 leaves the root instance's cgroup
            root_instance = self.instances.get(root)
            if root_instance is not None and root_instance.init_pid is not None:
                init_group = self.cgroups.create(f"init-{root}", Limits())
                init_group.add(root_instance.init_pid)
                self.init_groups[root] = init_group
        items, fds, handed_over = [], [], []
        for child_id in message["new_ids"]:
            listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listen.bind(("127.0.0.1", 0))
            listen.listen(1024)
            ours, theirs = _pair()
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            port = listen.getsockname()[1]
            group = (
                self.cgroups.create(f"i-{child_id}", self._limits_of(message))
                if self.cgroups
                else None
            )
            child = _Instance(
                str(child_id), port, ours, group, group_root=parent.group_root or parent.id
            )
            items.append(
                {
                    "id": str(child_id),
                    "network": bool(message.get("network")),
                    "token": (message.get("tokens") or {}).get(str(child_id)),
                }
            )
            fds.extend([listen.fileno(), theirs.fileno()])
            self.instances[child.id] = child
            handed_over.extend([listen, theirs])
        send(parent.channel, {"op": "fork", "items": items}, fds)
        for sock in handed_over:  # the runtime has its copies now
            sock.close()
        for child_id in message["new_ids"]:
            child = self.instances[str(child_id)]
            hello, pid = _receive_with_pid(child.channel)
            if hello is None or pid is None:
                self._forget(child)
                raise RuntimeError(f"fork {child.id} of {parent.id} failed: {hello}")
            child.pid = pid
            if child.group is not None:
                child.group.add(pid)
            send(child.channel, {"op": "go"})
            self.selector.register(child.channel, selectors.EVENT_READ, ("runtime", child.id))
            self._tell({"op": "spawned", "id": child.id, "port": child.port, "pid": pid})

    @staticmethod
    def _limits_of(message: dict[str, Any]) -> Limits:
        return Limits(
            memory=message.get("memory"), pids=message.get("pids"), cpu=message.get("cpu")
        )

    # -- deaths --------------------------------------------------------------------------------
    def _on_instance_event(self, data: tuple[str, str], sock: socket.socket) -> None:
        kind, iid = data
        instance = self.instances.get(iid)
        try:
            payload = sock.recv(_MAX_MESSAGE)
        except OSError:
            payload = b""
        if payload:
            self._on_child_message(iid, json.loads(payload), sock)
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(sock)
        if instance is None:
            return
        if kind == "init":
            if not instance.starting:
                return  # a pid 1 whose runtime is gone; the runtime's channel tells
            self._tell({"op": "error", "id": iid, "message": "its set-up failed (see the log)"})
            self._kill(instance)
            self._forget(instance)
            return
        if instance.killed:
            return
        reason, detail = "crashed", "its runtime exited"
        if instance.group is not None and instance.group.oom_killed():
            reason, detail = "out_of_memory", "killed by the kernel for exceeding its memory limit"
        self._kill(instance)
        self._finish(instance, reason, detail)

    def _kill(self, instance: _Instance) -> None:
        """SIGKILL the instance: its cgroup; without one, its runtime's process group, and its
        pid namespace's init (which ends the namespace) unless forks of it still live there."""
        instance.killed = True
        if instance.group is not None and instance.group.dirs:
            instance.group.kill()
        elif instance.pid is not None:
            shared = any(
                other.group_root == instance.group_root and not other.killed
                for other in self.instances.values()
            )
            if shared and instance.pid == instance.init_pid:
                # a Python pid 1 forked this runtime and alone knows its pid
                with contextlib.suppress(OSError):
                    send(self.inits[instance.group_root], {"op": "kill-runtime"})
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(instance.pid, signal.SIGKILL)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(instance.pid, signal.SIGKILL)
            if instance.init_pid is not None and not shared:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(instance.init_pid, signal.SIGKILL)
        self._reap()

    def _finish(self, instance: _Instance, reason: str, detail: str) -> None:
        self._forget(instance)
        self._tell({"op": "exited", "id": instance.id, "reason": reason, "detail": detail})

    def _forget(self, instance: _Instance) -> None:
        self.instances.pop(instance.id, None)
        socks = [instance.channel]
        root = instance.group_root
        if root in self.inits and not any(i.group_root == root for i in self.instances.values()):
            socks.append(self.inits.pop(root))  # its pid 1 exits when this closes
            init_group = self.init_groups.pop(root, None)
            if init_group is not None:
                init_group.kill()
                init_group.remove()
        for sock in socks:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
        if instance.group is not None:
            instance.group.kill()
            instance.group.remove()

    def _reap(self) -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    # -- children ------------------------------------------------------------------------------
    def _in_child(self, target: Any, *args: Any, close: list[Any]) -> None:
        """Run ``target(*args)`` in a fresh fork, without the zygote's other descriptors."""
        code = 1
        try:
            for item in close:
                if isinstance(item, int):
                    os.close(item)
                elif item is not None:
                    item.close()
            self.selector.close()
            self.control.close()
            # nothing of the zygote's own reaches an instance: its pid namespace, its cgroups
            inherited = [self.pid_namespace] if self.pid_namespace is not None else []
            if self.cgroups is not None:
                inherited += [
                    *self.cgroups.dir_fds.values(),
                    *(fd for fd, _ in self.cgroups.parents),
                ]
            for fd in inherited:
                os.close(fd)
            self.cgroups = None
            self.pid_namespace = None
            for instance in self.instances.values():
                instance.channel.close()
            for init in self.inits.values():
                init.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            target(*args)
            code = 0
        except BaseException:
            logging.getLogger("sandbox_runtime.zygote").exception("instance set-up failed")
        finally:
            os._exit(code)


class _Control(threading.Thread):
    """In a runtime: read the zygote's requests (``fork``) and run them between jobs."""

    def __init__(self, server: Any, channel: socket.socket, zygote: Zygote) -> None:
        super().__init__(name="aenv-control", daemon=True)
        self.server = server
        self.channel = channel
        self.zygote = zygote

    def run(self) -> None:
        while True:
            try:
                message, fds = receive(self.channel, max_fds=64)
            except OSError:
                return
            if message is None:
                return
            if message.get("op") == "fork":
                items = message["items"]
                self.server.ready.wait(30)  # fork a serving runtime, never one still starting
                self.server.runner.call_between_jobs(lambda i=items, f=fds: self._fork(i, f))

    def _fork(self, items: list[dict[str, Any]], fds: list[int]) -> None:
        """On the runtime's main thread: one child per item, then close the passed fds."""
        for index, item in enumerate(items):
            listen_fd, channel_fd = fds[2 * index], fds[2 * index + 1]
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                try:
                    for other in fds:
                        if other not in (listen_fd, channel_fd):
                            os.close(other)
                    self.channel.close()
                    self._become_fork(item, listen_fd, channel_fd)
                finally:
                    os._exit(1)
        for fd in fds:
            os.close(fd)

    def _become_fork(self, item: dict[str, Any], listen_fd: int, channel_fd: int) -> None:
        from sandbox_runtime.server import RuntimeServer

        os.setsid()
        channel = socket.socket(fileno=channel_fd)
        listen = socket.socket(fileno=listen_fd)
        workspace = os.environ.get("AENV_WORKSPACE", os.getcwd())
        if self.zygote.isolated:
            _private_copy_of_mounts(network=bool(item.get("network")))
        else:
            workspace = _copy_workspace(workspace, item["id"])
            os.environ["AENV_WORKSPACE"] = workspace
            os.chdir(workspace)
        os.environ["AENV_INSTANCE_ID"] = item["id"]
        send(channel, {"op": "hello", "id": item["id"]})
        reply, _ = receive(channel)
        if reply is None:
            os._exit(1)
        server = RuntimeServer(
            self.zygote.project,
            sockets=[listen],
            default_timeout=self.zygote.default_timeout,
            token=item.get("token"),
        )
        _Control(server, channel, self.zygote).start()
        server.run()
        os._exit(0)


def _private_copy_of_mounts(*, network: bool) -> None:
    """In a forked runtime (caps in its user namespace): own mounts of /workspace and /tmp
    holding copies of the parent's, and its own network namespace."""
    import shutil

    from sandbox_runtime.local import _linux

    flags = _linux.CLONE_NEWNS | (0 if network else _linux.CLONE_NEWNET)
    _linux.unshare(flags)
    if not network:
        _linux.loopback_up()
    for path, mode in (("/workspace", "755"), ("/tmp", "1777")):
        old = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            size = os.statvfs(path)
            limit = size.f_blocks * size.f_frsize
            _linux.mount(
                "tmpfs",
                path,
                "tmpfs",
                _linux.MS_NOSUID | _linux.MS_NODEV,
                f"mode={mode},size={limit}",
            )
            shutil.copytree(f"/proc/self/fd/{old}", path, symlinks=True, dirs_exist_ok=True)
        finally:
            os.close(old)
    os.chdir(os.getcwd())  # re-resolve the working directory on the new mount


def _copy_workspace(workspace: str, new_id: str) -> str:
    import shutil

    target = str(Path(workspace).parent / f"instance-{new_id}")
    shutil.copytree(workspace, target, symlinks=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sandbox_runtime.local.zygote``."""
    from aenv_ray.logs import configure_logging

    parser = argparse.ArgumentParser(prog="python -m sandbox_runtime.local.zygote")
    parser.add_argument("project")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--isolation", choices=["namespaces", "none"], default="namespaces")
    parser.add_argument("--owner", default=str(os.getppid()))
    parser.add_argument("--default-timeout", type=float, default=600.0)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    isolated = args.isolation == "namespaces"
    privileged = os.geteuid() == 0  # before any user namespace: inside one, everyone is root
    if isolated and not privileged:
        from sandbox_runtime.local._sandbox import enter_own_user_namespace

        try:
            enter_own_user_namespace()  # returns in the pid 1 of a pid namespace of our own
        except OSError as exc:
            with socket.socket(fileno=args.control_fd) as control:
                message = f"sandbox set-up failed: {exc}"
                send(control, {"op": "failed", "message": message, "type": "OSError"})
            return 1
    control = socket.socket(fileno=args.control_fd)
    try:
        project = load_project(args.project)
    except Exception as exc:
        send(control, {"op": "failed", "message": str(exc), "type": type(exc).__name__})
        return 2
    zygote = Zygote(
        control,
        project,
        isolated=isolated,
        privileged=privileged,
        owner=args.owner,
        default_timeout=args.default_timeout,
    )
    try:
        zygote.prepare()
    except Exception as exc:
        send(
            control, {"op": "failed", "message": f"sandbox set-up failed: {exc}", "type": "OSError"}
        )
        return 1
    zygote.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
