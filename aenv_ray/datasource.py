"""Run commands and read and write files in the second container of a ``DualContainer``
instance (its *datasource*), from the environment's own tools.

On the Kubernetes engine, an environment whose ``deployConfig.podTemplate`` is
``"DualContainer"`` gets a second container in each pod, running the image the instance names as
its ``datasource``. That image needs no Python and no shell: the pod places a small static exec
helper (``k8s_backend/aenv_exec.c``) in it, which serves this module on the unix socket named by
``AENV_DATASOURCE_SOCKET`` in the runtime container. Tools call it::

    from aenv_ray import datasource, register_tool

    @register_tool
    async def query(sql: str) -> str:
        result = await datasource.run(["psql", "-c", sql], timeout=30)
        return result.stdout_text if result.ok else result.stderr_text

The module's functions use the instance's own socket; :class:`Datasource` takes another. Every
call opens one connection, which the helper serves in a process of its own, so calls run
concurrently; cancelling a call (the tool's own timeout) closes it, and the helper then kills the
command. Failures are typed: :class:`~aenv_ray.errors.DatasourceNotConfiguredError` (no second
container: the local engine, or a single-container environment),
:class:`~aenv_ray.errors.DatasourceUnreachableError`,
:class:`~aenv_ray.errors.DatasourceTimeoutError` and
:class:`~aenv_ray.errors.DatasourceError` (``code`` is the errno's name).

The wire is described in ``aenv_exec.c``: a frame is a big-endian u32 length and a body; a
body is a version byte, an op (or a status) byte and fields of a tag byte, a u32 length and
bytes.

May import: the standard library and :mod:`aenv_ray.errors` only (it runs inside instances).
"""

from __future__ import annotations

import asyncio
import enum
import errno
import math
import os
import struct
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from aenv_ray.errors import (
    ConfigurationError,
    DatasourceError,
    DatasourceNotConfiguredError,
    DatasourceTimeoutError,
    DatasourceUnreachableError,
    ProtocolError,
)

__all__ = [
    "MAX_DATA",
    "MAX_OUTPUT",
    "SOCKET_ENV",
    "CommandResult",
    "Datasource",
    "DirEntry",
    "FileKind",
    "list_dir",
    "ping",
    "read_file",
    "read_text",
    "run",
    "write_file",
]

SOCKET_ENV = "AENV_DATASOURCE_SOCKET"
"""The runtime container's variable that names the exec helper's socket."""
MAX_DATA = 64 << 20
"""The most a file read or written, or a command's stdin, may hold (bytes)."""
MAX_OUTPUT = 16 << 20
"""The most of each of a command's stdout and stderr that is kept (bytes)."""
MAX_TIMEOUT = 24 * 3600.0
GRACE = 5.0  # how long past a command's timeout the helper's answer is awaited
_MAX_ANSWER = MAX_DATA + 2 * MAX_OUTPUT + (1 << 20)

_PROTOCOL = 1
_RUN, _READ, _WRITE, _LIST, _PING = 1, 2, 3, 4, 5
_ARG, _ENV, _CWD, _STDIN, _TIMEOUT_MS, _MAX_OUTPUT, _PATH, _DATA, _MODE, _MAX_SIZE = range(1, 11)
_PARENTS = 11
_STATUS, _STDOUT, _STDERR, _FLAGS, _CONTENT, _ENTRY, _VERSION, _SIZE = range(32, 40)
_KIND, _ERRNO, _MESSAGE = 48, 49, 50
_BAD_REQUEST, _OS, _TOO_LARGE, _BUSY, _START = 1, 2, 3, 4, 5


class FileKind(enum.Enum):
    """What a directory entry is (its own kind: a symlink is not followed)."""

    FILE = "file"
    DIRECTORY = "directory"
    SYMLINK = "symlink"
    OTHER = "other"


_KINDS = {1: FileKind.FILE, 2: FileKind.DIRECTORY, 3: FileKind.SYMLINK}


