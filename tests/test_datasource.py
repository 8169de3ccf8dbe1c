"""The DualContainer's exec helper (k8s_backend/aenv_exec.c) and its client (aenv_ray.datasource).

The helper is compiled once per session and run as a real process on a unix socket in a temporary
directory; the client talks to it as a tool inside an instance would. Malformed frames are thrown
at a build with AddressSanitizer and UndefinedBehaviorSanitizer (when the compiler has them): the
helper must answer each with an error or a closed connection, keep serving, and report nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import random
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from aenv_ray import (
    ConfigurationError,
    DatasourceError,
    DatasourceNotConfiguredError,
    DatasourceTimeoutError,
    DatasourceUnreachableError,
    NotSupportedError,
    ProtocolError,
)
from aenv_ray.datasource import SOCKET_ENV, Datasource, FileKind
from k8s_backend.exec_helper import build, helper_binary

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler"
)


class Helper:
    """A running aenv-exec serving ``socket`` from working directory ``root``."""

    def __init__(
        self, binary: Path, *, extra: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="aenv-ds-"))  # short: a socket path is <108 B
        self.socket = str(self.root / "exec.sock")
        self.log = self.root / "helper.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [str(binary), "--socket", self.socket, *extra],
                cwd=self.root,
                stdout=log,
                stderr=log,
                env={**os.environ, **(env or {})},
            )
        _wait_for(lambda: os.path.exists(self.socket) or self.process.poll() is not None)
        assert self.process.poll() is None, self.log.read_text()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        shutil.rmtree(self.root, ignore_errors=True)
        return code


def _wait_for(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "gave up waiting"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); it is gone for our purpose (and it may be reaped between
    # the kill and the read)
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().split(") ", 1)[1][0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


@pytest.fixture(scope="session")
def binary() -> Path:
    return helper_binary()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temporary directory with a short path (a unix socket's path is under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="aenv-ds-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def helper(binary: Path) -> Iterator[Helper]:
    running = Helper(binary)
    yield running
    assert running.stop() == 0, running.log.read_text()


@pytest.fixture
def client(helper: Helper) -> Datasource:
    return Datasource(helper.socket)


# -- the build ----------------------------------------------------------------------------------


def _has_interpreter(elf: bytes) -> bool:
    """Whether a 64-bit little-endian ELF file asks for a dynamic loader (a PT_INTERP header)."""
    assert elf[:6] == b"\x7fELF\x02\x01", "not a 64-bit little-endian ELF file"
    (table,) = struct.unpack_from("<Q", elf, 0x20)
    size, count = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, table + i * size)[0] == 3 for i in range(count))


def test_the_helper_is_static_where_there_is_a_static_libc(tmp_path: Path) -> None:
    libc = subprocess.run(["cc", "-print-file-name=libc.a"], capture_output=True, text=True)
    has_static_libc = os.path.isabs(libc.stdout.strip())
    target = tmp_path / "aenv-exec"
    assert build(target) is has_static_libc
    assert os.access(target, os.X_OK)
    if has_static_libc:  # no program interpreter: it runs in an image without any libc
        assert not _has_interpreter(target.read_bytes())
    assert subprocess.run([str(target), "--version"], capture_output=True).stdout == (
        b"aenv-exec 1\n"
    )


def test_install_copies_the_helper_into_a_new_directory(binary: Path, tmp_path: Path) -> None:
    dest = tmp_path / "shared" / "deeper" / "aenv-exec"
    done = subprocess.run([str(binary), "--install", str(dest)], capture_output=True)
    assert done.returncode == 0, done.stderr
    assert dest.read_bytes() == binary.read_bytes()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    assert [p.name for p in dest.parent.iterdir()] == ["aenv-exec"]  # no temporary left


def test_bad_usage_and_a_long_socket_path_are_refused(binary: Path) -> None:
    assert subprocess.run([str(binary)], capture_output=True).returncode == 2
    long = "/tmp/" + "x" * 120
    refused = subprocess.run([str(binary), "--socket", long], capture_output=True, text=True)
    assert refused.returncode == 2
    assert "over the limit" in refused.stderr


# -- commands -----------------------------------------------------------------------------------


async def test_a_command_runs_with_its_output_and_status(client: Datasource) -> None:
    result = await client.run(["sh", "-c", "echo hi; cat /etc/hostname; echo oops >&2; exit 3"])
    assert result.returncode == 3
    assert not result.ok
    hostname = await asyncio.to_thread(Path("/etc/hostname").read_bytes)
    assert result.stdout == b"hi\n" + hostname
    assert result.stderr_text == "oops\n"
    assert not result.stdout_truncated
    assert not result.stderr_truncated


async def test_stdin_env_and_cwd(client: Datasource, helper: Helper) -> None:
    data = bytes(range(256)) * 1000  # binary, larger than a pipe's buffer
    echoed = await client.run(["cat"], stdin=data)
    assert echoed.stdout == data
    (helper.root / "sub").mkdir()
    where = await client.run(
        ["sh", "-c", 'echo "$GREETING $PATH"; pwd'], env={"GREETING": "hello"}, cwd="sub"
    )
    greeting, path, cwd = where.stdout_text.replace("\n", " ").split()[:3]
    assert greeting == "hello"
    assert path == os.environ["PATH"]  # the container's own variables stay
    assert cwd == str(helper.root / "sub")


async def test_a_signal_is_a_negative_returncode(client: Datasource) -> None:
    result = await client.run(["sh", "-c", "kill -TERM $$"])
    assert result.returncode == -signal.SIGTERM


async def test_output_past_the_limit_is_cut_and_flagged(client: Datasource) -> None:
    result = await client.run(
        ["sh", "-c", "head -c 3000000 /dev/zero; head -c 10 /dev/zero >&2"], max_output=1 << 20
    )
    assert result.returncode == 0  # the command was not blocked by the cut
    assert result.stdout == b"\0" * (1 << 20)
    assert result.stdout_truncated
    assert result.stderr == b"\0" * 10
    assert not result.stderr_truncated


async def test_a_timeout_kills_the_whole_group_and_keeps_the_output(
    client: Datasource, helper: Helper
) -> None:
    with pytest.raises(DatasourceTimeoutError) as caught:
        await client.run(
            ["sh", "-c", "sleep 300 & echo $! > child.pid; echo started; wait"], timeout=0.5
        )
    assert caught.value.timeout == 0.5
    assert not caught.value.retryable
    assert caught.value.result.stdout == b"started\n"
    assert caught.value.result.returncode == -signal.SIGKILL
    copy = pickle.loads(pickle.dumps(caught.value))  # Ray ships errors: the output goes along
    assert copy.result == caught.value.result
    child = int((helper.root / "child.pid").read_text())
    _wait_for(lambda: not _alive(child))


async def test_what_a_command_leaves_behind_in_its_group_is_killed(
    client: Datasource, helper: Helper
) -> None:
    result = await client.run(["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"], timeout=60)
    assert result.ok  # answered when sh exited, not when the sleep would have
    _wait_for(lambda: not _alive(int(result.stdout)))


async def test_cancelling_a_call_kills_the_command(client: Datasource, helper: Helper) -> None:
    pidfile = helper.root / "sleeper.pid"
    call = asyncio.create_task(client.run(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 300"]))
    await asyncio.to_thread(_wait_for, lambda: pidfile.exists() and pidfile.read_text())
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    pid = int(pidfile.read_text())
    await asyncio.to_thread(_wait_for, lambda: not _alive(pid))


async def test_commands_run_concurrently(client: Datasource, helper: Helper) -> None:
    # each command marks itself present, then waits for all the others: served one at a time,
    # the first would wait for ever (and time out)
    n = 8
    line = (
        f"touch here.$N; while [ $(ls | grep -c '^here\\.') -lt {n} ]; do sleep 0.01; done; echo $N"
    )
    results = await asyncio.gather(
        *(client.run(["sh", "-c", line], env={"N": str(i)}, timeout=60) for i in range(n))
    )
    assert sorted(int(r.stdout) for r in results) == list(range(n))


async def test_a_command_that_cannot_start_says_why(client: Datasource) -> None:
    with pytest.raises(DatasourceError) as missing:
        await client.run(["no-such-command-anywhere"])
    assert missing.value.code == "ENOENT"
    assert "cannot run no-such-command-anywhere" in str(missing.value)
    assert "datasource image" in str(missing.value)
    with pytest.raises(DatasourceError) as nowhere:
        await client.run(["true"], cwd="/no/such/dir")
    assert nowhere.value.code == "ENOENT"
    assert "cannot enter /no/such/dir" in str(nowhere.value)


async def test_bad_arguments_are_refused_before_sending(client: Datasource) -> None:
    for argv in ("ls -l", [], ["a\0b"]):
        with pytest.raises(ConfigurationError):
            await client.run(argv)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_output"):
        await client.run(["true"], max_output=1 << 30)
    with pytest.raises(ConfigurationError, match="timeout"):
        await client.run(["true"], timeout=float("nan"))
    with pytest.raises(ConfigurationError, match="not valid"):
        await client.run(["true"], env={"A=B": "c"})


# -- files --------------------------------------------------------------------------------------


async def test_files_are_written_read_and_listed(client: Datasource, helper: Helper) -> None:
    target = helper.root / "deep" / "dir" / "notes.txt"
    assert await client.write_file(target, "héllo\n", parents=True) == len("héllo\n".encode())
    assert target.read_text() == "héllo\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert await client.read_text(target) == "héllo\n"
    await client.write_file(target, b"\0\1", mode=0o600)  # replaces, and sets the mode
    assert await client.read_file(target) == b"\0\1"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    (helper.root / "deep" / "link").symlink_to("dir")
    entries = await client.list_dir(helper.root / "deep")
    assert [(e.name, e.kind) for e in entries] == [
        ("dir", FileKind.DIRECTORY),
        ("link", FileKind.SYMLINK),
    ]
    [notes] = await client.list_dir(target.parent)
    assert (notes.name, notes.kind, notes.size, notes.mode) == (
        "notes.txt",
        FileKind.FILE,
        2,
        0o600,
    )


async def test_file_errors_carry_the_errno(client: Datasource, helper: Helper) -> None:
    cases = [
        (client.read_file(helper.root / "missing"), "ENOENT"),
        (client.read_file(helper.root), "EISDIR"),
        (client.write_file(helper.root / "no" / "parent", b"x"), "ENOENT"),
        (client.list_dir(helper.root / "missing"), "ENOENT"),
    ]
    for call, code in cases:
        with pytest.raises(DatasourceError) as caught:
            await call
        assert caught.value.code == code, caught.value
    os.mkfifo(helper.root / "fifo")  # would block a reader or a writer for ever
    for call in (
        client.read_file(helper.root / "fifo"),
        client.write_file(helper.root / "fifo", b""),
    ):
        with pytest.raises(DatasourceError, match=r"not a regular file|No such device"):
            await call


async def test_a_file_over_max_bytes_is_refused(client: Datasource, helper: Helper) -> None:
    (helper.root / "big").write_bytes(b"x" * 1001)
    assert await client.read_file(helper.root / "big", max_bytes=1001) == b"x" * 1001
    with pytest.raises(DatasourceError) as caught:
        await client.read_file(helper.root / "big", max_bytes=1000)
    assert caught.value.code == "EFBIG"
    assert "1001 bytes" in str(caught.value)


# -- reaching it ------------------------------------------------------------------------------


async def test_the_module_functions_use_the_instances_socket(
    helper: Helper, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aenv_ray import datasource

    monkeypatch.setenv(SOCKET_ENV, helper.socket)
    assert datasource.Datasource().is_configured
    assert await datasource.ping() == "aenv-exec 1"
    assert (await datasource.run(["echo", "via the module"])).stdout == b"via the module\n"


async def test_no_second_container_is_a_typed_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    from aenv_ray import datasource

    monkeypatch.delenv(SOCKET_ENV, raising=False)
    assert not datasource.Datasource().is_configured
    with pytest.raises(DatasourceNotConfiguredError) as caught:
        await datasource.run(["true"])
    assert isinstance(caught.value, NotSupportedError)
    assert "DualContainer" in str(caught.value)
    assert 'engine="kubernetes"' in str(caught.value)


async def test_an_absent_helper_is_unreachable(short_dir: Path) -> None:
    tmp_path = short_dir
    with pytest.raises(DatasourceUnreachableError, match="has not started"):
        await Datasource(tmp_path / "none.sock", connect_timeout=0.2).ping()
    closed = socket.socket(socket.AF_UNIX)
    closed.bind(str(tmp_path / "closed.sock"))  # bound, never listening: refused
    with pytest.raises(DatasourceUnreachableError) as caught:
        await Datasource(tmp_path / "closed.sock", connect_timeout=0.2).ping()
    assert caught.value.retryable
    closed.close()


async def test_a_helper_that_starts_late_is_waited_for(binary: Path, short_dir: Path) -> None:
    sock = short_dir / "late.sock"
    call = asyncio.create_task(Datasource(sock, connect_timeout=30).ping())
    await asyncio.sleep(0.1)
    assert not call.done()
    process = await asyncio.create_subprocess_exec(
        str(binary), "--socket", str(sock), stderr=subprocess.DEVNULL
    )
    try:
        assert await call == "aenv-exec 1"
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 30) == 0


# -- the helper as a container's command ------------------------------------------------------


def test_it_supervises_a_command_and_ends_with_it(binary: Path, short_dir: Path) -> None:
    sock = short_dir / "s.sock"
    ended = subprocess.run(
        [str(binary), "--socket", str(sock), "--", "sh", "-c", "exit 7"],
        capture_output=True,
        timeout=60,
    )
    assert ended.returncode == 7
    assert not sock.exists()
    # SIGTERM goes to the command; the helper ends as it does
    process = subprocess.Popen(
        [str(binary), "--socket", str(sock), "--", "sleep", "300"], stderr=subprocess.DEVNULL
    )
    _wait_for(sock.exists)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 128 + signal.SIGTERM
    assert not sock.exists()


# -- malformed frames ---------------------------------------------------------------------------


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _tlv(tag: int, value: bytes) -> bytes:
    return struct.pack(">BI", tag, len(value)) + value


def _connected(path: str) -> socket.socket:
    """A connection to ``path``, waiting while its backlog is full."""
    deadline = time.monotonic() + 30
    while True:
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(30)
        try:
            conn.connect(path)
            return conn
        except BlockingIOError:
            conn.close()
            assert time.monotonic() < deadline, "the backlog stayed full"
            time.sleep(0.01)


def _exchange(path: str, raw: bytes) -> bytes:
    """Send ``raw``, then read until the helper closes: its whole answer (maybe nothing)."""
    with _connected(path) as conn:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.sendall(raw)
        return _answer(conn)


def _answer(conn: socket.socket) -> bytes:
    """Everything the helper sends on ``conn`` until it closes it."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
    chunks = []
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _error_kind(answer: bytes) -> int | None:
    """The error kind of a well-formed error answer, else None."""
    if len(answer) < 6 or struct.unpack(">I", answer[:4])[0] != len(answer) - 4:
        return None
    body = answer[4:]
    if body[:2] != b"\1\1":
        return None
    pos = 2
    while pos + 5 <= len(body):
        tag, size = struct.unpack_from(">BI", body, pos)
        if tag == 48:
            return body[pos + 5]
        pos += 5 + size
    return None


