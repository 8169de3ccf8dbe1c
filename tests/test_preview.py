"""The preview: an instance's files served to a browser behind a capability (``aenv_ray.preview``,
``sandbox_runtime._preview``, ``Environment.preview_url``, the hub's key-less preview route).

The built-in mini-program registers its project as the preview and writes, links and runs
whatever a test needs (``execute_python_code`` makes the symbolic links, FIFOs and big files an
attacker's code would). Served by ``aenv run``'s runtime (no token: cross-site checks guard
its API), by the local engine (a token), and through a real hub (``aenv serve``) whose key a
browser cannot send. A real headless Chromium (Debian's ``chromium``) opens what the tools
wrote: the text a script renders, a ``fetch`` of a project file, and the page's attempts to
call the runtime's tools, which must fail.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import pytest

from aenv_ray import Environment, NotSupportedError
from aenv_ray.engine import default_engine
from aenv_ray.protocol import FAST_INFO_PATH, MAX_PREVIEW_FILE_BYTES, PREVIEW_PATH
from aenv_ray.settings import Settings
from aenv_ray.testing import RuntimeProcess
from tests._hub import HubProcess, new_key

ROOT = Path(__file__).resolve().parent.parent
MINI_PROGRAM = ROOT / "builtin_envs" / "mini_program"

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Preview test</title>
<link rel="stylesheet" href="style.css"><script src="app.js"></script></head>
<body><h1 id="title">static text</h1><p id="data">no data</p>
<p id="api">api not tried</p><p id="storage">storage not tried</p></body></html>
"""
# The page renders text, fetches a project file, then tries what a hostile page would: call a
# tool of the runtime that serves it (both as a CORS request and as a "simple" no-cors POST)
# and use the origin's storage.
SCRIPT = """
document.addEventListener('DOMContentLoaded', async () => {
  document.getElementById('title').textContent = 'Rendered by ' + ['a', 'script'].join(' ');
  try {
    const data = await (await fetch('data.json')).json();
    document.getElementById('data').textContent = 'data says ' + data.answer;
  } catch (e) { document.getElementById('data').textContent = 'data failed: ' + e; }
  const call = JSON.stringify({name: 'write_file',
                               arguments: {file_path: 'pwned.txt', content: 'x'}});
  const results = [];
  try {
    const r = await fetch('/aenv/v1/call', {method: 'POST', body: call,
                                            headers: {'content-type': 'application/json'}});
    results.push('cors answered ' + r.status);
  } catch (e) { results.push('cors refused'); }
  try {
    const r = await fetch('/aenv/v1/call', {method: 'POST', mode: 'no-cors', body: call});
    results.push('no-cors answered ' + r.status);
  } catch (e) { results.push('no-cors refused'); }
  document.getElementById('api').textContent = results.join(', ');
  try { localStorage.setItem('k', 'v'); document.getElementById('storage').textContent = 'open'; }
  catch (e) { document.getElementById('storage').textContent = 'storage refused'; }
});
"""
FILES = {
    "index.html": PAGE,
    "app.js": SCRIPT,
    "style.css": "h1 { color: #333; }\n",
    "data.json": '{"answer": 42}\n',
    "logo.svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>\n',
    "notes": "no extension\n",
    "sub/index.html": "<!DOCTYPE html><title>sub</title><p>sub page</p>\n",
}
# What an attacker's code leaves in the project: links out of it, a FIFO, a hidden file, a file
# over the size limit.
PLANT = f"""
import os
os.symlink("/etc/passwd", "passwd")
os.symlink("/etc", "etc")
os.makedirs("deep", exist_ok=True)
os.symlink("../sub", "deep/up")
os.mkfifo("pipe")
open(".secret", "w").write("hidden")
with open("big.bin", "wb") as out:
    out.truncate({MAX_PREVIEW_FILE_BYTES + 1})
print("planted")
"""


async def _write_project(env: Environment) -> None:
    await env.call_function("reset_project", {"files": FILES})
    planted = await env.call_tool("execute_python_code", {"code": PLANT})
    assert planted.structured["output"] == "planted\n", planted.text


async def _get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, allow_redirects=False) as reply,
    ):
        return reply.status, dict(reply.headers), await reply.read()


