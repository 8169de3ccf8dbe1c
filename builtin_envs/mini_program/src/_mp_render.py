"""What a person sees of a page: its visible text, as headless Chromium lays it out once the
page's scripts ran.

One Chromium per process (started on first use, started again if it died; none survives its
runtime), driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``: no port to
reach). Each render opens a new tab, serves the project's files at
``http://mini-program.invalid/`` from the project itself (every request is answered by
:func:`render` through the protocol's ``Fetch`` domain; anything else is refused: the page
reaches no network, loopback included), waits for the load event and a short settle, and
reads the text in an isolated JavaScript world (the page's scripts cannot replace the functions
it uses). Text is visible when it is laid out with a size, inside the page, not clipped away by
an ancestor, not transparent, not the colour of its background, and not covered at its centre
by another element; ``document.body.innerText`` with the other text nodes emptied is the
page's text.

Chromium is never one the agent could have planted (:func:`_chromium`: not from a temporary,
home or workspace directory, nor from one on ``PATH``), and starts with the variables of
:func:`browser_environment` only, in a fresh profile. The reward runs in the judge
(``config.json``'s ``"reward": {"judge": true}``): there every process of the agent's has
ended, ``HOME`` and ``TMPDIR`` are fresh and the project is a copy, so the Chromium a reward
starts is the judge's own and ends with it.

May import: the standard library, ``aenv_ray.errors``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import mimetypes
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from aenv_ray.errors import ConfigurationError

__all__ = [
    "ORIGIN",
    "BrowserUnavailableError",
    "Rendered",
    "browser_environment",
    "render",
]

ORIGIN = "http://mini-program.invalid"
"""Where the page is served from while it is rendered (a name no resolver answers)."""
_USER_AGENT = (
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
    "Chrome/130.0.0.0 Safari/537.36"
)
_VISIBLE_TEXT = r"""
(async () => {
  await new Promise((resolve) => setTimeout(resolve, 150));
  await new Promise((resolve) => requestAnimationFrame(() => resolve()));
  const body = document.body;
  if (!body) return "";
  const root = document.documentElement;
  const width = Math.max(root.scrollWidth, innerWidth);
  const height = Math.max(root.scrollHeight, innerHeight);
  const alpha = (color) => {
    const m = /rgba?\(([^)]*)\)/.exec(color || "");
    if (!m) return 1;
    const parts = m[1].split(/[ ,/]+/).filter(Boolean);
    return parts.length > 3 ? parseFloat(parts[3]) : 1;
  };
  const background = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = getComputedStyle(e).backgroundColor;
      if (alpha(c) > 0) return c;
      if (getComputedStyle(e).backgroundImage !== "none") return null;
    }
    return "rgb(255, 255, 255)";
  };
  const visible = (node) => {
    const el = node.parentElement;
    if (!el) return false;
    const range = document.createRange();
    range.selectNodeContents(node);
    let rects = [...range.getClientRects()]
      .map((r) => ({
        l: r.left + scrollX, t: r.top + scrollY, r: r.right + scrollX, b: r.bottom + scrollY,
      }))
      .filter((r) => r.r - r.l >= 2 && r.b - r.t >= 2);
    rects = rects.filter((r) => r.r > 0 && r.b > 0 && r.l < width && r.t < height);
    if (!rects.length) return false;
    const style = getComputedStyle(el);
    if (style.visibility !== "visible" || parseFloat(style.fontSize) < 4) return false;
    if (alpha(style.color) === 0) return false;
    const bg = background(el);
    if (bg !== null && bg === style.color) return false;
    for (let e = el; e; e = e.parentElement) {
      const s = getComputedStyle(e);
      if (parseFloat(s.opacity) === 0 || s.display === "none") return false;
      if (s.clipPath !== "none" || (s.clip && s.clip !== "auto")) return false;
      if (e !== el && (s.overflowX !== "visible" || s.overflowY !== "visible")) {
        const box = e.getBoundingClientRect();
        const l = box.left + scrollX, t = box.top + scrollY;
        const r = box.right + scrollX, b = box.bottom + scrollY;
        rects = rects
          .map((x) => ({
            l: Math.max(x.l, l), t: Math.max(x.t, t), r: Math.min(x.r, r), b: Math.min(x.b, b),
          }))
          .filter((x) => x.r - x.l >= 2 && x.b - x.t >= 2);
        if (!rects.length) return false;
      }
    }
    // not covered: the element at the centre of a rect in the viewport is this text's
    for (const x of rects) {
      const cx = (x.l + x.r) / 2 - scrollX, cy = (x.t + x.b) / 2 - scrollY;
      if (cx < 0 || cy < 0 || cx >= innerWidth || cy >= innerHeight) return true;
      const top = document.elementFromPoint(cx, cy);
      if (!top || top === el || el.contains(top) || top.contains(el)) return true;
    }
    return false;
  };
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT);
  const hidden = [];
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    if (node.data.trim() && !visible(node)) hidden.push(node);
  }
  const saved = hidden.map((node) => node.data);
  hidden.forEach((node) => { node.data = ""; });
  const text = body.innerText;
  hidden.forEach((node, i) => { node.data = saved[i]; });
  return text;
})()
"""


class BrowserUnavailableError(ConfigurationError):
    """No Chromium to render pages with (or it cannot start here): install Debian's
    ``chromium`` (``apt-get install chromium``) or set ``MINI_PROGRAM_CHROMIUM``."""


@dataclass(frozen=True)
class Rendered:
    """A page's visible text (whitespace collapsed), or why it could not be read; ``ignored``:
    the programs and ``PATH`` directories passed over to start Chromium (``{"path", "type",
    "why"}``: in a place the agent writes)."""

    text: str
    error: str | None = None
    ignored: tuple[dict[str, str], ...] = ()

    @classmethod
    def of(cls, browser: _Browser, text: str, error: str | None = None) -> Rendered:
        return cls(text, error, tuple(browser.ignored))


_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")
_KEPT_VARIABLES = ("PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ")
_NAMED_VARIABLES = ("XDG_", "FONTCONFIG_", "CHROME", "GTK_", "GIO_", "LD_", "DBUS_", "GOOGLE_")
"""Prefixes of the variables Chromium, its libraries or its wrapper read; when this process
has one, the reward's ``ignored`` names it (Chromium starts without)."""


