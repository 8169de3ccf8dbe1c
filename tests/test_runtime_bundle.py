"""``python -m sandbox_runtime --bundle URL --digest D``: a runtime that starts from a bundle a
hub holds (sandbox_runtime._fetch), against a real hub (``aenv serve``) with a pushed project,
and against a plain loopback server that serves whatever bytes a case needs (a truncated, an
oversized, a hostile or an unpublishable bundle: a hub refuses to hold those).
"""

from __future__ import annotations

import asyncio
import gzip
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aenv_cli._scaffold import write_project
from aenv_ray import Environment
from aenv_ray.bundle import build_bundle, digest_of
from aenv_ray.hub import HubClient
from aenv_ray.protocol import BUNDLE_KEY_ENV, READY_PATH
from aenv_ray.testing import free_port
from envhub.keys import create_key
from envhub.store import open_store
from sandbox_runtime.__main__ import main as runtime_main
from tests._hub import HubProcess

KEY_FOR_TESTS = "aenv_000000000000_not-a-real-key-but-long-enough"


@dataclass
class Pushed:
    """A hub with one pushed project: the bundle's URL, its digest and a tenant's key."""

    hub: HubProcess
    key: str
    name: str
    digest: str
    data: bytes

    @property
    def url(self) -> str:
        return f"{self.hub.url}/v1/envs/{self.name}/1.0.0/bundle"


async def _key(store_url: str) -> str:
    store = await open_store(store_url)
    try:
        return (await create_key(store, tenant="alice"))[1]
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def pushed(shared_hub: HubProcess, tmp_path_factory: pytest.TempPathFactory) -> Pushed:
    """A project pushed (once for the module) to the session's hub (auth on; nothing here tests
    the hub's own lifecycle or flags), under a name of its own, by a tenant key of its own."""
    tmp = tmp_path_factory.mktemp("bundle-hub")
    key = asyncio.run(_key(shared_hub.store))
    name = f"notes-from-hub-{uuid.uuid4().hex[:6]}"
    project = tmp / "notes"
    write_project(project, name)
    bundle = build_bundle(project)

    async def push(url: str) -> None:
        async with HubClient(url, api_key=key) as client:
            await client.push(bundle.data)

    asyncio.run(push(shared_hub.url))
    return Pushed(shared_hub, key, name, bundle.digest, bundle.data)


# -- running the runtime -------------------------------------------------------------------------


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    url: str
    log: Path