async def _raw(url: str, path: bytes, method: bytes = b"GET") -> tuple[int, bytes]:
    """One request whose path goes out byte for byte (no client normalises its dots)."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(
            method + b" " + path + b" HTTP/1.1\r\nHost: " + parts.netloc.encode() + b"\r\n"
            b"Connection: close\r\n\r\n"
        )
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture(scope="module")
def runtime() -> Iterator[RuntimeProcess]:
    """mini-program served as ``aenv run`` serves it: no token, the cross-site checks only."""
    with RuntimeProcess(MINI_PROGRAM) as process:
        yield process


@pytest.fixture
async def served(runtime: RuntimeProcess) -> AsyncIterator[tuple[Environment, str]]:
    async with runtime.environment() as env:
        await _write_project(env)
        yield env, await env.preview_url()


# -- what is served, and how --------------------------------------------------------------------


async def test_files_are_served_with_their_types_and_a_sandboxing_policy(
    served: tuple[Environment, str],
) -> None:
    _, url = served
    expected = {
        "": ("text/html; charset=utf-8", PAGE),
        "index.html": ("text/html; charset=utf-8", PAGE),
        "app.js": ("text/javascript; charset=utf-8", SCRIPT),
        "style.css": ("text/css; charset=utf-8", FILES["style.css"]),
        "data.json": ("application/json", FILES["data.json"]),
        "logo.svg": ("image/svg+xml", FILES["logo.svg"]),
        "notes": ("application/octet-stream", FILES["notes"]),
        "sub/": ("text/html; charset=utf-8", FILES["sub/index.html"]),
    }
    for path, (kind, text) in expected.items():
        status, headers, body = await _get(url + path)
        assert (status, headers["Content-Type"], body.decode()) == (200, kind, text), path
        policy = headers["Content-Security-Policy"]
        assert policy.startswith("sandbox allow-scripts ")  # an opaque origin: no same-origin
        assert "allow-same-origin" not in policy
        assert "default-src 'self' data: blob: 'unsafe-inline' 'unsafe-eval'" in policy
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Referrer-Policy"] == "no-referrer"
        assert headers["Cache-Control"] == "no-store"
    status, headers, body = await _get(url + "app.js", "HEAD")
    assert (status, headers["Content-Length"], body) == (200, str(len(SCRIPT)), b"")
    # a directory, or the preview's root, without its slash: redirected (relative links need it)
    assert (await _get(url + "sub"))[:2][0] == 301
    assert (await _get(url + "sub"))[1]["Location"] == "sub/"
    assert (await _get(url.rstrip("/")))[1]["Location"].endswith("/")


@pytest.mark.parametrize(
    ("path", "why"),
    [
        (b"passwd", b"is a symbolic link"),
        (b"etc/passwd", b"is a symbolic link"),
        (b"deep/up/index.html", b"is a symbolic link"),
        (b"pipe", b"is not a regular file"),
        (b".secret", b"hidden files are not served"),
        (b"%2esecret", b"hidden files are not served"),
        (b"../../info", b"`..`"),
        (b"%2e%2e/%2e%2e/info", b"`..`"),
        (b"sub/..%2f..%2finfo", b"separator"),
        (b"..%5c..%5cinfo", b"separator"),
        (b"sub//index.html", b"empty path components"),
        (b"a%00b", b"control character"),
        (b"missing.html", b"no such file"),
    ],
)
async def test_what_is_not_served(served: tuple[Environment, str], path: bytes, why: bytes) -> None:
    _, url = served
    status, body = await _raw(url, urlsplit(url).path.encode() + path)
    assert status == 404
    assert why in body
    assert b"root:" not in body  # /etc/passwd's lines
    assert b"tools" not in body  # the runtime's info


async def test_size_method_and_capability_limits(served: tuple[Environment, str]) -> None:
    _, url = served
    status, _, body = await _get(url + "big.bin")
    assert status == 413
    assert b"over 16 MiB" in body
    status, headers, _ = await _get(url + "index.html", "POST")
    assert (status, headers["Allow"]) == (405, "GET, HEAD")
    base = url.rsplit("/", 2)[0]
    capability = url.rsplit("/", 2)[1]
    for wrong in ["x" * len(capability), capability[:-1], capability.lower(), ""]:
        status, _, body = await _get(f"{base}/{wrong}/index.html")
        assert status == 404
        assert b"no such preview" in body
    # the route reaches nothing else of the runtime, whatever the path says
    status, body = await _raw(url, f"/aenv/v1/preview/{capability}/../info".encode())
    assert status == 404
    status, body = await _raw(url, b"/aenv/v1/preview/../info")
    assert (status, b"tools" in body) == (404, False)


async def test_an_environment_without_a_preview_says_so(terminal_runtime: RuntimeProcess) -> None:
    async with terminal_runtime.environment() as env:
        with pytest.raises(NotSupportedError, match="serves no preview"):
            await env.preview_url()
        status, _, body = await _get(f"{env.url}{PREVIEW_PATH}")
        assert status == 200
        assert b'"directory":null' in body


# -- the local engine: a token, forks ---------------------------------------------------------


async def test_local_engine_preview_needs_no_token_and_shows_none() -> None:
    async with Environment("mini-program@1.0.0") as env:
        await env.call_tool("write_file", {"file_path": "index.html", "content": PAGE})
        url = await env.preview_url("index.html")
        info = await default_engine().get(env.instance_id or "")
        assert info.token
        assert info.token not in url
        status, _, body = await _get(url)  # no Authorization header
        assert (status, body.decode()) == (200, PAGE)
        # everything else of the instance still wants the token
        assert (await _get(f"{env.url}{PREVIEW_PATH}"))[0] == 401
        assert (await _get(f"{env.url}{FAST_INFO_PATH}"))[0] == 401
        token_as_capability = f"{env.url}/aenv/v1/preview/{info.token}/index.html"
        assert (await _get(token_as_capability))[0] == 404
        (child,) = await env.fork(1)
        try:
            copy = await child.preview_url("index.html")
            assert urlsplit(copy).path != urlsplit(url).path  # a capability of its own
            assert (await _get(copy))[2].decode() == PAGE  # of its copy of the files
            parents = url.replace(env.url or "", child.url or "")
            assert (await _get(parents))[0] == 404
        finally:
            await child.release()


# -- through a hub ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HubProcess, str]]:
    proc = HubProcess(tmp_path_factory.mktemp("hub"), auth=True, engine="local")
    key = new_key("alice", proc.store)
    with proc:
        yield proc, key


async def test_the_hub_serves_the_preview_without_its_key(hub: tuple[HubProcess, str]) -> None:
    proc, key = hub
    settings = Settings(hub_route="proxy")  # type: ignore[arg-type]
    async with Environment(
        "mini-program@1.0.0", aenv_url=proc.url, api_key=key, settings=settings
    ) as env:
        await _write_project(env)
        url = await env.preview_url()
        assert url.startswith(f"{proc.url}/v1/instances/{env.instance_id}/proxy/aenv/v1/preview/")
        assert key not in url
        status, headers, body = await _get(url + "app.js")  # no key
        assert (status, body.decode()) == (200, SCRIPT)
        assert headers["Content-Security-Policy"].startswith("sandbox allow-scripts ")
        assert headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert (await _get(url + "app.js", "HEAD"))[2] == b""
        path = urlsplit(url).path.encode()
        capability = path.rstrip(b"/").rsplit(b"/", 1)[1]
        instance = f"/v1/instances/{env.instance_id}/proxy".encode()
        for attempt in [
            path + b"passwd",
            path + b"%2e%2e/%2e%2e/info",  # decoded by the hub: refused there
            path + b"%252e%252e/%252e%252e/info",  # re-encoded by the hub: a name, not `..`
            path + b"sub/..%2f..%2f..%2finfo",
            instance + b"/aenv/v1/preview/" + capability + b"/../../info",
            instance + b"/aenv/v1/preview/nope/index.html",
            b"/v1/instances/no-such-instance/proxy/aenv/v1/preview/" + capability + b"/",
        ]:
            status, body = await _raw(url, attempt)
            assert status == 404, attempt
            assert b"tools" not in body, attempt
            assert b"root:" not in body, attempt
        # the rest of the instance's proxy still wants the key, and writes are not previews
        info_route = f"{proc.url}/v1/instances/{env.instance_id}/proxy{PREVIEW_PATH}"
        assert (await _get(info_route))[0] == 401
        assert (await _get(url + "index.html", "POST"))[0] == 401


# -- in a real browser --------------------------------------------------------------------------


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip(
        "no Chromium: scripts/setup installs Debian's `chromium` when run as root "
        "(apt-get install chromium)"
    )


def _render(url: str) -> str:
    """The DOM headless Chromium holds once the page's scripts ran (their fetches included)."""
    with tempfile.TemporaryDirectory(prefix="aenv-chromium-") as profile:
        done = subprocess.run(
            [
                _chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


async def _opened_in_a_browser(env: Environment) -> None:
    await env.call_function("reset_project", {"files": FILES})
    dom = await asyncio.to_thread(_render, await env.preview_url())
    assert '<h1 id="title">Rendered by a script</h1>' in dom  # the page's script ran
    assert '<p id="data">data says 42</p>' in dom  # and fetched a project file
    assert "storage refused" in dom  # an opaque origin: no storage of the runtime's origin
    assert "answered 200" not in dom
    assert "cors refused" in dom
    files = (await env.call_tool("list_files", {})).structured["files"]
    assert "pwned.txt" not in files  # the page could not call a tool
    assert sorted(files) == sorted(FILES)


async def test_a_browser_shows_the_page_and_the_page_cannot_call_tools_aenv_run(
    runtime: RuntimeProcess,
) -> None:
    async with runtime.environment() as env:
        await _opened_in_a_browser(env)


async def test_a_browser_shows_the_page_and_the_page_cannot_call_tools_local_engine() -> None:
    async with Environment("mini-program@1.0.0") as env:
        await _opened_in_a_browser(env)