SEEDS = [
    b"\1\5",  # ping
    b"\1\2" + _tlv(7, b"missing-file") + _tlv(10, (100).to_bytes(4, "big")),
    b"\1\4" + _tlv(7, b"."),
    b"\1\1" + _tlv(1, b"true") + _tlv(5, (5000).to_bytes(4, "big")),
]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (_frame(b""), "at least 2 bytes"),
        (_frame(b"\2\5"), "protocol version"),
        (_frame(b"\1\x63"), "unknown op"),
        (_frame(b"\1\1"), "needs an arg"),
        (_frame(b"\1\2" + _tlv(7, b"")), "path is empty"),
        (_frame(b"\1\1" + _tlv(1, b"a\0b")), "NUL"),
        (_frame(b"\1\1" + _tlv(1, b"x") + b"\1\0\0"), "cut short"),
        (_frame(b"\1\1" + b"\1\xff\xff\xff\xffabc"), "bytes, 3 are left"),
        (_frame(b"\1\2" + _tlv(7, b"x") + _tlv(7, b"y")), "given twice"),
        (_frame(b"\1\2" + _tlv(7, b"x") + _tlv(1, b"ls")), "not one of op 2"),
        (_frame(b"\1\1" + _tlv(1, b"x") + _tlv(5, b"\0\0")), "must be 4 bytes"),
        (_frame(b"\1\1" + _tlv(1, b"x") + _tlv(5, b"\0\0\0\0")), "timeout_ms must be"),
        (_frame(b"\1\1" + _tlv(1, b"x") + _tlv(2, b"=v")), "KEY=VALUE"),
        (_frame(b"\1\3" + _tlv(7, b"x") + _tlv(9, b"\0\1\0\0")), "not a file mode"),
        (b"\xff\xff\xff\xff", "over the limit"),
    ],
)
def test_a_malformed_request_gets_a_bad_request_answer(
    helper: Helper, raw: bytes, said: str
) -> None:
    answer = _exchange(helper.socket, raw)
    assert _error_kind(answer) == 1, answer
    assert said.encode() in answer
    assert _exchange(helper.socket, _frame(SEEDS[0])).endswith(b"aenv-exec 1")