def _untrusted(directory: str) -> str | None:
    """Why Chromium is not run from ``directory`` (a directory of ``PATH``, or where
    ``MINI_PROGRAM_CHROMIUM`` lies): it is relative, or in a place the agent's code writes (a
    temporary directory, the home directory, the workspace, a directory this process may
    write while it is not root); None: a place of the image's."""
    if not os.path.isabs(directory):
        return "a relative directory"
    real = os.path.realpath(directory)
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(KeyError, ImportError):
        import pwd

        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    places = [
        *(("a temporary directory", p) for p in (*_SCRATCH, tempfile.gettempdir())),
        *(("the home directory", h) for h in homes if h not in ("", "/")),
        *(("the workspace", w) for w in (os.environ.get("AENV_WORKSPACE"), os.getcwd()) if w),
    ]
    for what, place in places:
        root = os.path.realpath(place)
        if root != "/" and (real == root or real.startswith(root.rstrip("/") + "/")):
            return f"in {what} ({place})"
    if os.geteuid() != 0 and os.access(real, os.W_OK):
        return "writable by the runtime's user"
    return None


def _chromium(ignored: list[dict[str, str]] | None = None) -> str:
    """The Chromium to run: ``MINI_PROGRAM_CHROMIUM``, else ``chromium`` or ``chromium-browser``
    in a directory of ``PATH`` the agent cannot have written (:func:`_untrusted`); each one
    passed over is added to ``ignored`` (``{"path", "type", "why"}``)."""
    chosen = os.environ.get("MINI_PROGRAM_CHROMIUM") or ""
    candidates = [chosen] if chosen else []
    for directory in _trusted_path(ignored):
        candidates += [os.path.join(directory, n) for n in ("chromium", "chromium-browser")]
    for path in candidates:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        why = _untrusted(os.path.dirname(path)) or (
            None if os.geteuid() == 0 or not os.access(path, os.W_OK) else "writable"
        )
        if why is None:
            return path
        if ignored is not None:
            ignored.append({"path": path, "type": "executable", "why": why})
    raise BrowserUnavailableError(
        "mini-program: no Chromium to render the page with: install Debian's `chromium` "
        "(apt-get install chromium) or set MINI_PROGRAM_CHROMIUM to its path (one the agent "
        "cannot write: not in a temporary, home or workspace directory)"
    )


