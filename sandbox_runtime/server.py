"""The runtime process: serve one environment project on one or more loopback sockets.

Threads: the **main thread** runs sync environment code (so that ``SIGALRM`` can interrupt it);
a **loop thread** runs uvicorn with our raw ASGI app and async environment code; the
**watchdog** (:mod:`sandbox_runtime._watchdog`) ends async calls that block the loop past their
deadline and watches the instance's limits (:mod:`sandbox_runtime._limits`). Uvicorn's 10 Hz
housekeeping tick is replaced by a wait on a shutdown event, so an idle runtime uses no CPU.
The signals the main thread handles (SIGTERM and SIGINT stop the runtime, SIGALRM ends a sync
call past its deadline) are blocked in the runtime's other threads, so they reach the main
thread, and :func:`end_process` ends a stopped runtime even if the environment left threads.

When the runtime cannot serve any more (an async call blocks the loop and ignores its
interruption, the HTTP server failed), it calls :attr:`RuntimeServer.on_broken` with a sentence
saying why, then ends the process with status ``BROKEN_EXIT_CODE`` (70), so that every caller gets
``InstanceBrokenError`` at once instead of a hang.

    server = RuntimeServer(load_project("builtin_envs/mini_terminal"), ports=[8080, 8081])
    server.run()   # blocks until SIGTERM/SIGINT
    end_process(0)  # the environment's exit handlers run; a thread it left running cannot hang it
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import uvicorn

from aenv_ray.net import bind_socket
from sandbox_runtime import _limits, contain
from sandbox_runtime._dispatch import STUCK_GRACE, Dispatcher
from sandbox_runtime._http import RuntimeApp
from sandbox_runtime._judge import Judge, WorkspaceLimits, judge_environment, judge_ignored
from sandbox_runtime._lazy_mcp import ASGIApp, LazyMCP
from sandbox_runtime._loader import LoadedProject
from sandbox_runtime._runner import SyncRunner
from sandbox_runtime._watchdog import BROKEN_EXIT_CODE, Watchdog

__all__ = ["BROKEN_EXIT_CODE", "RuntimeServer", "bind_socket", "end_process", "warm_imports"]

log = logging.getLogger("sandbox_runtime.server")

_MAIN_THREAD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGALRM}
"""Signals whose handlers interrupt the main thread (stop; a sync call's timeout)."""


_LAZY_MODULES = (
    "concurrent.futures.thread",
    "encodings.idna",
    "httptools",
    "sandbox_runtime._loader",
    "uvicorn.lifespan.on",
    "uvicorn.protocols.http.flow_control",
    "uvicorn.protocols.http.httptools_impl",
    "uvloop",
)


def warm_imports() -> None:
    """Import what the server would import lazily once serving.

    A template process calls this before it forks: a child must never start with a module
    half-imported by a thread that does not exist in it (its import lock would stay held).
    The fast path's modules only: FastMCP and what it imports while serving are imported by
    the first MCP request (:mod:`sandbox_runtime._lazy_mcp`, under a lock ``os.fork`` takes).
    """
    import importlib

    for name in _LAZY_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


class _QuietServer(uvicorn.Server):
    """uvicorn without the periodic tick: shutdown is an event, not a polled flag."""

    def __init__(self, config: uvicorn.Config, ready: threading.Event) -> None:
        super().__init__(config)
        self._exit_event: asyncio.Event | None = None
        self._ready = ready

    async def main_loop(self) -> None:
        self._exit_event = asyncio.Event()
        await self.on_tick(0)  # the one-time header setup uvicorn does on its first tick
        self._ready.set()
        if not self.should_exit:
            await self._exit_event.wait()

    def request_exit(self) -> None:
        self.should_exit = True
        if self._exit_event is not None:
            self._exit_event.set()


def _log_broken(reason: str) -> None:
    log.critical("runtime broken", extra={"reason": reason})


class RuntimeServer:
    """Serve a loaded project: fast path, seeds' routes and MCP on every socket.

    ``on_broken``: called with a sentence (which call, which timeout, why) when this runtime
    cannot serve any more, just before the process ends with ``BROKEN_EXIT_CODE``; an engine
    sets it to report the reason. Default: log it. Called from the watchdog's thread.

    A reward registered with ``judge=True`` runs in the judge (:mod:`sandbox_runtime._judge`),
    whose seed :meth:`run` starts before anything else: forked from this process, whose
    environment code has run no call yet, unless ``judge_environment`` is given (a fork of a
    running instance: its memory did run calls): then the seed is a fresh interpreter that
    loads the project again, with those variables (the instance's as it started).
    """

    def __init__(
        self,
        project: LoadedProject,
        *,
        host: str = "127.0.0.1",
        ports: Sequence[int] = (8080, 8081),
        sockets: Sequence[socket.socket] | None = None,
        default_timeout: float = 600.0,
        debug: bool = False,
        enable_mcp: bool = True,
        token: str | None = None,
        token_sha256: str | None = None,
        judge_environment: Mapping[str, str] | None = None,
    ) -> None:
        self.project = project
        self.judge_environment = dict(judge_environment) if judge_environment is not None else None
        """The variables a judge reward starts from (taken when :meth:`run` starts the judge)."""
        self._pristine = judge_environment is None
        self.runner = SyncRunner()
        self.on_broken: Callable[[str], None] = _log_broken
        self.watchdog = Watchdog(grace=STUCK_GRACE, on_broken=self._report_broken)
        self.dispatcher = Dispatcher(
            project.registry,
            env_ref=project.config.ref,
            runner=self.runner,
            default_timeout=default_timeout,
            debug=debug,
            watchdog=self.watchdog,
        )
        mcp = None
        if enable_mcp:  # built by the first MCP request: FastMCP is not imported before
            env = project.config
            mcp = LazyMCP(functools.partial(_build_mcp, self.dispatcher, env.name, env.version))
        self.app = RuntimeApp(self.dispatcher, mcp=mcp, token=token)
        if token_sha256 is not None:
            self.app.set_token_sha256(token_sha256)
        self.ready = threading.Event()  # set once the HTTP server serves
        # ``sockets=[]``: built now, given its sockets later (:meth:`listen_on`); a template
        # process builds one server this way so that the instances it forks need not
        self.sockets = (
            list(sockets) if sockets is not None else [bind_socket(host, port) for port in ports]
        )
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            log_level="warning",
            log_config=None,
            access_log=False,
            timeout_keep_alive=3600,
            date_header=False,
            server_header=False,
            loop=_loop_setting(),
            http="httptools",
            ws="none",
        )
        config.load()  # now: the instances a template forks inherit it loaded
        self._uvicorn = _QuietServer(config, self.ready)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def _report_broken(self, reason: str) -> None:
        try:
            answered = self.app.waiting.answer_all(reason)
        except Exception:
            log.exception("cannot answer the requests waiting")
        else:
            if answered:
                log.warning("requests answered: the runtime ends", extra={"answered": answered})
        self.on_broken(reason)

    def set_token(self, token: str | None) -> None:
        """Require ``Authorization: Bearer token`` on every request (an engine's instance)."""
        self.app.set_token(token)

    def set_token_sha256(self, digest: str | None) -> None:
        """Require a token whose SHA-256 is ``digest`` (64 hex digits): the runtime is given
        the digest only (a Kubernetes pod's spec carries nothing that is a token)."""
        self.app.set_token_sha256(digest)

    def listen_on(self, sockets: Sequence[socket.socket]) -> None:
        """Serve on ``sockets`` (instead of any given before); call before :meth:`run`."""
        if self._loop_thread is not None:
            raise RuntimeError("the server runs already: its sockets are fixed")
        self.sockets = list(sockets)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every listening socket."""
        return [sock.getsockname()[:2] for sock in self.sockets]

    def run(self) -> None:
        """Serve until SIGTERM/SIGINT or :meth:`stop`. Call from the main thread."""
        if not self.sockets:
            raise RuntimeError("no socket to serve on: pass sockets= or call listen_on() first")
        self._start_judge()  # first: its seed is a fork of this process before any call
        self._warm_up()  # after the judge's fork (its seed holds nothing warm-up started)
        on_main = threading.current_thread() is threading.main_thread()
        if on_main:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            # the threads started here (and theirs) block the signals that the main thread
            # handles, so the kernel hands those to the main thread, whose waits they interrupt
            signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_THREAD_SIGNALS)
        try:
            _limits.reapply_if_forked()
            self._loop_thread = threading.Thread(target=self._serve, name="aenv-http", daemon=True)
            self._loop_thread.start()
        finally:
            if on_main:  # unblocked here even if our parent left them blocked
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _MAIN_THREAD_SIGNALS)
        log.info(
            "runtime ready",
            extra={
                "env": self.project.config.ref,
                "listen": ",".join(f"{h}:{p}" for h, p in self.addresses),
                "tools": len(self.project.registry.tools),
            },
        )
        try:
            self.runner.run_forever()
        finally:
            self._finish()

    def _finish(self) -> None:
        """What a stopping runtime does once its runner returned: the HTTP server stops, the
        judge's seed goes, and so does every process its calls left."""
        self._shutdown_http()
        if self.dispatcher.judge is not None:
            self.dispatcher.judge.close()
        tracker = contain.calls()
        # the episode ends: so does every process its calls left (a local instance, pid 2,
        # ends with its pid namespace, and its forks, in namespaces below, live on)
        if tracker is not None and os.getpid() != 2:
            tracker.end_all()

    def _warm_up(self) -> None:
        """The project's warm-ups (:meth:`~aenv_ray.registry.DefinitionRegistry.add_warm_up`),
        in this instance's process, before it serves: a warm instance has done the start-up
        work its first call would otherwise wait for. A failure is logged, never fatal."""
        for fn in self.project.registry.warm_ups:
            started = time.perf_counter()
            try:
                fn()
            except Exception:
                log.exception("warm-up failed", extra={"warm_up": _name_of(fn)})
                continue
            took = time.perf_counter() - started
            log.debug("warm-up done", extra={"warm_up": _name_of(fn), "ms": round(took * 1e3, 1)})

    def _start_judge(self) -> None:
        """The judge's seed, when the reward asks for the judge (once per server)."""
        reward = self.project.registry.reward
        if reward is None or not reward.judge or self.dispatcher.judge is not None:
            return
        ignored: list[dict[str, str]] = []
        reward_config = self.project.config.reward
        if self.judge_environment is None:
            config_env = self.project.config.deploy_config.env
            self.judge_environment = judge_environment(os.environ, config_env)
            ignored = judge_ignored(os.environ, config_env)
        judge = Judge(
            self.project.registry,
            project=str(self.project.root),
            env_ref=self.project.config.ref,
            environment=self.judge_environment,
            workspace=os.environ.get("AENV_WORKSPACE") or os.getcwd(),
            ignored=ignored,
            limits=WorkspaceLimits(
                files=reward_config.max_workspace_files,
                bytes=reward_config.max_workspace_bytes,
                depth=reward_config.max_workspace_depth,
            ),
        )
        try:
            judge.start(pristine=self._pristine)
        except Exception:  # the first judge call starts a fresh seed, or says why it cannot
            log.exception("the judge's seed did not start")
        self.dispatcher.judge = judge

    def stop(self) -> None:
        """Stop serving (thread-safe; idempotent)."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.runner.stop()

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.info("runtime stopping", extra={"signal": signal.Signals(signum).name})
        stuck = self.runner.stuck_in
        if stuck is not None and not self._stopped.is_set():
            # a sync job that ignored its interruption holds the main thread, where this
            # handler runs: :meth:`run` would never return to end the process, and its engine
            # would wait out its grace for a kill. End here, as run() and end_process() would.
            # (the runner's alarms would interrupt this handler too, and the job swallows that)
            signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_THREAD_SIGNALS)
            log.warning("runtime stopping with a stuck job", extra={"function": stuck})
            self._stopped.set()
            try:
                self._finish()
            finally:
                end_process(0)
        self.stop()

    def _serve(self) -> None:
        server = self._uvicorn

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self.watchdog.start(self._loop)
            await server.serve(sockets=self.sockets)

        try:
            asyncio.run(main()) if server.config.loop == "asyncio" else _run_uvloop(main)
        except BaseException as exc:
            log.exception("http server failed")
            if not self._stopped.is_set():
                self._report_broken(f"the runtime's HTTP server failed: {exc!r}")
                os._exit(BROKEN_EXIT_CODE)
        finally:
            self.stop()

    def _shutdown_http(self) -> None:
        self.watchdog.stop()
        server, loop = self._uvicorn, self._loop
        if server is not None and loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(server.request_exit)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=5)


def _name_of(fn: Callable[[], object]) -> str:
    return str(getattr(fn, "__qualname__", None) or fn)


def _build_mcp(dispatcher: Dispatcher, name: str, version: str) -> ASGIApp:
    from sandbox_runtime._mcp import build_mcp_app  # FastMCP: ~1.5 s of CPU to import

    app: ASGIApp = build_mcp_app(dispatcher, name=name, version=version)
    return app


def _loop_setting() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def _run_uvloop(main: Any) -> None:
    import uvloop

    uvloop.run(main())


def end_process(code: int) -> NoReturn:
    """End a runtime's process once :meth:`RuntimeServer.run` returned: the exit handlers run
    (``atexit``: the environment's own, logging's), then the process ends with ``code``.

    Python's own exit would first wait for every thread that is not a daemon; one that the
    environment's code started and never ends would keep a stopped runtime alive until its
    engine kills it, and then no exit handler runs at all.
    """
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