def test_a_client_that_leaves_mid_frame_costs_nothing(helper: Helper) -> None:
    for raw in (b"", b"\0\0", b"\0\0\0\x10\1\5", _frame(SEEDS[1])[:-3]):
        assert _exchange(helper.socket, raw) == b""
    assert _exchange(helper.socket, _frame(SEEDS[0])).endswith(b"aenv-exec 1")


def test_the_helper_says_busy_and_survives_many_connections(helper: Helper) -> None:
    # more connections than handlers at once: each is served or told to retry, none crashes it
    waiting = []
    try:
        for _ in range(300):
            waiting.append(_connected(helper.socket))  # a handler waits for its frame
        busy = 0
        for conn in waiting[-20:]:  # past the 256 handlers: each told to retry
            busy += _error_kind(_answer(conn)) == 4
        assert busy == 20
    finally:
        for conn in waiting:
            conn.close()
    assert _exchange(helper.socket, _frame(SEEDS[0])).endswith(b"aenv-exec 1")


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("asan") / "aenv-exec"
    try:
        build(target, static=False, extra=("-g", "-fsanitize=address,undefined", "-O1"))
    except ConfigurationError as exc:
        pytest.skip(f"no sanitizers in this compiler: {exc}")
    return target


def _mutations(rng: random.Random) -> Iterator[bytes]:
    for _ in range(400):
        body = bytearray(rng.choice(SEEDS))
        for _ in range(rng.randint(1, 4)):
            how = rng.random()
            if how < 0.5 and body:  # change a byte (op, tag, length, content)
                body[rng.randrange(len(body))] = rng.randrange(256)
            elif how < 0.7:  # cut
                del body[rng.randrange(len(body) + 1) :]
            elif how < 0.9:  # insert garbage
                at = rng.randrange(len(body) + 1)
                body[at:at] = rng.randbytes(rng.randint(1, 12))
            else:  # a length field that lies
                at = rng.randrange(len(body) + 1)
                body[at:at] = struct.pack(">BI", rng.randint(0, 255), rng.getrandbits(32))
        declared = len(body) if rng.random() < 0.9 else rng.getrandbits(32)
        yield struct.pack(">I", declared) + bytes(body)
    for _ in range(100):
        yield rng.randbytes(rng.randint(0, 64))