def _trusted_path(ignored: list[dict[str, str]] | None = None) -> list[str]:
    """The directories of ``PATH`` the agent cannot have written, in order (the others that
    exist are added to ``ignored``: Chromium's start, a shell script on Debian, runs none of
    their programs)."""
    kept: list[str] = []
    for directory in (os.environ.get("PATH") or os.defpath).split(os.pathsep):
        if directory in kept:
            continue
        why = _untrusted(directory) if directory else "an empty entry"
        if why is None:
            kept.append(directory)
        elif ignored is not None and directory and os.path.isdir(directory):
            ignored.append({"path": directory, "type": "PATH directory", "why": why})
    return kept


def browser_environment(ignored: list[dict[str, str]] | None = None) -> dict[str, str]:
    """The variables Chromium starts with: ``PATH`` (its trusted directories only), ``HOME``,
    ``TMPDIR``, the locale and the time zone of this process; nothing else (no ``LD_*``,
    ``FONTCONFIG_*``, ``XDG_*``, ``CHROME_*`` or ``CHROMIUM_*`` of anyone's choosing: fontconfig
    and Chromium read their settings from the image's files and the fresh ``HOME``). Those of
    :data:`_NAMED_VARIABLES` left out are added to ``ignored``."""
    kept = {k: v for k, v in os.environ.items() if k in _KEPT_VARIABLES or k.startswith("LC_")}
    kept["PATH"] = os.pathsep.join(_trusted_path()) or "/usr/bin:/bin"
    kept.setdefault("HOME", tempfile.gettempdir())
    if ignored is not None:
        ignored += [
            {"path": name, "type": "variable", "why": "not passed to Chromium"}
            for name in sorted(os.environ)
            if name.startswith(_NAMED_VARIABLES) and name not in kept
        ]
    return kept


