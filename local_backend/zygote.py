"""The zygote of one environment definition: sandboxes templates, places and watches instances.

``python -m local_backend.zygote PROJECT --control-fd N [--isolation namespaces|none]``

Given ``--launcher-fd M`` (an engine's first zygote), it forks a launcher on that socket once the
runtime is imported, before anything of its own; the engine's later zygotes are forked from it
and run :func:`main` as this one does (``_launcher.py``).

The engine starts one zygote per definition with one end of a ``SOCK_SEQPACKET`` pair. The zygote
imports the runtime (never the environment), opens its cgroups, builds the template root
(``_sandbox.enter_template_root``) and forks a **template** (``_template.py``): a process that
builds its own sandbox and only then imports the environment's modules, as ``nobody`` on a root
host, with no network, a read-only view of the system and cgroup limits. It says ``ready`` (with
the environment's manifest) once the template loaded, ``failed`` if it could not, and then serves
the engine's requests:

``spawn`` (id, token, environment, arguments, sizes, datasource, storage)
    bind the instance's socket on the host's loopback, create its cgroup and channels, and ask the
    template of that datasource and storage (started on first use) to fork it. The instance says
    ``hello`` once it is in its sandbox; the kernel tells the zygote its pid; the zygote moves it
    into its cgroup and answers ``go``. Answer to the engine: ``spawned`` (id, port, pid).
``fork`` (id, new ids, tokens)
    ask the running instance to fork; each child says ``hello`` as above. Never waited for: a
    busy instance forks between its jobs while the zygote serves everyone else.
``kill`` (id)
    SIGKILL everything in the instance's cgroup and end its pid namespace. Answer: ``exited``.

Unasked, it reports ``exited`` (id, reason, detail) when an instance dies. Everything a template
or an instance sends is untrusted: a message that is not ours, out of turn, or never read is a
protocol violation and costs that instance (or that template and its instances) their life,
never anyone else's; every wait has a deadline. When the engine's end closes (the owner died,
even by SIGKILL), the zygote kills everything and removes its cgroups; every instance's pid 1
also exits when the zygote's end of its socket closes, so nothing outlives the zygote either.

Started by root it is *privileged*: templates and instances are ``nobody`` outside and cgroups
limit them. Started by another user (isolated all the same), it first enters a user namespace of
its own (``_sandbox.enter_own_user_namespace``): instances are that user outside, unlimited.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local_backend import _channel
from local_backend._cgroups import Cgroups, InstanceGroup, Limits, limit_warnings
from local_backend._channel import ProtocolViolation, Received
from local_backend._template import TemplateContext

__all__ = ["Zygote", "main"]

log = logging.getLogger("local_backend.zygote")

_START_TIMEOUT = 60.0  # seconds an instance (or a template) may take to come up
_IDLE_TEMPLATE = 60.0  # seconds a template other than the first lives with no instance
_MAX_MANIFEST_TOOLS = 4096
_IN_FLIGHT = 32  # spawns a template has in flight at once (the rest wait in the zygote)
# After each fork the template copies again the pages it touches; the old copies live on in the
# instance but stay charged to the template's group (~0.45 MiB per instance, measured). So the
# template's memory limit is its definition's, plus this much per live instance.
_SHARED_PER_INSTANCE = 1 << 20
_RESIZE_STEP = 16


@dataclass(eq=False)
class _Template:
    key: tuple[str | None, str | None]  # (datasource, storage)
    name: str
    pid: int  # the zygote's child (the template waits for it; its death ends the template)
    channel: socket.socket
    group: InstanceGroup | None
    deadline: float
    state: str = "starting"  # starting -> ready -> dead
    queued: list[tuple[dict[str, Any], list[Any]]] = field(default_factory=list)  # sockets, fds
    instances: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)  # spawned, no hello yet
    memory_limit: int | None = None  # as last written
    idle_since: float | None = None


@dataclass(eq=False)
class _Instance:
    id: str
    template: _Template
    port: int
    channel: socket.socket  # the runtime's end is in the instance; EOF: the runtime is gone
    init_channel: socket.socket | None  # its pid 1's end; closing ours ends its pid namespace
    group: InstanceGroup | None
    deadline: float
    request: str  # the id the engine waits on for errors (a fork's: its parent's)
    ns_parent: str | None = None  # the instance whose pid namespace holds this one's (forks)
    state: str = "starting"  # starting -> running -> dead
    pid: int | None = None  # the runtime, in our pid namespace (from the kernel)
    init_pid: int | None = None
    init_group: InstanceGroup | None = None  # its pid 1, once forks live in its namespace
    killed: bool = False
    broken: str | None = None  # why the runtime said it could not go on
    workspace: str | None = None  # plain processes: a host directory, removed with it


class Zygote:
    """Serve one engine's requests for one environment definition."""

    def __init__(
        self,
        control: socket.socket,
        project: str,
        *,
        isolated: bool,
        privileged: bool,
        owner: str,
        cgroup_name: str = "z",
        network: bool = False,
        limits: Limits | None = None,
        default_timeout: float = 600.0,
        workspace: str = "/workspace",
        host_data: dict[str, str] | None = None,
    ) -> None:
        self.control = control
        self.project = str(Path(project).resolve())
        self.isolated = isolated
        self.privileged = privileged  # really root (decided before any user namespace)
        self.owner = owner
        self.cgroup_name = cgroup_name
        self.network = network
        self.workspace = workspace  # its instances' workspace and working directory
        # a built-in's host directories by their variable: bound read-only, set in the template
        self.host_data = dict(host_data or {})
        self.limits = limits or Limits()
        self.default_timeout = default_timeout
        self.cgroups: Cgroups | None = None
        self.templates: dict[tuple[str | None, str | None], _Template] = {}
        self.instances: dict[str, _Instance] = {}
        self.selector = selectors.DefaultSelector()
        self.warnings: list[str] = []
        self.engine_gone = False
        self.ready_sent = False
        self.keep_under_tmp: tuple[str, ...] = ()
        self.init_path: str | None = None
        self._numbers = iter(range(1, 1 << 62))

    # -- set-up --------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Open cgroups, build the template root (isolated), warm the runtime's imports."""
        _warm_imports()
        # not root: the groups of a cgroup subtree delegated to this user, where there is one
        cgroups = Cgroups.detect(self.owner, self.cgroup_name)
        self.warnings.extend(limit_warnings(cgroups, privileged=self.privileged))
        if self.privileged or cgroups.limited:
            self.cgroups = cgroups
        else:
            cgroups.close()
        if self.isolated:
            from local_backend import _linux, _sandbox
            from local_backend._init import init_binary

            paths = _sandbox.runtime_paths(Path(self.project), self.host_data.values())
            _sandbox.check_workspace_free(self.workspace, paths)
            self.keep_under_tmp = tuple(_sandbox.under_tmp(paths))
            init, why_not = init_binary()
            if init is None:
                log.info("instances get a Python pid 1", extra={"reason": why_not})
            self.init_path = _sandbox.enter_template_root(
                paths, init=init, workspace=self.workspace, owner=self.owner
            )
            _linux.set_child_subreaper()
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector.register(wake_read, selectors.EVENT_READ, ("wake", None))

    def _tell(self, message: dict[str, Any]) -> None:
        """Report to the engine; a closed socket means the engine is gone (checked by serve)."""
        try:
            _channel.send(self.control, message)
        except OSError:
            self.engine_gone = True

    # -- templates -----------------------------------------------------------------------------
    def _template(self, key: tuple[str | None, str | None]) -> _Template:
        template = self.templates.get(key)
        if template is not None and template.state != "dead":
            return template
        number = next(self._numbers)
        group = self.cgroups.create(f"t{number}", self.limits) if self.cgroups else None
        procs = group.procs_fds() if group is not None else []
        context = TemplateContext(
            project=self.project,
            owner=self.owner,
            isolated=self.isolated,
            privileged=self.privileged,
            network=self.network,
            keep_under_tmp=self.keep_under_tmp,
            workspace=self.workspace,
            init_path=self.init_path,
            default_timeout=self.default_timeout,
            host_env=tuple(self.host_data.items()),
            datasource=key[0],
            storage=key[1],
            cgroup_procs=tuple(procs),
        )
        ours, theirs = _channel.pair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        go_read, go_write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            from local_backend._template import become_template

            os.close(go_write)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            become_template(context, theirs, go_read)
        os.close(go_read)
        theirs.close()
        for fd in procs:
            os.close(fd)
        try:
            if group is not None:
                group.add(pid)
            os.write(go_write, b"g")
        finally:
            os.close(go_write)
        template = _Template(key, f"t{number}", pid, ours, group, time.monotonic() + _START_TIMEOUT)
        self.templates[key] = template
        self.selector.register(ours, selectors.EVENT_READ, ("template", template))
        return template

    def _on_template(self, template: _Template) -> None:
        try:
            try:
                received = _channel.receive(template.channel, creds=True)
            except OSError:
                received = Received(None)
            message = received.message
            if message is None:
                self._template_exited(template)
                return
            op = message.get("op")
            if op == "map" and template.state == "starting" and received.pid == template.pid:
                from local_backend._sandbox import instance_root, write_id_maps

                write_id_maps(template.pid, instance_root(self.privileged))
                _channel.send(template.channel, {"op": "mapped"}, block=False)
            elif op == "loaded" and template.state == "starting":
                manifest = _checked_manifest(message.get("manifest"))
                template.state = "ready"
                template.idle_since = time.monotonic()
                if not self.ready_sent:
                    self.ready_sent = True
                    ready = {"op": "ready", "pid": os.getpid(), "warnings": self.warnings}
                    self._tell({**ready, "manifest": manifest})
                self._drain(template)
            elif op == "failed" and template.state == "starting":
                why = _channel.text(message, "message", limit=8000)
                kind = str(message.get("type") or "")[:100]
                self._template_failed(template, why, kind, str(message.get("location") or ""))
            elif op == "error" and template.state == "ready":
                instance = self.instances.get(str(message.get("id")))
                if instance is not None and instance.template is template:
                    why = _channel.text(message, "message", limit=2000)
                    self._fail_start(instance, f"its template could not fork it: {why}")
            else:
                raise ProtocolViolation(f"unexpected {op!r} from a template in {template.state}")
        except ProtocolViolation as exc:
            log.warning(
                "template broke protocol", extra={"template": template.name, "why": str(exc)}
            )
            self._template_gone(template, f"its template broke protocol ({exc})")

    def _template_failed(self, template: _Template, why: str, kind: str, location: str) -> None:
        if not self.ready_sent:  # the definition does not load: the engine hears it once
            self._tell({"op": "failed", "message": why, "type": kind, "location": location})
            self.engine_gone = True  # nothing more to do: exit
        self._template_gone(template, f"it does not load: {why}")

    def _template_exited(self, template: _Template) -> None:
        if template.state == "starting":  # died importing the project: it does not load
            why = "its process exited while importing the project (os._exit, a signal or a crash)"
            self._template_failed(template, why, "DefinitionError", "")
        else:
            self._template_gone(template, "its template process exited")

    def _template_gone(self, template: _Template, detail: str) -> None:
        """The template died (or is made to): so do its instances (their pid namespaces are
        inside its own)."""
        if template.state == "dead":
            return
        template.state = "dead"
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(template.channel)
        template.channel.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(template.pid, signal.SIGKILL)
        for request, sockets in template.queued:
            _close_all(sockets)
            instance = self.instances.get(str(request.get("id")))
            if instance is not None:
                self._fail_start(instance, f"its template is gone: {detail}")
        template.queued.clear()
        for iid in list(template.instances):
            instance = self.instances.get(iid)
            if instance is None:
                continue
            if instance.state == "starting":
                self._fail_start(instance, detail)
            else:
                self._kill(instance)
                self._finish(instance, "crashed", detail)
        if template.group is not None:
            template.group.kill()
            template.group.remove()
        if self.templates.get(template.key) is template:
            del self.templates[template.key]
        self._reap()

    def _resize(self, template: _Template) -> None:
        """The template's memory limit: its definition's, plus what its live instances share."""
        if template.group is None or self.limits.memory is None or template.state == "dead":
            return
        steps = -(-len(template.instances) // _RESIZE_STEP)  # in steps: a write per 16 creates
        limit = self.limits.memory + _SHARED_PER_INSTANCE * _RESIZE_STEP * steps
        if limit == template.memory_limit:
            return
        template.memory_limit = limit
        try:
            template.group.set_memory(limit)
        except OSError as exc:  # usage above a lowered limit: it comes down with the instances
            log.debug(
                "template limit not changed", extra={"template": template.name, "why": str(exc)}
            )

    # -- the loop ------------------------------------------------------------------------------
    def serve(self) -> None:
        """Answer requests until the engine's end closes; then kill everything and return."""
        self.selector.register(self.control, selectors.EVENT_READ, ("engine", None))
        try:
            self._template((None, None))  # the first: its import is the definition's check
            while not self.engine_gone:
                for key, _ in self.selector.select(self._next_deadline()):
                    kind, what = key.data
                    if isinstance(key.fileobj, socket.socket) and key.fileobj.fileno() == -1:
                        continue  # closed by an event handled before it in this batch
                    if kind == "engine":
                        self._on_engine()
                    elif kind == "template":
                        self._on_template(what)
                    elif kind == "runtime":
                        self._on_runtime(what)
                    elif kind == "init":
                        self._on_init(what)
                    else:
                        os.read(key.fd, 512)  # SIGCHLD woke us
                    if self.engine_gone:
                        break
                self._reap()
                self._check_deadlines()
        finally:
            self._shutdown()

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [i.deadline for i in self.instances.values() if i.state == "starting"]
        deadlines += [t.deadline for t in self.templates.values() if t.state == "starting"]
        deadlines += [
            t.idle_since + _IDLE_TEMPLATE
            for t in self.templates.values()
            if t.idle_since is not None and t.key != (None, None)
        ]
        return max(0.0, min(deadlines) - now) if deadlines else 3600.0

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for template in list(self.templates.values()):
            if template.state == "starting" and now >= template.deadline:
                self._template_failed(
                    template, f"its template did not load within {_START_TIMEOUT:g} s", "", ""
                )
            elif (
                template.idle_since is not None
                and template.key != (None, None)
                and now >= template.idle_since + _IDLE_TEMPLATE
            ):
                self._template_gone(template, "idle")
        for instance in list(self.instances.values()):
            if instance.state == "starting" and now >= instance.deadline:
                what = "its parent was busy or it" if instance.ns_parent else "it"
                self._fail_start(instance, f"{what} did not start within {_START_TIMEOUT:g} s")

    def _on_engine(self) -> None:
        received = _channel.receive(self.control, max_fds=0)
        message = received.message
        if message is None:
            self.engine_gone = True
            return
        op = message.get("op")
        try:
            if op == "spawn":
                self._spawn(message)
            elif op == "fork":
                self._fork(message)
            elif op == "kill":
                instance = self.instances.get(str(message["id"]))
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

    # -- spawn ---------------------------------------------------------------------------------
    def _spawn(self, message: dict[str, Any]) -> None:
        iid = str(message["id"])
        if iid in self.instances:
            raise ValueError(f"instance {iid} exists already")
        template = self._template((message.get("datasource"), message.get("storage")))
        instance, handed = self._new_instance(
            iid, template, message, workspace=message.get("workspace")
        )
        request = {
            "op": "spawn",
            "id": iid,
            "token": message.get("token"),
            "env": message.get("env") or {},
            "arguments": message.get("arguments") or [],
            "tmp_bytes": message.get("tmp_bytes"),
            "workspace_bytes": message.get("workspace_bytes"),
            "workspace": message.get("workspace"),
        }
        placement = instance.group.procs_fds() if instance.group is not None else []
        template.queued.append((request, [*handed, *placement]))
        self._drain(template)

    def _new_instance(
        self,
        iid: str,
        template: _Template,
        message: dict[str, Any],
        *,
        ns_parent: str | None = None,
        workspace: str | None = None,
    ) -> tuple[_Instance, list[socket.socket]]:
        """A starting instance's record: its cgroup, its socket on the host's loopback and its
        channels, remembered; with the three sockets to hand over (listen, channel, pid 1)."""
        group = None
        if self.cgroups:
            group = self.cgroups.create(f"i-{iid}", _limits(message))
            self.cgroups.create_work(group, _limits(message))
        listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listen.bind(("127.0.0.1", 0))
        listen.listen(1024)
        ours, theirs = _channel.pair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        init_ours, init_theirs = self._init_pair()
        instance = _Instance(
            iid,
            template,
            listen.getsockname()[1],
            ours,
            init_ours,
            group,
            time.monotonic() + float(message.get("timeout") or _START_TIMEOUT),
            request=iid,
            ns_parent=ns_parent,
            workspace=workspace,
        )
        self._remember(instance)
        return instance, [listen, theirs, init_theirs or _null_socket()]

    def _drain(self, template: _Template) -> None:
        """Send queued spawns to a ready template, at most ``_IN_FLIGHT`` unanswered at once."""
        while (
            template.state == "ready" and template.queued and len(template.in_flight) < _IN_FLIGHT
        ):
            request, sockets = template.queued.pop(0)
            if str(request["id"]) not in self.instances:  # killed or failed while it waited
                _close_all(sockets)
                continue
            template.in_flight.add(str(request["id"]))
            try:
                fds = [s if isinstance(s, int) else s.fileno() for s in sockets]
                _channel.send(template.channel, request, fds, block=False)
            except (ProtocolViolation, OSError) as exc:
                self._template_gone(template, f"its template does not take requests ({exc})")
                return
            finally:
                _close_all(sockets)
            template.idle_since = None

    def _init_pair(self) -> tuple[socket.socket | None, socket.socket | None]:
        if not self.isolated:
            return None, None
        ours, theirs = _channel.pair()
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        return ours, theirs

    def _remember(self, instance: _Instance) -> None:
        self.instances[instance.id] = instance
        instance.template.instances.add(instance.id)
        instance.template.idle_since = None
        self._resize(instance.template)
        self.selector.register(instance.channel, selectors.EVENT_READ, ("runtime", instance))
        if instance.init_channel is not None:
            self.selector.register(instance.init_channel, selectors.EVENT_READ, ("init", instance))

    # -- messages from instances ---------------------------------------------------------------
    def _on_runtime(self, instance: _Instance) -> None:
        try:
            received = _channel.receive(instance.channel, creds=True)
        except ProtocolViolation as exc:
            self._violation(instance, str(exc))
            return
        except OSError:
            received = Received(None)
        message = received.message
        if message is None:
            self._runtime_gone(instance)
            return
        op = message.get("op")
        if op == "hello" and instance.state == "starting" and received.pid:
            self._on_hello(instance, received)
        elif op == "broken" and instance.state == "running":
            try:
                instance.broken = _channel.text(message, "reason", limit=2000)
            except ProtocolViolation as exc:
                self._violation(instance, str(exc))
        else:
            self._violation(instance, f"unexpected {op!r} while {instance.state}")

    def _on_hello(self, instance: _Instance, received: Received) -> None:
        """The instance is in its sandbox: place it in its cgroup, let it serve, tell."""
        assert received.pid is not None
        instance.pid = received.pid
        fds: list[int] = []
        names: list[str] = []
        try:
            if instance.group is not None:
                if not instance.group.holds(instance.pid):  # its template did not place it
                    instance.group.add(instance.pid)
                memory_events, pids_events = instance.group.event_fds()
                work_procs, work_memory, work_pids = instance.group.work_fds()
                for name, fd in (
                    ("memory_events", memory_events),
                    ("pids_events", pids_events),
                    *(("work_procs", fd) for fd in work_procs),
                    ("work_memory_events", work_memory),
                    ("work_pids_events", work_pids),
                    ("memory_usage", instance.group.usage_fd()),
                ):
                    if fd is not None:
                        names.append(name)
                        fds.append(fd)
            # without a group, the runtime makes the limits rlimits (RLIMIT_NPROC counts per
            # user namespace: per instance when isolated, but every process of the user if not)
            isolated_or_grouped = instance.group is not None or self.isolated
            limits = self.limits if isolated_or_grouped else Limits()
            go = {
                "op": "go",
                "memory": limits.memory,
                "pids": limits.pids,
                "enforced": instance.group is not None,
                **_work_message(instance.group),
                "fds": names,
            }
            _channel.send(instance.channel, go, fds, block=False)
        except ProtocolViolation as exc:
            self._violation(instance, str(exc))
            return
        except OSError as exc:  # it died meanwhile
            log.info(
                "instance gone before it started", extra={"instance": instance.id, "why": str(exc)}
            )
            self._fail_start(instance, f"it died while starting ({exc.strerror or exc})")
            return
        finally:
            for fd in fds:
                os.close(fd)
        instance.state = "running"
        self._tell({"op": "spawned", "id": instance.id, "port": instance.port, "pid": instance.pid})
        self._landed(instance)

    def _landed(self, instance: _Instance) -> None:
        """The instance's spawn is over (it said hello, or failed): the next one may go."""
        template = instance.template
        if instance.id in template.in_flight:
            template.in_flight.discard(instance.id)
            self._drain(template)

    def _on_init(self, instance: _Instance) -> None:
        assert instance.init_channel is not None
        try:
            data, ancillary, flags, _ = instance.init_channel.recvmsg(
                64, socket.CMSG_SPACE(12), socket.MSG_DONTWAIT
            )
        except BlockingIOError:
            return
        except OSError:
            data, ancillary, flags = b"", [], 0
        if not data:  # its pid 1 exited: its pid namespace, and so the instance, is gone
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(instance.init_channel)
            if instance.state == "starting":
                self._fail_start(instance, "its pid 1 exited while it started")
            elif not instance.killed:
                self._kill(instance)
                self._finish(instance, "crashed", "its pid namespace ended")
            return
        pid = next(
            (
                int.from_bytes(payload[:4], sys.byteorder, signed=True)
                for level, kind, payload in ancillary
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS
            ),
            None,
        )
        if instance.init_pid is not None or pid is None or flags & socket.MSG_TRUNC:
            self._violation(instance, "its pid 1 said more than hello")
            return
        instance.init_pid = pid
        group = instance.init_group or instance.group
        if group is not None and not group.holds(pid):
            with contextlib.suppress(OSError):
                group.add(pid)

    def _violation(self, instance: _Instance, why: str) -> None:
        log.warning("instance broke protocol", extra={"instance": instance.id, "why": why})
        if instance.state == "starting":
            self._fail_start(instance, f"it broke protocol ({why})")
        else:
            self._kill(instance)
            self._finish(instance, "crashed", f"it broke protocol with the engine ({why})")

    def _runtime_gone(self, instance: _Instance) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(instance.channel)
        if instance.killed:
            return
        if instance.state == "starting":
            self._fail_start(instance, "it exited while starting (see the engine's log)")
            return
        reason, detail = "crashed", instance.broken or "its runtime exited"
        if instance.group is not None and instance.group.oom_killed():
            reason, detail = "out_of_memory", "killed by the kernel for exceeding its memory limit"
        self._kill(instance)
        self._finish(instance, reason, detail)

    # -- fork of a running instance ------------------------------------------------------------
    def _fork(self, message: dict[str, Any]) -> None:
        parent = self.instances.get(str(message["id"]))
        if parent is None or parent.state != "running":
            raise LookupError(f"no running instance {message['id']}")
        if self.cgroups is not None and parent.init_pid is not None and parent.init_group is None:
            # before its first fork: its pid 1 leaves its cgroup, so that deleting it leaves its
            # pid namespace, and the forks inside, alive
            parent.init_group = self.cgroups.create(f"init-{parent.id}", Limits())
            parent.init_group.add(parent.init_pid)
        tokens = message.get("tokens") or {}
        items, sockets, children = [], [], []
        for child_id in [str(i) for i in message["new_ids"]]:
            workspace = (
                None
                if self.isolated
                else tempfile.mkdtemp(prefix=f"aenv-fork-{self.owner}-{child_id}-")
            )
            child, handed = self._new_instance(
                child_id, parent.template, message, ns_parent=parent.id, workspace=workspace
            )
            children.append(child)
            items.append({"id": child_id, "token": tokens.get(child_id), "workspace": workspace})
            sockets.extend(handed)
        try:
            _channel.send(
                parent.channel,
                {"op": "fork", "items": items},
                [s.fileno() for s in sockets],
                block=False,
            )
        except ProtocolViolation as exc:
            for child in children:
                self._fail_start(child, "its parent does not take requests")
            self._violation(parent, str(exc))
        finally:
            for sock in sockets:
                sock.close()

    # -- deaths --------------------------------------------------------------------------------
    def _fail_start(self, instance: _Instance, why: str) -> None:
        self._kill(instance)
        self._forget(instance)
        self._tell({"op": "error", "id": instance.request, "message": why})
        self._landed(instance)

    def _kill(self, instance: _Instance) -> None:
        """SIGKILL the instance: its cgroup (without one, its process group); its pid namespace
        ends with its pid 1 unless forks of it still live there."""
        instance.killed = True
        if instance.group is not None and instance.group.dirs:
            instance.group.kill()
        elif instance.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(instance.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(instance.pid, signal.SIGKILL)
        self._release_namespace(instance)
        self._reap()

    def _release_namespace(self, instance: _Instance) -> None:
        """Close the pid 1 channel of a killed instance once no live fork is inside its pid
        namespace; then do the same for the namespace it is inside."""
        if not instance.killed or instance.init_channel is None:
            return
        if any(self._inside(other, instance.id) for other in self.instances.values()):
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(instance.init_channel)
        instance.init_channel.close()
        instance.init_channel = None
        if instance.init_group is not None:
            instance.init_group.kill()
            instance.init_group.remove()
            instance.init_group = None
        outer = self.instances.get(instance.ns_parent or "")
        if outer is not None:
            self._release_namespace(outer)

    def _inside(self, instance: _Instance, ancestor: str) -> bool:
        """True if ``instance`` is alive and its pid namespace lies within ``ancestor``'s."""
        if instance.killed or instance.id == ancestor:
            return False
        seen = instance.ns_parent
        while seen is not None:
            if seen == ancestor:
                return True
            parent = self.instances.get(seen)
            seen = parent.ns_parent if parent is not None else None
        return False

    def _finish(self, instance: _Instance, reason: str, detail: str) -> None:
        self._forget(instance)
        self._tell({"op": "exited", "id": instance.id, "reason": reason, "detail": detail})

    def _forget(self, instance: _Instance) -> None:
        """Drop the instance's record, channels and cgroup (its namespace may outlive it)."""
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(instance.channel)
        instance.channel.close()
        if instance.group is not None:
            instance.group.kill()
            instance.group.remove()
        instance.state = "dead"
        if instance.workspace is not None:
            shutil.rmtree(instance.workspace, ignore_errors=True)
            instance.workspace = None
        if instance.init_channel is None or not any(
            self._inside(o, instance.id) for o in self.instances.values()
        ):
            self.instances.pop(instance.id, None)
        instance.template.instances.discard(instance.id)
        self._resize(instance.template)
        if not instance.template.instances and instance.template.state == "ready":
            instance.template.idle_since = time.monotonic()
        self._release_namespace(instance)
        # records kept only for their pid namespace go once it is released
        for other in list(self.instances.values()):
            if other.state == "dead" and other.init_channel is None:
                self.instances.pop(other.id, None)

    def _reap(self) -> None:
        from local_backend._linux import reap_children

        for pid in reap_children():
            for template in list(self.templates.values()):
                if template.pid == pid and template.state != "dead":
                    self._template_exited(template)

    def _shutdown(self) -> None:
        """Kill everything: every pid namespace ends, every cgroup goes."""
        for instance in list(self.instances.values()):
            instance.killed = True
            if instance.init_channel is not None:
                instance.init_channel.close()
                instance.init_channel = None
            if instance.pid is not None and self.cgroups is None and not self.isolated:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(instance.pid, signal.SIGKILL)
            if instance.workspace is not None:
                shutil.rmtree(instance.workspace, ignore_errors=True)
        for template in list(self.templates.values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(template.pid, signal.SIGKILL)
        if self.cgroups is not None:
            self.cgroups.kill_all()
            self.cgroups.close()
        self._reap()


def _work_message(group: InstanceGroup | None) -> dict[str, Any]:
    """What ``go`` says of the limits of the processes the instance's calls start."""
    work = group.work if group is not None else None
    if work is None:
        return {}
    return {"work_memory": work.memory, "work_pids": work.pids}


def _limits(message: dict[str, Any]) -> Limits:
    def number(key: str) -> Any:
        value = message.get(key)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    memory, pids = number("memory"), number("pids")
    return Limits(
        memory=int(memory) if memory is not None else None,
        pids=int(pids) if pids is not None else None,
        cpu=number("cpu"),
    )


def _close_all(items: list[Any]) -> None:
    """Close sockets and raw descriptors alike."""
    for item in items:
        if isinstance(item, int):
            with contextlib.suppress(OSError):
                os.close(item)
        else:
            item.close()


def _null_socket() -> socket.socket:
    """A placeholder descriptor where an instance needs no pid 1 channel (plain processes)."""
    ours, theirs = _channel.pair()
    ours.close()
    return theirs


def _described_calls(calls: Any) -> bool:
    """Whether a manifest's ``calls`` is ``{"reward": described or None, "functions": [...]}``."""
    if not isinstance(calls, dict) or not isinstance(calls.get("functions"), list):
        return False
    described = [calls.get("reward"), *calls["functions"]]
    return all(
        c is None or (isinstance(c, dict) and isinstance(c.get("name"), str)) for c in described
    )


def _checked_manifest(manifest: Any) -> dict[str, Any]:
    """The template's account of the environment, checked as untrusted data."""
    if not isinstance(manifest, dict):
        raise ProtocolViolation("a manifest that is not an object")
    tools = manifest.get("tools")
    if not isinstance(tools, list) or len(tools) > _MAX_MANIFEST_TOOLS:
        raise ProtocolViolation("a manifest without a list of tools")
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise ProtocolViolation("a manifest tool without a name")
    functions = manifest.get("functions")
    if not isinstance(functions, list) or not all(isinstance(f, str) for f in functions):
        raise ProtocolViolation("a manifest without a list of function names")
    for key in ("ref", "reward", "health"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            raise ProtocolViolation(f"a manifest whose {key} is not a string")
    calls = manifest.get("calls")
    if calls is not None and not _described_calls(calls):
        raise ProtocolViolation("a manifest whose calls are not described by name")
    return manifest


def _warm_imports() -> None:
    """What every zygote imports before its own set-up (a launcher forks zygotes with it)."""
    import local_backend._instance  # noqa: F401  (imported now: templates need not)
    from sandbox_runtime import warm_imports

    warm_imports()


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m local_backend.zygote``."""
    from aenv_ray.logs import configure_logging

    parser = argparse.ArgumentParser(prog="python -m local_backend.zygote")
    parser.add_argument("project")
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--isolation", choices=["namespaces", "none"], default="namespaces")
    parser.add_argument("--owner", default=str(os.getppid()))
    parser.add_argument("--cgroup-name", default="z")
    parser.add_argument("--default-timeout", type=float, default=600.0)
    parser.add_argument("--network", action="store_true")
    parser.add_argument("--workspace", default="/workspace")
    parser.add_argument("--memory", type=int)
    parser.add_argument("--pids", type=int)
    parser.add_argument("--cpu", type=float)
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--host-data", action="append", default=[], metavar="VARIABLE=DIR")
    parser.add_argument("--launcher-fd", type=int, help="fork a launcher on this socket")
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    from aenv_ray.config import quiet_notes

    quiet_notes()  # the engine that started this read the project's config.json and told them
    if args.launcher_fd is not None:  # the engine's first zygote: warm, fork its launcher
        from local_backend._launcher import fork_launcher

        _warm_imports()
        fork_launcher(args.launcher_fd, main, owner=args.owner)
    isolated = args.isolation == "namespaces"
    privileged = os.geteuid() == 0  # before any user namespace: inside one, everyone is root
    if isolated and not privileged:
        from local_backend._sandbox import enter_own_user_namespace

        try:
            enter_own_user_namespace()  # returns in the pid 1 of a pid namespace of our own
        except OSError as exc:
            with socket.socket(fileno=args.control_fd) as control:
                message = f"sandbox set-up failed: {exc}"
                _channel.send(control, {"op": "failed", "message": message, "type": "OSError"})
            return 1
    control = socket.socket(fileno=args.control_fd)
    zygote = Zygote(
        control,
        args.project,
        isolated=isolated,
        privileged=privileged,
        owner=args.owner,
        cgroup_name=args.cgroup_name,
        network=args.network,
        limits=Limits(memory=args.memory, pids=args.pids, cpu=args.cpu),
        default_timeout=args.default_timeout,
        workspace=args.workspace,
        host_data=dict(item.split("=", 1) for item in args.host_data),
    )
    try:
        zygote.prepare()
    except Exception as exc:
        _channel.send(
            control, {"op": "failed", "message": f"sandbox set-up failed: {exc}", "type": "OSError"}
        )
        return 1
    zygote.serve()
    return 0


def _run_and_exit() -> None:
    """Run :func:`main` and end the process as a warm zygote ends (``local_backend._launcher``):
    streams flushed, then ``os._exit``. Nothing is left to do by then (instances, templates and
    cgroups are gone), and tearing down the interpreter of a process that imported the runtime
    costs a second or more of CPU on every engine's close."""
    from local_backend._launcher import run_then_exit

    run_then_exit(main)


if __name__ == "__main__":
    _run_and_exit()