def _command(url: str, digest: str, into: Path, *extra: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sandbox_runtime",
        "--bundle",
        url,
        "--digest",
        digest,
        "--bundle-dir",
        str(into),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + READY_PATH, timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture
def runtimes(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def start(
    runtimes: list[subprocess.Popen[bytes]],
    tmp: Path,
    url: str,
    digest: str,
    *extra: str,
    key: str | None = None,
) -> Started:
    port = free_port()
    log = tmp / f"runtime-{port}.log"
    env = {k: v for k, v in os.environ.items() if k != BUNDLE_KEY_ENV}
    if key is not None:
        env[BUNDLE_KEY_ENV] = key
    with log.open("wb") as out:
        process = subprocess.Popen(
            _command(url, digest, tmp / "bundles", *extra, port=port),
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    runtimes.append(process)
    return Started(process, f"http://127.0.0.1:{port}", log)


def serves(started: Started, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not _ready(started.url):
        code = started.process.poll()
        assert code is None, f"the runtime exited with {code}: {started.log.read_text()}"
        assert time.monotonic() < end, f"not ready in {deadline:g} s: {started.log.read_text()}"
        time.sleep(0.05)


def fails(started: Started, deadline: float = 120.0) -> tuple[int, str]:
    """The exit code and the one error line of a runtime that must not serve."""
    try:
        code = started.process.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runtime still runs: {started.log.read_text()}")
    errors = [
        line
        for line in started.log.read_text().splitlines()
        if line.startswith("sandbox_runtime: error:")
    ]
    assert len(errors) == 1, started.log.read_text()
    return code, errors[0]


# -- from a real hub -----------------------------------------------------------------------------


def test_a_pushed_bundle_is_fetched_checked_and_served(
    pushed: Pushed, tmp_path: Path, runtimes: list[subprocess.Popen[bytes]]
) -> None:
    started = start(runtimes, tmp_path, pushed.url, pushed.digest, key=pushed.key)
    serves(started)

    async def call() -> dict[str, object]:
        async with Environment.attach(started.url) as env:
            result = await env.call_tool("add_note", {"text": "buy milk"})
        assert not result.is_error, result.text
        return dict(result.structured)

    assert asyncio.run(call()) == {"saved": "buy milk", "count": 1}
    # exec'd in place: the serving process (same pid) started without the key
    environ = Path(f"/proc/{started.process.pid}/environ").read_bytes()
    assert BUNDLE_KEY_ENV.encode() not in environ
    assert pushed.key.encode() not in environ
    served = [p for p in (tmp_path / "bundles").glob("aenv-bundle-*/*") if p.is_dir()]
    assert [p.name for p in served] == [pushed.digest.replace(":", "-")]
    assert (served[0] / ".aenv-digest").read_text().strip() == pushed.digest


def test_the_wrong_digest_is_refused_before_anything_is_unpacked(
    pushed: Pushed, tmp_path: Path, runtimes: list[subprocess.Popen[bytes]]
) -> None:
    wrong = "sha256:" + "0" * 64
    code, line = fails(start(runtimes, tmp_path, pushed.url, wrong, key=pushed.key))
    assert code == 2
    assert pushed.digest in line, line
    assert wrong in line, line
    assert not (tmp_path / "bundles").exists() or not any((tmp_path / "bundles").iterdir())


def test_without_the_hub_key_the_hub_answers_401_and_the_runtime_says_so(
    pushed: Pushed, tmp_path: Path, runtimes: list[subprocess.Popen[bytes]]
) -> None:
    code, line = fails(start(runtimes, tmp_path, pushed.url, pushed.digest))
    assert code == 2
    assert "HTTP 401" in line, line
    assert "hub key" in line, line


def test_a_version_the_hub_does_not_hold_is_a_404_that_says_to_push(
    pushed: Pushed, tmp_path: Path, runtimes: list[subprocess.Popen[bytes]]
) -> None:
    url = pushed.url.replace("/1.0.0/", "/9.9.9/")
    code, line = fails(start(runtimes, tmp_path, url, pushed.digest, key=pushed.key))
    assert code == 2
    assert "HTTP 404" in line, line
    assert "aenv push" in line, line


def test_an_unreachable_hub_is_retried_then_named(
    pushed: Pushed, tmp_path: Path, runtimes: list[subprocess.Popen[bytes]]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/envs/{pushed.name}/1.0.0/bundle"
    started = start(runtimes, tmp_path, url, pushed.digest, "--fetch-attempts", "2")
    code, line = fails(started)
    assert code == 1
    assert url in line, line
    assert "tried 2 times" in line, line
    assert "retrying" in started.log.read_text()  # the first failure was logged, then retried


# -- from a loopback server serving chosen bytes -------------------------------------------------


@dataclass
class Answer:
    body: bytes = b""
    status: int = 200
    length: int | None = None  # a Content-Length other than the body's (a cut answer)
    seen: list[str] = field(default_factory=list)  # the Authorization headers received


class _Handler(http.server.BaseHTTPRequestHandler):
    answer: Answer

    def do_GET(self) -> None:
        answer = self.server.answer  # type: ignore[attr-defined]
        answer.seen.append(self.headers.get("Authorization", ""))
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/gzip")
        length = len(answer.body) if answer.length is None else answer.length
        self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(answer.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, Answer]]:
    answer = Answer()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.answer = answer  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/bundle", answer
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def _members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar:
            handle = tar.extractfile(member) if member.isreg() else None
            out.append((member, handle.read() if handle else None))
    return out


def _targz(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for member, content in members:
            tar.addfile(member, io.BytesIO(content) if content is not None else None)
    return gzip.compress(raw.getvalue())


def _file(name: str, content: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(content)
    info.mode = 0o644
    return info, content


def test_the_key_is_sent_and_a_good_bundle_served_from_any_server(
    pushed: Pushed,
    server: tuple[str, Answer],
    tmp_path: Path,
    runtimes: list[subprocess.Popen[bytes]],
) -> None:
    url, answer = server
    answer.body = pushed.data
    serves(start(runtimes, tmp_path, url, pushed.digest, key=KEY_FOR_TESTS))
    assert answer.seen == [f"Bearer {KEY_FOR_TESTS}"]


def test_a_truncated_answer_is_retried_then_refused(
    pushed: Pushed,
    server: tuple[str, Answer],
    tmp_path: Path,
    runtimes: list[subprocess.Popen[bytes]],
) -> None:
    url, answer = server
    answer.body = pushed.data[: len(pushed.data) // 2]
    answer.length = len(pushed.data)
    started = start(runtimes, tmp_path, url, pushed.digest, "--fetch-attempts", "2")
    code, line = fails(started)
    assert code == 1
    assert f"of {len(pushed.data)} bytes" in line, line
    assert "tried 2 times" in line, line
    assert len(answer.seen) == 2


def test_an_oversized_bundle_is_refused_naming_the_limit(
    pushed: Pushed,
    server: tuple[str, Answer],
    tmp_path: Path,
    runtimes: list[subprocess.Popen[bytes]],
) -> None:
    url, answer = server
    answer.body = pushed.data
    limit = len(pushed.data) - 1
    started = start(runtimes, tmp_path, url, pushed.digest, "--max-bundle", str(limit))
    code, line = fails(started)
    assert code == 2
    assert f"limit of {limit}" in line, line
    assert "--max-bundle" in line, line


def test_a_body_longer_than_the_limit_without_a_length_is_cut_off(
    pushed: Pushed, tmp_path: Path
) -> None:
    # no Content-Length, a body that goes on: counted as it streams
    from aenv_ray.errors import ArtifactTooLargeError
    from sandbox_runtime._fetch import fetch_bundle

    class Endless(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(1000):
                    self.wfile.write(b"\0" * 65536)
            except OSError:
                pass  # the client stopped reading: what the test wants

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/bundle"
        with pytest.raises(ArtifactTooLargeError, match="over 1048576 bytes"):
            fetch_bundle(url, pushed.digest, tmp_path, max_size=1 << 20)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
    assert list(tmp_path.iterdir()) == []


def test_a_hostile_bundle_with_its_own_digest_is_refused_and_nothing_escapes(
    pushed: Pushed,
    server: tuple[str, Answer],
    tmp_path: Path,
    runtimes: list[subprocess.Popen[bytes]],
) -> None:
    url, answer = server
    answer.body = _targz([*_members(pushed.data), _file("src/../../escape.py", b"X = 1")])
    code, line = fails(start(runtimes, tmp_path, url, digest_of(answer.body)))
    assert code == 2
    assert "src/../../escape.py" in line, line
    assert "`..`" in line, line
    assert not list(tmp_path.rglob("escape.py"))
    assert not any((tmp_path / "bundles").iterdir())  # its directory was removed


def test_a_bundle_pinning_a_package_this_image_lacks_is_refused_naming_it(
    pushed: Pushed,
    server: tuple[str, Answer],
    tmp_path: Path,
    runtimes: list[subprocess.Popen[bytes]],
) -> None:
    url, answer = server
    members = []
    for member, content in _members(pushed.data):
        if member.name == "aenv.lock":
            assert content is not None
            content += b"surely-not-installed-here==1.2.3\n"
            member.size = len(content)
        members.append((member, content))
    answer.body = _targz(members)
    code, line = fails(start(runtimes, tmp_path, url, digest_of(answer.body)))
    assert code == 2
    assert "surely-not-installed-here==1.2.3" in line, line
    assert "aenv build" in line, line


def test_a_redirect_is_not_followed_with_the_key(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    from aenv_ray.errors import ConfigurationError
    from sandbox_runtime._fetch import fetch_bundle

    url, answer = server
    answer.status = 302
    with pytest.raises(ConfigurationError, match="redirects"):
        fetch_bundle(url, "sha256:" + "0" * 64, tmp_path, key=KEY_FOR_TESTS)
    assert len(answer.seen) == 1


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bundle", "http://x/b"], "--bundle needs --digest"),
        (["proj", "--bundle", "http://x/b", "--digest", "sha256:" + "0" * 64], "give one of a"),
        ([], "give one of a PROJECT directory, --bundle URL (with --digest) or --builtin"),
        (["proj", "--builtin", "mini-terminal@1.0.0"], "give one of a PROJECT directory"),
        (["proj", "--digest", "sha256:" + "0" * 64], "go with --bundle"),
        (["--bundle", "http://x/b", "--digest", "sha256:" + "0" * 64, "--max-bundle", "0"], ""),
    ],
)
def test_usage_errors_exit_2(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # in this process (the program's main, as `python -m sandbox_runtime` runs it): each is
    # refused while the arguments are parsed, before anything is configured, fetched or served
    with pytest.raises(SystemExit) as exited:
        runtime_main(args)
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    assert said in stderr


def test_a_malformed_digest_is_refused_before_any_request(
    server: tuple[str, Answer], tmp_path: Path
) -> None:
    url, answer = server
    done = subprocess.run(
        [sys.executable, "-m", "sandbox_runtime", "--bundle", url, "--digest", "md5:abc"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 2
    assert "is not `sha256:` and 64 hex digits" in done.stderr
    assert answer.seen == []


def test_the_hub_key_never_reaches_a_project_served_from_a_directory(tmp_path: Path) -> None:
    # the variable is removed first in both modes: a PROJECT runtime's code never sees it
    project = tmp_path / "p"
    write_project(project, "keyless")
    source = next((project / "src").glob("*.py"))
    source.write_text(
        source.read_text()
        + "\nimport os, sys\nprint('KEY', os.environ.get('AENV_BUNDLE_KEY'), file=sys.stderr)\n"
    )
    port = free_port()
    log = tmp_path / "log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "sandbox_runtime", str(project), "--port", str(port)],
            stdout=out,
            stderr=out,
            env={**os.environ, BUNDLE_KEY_ENV: KEY_FOR_TESTS},
        )
    try:
        end = time.monotonic() + 60
        while "KEY" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        assert "KEY None" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=15)
