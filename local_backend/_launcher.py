"""Zygotes forked warm from a launcher instead of exec'd cold.

A zygote spends most of its start importing the runtime (pydantic, the SDK's models, uvicorn:
~0.5 s of CPU) before it does anything of its own definition. An engine's first zygote therefore
forks a **launcher** right after those imports, before anything else (its user and pid
namespaces, cgroups, template root): a process in the host's namespaces with the runtime
imported, the zygote's exec-time environment block and nothing of any definition. Every later
zygote of that engine is forked from it and runs :func:`local_backend.zygote.main` with its own
arguments, as a cold one would, minus the imports.

What it holds is the fast path's imports only (``sandbox_runtime.warm_imports``), not FastMCP
(~600 pydantic models, ~1.8 s of CPU): the runtime builds its MCP side on an instance's first
MCP request (``sandbox_runtime._lazy_mcp``), and most instances never get one; importing it here
would cost every engine that much for the few instances MCP clients talk to.

The engine talks to its launcher over a ``SOCK_SEQPACKET`` pair (:mod:`local_backend._channel`):

``hello`` (launcher -> engine, once, with a pidfd of the launcher)
    it is up; the engine waits on that pidfd when it closes.
``launch`` (argv, with the new zygote's control socket)
    fork a zygote; answered in order with ``launched`` (pid, with a pidfd of the zygote, which
    the engine waits on and kills through: the zygote is the launcher's child, not the
    engine's) or ``refused`` (message).

The launcher reaps its zygotes, holds no descriptor but its socket (a zygote's death must reach
the engine as the end of that zygote's socket), ignores SIGINT (a terminal's Ctrl-C reaches the
engine, which closes), and exits when the engine's end closes, even if the engine died by
SIGKILL; its zygotes then end on their own sockets, as cold ones do. An engine whose launcher is
gone (or whose zygote environment changed since it started: ``zygote_environment``) starts its
zygotes cold again, the next first one bringing a new launcher.

    >>> from local_backend._launcher import LaunchedZygote
    >>> LaunchedZygote.__doc__.splitlines()[0]
    'A zygote forked by a launcher: the part of ``subprocess.Popen`` the engine uses.'
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from local_backend import _channel, _linux

__all__ = ["LaunchedZygote", "Launcher", "LauncherGone", "fork_launcher"]

_ZYGOTE = [sys.executable, "-m", "local_backend.zygote"]
_STOP_GRACE = 5.0  # seconds a launcher whose socket closed may take to exit


class LauncherGone(Exception):
    """The launcher cannot launch (it exited, refused, or never came up): start cold."""


class LaunchedZygote:
    """A zygote forked by a launcher: the part of ``subprocess.Popen`` the engine uses.

    It is the launcher's child, so the engine watches it through a pidfd: :meth:`poll` and
    :meth:`wait` say whether it exited, :meth:`kill` signals it. The launcher reaps it and keeps
    its exit status: ``returncode`` is ``-1`` once it exited ("ended; its status went to the
    launcher"), None while it runs.
    """

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """-1 once it exited, else None."""
        return self.wait(0.0) if self._exited(0.0) else None

    def wait(self, timeout: float | None = None) -> int:
        """Wait until it exited; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if not self._exited(timeout):
            raise subprocess.TimeoutExpired(f"zygote {self.pid}", timeout or 0.0)
        self.returncode = -1
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it (nothing if it already exited)."""
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def _exited(self, timeout: float | None) -> bool:
        if self._pidfd is None:
            return True
        ready, _, _ = select.select([self._pidfd], [], [], timeout)
        return bool(ready)

    def __del__(
        self,
        _close: Callable[[int], None] = os.close,
        _suppress: type[contextlib.suppress] = contextlib.suppress,
    ) -> None:
        # only its defaults here: at interpreter exit the module's globals may already be None
        fd, self._pidfd = self._pidfd, None
        if fd is not None:
            with _suppress(OSError):
                _close(fd)


class Launcher:
    """The engine's end of its launcher; used on the engine's event loop only."""

    def __init__(
        self, sock: socket.socket, environment: dict[str, str], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.environment = environment  # the zygote environment it was started with
        self._sock = sock
        self._loop = loop
        self._pidfd: int | None = None  # the launcher itself, from its hello
        self._pending: collections.deque[asyncio.Future[LaunchedZygote]] = collections.deque()
        self.gone = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_message)

    async def launch(self, arguments: list[str], control: int, deadline: float) -> LaunchedZygote:
        """A zygote forked with ``arguments`` (``local_backend.zygote``'s, no ``--control-fd``)
        and ``control`` as its socket to the engine; :class:`LauncherGone` if it cannot be."""
        if self.gone:
            raise LauncherGone("the launcher exited")
        try:
            _channel.send(self._sock, {"op": "launch", "argv": arguments}, [control], block=False)
        except (OSError, _channel.ProtocolViolation) as exc:
            self._lost()
            raise LauncherGone(f"the launcher does not take requests ({exc})") from None
        answer = self._loop.create_future()
        self._pending.append(answer)  # answered in order; a cancelled one is still popped
        left = max(0.0, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout=left)
        except TimeoutError:
            answer.cancel()  # a late answer's zygote finds its socket closed by our caller
            raise LauncherGone("the launcher did not answer in time") from None

    def _on_message(self) -> None:
        while not self.gone:
            try:
                got = _channel.receive(self._sock, max_fds=1)
            except _channel.ProtocolViolation:
                return  # woken with nothing there
            except OSError:
                got = _channel.Received(None)
            if got.message is None:
                self._lost()
                return
            op = got.message.get("op")
            if op == "hello" and got.fds and self._pidfd is None:
                self._pidfd = got.fds.pop()
            elif op in ("launched", "refused") and self._pending:
                answer = self._pending.popleft()
                if op == "launched" and got.fds and not answer.done():
                    answer.set_result(LaunchedZygote(int(got.message["pid"]), got.fds.pop()))
                elif not answer.done():
                    answer.set_exception(LauncherGone(str(got.message.get("message"))))
            got.close_fds()  # the pidfd of an answer nobody waits for any more

    def _lost(self) -> None:
        if self.gone:
            return
        self.gone = True
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._sock.fileno())
        while self._pending:
            answer = self._pending.popleft()
            if not answer.done():
                answer.set_exception(LauncherGone("the launcher exited"))

    def close(self) -> None:
        """Close our end and wait (briefly) for the launcher to exit; kill it if it does not."""
        self._lost()
        self._sock.close()
        if self._pidfd is None:
            return
        with contextlib.closing(_Fd(self._pidfd)):
            ready, _, _ = select.select([self._pidfd], [], [], _STOP_GRACE)
            if not ready:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self._pidfd = None


class _Fd:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


# -- the launcher's side ---------------------------------------------------------------------------
def fork_launcher(fd: int, main: Callable[[list[str]], int], *, owner: str) -> None:
    """Fork this warm zygote's launcher on socket ``fd``; return in the zygote.

    Called once the runtime is imported and before anything of the zygote's own (namespaces,
    cgroups, sockets other than its control socket). The launcher runs ``main(argv)`` in each
    zygote it forks; its command line (``ps``) is ``... local_backend.zygote --launcher --owner
    OWNER``, and each zygote's its own.
    """
    import threading

    if threading.active_count() > 1:  # a fork would copy a lock another thread holds
        os.close(fd)  # the engine sees the socket close and starts its zygotes cold
        return
    try:
        pid = os.fork()
    except OSError:
        os.close(fd)
        return
    if pid:
        os.close(fd)  # the zygote keeps no end of its launcher's socket
        return
    code = 1
    try:
        _linux.set_command_line([*_ZYGOTE, "--launcher", "--owner", owner])
        code = _serve(fd, main)
    except BaseException:  # the launcher's last word, then it ends
        traceback.print_exc()
    finally:
        os._exit(code)


def _serve(fd: int, main: Callable[[list[str]], int]) -> int:
    # nothing but our socket and the standard streams: a zygote's death must reach the engine
    # as the end of its socket, which a copy held here would keep open
    os.closerange(3, fd)
    os.closerange(fd + 1, _max_fd())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    me = os.pidfd_open(os.getpid())
    _channel.send(sock, {"op": "hello"}, [me])
    os.close(me)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    children: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in selector.select():
            if key.fileobj is not sock:
                pidfd = key.fd
                selector.unregister(pidfd)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(children.pop(pidfd), 0)
                os.close(pidfd)
                continue
            try:
                got = _channel.receive(sock, max_fds=1, block=True)
            except _channel.ProtocolViolation as exc:
                _channel.send(sock, {"op": "refused", "message": str(exc)})
                continue
            if got.message is None:
                return 0  # the engine closed (or died): our zygotes end on their own sockets
            argv = got.message.get("argv")
            if (
                got.message.get("op") != "launch"
                or len(got.fds) != 1
                or not isinstance(argv, list)
                or not all(isinstance(a, str) for a in argv)
            ):
                got.close_fds()
                _channel.send(sock, {"op": "refused", "message": "not a launch request"})
                continue
            control = got.fds[0]
            os.set_inheritable(control, True)
            pid = os.fork()
            if pid == 0:
                argv = [*argv, "--control-fd", str(control)]
                _become_zygote(sock, selector, children, main, argv)
            os.close(control)
            pidfd = os.pidfd_open(pid)
            children[pidfd] = pid
            selector.register(pidfd, selectors.EVENT_READ)
            _channel.send(sock, {"op": "launched", "pid": pid}, [pidfd])


def _become_zygote(
    sock: socket.socket,
    selector: selectors.BaseSelector,
    children: dict[int, int],
    main: Callable[[list[str]], int],
    argv: list[str],
) -> None:
    def body() -> int:
        selector.close()
        sock.close()
        for pidfd in children:
            os.close(pidfd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _linux.set_command_line([*_ZYGOTE, *argv])
        return main(argv)

    run_then_exit(body)


def run_then_exit(body: Callable[[], int], *, last: Callable[[], None] | None = None) -> NoReturn:
    """Run ``body`` and end the process with its code, without tearing the interpreter down:
    what an uncaught exception prints is printed (code 1), ``SystemExit`` gives its code,
    ``last`` runs (a log to close), the standard streams are flushed, then ``os._exit``. For
    processes with nothing left to do at their end (a zygote, the engine daemon), where the
    teardown of an interpreter that imported the runtime costs a second or more of CPU."""
    code = 1
    try:
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # as an uncaught exception ends a process
        traceback.print_exc()
    finally:
        if last is not None:
            with contextlib.suppress(Exception):
                last()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _max_fd() -> int:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else 1 << 16