def test_fuzzed_frames_neither_crash_nor_corrupt_the_helper(sanitized: Path) -> None:
    running = Helper(sanitized, env={"ASAN_OPTIONS": "detect_leaks=0"})
    try:
        rng = random.Random(20241125)
        for raw in _mutations(rng):
            answer = _exchange(running.socket, raw)
            # an answer is a whole frame of the protocol (an ok or an error), or nothing
            if answer:
                (size,) = struct.unpack(">I", answer[:4])
                assert size == len(answer) - 4, raw
                assert answer[4] == 1, raw
                assert answer[5] in (0, 1), raw
            assert running.process.poll() is None, running.log.read_text()
        assert _exchange(running.socket, _frame(SEEDS[0])).endswith(b"aenv-exec 1")
    finally:
        code = running.process.poll()
        log = running.log.read_text()
        running.stop()
    assert code is None
    for word in ("AddressSanitizer", "runtime error", "LeakSanitizer"):
        assert word not in log, log


def test_the_client_reads_a_broken_answer_as_a_protocol_error(short_dir: Path) -> None:
    path = str(short_dir / "liar.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen()

    def lie(answer: bytes) -> None:
        conn, _ = server.accept()
        with conn:
            (size,) = struct.unpack(">I", conn.recv(4))
            conn.recv(size)
            conn.sendall(answer)

    async def ask(answer: bytes) -> BaseException:
        task = asyncio.to_thread(lie, answer)
        with pytest.raises((ProtocolError, DatasourceUnreachableError)) as caught:
            await asyncio.gather(Datasource(path).ping(timeout=10), task)
        return caught.value

    async def main() -> None:
        assert isinstance(await ask(_frame(b"HTTP/1.1 200")), ProtocolError)
        assert isinstance(await ask(_frame(b"\1\0" + b"\x26\0\0\0\x09ab")), ProtocolError)
        assert isinstance(await ask(b"\xff\xff\xff\xff"), ProtocolError)
        assert isinstance(await ask(b"\0\0\0\x10\1\0"), DatasourceUnreachableError)

    try:
        asyncio.run(main())
    finally:
        server.close()