@dataclass(frozen=True)
class CommandResult:
    """What a command did. ``returncode`` is its exit code, or ``-N`` when signal ``N`` ended
    it (as in :mod:`subprocess`); each stream keeps its first ``max_output`` bytes, and its
    ``*_truncated`` flag says whether more was written."""

    argv: tuple[str, ...]
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """The command exited with status 0."""
        return self.returncode == 0

    @property
    def stdout_text(self) -> str:
        """``stdout`` as UTF-8 (undecodable bytes replaced)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        """``stderr`` as UTF-8 (undecodable bytes replaced)."""
        return self.stderr.decode("utf-8", "replace")


@dataclass(frozen=True)
class DirEntry:
    """One entry of :func:`list_dir`: its name, kind, size in bytes and permission bits."""

    name: str
    kind: FileKind
    size: int
    mode: int


@dataclass
class _Answer:
    status: int
    fields: dict[int, list[bytes]] = field(default_factory=dict)

    def one(self, tag: int, default: bytes | None = None) -> bytes:
        values = self.fields.get(tag)
        if not values:
            if default is None:
                raise ProtocolError(f"the datasource's exec helper left out field {tag}")
            return default
        return values[0]

    def number(self, tag: int, size: int, *, signed: bool = False) -> int:
        value = self.one(tag)
        if len(value) != size:
            raise ProtocolError(f"the datasource's exec helper sent field {tag} of {len(value)} B")
        return int.from_bytes(value, "big", signed=signed)


def _field(tag: int, value: bytes) -> bytes:
    return struct.pack(">BI", tag, len(value)) + value


def _text(value: str | os.PathLike[str], what: str) -> bytes:
    text = os.fspath(value)
    if not isinstance(text, str):
        raise ConfigurationError(f"{what} must be text, not {type(text).__name__}")
    data = text.encode("utf-8", "surrogateescape")
    if b"\0" in data:
        raise ConfigurationError(f"{what} {text!r} holds a NUL character")
    return data


def _data(value: bytes | str, what: str) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    if len(data) > MAX_DATA:
        raise ConfigurationError(f"{what} is {len(data)} bytes, over the limit of {MAX_DATA}")
    return data


def _timeout(value: float) -> float:
    if not (0 < value <= MAX_TIMEOUT and math.isfinite(value)):
        raise ConfigurationError(f"timeout must be positive seconds up to {MAX_TIMEOUT:g}")
    return value


def _decode(body: bytes) -> _Answer:
    if len(body) < 2 or body[0] != _PROTOCOL or body[1] not in (0, 1):
        raise ProtocolError(
            "the datasource's exec helper answered something that is not its protocol "
            f"(first bytes {body[:8]!r}); is the helper the same version as aenv-ray?"
        )
    answer = _Answer(body[1])
    pos = 2
    while pos < len(body):
        if len(body) - pos < 5:
            raise ProtocolError("the datasource's exec helper sent a field cut short")
        tag, size = struct.unpack_from(">BI", body, pos)
        pos += 5
        if size > len(body) - pos:
            raise ProtocolError("the datasource's exec helper sent a field longer than its answer")
        answer.fields.setdefault(tag, []).append(body[pos : pos + size])
        pos += size
    return answer


class Datasource:
    """A client of a second container's exec helper at ``socket`` (default: the instance's,
    ``$AENV_DATASOURCE_SOCKET``, read at each call). ``connect_timeout`` bounds how long a
    socket that is not there yet (the container is starting) is waited for."""

    def __init__(
        self, socket: str | os.PathLike[str] | None = None, *, connect_timeout: float = 10.0
    ) -> None:
        self._socket = os.fspath(socket) if socket is not None else None
        self.connect_timeout = connect_timeout

    def __repr__(self) -> str:
        return f"Datasource({self.socket!r})"

    @property
    def socket(self) -> str | None:
        """The helper's socket path, or None when this instance has no second container."""
        if self._socket is not None:
            return self._socket
        # read here, not through aenv_ray.settings: this runs inside instances, per call, and the
        # runtime's pod sets it; pydantic-settings would cost more than the call
        return os.environ.get(SOCKET_ENV) or None

    @property
    def is_configured(self) -> bool:
        """Whether this instance has a second container to talk to."""
        return self.socket is not None

    # -- the operations ---------------------------------------------------------------------
    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | str = b"",
        timeout: float = 60.0,
        max_output: int = 1 << 20,
    ) -> CommandResult:
        """Run ``argv`` (a list: no shell unless you ask for one, ``["sh", "-c", line]``) in
        the second container, in ``cwd`` (default: the container's working directory), with
        the container's environment plus ``env``, ``stdin`` as its input. The command and
        everything it started in its process group are killed at ``timeout`` seconds
        (:class:`~aenv_ray.errors.DatasourceTimeoutError`, with what it wrote in ``result``);
        processes it leaves behind in its group when it exits are killed too."""
        if isinstance(argv, str | bytes) or not argv:
            raise ConfigurationError(
                "argv is a non-empty list of strings, e.g. ['ls', '-l']; for a shell line "
                "use ['sh', '-c', line]"
            )
        if not (0 <= max_output <= MAX_OUTPUT):
            raise ConfigurationError(f"max_output must be 0..{MAX_OUTPUT} bytes")
        timeout = _timeout(timeout)
        args = tuple(str(a) for a in argv)
        parts = [_field(_ARG, _text(a, "an argument")) for a in args]
        for key, value in (env or {}).items():
            if not key or "=" in key:
                raise ConfigurationError(f"environment variable name {key!r} is not valid")
            parts.append(_field(_ENV, _text(f"{key}={value}", "an environment variable")))
        if cwd is not None:
            parts.append(_field(_CWD, _text(cwd, "cwd")))
        data = _data(stdin, "stdin")
        if data:
            parts.append(_field(_STDIN, data))
        millis = max(1, math.ceil(timeout * 1000))
        parts.append(_field(_TIMEOUT_MS, millis.to_bytes(4, "big")))
        parts.append(_field(_MAX_OUTPUT, max_output.to_bytes(4, "big")))
        answer = await self._call(_RUN, parts, timeout + GRACE, what=f"running {args[0]}")
        flags = answer.number(_FLAGS, 1)
        result = CommandResult(
            argv=args,
            returncode=answer.number(_STATUS, 4, signed=True),
            stdout=answer.one(_STDOUT, b""),
            stderr=answer.one(_STDERR, b""),
            stdout_truncated=bool(flags & 2),
            stderr_truncated=bool(flags & 4),
        )
        if flags & 1:
            error = DatasourceTimeoutError(
                f"{list(args)} ran past its timeout of {timeout:g} s in the datasource container "
                "and was killed with its process group; pass a larger timeout= or make it faster",
                timeout=timeout,
            )
            error.result = result  # type: ignore[attr-defined]
            raise error
        return result

    async def read_file(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = 16 << 20,
        timeout: float = 60.0,
    ) -> bytes:
        """The content of the regular file ``path`` in the second container. A file larger
        than ``max_bytes`` is a :class:`~aenv_ray.errors.DatasourceError` (code ``EFBIG``)."""
        if not (0 <= max_bytes <= MAX_DATA):
            raise ConfigurationError(f"max_bytes must be 0..{MAX_DATA}")
        parts = [
            _field(_PATH, _text(path, "path")),
            _field(_MAX_SIZE, max_bytes.to_bytes(4, "big")),
        ]
        answer = await self._call(_READ, parts, _timeout(timeout), what=f"reading {path}")
        return answer.one(_CONTENT, b"")

    async def read_text(
        self,
        path: str | os.PathLike[str],
        *,
        encoding: str = "utf-8",
        max_bytes: int = 16 << 20,
        timeout: float = 60.0,
    ) -> str:
        """:meth:`read_file`, decoded (undecodable bytes replaced)."""
        data = await self.read_file(path, max_bytes=max_bytes, timeout=timeout)
        return data.decode(encoding, "replace")

    async def write_file(
        self,
        path: str | os.PathLike[str],
        data: bytes | str,
        *,
        mode: int | None = None,
        parents: bool = False,
        timeout: float = 60.0,
    ) -> int:
        """Write ``data`` (text as UTF-8) to ``path`` in the second container, replacing what
        was there; ``mode`` sets its permission bits (a new file's default: 0o644);
        ``parents`` makes missing directories first. The bytes written. The container's root
        file system is read-only: write under ``/workspace`` or ``/tmp``."""
        parts = [_field(_PATH, _text(path, "path")), _field(_DATA, _data(data, "data"))]
        if mode is not None:
            if not (0 <= mode <= 0o7777):
                raise ConfigurationError(f"mode {mode!r} is not a file mode (0..0o7777)")
            parts.append(_field(_MODE, mode.to_bytes(4, "big")))
        if parents:
            parts.append(_field(_PARENTS, b"\1"))
        answer = await self._call(_WRITE, parts, _timeout(timeout), what=f"writing {path}")
        return answer.number(_SIZE, 8)

    async def list_dir(
        self, path: str | os.PathLike[str], *, timeout: float = 60.0
    ) -> list[DirEntry]:
        """The entries of directory ``path`` in the second container, sorted by name."""
        parts = [_field(_PATH, _text(path, "path"))]
        answer = await self._call(_LIST, parts, _timeout(timeout), what=f"listing {path}")
        entries = []
        for raw in answer.fields.get(_ENTRY, []):
            if len(raw) < 13:
                raise ProtocolError("the datasource's exec helper sent an entry cut short")
            kind, mode, size = struct.unpack_from(">BIQ", raw)
            name = raw[13:].decode("utf-8", "surrogateescape")
            entries.append(DirEntry(name, _KINDS.get(kind, FileKind.OTHER), size, mode))
        return sorted(entries, key=lambda e: e.name)

    async def ping(self, *, timeout: float = 10.0) -> str:
        """The helper's version (``"aenv-exec 1"``): it is up and answering."""
        answer = await self._call(_PING, [], _timeout(timeout), what="ping")
        return answer.one(_VERSION).decode("utf-8", "replace")

    # -- the transport ----------------------------------------------------------------------
    async def _call(self, op: int, parts: list[bytes], timeout: float, *, what: str) -> _Answer:
        path = self.socket
        if path is None:
            raise DatasourceNotConfiguredError(
                f"this instance has no datasource container ({SOCKET_ENV} is not set): only an "
                'environment whose deployConfig.podTemplate is "DualContainer", run on the '
                'Kubernetes engine (engine="kubernetes"), has one; the local engine runs '
                "the runtime alone (there a datasource is a directory, mounted at /data)"
            )
        body = bytes([_PROTOCOL, op]) + b"".join(parts)
        deadline = time.monotonic() + timeout
        reader, writer = await self._connect(path, deadline)
        try:
            try:
                async with asyncio.timeout(deadline - time.monotonic()):
                    writer.write(struct.pack(">I", len(body)) + body)
                    await writer.drain()
                    size = struct.unpack(">I", await reader.readexactly(4))[0]
                    if size > _MAX_ANSWER:
                        raise ProtocolError(
                            f"the datasource's exec helper announced an answer of {size} bytes, "
                            f"over {_MAX_ANSWER}"
                        )
                    answer = _decode(await reader.readexactly(size))
            except TimeoutError as exc:
                raise DatasourceTimeoutError(
                    f"the datasource container's exec helper did not answer {what} within "
                    f"{timeout:g} s",
                    timeout=timeout,
                ) from exc
            except (asyncio.IncompleteReadError, ConnectionError) as exc:
                raise DatasourceUnreachableError(
                    f"the datasource container's exec helper closed the connection while "
                    f"{what} (it died, or ran out of memory); see the container's log"
                ) from exc
        finally:
            writer.close()
        if answer.status != 0:
            raise _error(answer, what)
        return answer

    async def _connect(
        self, path: str, deadline: float
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect, waiting (up to ``connect_timeout``) for a socket that is not there yet."""
        until = min(deadline, time.monotonic() + self.connect_timeout)
        while True:
            try:
                return await asyncio.open_unix_connection(path, limit=1 << 20)
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() >= until:
                    raise DatasourceUnreachableError(
                        f"nothing answers at the datasource container's socket {path} "
                        f"({exc.strerror}): the container has not started, or has stopped"
                    ) from exc
                await asyncio.sleep(0.05)
            except OSError as exc:
                raise DatasourceUnreachableError(
                    f"cannot connect to the datasource container's socket {path}: {exc}"
                ) from exc


def _error(answer: _Answer, what: str) -> Exception:
    kind = answer.number(_KIND, 1) if _KIND in answer.fields else 0
    number = answer.number(_ERRNO, 4) if _ERRNO in answer.fields else 0
    said = answer.one(_MESSAGE, b"").decode("utf-8", "replace")
    if kind == _BAD_REQUEST:
        return ProtocolError(
            f"the datasource container's exec helper refused the request ({said}); is the "
            "helper the same version as aenv-ray?"
        )
    code = errno.errorcode.get(number)
    if kind == _BUSY:
        return DatasourceError(f"the datasource container is busy: {said}", code=code)
    if kind == _START and said.startswith("cannot run") and code == "ENOENT":
        said += " (is it in the datasource image, on its PATH?)"
    return DatasourceError(f"{what} in the datasource container failed: {said}", code=code)


_default = Datasource()
run = _default.run
read_file = _default.read_file
read_text = _default.read_text
write_file = _default.write_file
list_dir = _default.list_dir
ping = _default.ping