class _Browser:
    """One headless Chromium and its protocol pipe."""

    def __init__(self) -> None:
        self.ignored: list[dict[str, str]] = []
        executable = _chromium(self.ignored)
        self.profile = tempfile.mkdtemp(prefix="mini-program-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        argv = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-extensions",
            "--disable-sync",
            "--disable-blink-features=AutomationControlled",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            "--proxy-server=127.0.0.1:9",
            "--proxy-bypass-list=<-loopback>",  # loopback too: a WebSocket reaches no server
            f"--user-agent={_USER_AGENT}",
            f"--user-data-dir={self.profile}",
            "--window-size=1280,800",
            "--remote-debugging-pipe",
            "about:blank",
        ]

        def child() -> None:  # the protocol pipe on fds 3 and 4, as Chromium wants it
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)
            with contextlib.suppress(Exception):
                import ctypes

                ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(3, 4),  # what child() makes of the pipe's ends
                preexec_fn=child,  # only dup2 and prctl, before exec
                start_new_session=True,
                env=browser_environment(self.ignored),
                cwd=self.profile,
            )
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._lock = threading.Lock()
        self._next = 0
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._events: dict[str, queue.Queue[dict[str, Any]]] = {}
        self._reader = threading.Thread(target=self._read, name="mini-program-cdp", daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self.process.poll() is None and self._reader.is_alive()

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            buffer += chunk
            while b"\0" in buffer:
                raw, buffer = buffer.split(b"\0", 1)
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                self._dispatch(message)
        with self._lock:
            for waiter in self._waiting.values():
                waiter.put({"error": {"message": "the browser exited"}})

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            with self._lock:
                waiter = self._waiting.pop(message["id"], None)
            if waiter is not None:
                waiter.put(message)
            return
        session = message.get("sessionId", "")
        with self._lock:
            handler = self._handlers.get(session)
        if handler is not None:
            with contextlib.suppress(Exception):
                handler(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> int:
        """Send a command without waiting for its answer; its id."""
        with self._lock:
            self._next += 1
            ident = self._next
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return ident

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str = "",
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send a command and wait for its answer (``TimeoutError`` past ``timeout``)."""
        waiter: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._next += 1
            ident = self._next
            self._waiting[ident] = waiter
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        try:
            answer = waiter.get(timeout=timeout)
        except queue.Empty:
            with self._lock:
                self._waiting.pop(ident, None)
            raise TimeoutError(f"{method} got no answer in {timeout:g} s") from None
        if "error" in answer:
            raise RuntimeError(f"{method}: {answer['error'].get('message')}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    def on(self, session: str, handler: Callable[[dict[str, Any]], None] | None) -> None:
        with self._lock:
            if handler is None:
                self._handlers.pop(session, None)
            else:
                self._handlers[session] = handler

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.process.wait(timeout=10)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)


_browser: _Browser | None = None
_browser_lock = threading.Lock()
_owner = os.getpid()


def _forget_after_fork() -> None:  # a fork's child starts its own browser when it needs one
    global _browser, _browser_lock, _owner
    _browser, _browser_lock, _owner = None, threading.Lock(), os.getpid()


os.register_at_fork(after_in_child=_forget_after_fork)


def _get_browser() -> _Browser:
    global _browser
    if _browser is not None and not _browser.alive():
        _browser.close()
        _browser = None
    if _browser is None:
        _browser = _Browser()
        import atexit

        atexit.register(_browser.close)
    return _browser


def _fulfil(
    browser: _Browser, session: str, event: dict[str, Any], read: Callable[[str], bytes | None]
) -> None:
    params = event["params"]
    parts = urlsplit(params["request"]["url"])
    if f"{parts.scheme}://{parts.netloc}" != ORIGIN:
        browser.send(
            "Fetch.failRequest",
            {"requestId": params["requestId"], "errorReason": "BlockedByClient"},
            session,
        )
        return
    path = unquote(parts.path).lstrip("/")
    data = read(path) if path else None
    if data is None:
        status, kind, data = 404, "text/plain", b"not found"
    else:
        status = 200
        kind = mimetypes.guess_type(path)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind in ("application/javascript", "application/json"):
            kind += "; charset=utf-8"
    browser.send(
        "Fetch.fulfillRequest",
        {
            "requestId": params["requestId"],
            "responseCode": status,
            "responseHeaders": [{"name": "Content-Type", "value": kind}],
            "body": base64.b64encode(data).decode(),
        },
        session,
    )


def render(entry: str, read: Callable[[str], bytes | None], timeout: float = 20.0) -> Rendered:
    """The visible text of the project's page ``entry``; ``read(path)`` gives a project file's
    bytes (None: no such file). A page that does not load, or whose scripts do not yield,
    within ``timeout`` seconds shows nothing (``error`` says why). Raises
    :class:`BrowserUnavailableError` when there is no Chromium."""
    with _browser_lock:
        browser = _get_browser()
        try:
            target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        except (RuntimeError, TimeoutError, OSError) as exc:  # a browser that broke: again
            browser.close()
            globals()["_browser"] = None
            browser = _get_browser()
            try:
                target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            except (RuntimeError, TimeoutError, OSError) as again:
                raise BrowserUnavailableError(
                    f"mini-program: Chromium does not answer ({again}; before: {exc})"
                ) from again
    loaded = threading.Event()
    session = ""
    try:
        session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]

        def handle(message: dict[str, Any]) -> None:
            method = message.get("method")
            if method == "Fetch.requestPaused":
                _fulfil(browser, session, message, read)
            elif method == "Page.loadEventFired":
                loaded.set()

        browser.on(session, handle)
        browser.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session)
        browser.call("Page.enable", {}, session)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        deadline = time.monotonic() + timeout
        navigated = browser.call("Page.navigate", {"url": f"{ORIGIN}/{entry}"}, session)
        if navigated.get("errorText"):
            return Rendered.of(browser, "", f"the page did not open: {navigated['errorText']}")
        if not loaded.wait(max(deadline - time.monotonic(), 0.1)):
            return Rendered.of(browser, "", f"the page did not finish loading in {timeout:g} s")
        world = browser.call(
            "Page.createIsolatedWorld",
            {"frameId": navigated["frameId"], "worldName": "mini-program-judge"},
            session,
        )
        left = max(deadline - time.monotonic(), 1.0)
        answer = browser.call(
            "Runtime.evaluate",
            {
                "expression": _VISIBLE_TEXT,
                "contextId": world["executionContextId"],
                "awaitPromise": True,
                "returnByValue": True,
            },
            session,
            timeout=left,
        )
        value = answer.get("result", {}).get("value")
        if not isinstance(value, str):
            return Rendered.of(browser, "", f"the page's text could not be read: {answer}"[:500])
        return Rendered.of(browser, " ".join(value.split()))
    except TimeoutError as exc:
        return Rendered.of(browser, "", f"the page's scripts did not yield: {exc}")
    finally:
        if session:
            browser.on(session, None)
        with contextlib.suppress(Exception):
            browser.send("Target.closeTarget", {"targetId": target})
