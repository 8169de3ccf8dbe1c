"""The judge: run a reward where the agent never was.

A reward registered with ``judge=True`` (or ``config.json``'s ``"reward": {"judge": true}``)
never runs in the runtime's process, whose memory the environment's tools have been changing
all episode (module globals, patched builtins, a planted ``os.environ``). Instead:

1. **a seed**: before the runtime serves its first call, it forks a *judge seed*
   (:meth:`Judge.start`): a copy of the loaded environment nothing has run in yet. It waits on a
   socket only the runtime holds. A fork of a running instance (whose memory did run calls)
   starts its seed as a fresh interpreter that loads the project again instead
   (``python -I``), and so does any runtime whose seed died.
2. **the agent's processes end** (:meth:`sandbox_runtime.contain.Calls.end_for_judge`): every
   process of the instance but pid 1, the runtime, the seed and the runtime's own forks of the
   instance is stopped (``SIGSTOP``, repeated until no new one appears), listed, then killed.
3. **a judge process per call**, forked by the seed: its own session, every inherited
   descriptor but the result pipe made ``/dev/null`` (no socket of the runtime), a fresh
   directory as ``HOME`` and another as ``TMPDIR``, the environment the instance started with
   (``PYTHON*``, ``LD_*``, ``PYTEST_*``, ``BASH_ENV``, ``ENV`` dropped unless the definition's
   ``deployConfig.env`` sets them), and a **copy of the workspace** as its working directory
   (``AENV_WORKSPACE``): regular files, directories and links only; FIFOs, sockets and device
   nodes are left out (``removed``), links whose target resolves outside the copy are removed
   (``links_out``), absolute links into the workspace point into the copy; holes of sparse
   files stay holes, and past :class:`WorkspaceLimits` the copy stops and the episode is graded
   0 with the limit named (``over_limit``: the agent's failure, never the judge's). Then a
   fresh ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (:func:`fresh_scratch_places`: a user and
   mount namespace of its own; where the host refuses, ``fresh_refused`` says so).
4. the reward runs there, validated against its own signature, and its value comes back as JSON
   on a pipe only the judge writes; the seed removes the judge's directory once it ended, and
   what the judge started ends with the call: the seed is a child subreaper, and kills every
   process that comes to it, whatever session it started (a browser's) or left.

What the judge did comes back with the value (:class:`aenv_ray.protocol.JudgeReport`). A judge
that cannot run raises :class:`aenv_ray.errors.JudgeUnavailableError`, never a reward.

May import: the standard library, orjson, pydantic and pydantic_core, ``aenv_ray`` and
:mod:`sandbox_runtime.contain`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import errno
import json
import os
import selectors
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson
import pydantic
import pydantic_core

from aenv_ray.errors import JudgeUnavailableError
from aenv_ray.protocol import MAX_RESPONSE_BYTES
from aenv_ray.registry import DefinitionRegistry, Registered
from sandbox_runtime import contain

__all__ = [
    "AGENT_PLACES",
    "DROPPED_VARIABLES",
    "Judge",
    "JudgeOutcome",
    "WorkspaceLimits",
    "WorkspaceTooLarge",
    "copy_workspace",
    "fresh_scratch_places",
    "judge_environment",
    "judge_ignored",
]

DROPPED_VARIABLES = (
    "PYTHON",
    "LD_",
    "PYTEST_",
    "BASH_ENV",
    "ENV",
    "PERL5",
    "NODE_OPTIONS",
    "XDG_",
    "FONTCONFIG_",
    "CHROME_",
    "CHROMIUM_",
    "GTK_",
    "GIO_",
)
"""Prefixes of the variables a judge never inherits (unless ``deployConfig.env`` sets them):
what makes an interpreter or the loader run code of someone's choosing, and what points a
program's settings elsewhere than the image and the judge's fresh home (``XDG_*`` directories,
fontconfig's and Chromium's settings)."""
AGENT_PLACES = ("/tmp", "/var/tmp", "/dev/shm")
"""Directories every agent may write: never on a judge's ``PATH`` (nor the instance's home,
temporary directory and workspace)."""
_MAX_MESSAGE = 64 << 20
_MAX_LISTED = 100  # processes, removed files, links named in the report (the counts are whole)
_PR_SET_DUMPABLE = 4
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_JUDGE_END_WAIT = 5.0  # seconds the seed waits for a judge it was told to end


def judge_environment(environ: Mapping[str, str], config_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a judge starts from: ``environ`` (what the instance started with) without
    :data:`DROPPED_VARIABLES`, then the definition's own ``config_env`` (``deployConfig.env``);
    ``PATH`` without its relative directories and those in a place the agent writes (its home,
    ``TMPDIR``, ``AENV_WORKSPACE``, :data:`AGENT_PLACES`): a program planted there, first on
    ``PATH``, would run in the judge's place. :func:`judge_ignored` names what was left out.

        >>> judge_environment({"PATH": "/bin", "PYTHONPATH": "/x", "LD_PRELOAD": "e.so"}, {})
        {'PATH': '/bin'}
        >>> judge_environment({"PYTHONPATH": "/x"}, {"PYTHONPATH": "/lib"})
        {'PYTHONPATH': '/lib'}
        >>> judge_environment({"HOME": "/w", "PATH": "/w/.local/bin:/tmp/b:bin:/usr/bin"}, {})
        {'HOME': '/w', 'PATH': '/usr/bin'}
    """
    return _environment_and_ignored(environ, config_env)[0]


def judge_ignored(
    environ: Mapping[str, str], config_env: Mapping[str, str]
) -> list[dict[str, str]]:
    """What :func:`judge_environment` left out: ``{"path", "type", "why"}`` for each variable
    (``type`` ``variable``, ``path`` its name) and each ``PATH`` directory (``PATH directory``).

        >>> judge_ignored({"HOME": "/w", "PATH": "/w/bin:/bin", "LD_PRELOAD": "e.so"}, {})[1]
        {'path': '/w/bin', 'type': 'PATH directory', 'why': 'in a place the agent writes (/w)'}
    """
    return _environment_and_ignored(environ, config_env)[1]


def _environment_and_ignored(
    environ: Mapping[str, str], config_env: Mapping[str, str]
) -> tuple[dict[str, str], list[dict[str, str]]]:
    kept: dict[str, str] = {}
    ignored: list[dict[str, str]] = []
    for name, value in environ.items():
        if name.startswith(DROPPED_VARIABLES) and name not in config_env:
            why = "it runs code or points settings elsewhere than the image"
            ignored.append({"path": name, "type": "variable", "why": why})
        elif not name.startswith(DROPPED_VARIABLES):
            kept[name] = value
    kept.update(config_env)
    if "PATH" in kept:
        places = [*AGENT_PLACES]
        places += [environ[k] for k in ("HOME", "TMPDIR", "AENV_WORKSPACE") if environ.get(k)]
        roots = [os.path.normpath(p) for p in places if os.path.isabs(p)]
        directories = []
        for directory in kept["PATH"].split(os.pathsep):
            place = next(
                (r for r in roots if r != "/" and _inside(os.path.normpath(directory), r)), None
            )
            if not os.path.isabs(directory):
                why = "a relative directory"
            elif place is not None:
                why = f"in a place the agent writes ({place})"
            else:
                directories.append(directory)
                continue
            ignored.append({"path": directory, "type": "PATH directory", "why": why})
        kept["PATH"] = os.pathsep.join(directories)
    return kept, ignored


# -- the workspace copy --------------------------------------------------------------------------
def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "other"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class WorkspaceLimits:
    """How much of a workspace the judge copies (``config.json``'s ``"reward"``:
    ``maxWorkspaceFiles``, ``maxWorkspaceBytes``, ``maxWorkspaceDepth``). A workspace past one
    of them is the agent's doing: the reward is not run, it is 0 with a ``reason`` naming the
    limit (:class:`WorkspaceTooLarge`), never a judge that cannot run.

    ``files``: entries (files, directories, links, the rest); ``bytes``: both the apparent size
    of the regular files (what a reader reads: a sparse file of 1 TiB counts 1 TiB) and what
    they occupy on disk; ``depth``: directories deep (and no path longer than 3,000 bytes).

        >>> WorkspaceLimits().files
        200000
    """

    files: int = 200_000
    bytes: int = 4 << 30
    depth: int = 128


_MAX_RELATIVE_PATH = 3000  # bytes: the copy's own prefix and PATH_MAX (4096) leave room for it


class WorkspaceTooLarge(Exception):
    """The agent's workspace is past a :class:`WorkspaceLimits`: ``limit`` (``files``,
    ``bytes``, ``allocated bytes``, ``depth`` or ``path length``; ``room``: more on disk than
    the judge's directory has room for, which the agent's own files took), ``cap``, and
    ``path`` where it was found past it."""

    def __init__(self, limit: str, cap: int, path: str, found: int) -> None:
        self.limit, self.cap, self.path, self.found = limit, cap, path, found
        what = {
            "files": "files and directories",
            "bytes": "bytes (apparent size of its files)",
            "allocated bytes": "bytes on disk",
            "room": "bytes on disk, more than the judge's directory has room for",
            "depth": "directories deep",
            "path length": "bytes in one path",
        }[limit]
        super().__init__(
            f"the workspace holds more than {cap} {what} (the judge's limit "
            f"`{_LIMIT_KEYS[limit]}`): {found} at {path!r}; the judge copied no more of it "
            "and graded the episode 0"
        )

    def report(self) -> dict[str, Any]:
        """``{"limit", "cap", "found", "path"}`` (the judge's report's ``over_limit``)."""
        return {"limit": self.limit, "cap": self.cap, "found": self.found, "path": self.path}


_LIMIT_KEYS = {
    "files": "maxWorkspaceFiles",
    "bytes": "maxWorkspaceBytes",
    "allocated bytes": "maxWorkspaceBytes",
    "room": "the instance's free room (its memory and disk sizes)",
    "depth": "maxWorkspaceDepth",
    "path length": "maxWorkspaceDepth",
}


def copy_workspace(
    source: str,
    target: str,
    *,
    skip: str | None = None,
    limits: WorkspaceLimits | None = None,
    room: int | None = None,
) -> dict[str, Any]:
    """Copy the workspace ``source`` into the new directory ``target`` as the judge sees it (see
    the module's docstring); ``skip``: a path under ``source`` not to copy (the judge's own
    scratch). Returns ``files``, ``bytes`` (apparent), ``allocated`` (bytes on disk of the
    copy: holes of sparse files stay holes), ``removed`` (``{"path", "type"}``) and
    ``links_out`` (``{"path", "target"}``), paths relative to the workspace. Past ``limits``
    (default :class:`WorkspaceLimits`) or past ``room`` bytes on disk (the free room where
    ``target`` is), it stops and raises :class:`WorkspaceTooLarge` before it copies what
    would pass them.

        >>> import tempfile, pathlib
        >>> ws = pathlib.Path(tempfile.mkdtemp())
        >>> for n in range(3): _ = (ws / f"f{n}").write_text("x")
        >>> copy_workspace(str(ws), str(ws) + "-copy", limits=WorkspaceLimits(files=2))
        Traceback (most recent call last):
        ...
        sandbox_runtime._judge.WorkspaceTooLarge: the workspace holds more than 2 files ...
    """
    limits = limits or WorkspaceLimits()
    source = os.path.realpath(source)
    removed: list[dict[str, str]] = []
    links: list[str] = []
    files = size = allocated = entries_seen = 0
    os.mkdir(target, 0o700)
    pending = [""]
    while pending:
        relative = pending.pop()
        here = os.path.join(source, relative) if relative else source
        depth = relative.count("/") + 1 if relative else 0
        if depth > limits.depth:
            raise WorkspaceTooLarge("depth", limits.depth, relative, depth)
        with os.scandir(here) as entries:
            for entry in entries:
                rel = os.path.join(relative, entry.name)
                full = os.path.join(source, rel)
                if skip is not None and full == skip:
                    continue
                entries_seen += 1
                if entries_seen > limits.files:
                    raise WorkspaceTooLarge("files", limits.files, rel, entries_seen)
                if len(os.fsencode(rel)) > _MAX_RELATIVE_PATH:
                    raise WorkspaceTooLarge(
                        "path length", _MAX_RELATIVE_PATH, rel[:200], len(os.fsencode(rel))
                    )
                dest = os.path.join(target, rel)
                status = entry.stat(follow_symlinks=False)
                mode = status.st_mode
                if stat.S_ISREG(mode):
                    if size + status.st_size > limits.bytes:
                        raise WorkspaceTooLarge("bytes", limits.bytes, rel, size + status.st_size)
                    on_disk = status.st_blocks * 512
                    if allocated + on_disk > limits.bytes:
                        raise WorkspaceTooLarge(
                            "allocated bytes", limits.bytes, rel, allocated + on_disk
                        )
                    if room is not None and allocated + on_disk > room:
                        raise WorkspaceTooLarge("room", room, rel, allocated + on_disk)
                if stat.S_ISLNK(mode):
                    link = os.readlink(full)
                    if os.path.isabs(link) and _inside(os.path.normpath(link), source):
                        link = os.path.join(target, os.path.relpath(os.path.normpath(link), source))
                    os.symlink(link, dest)
                    links.append(rel)
                elif stat.S_ISDIR(mode):
                    os.mkdir(dest, 0o700)
                    pending.append(rel)
                elif stat.S_ISREG(mode):
                    copied = _copy_file(full, dest, mode, limits.bytes - size)
                    if size + copied > limits.bytes:  # it grew since its stat
                        raise WorkspaceTooLarge("bytes", limits.bytes, rel, size + copied)
                    size += copied
                    allocated += os.lstat(dest).st_blocks * 512
                    files += 1
                else:
                    removed.append({"path": rel, "type": _kind(mode)})
        os.chmod(os.path.join(target, relative), stat.S_IMODE(os.stat(here).st_mode) | 0o700)
    links_out = _drop_links_out(target, links)
    return {
        "files": files,
        "bytes": size,
        "allocated": allocated,
        "removed": removed,
        "links_out": links_out,
    }


def _copy_file(source: str, dest: str, mode: int, room: int) -> int:
    """Copy one regular file (never through a link: ``O_NOFOLLOW``) in the kernel
    (``sendfile``), its data only: a hole of a sparse file (``SEEK_HOLE``) stays a hole; its
    mode kept, readable and writable by the judge. Returns its size (past ``room`` bytes it
    stops, and returns more than ``room``)."""
    reader = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        writer = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(writer, stat.S_IMODE(mode) | 0o600)
            end = os.fstat(reader).st_size
            if end > room:
                return end
            offset = 0
            while offset < end:
                try:
                    data = os.lseek(reader, offset, os.SEEK_DATA)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:  # ENXIO: only a hole is left
                        raise
                    break
                try:
                    hole = os.lseek(reader, data, os.SEEK_HOLE)
                except OSError:
                    hole = end
                os.lseek(writer, data, os.SEEK_SET)
                offset = data
                while offset < hole and (
                    sent := os.sendfile(writer, reader, offset, hole - offset)
                ):
                    offset += sent
                if offset < hole:  # shorter than its size said: it ended there
                    end = offset
                    break
            if offset > room:
                return offset
            os.ftruncate(writer, max(end, offset))
        finally:
            os.close(writer)
    finally:
        os.close(reader)
    return max(end, offset)


def _drop_links_out(target: str, links: list[str]) -> list[dict[str, str]]:
    """Remove every link of the copy whose target, resolved as the kernel would (through the
    copy's other links), is outside the copy; again until none is (a removal changes what
    other links resolve to)."""
    root = os.path.realpath(target)
    out: list[dict[str, str]] = []
    remaining = list(links)
    changed = True
    while changed:
        changed = False
        for rel in list(remaining):
            path = os.path.join(target, rel)
            if not _inside(os.path.realpath(path), root):
                out.append({"path": rel, "target": os.readlink(path)})
                os.unlink(path)
                remaining.remove(rel)
                changed = True
    return out


# -- a fresh /tmp, /var/tmp and /dev/shm -----------------------------------------------------------
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_FRESH_SIZE = "1g"  # each fresh place's tmpfs at most (its pages count as the instance's memory)


def _libc_call(name: str, *arguments: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*arguments) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _mount(source: str | None, target: str, kind: str | None, flags: int, data: str = "") -> None:
    def encode(value: str | None) -> bytes | None:
        return value.encode() if value is not None else None

    libc = ctypes.CDLL(None, use_errno=True)
    flags_c = ctypes.c_ulong(flags)
    if libc.mount(encode(source), encode(target), encode(kind), flags_c, encode(data)):
        code = ctypes.get_errno()
        raise OSError(code, f"mount {source or kind or ''} on {target}: {os.strerror(code)}")


def _kept_under_places(scratch: str, project: str, workspace: str) -> list[tuple[str, str]]:
    """What a judge's fresh places must still show of the ones they cover: ``(mode, path)``
    for its scratch (``rw``), the project and the directories Python imports from (``ro``;
    none in the agent's ``workspace``), those that lie in one of :data:`AGENT_PLACES`
    (resolved; directories that exist), outer paths first; a read-only one inside another is
    shown by that one. Nothing the agent wrote: the scratch is the judge's, made after the
    agent's processes ended; the project and Python are the image's."""
    ours = os.path.realpath(workspace)
    wanted = [("rw", scratch), ("ro", project)]
    wanted += [
        ("ro", p)
        for p in (sys.prefix, sys.base_prefix, *sys.path)
        if p and (ours == "/" or not _inside(os.path.realpath(p), ours))
    ]
    places = [os.path.realpath(p) for p in AGENT_PLACES]
    kept: dict[str, str] = {}
    for mode, path in wanted:
        real = os.path.realpath(path) if path else ""
        if (
            real
            and any(real != place and _inside(real, place) for place in places)
            and os.path.isdir(real)
        ):
            kept[real] = "rw" if kept.get(real) == "rw" else mode
    ordered: list[tuple[str, str]] = []
    for path in sorted(kept, key=lambda p: (p.count("/"), p)):
        if kept[path] == "ro" and any(_inside(path, outer) for _, outer in ordered):
            continue
        ordered.append((kept[path], path))
    return ordered


def fresh_scratch_places(keep: list[tuple[str, str]]) -> dict[str, Any]:
    """Give this process (single-threaded: a judge) an empty ``/tmp``, ``/var/tmp`` and
    ``/dev/shm`` of its own (:data:`AGENT_PLACES`): a user and mount namespace of its own (its
    uid and gid the same), a fresh tmpfs on each place, then each ``(mode, path)`` of ``keep``
    bound back at its own path (read-only for ``ro``), as the swe and terminal-bench judges do
    for the commands they run. What the agent planted at a fixed path there (a file, a FIFO, a
    fonts.conf, a Chromium profile) is out of sight; so is the agent's workspace when it lies
    there (the judge grades its copy).

    Returns ``{"places": [...], "kept": [...]}``; where the host refuses namespaces (no user
    namespaces, a seccomp profile that forbids them), ``{"places": [], "refused": why}``: the
    judge then grades on the instance's own places, and its report says so."""
    places = [p for p in AGENT_PLACES if os.path.isdir(p) and not os.path.islink(p)]
    opened: list[tuple[str, str, int]] = []
    mounted: list[str] = []
    entered = False
    try:
        uid, gid = os.geteuid(), os.getegid()
        _libc_call("unshare", ctypes.c_int(_CLONE_NEWUSER | _CLONE_NEWNS))
        entered = True
        # its /proc/self files are its own only while it is dumpable (the seed is not); no
        # process of the agent is left to trace it meanwhile
        _prctl(_PR_SET_DUMPABLE, 1)
        try:
            for name, line in (
                ("setgroups", "deny"),
                ("uid_map", f"{uid} {uid} 1"),
                ("gid_map", f"{gid} {gid} 1"),
            ):
                with open(f"/proc/self/{name}", "w") as handle:
                    handle.write(line)
        finally:
            _prctl(_PR_SET_DUMPABLE, 0)
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
        for mode, path in keep:  # opened in the new namespace: a bind's source must be in it
            opened.append((mode, path, os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)))
        for place in places:
            _mount(
                "judge-tmp", place, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode=1777,size={_FRESH_SIZE}"
            )
            mounted.append(place)
        for mode, path, fd in opened:
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
            mounted.append(path)
            if mode == "ro":
                noexec = _MS_NOEXEC if os.statvfs(path).f_flag & os.ST_NOEXEC else 0
                flags = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | noexec
                _mount(None, path, None, flags)
    except OSError as exc:
        for path in reversed(mounted):  # back to the instance's places, as they were
            with contextlib.suppress(OSError):
                _libc_call("umount2", path.encode(), ctypes.c_int(_MNT_DETACH))
        where = "in a user namespace of its own" if entered else "a user namespace"
        return {
            "places": [],
            "refused": f"the judge could not get {where} with a fresh "
            f"{', '.join(places)} ({exc}); it graded on the instance's own",
        }
    finally:
        for _, _, fd in opened:
            os.close(fd)
    return {"places": places, "kept": [path for _, path in keep]}


_ROOM_MARGIN = 16 << 20  # bytes of the judge's directory's filesystem the copy leaves free


def _room(directory: str) -> int | None:
    """How many bytes a copy into ``directory`` may take: its filesystem's free room, less a
    margin for the reward's own files; None when it cannot be told."""
    try:
        found = os.statvfs(directory)
    except OSError:
        return None
    return max(0, found.f_bavail * found.f_frsize - _ROOM_MARGIN)


def _scratch_base(workspace: str, limits: WorkspaceLimits) -> str | None:
    """Where the judge's scratch goes: the temporary directory, unless the workspace would not
    fit there while it fits its own filesystem (then a hidden directory in the workspace, left
    out of the copy); None: the temporary directory. What the workspace needs is what its files
    occupy on disk (a sparse file's holes are copied as holes), counted up to ``limits`` (past
    them, the copy stops anyway)."""
    try:
        need = seen = 0
        for directory, subdirectories, names in os.walk(workspace):
            for name in names:
                with contextlib.suppress(OSError):
                    need += os.lstat(os.path.join(directory, name)).st_blocks * 512
                seen += 1
                if seen > limits.files or need > limits.bytes:
                    break
            if seen > limits.files or need > limits.bytes:
                need = min(need, limits.bytes)
                break
            seen += len(subdirectories)
        tmp = os.statvfs(tempfile.gettempdir())
        room_tmp = tmp.f_bavail * tmp.f_frsize
        if room_tmp > 2 * need + (16 << 20):
            return None
        own = os.statvfs(workspace)
        if own.f_bavail * own.f_frsize > room_tmp:
            return workspace
    except OSError:
        return None
    return None


# -- the seed's channel: length-prefixed JSON, descriptors with the first byte --------------------
def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = orjson.dumps(message)
    framed = struct.pack("!Q", len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [framed], fds)
        framed = framed[sent:]
    if framed:
        sock.sendall(framed)


def _receive(sock: socket.socket, *, fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (None at the end of the channel) and the descriptors that came with it."""
    got: list[int] = []
    head = b""
    while len(head) < 8:
        if fds and not got:
            chunk, got, _, _ = socket.recv_fds(sock, 8 - len(head), fds)
        else:
            chunk = sock.recv(8 - len(head))
        if not chunk:
            for fd in got:
                os.close(fd)
            return None, []
        head += chunk
    (length,) = struct.unpack("!Q", head)
    if length > _MAX_MESSAGE:
        raise ValueError(f"a judge message of {length} bytes")
    body = bytearray()
    while len(body) < length:
        chunk = sock.recv(min(1 << 20, length - len(body)))
        if not chunk:
            return None, got
        body += chunk
    value = orjson.loads(bytes(body))
    return (value if isinstance(value, dict) else None), got


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(value), 0, 0, 0)


def _only_descriptors(keep: set[int]) -> None:
    """Every open descriptor but ``keep`` and stdout/stderr becomes ``/dev/null`` (``dup2``
    keeps the numbers taken, so Python objects that own them close ``/dev/null`` later)."""
    null = os.open("/dev/null", os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd in (1, 2, null):
                continue
            with contextlib.suppress(OSError):
                os.dup2(null, fd, inheritable=fd == 0)
    finally:
        os.close(null)


# -- the seed ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _SeedState:
    """What a seed holds: the loaded environment and the judge's environment."""

    registry: DefinitionRegistry
    environment: dict[str, str]
    workspace: str
    env_ref: str
    limits: WorkspaceLimits = WorkspaceLimits()
    project: str = ""


def _seed_loop(state: _SeedState, channel: socket.socket) -> NoReturn:
    """The seed: fork one judge per request until the runtime's end of the channel closes."""
    code = 0
    try:
        while True:
            try:
                request, fds = _receive(channel, fds=1)
            except (OSError, ValueError):
                request, fds = None, []
            if request is None or len(fds) != 1:
                break
            result = fds[0]
            scratch = _make_scratch(state)
            pid = os.fork()
            if pid == 0:
                channel.close()
                _judge_main(state, request, result, scratch)
            os.close(result)
            _send(channel, {"pid": pid})
            _, status = os.waitpid(pid, 0)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # what it left in its session
            _end_orphans()  # and in sessions of their own (a browser): they came to the seed
            if isinstance(scratch, str):  # here, not in the judge: a judge killed leaves none
                shutil.rmtree(scratch, ignore_errors=True)
            _send(channel, {"exit": os.waitstatus_to_exitcode(status)})
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _end_orphans() -> None:
    """Kill and reap every process left under the seed: what a judge started and left behind,
    in whatever session, comes to the seed (a child subreaper) when its parent ends; killed
    again until none is left (a process killed leaves its own children to the seed)."""
    me = os.getpid()
    while True:
        left = []
        for name in os.listdir("/proc"):
            if name.isdigit() and (found := contain.process_stat(name)) and found[0] == me:
                left.append(int(name))
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)


def _become_seed(state: _SeedState, channel: socket.socket) -> NoReturn:
    """In the process that will be the seed: its own descriptors, default signals, dying with
    the runtime, and the reaper of what its judges leave."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        signal.set_wakeup_fd(-1)
    _only_descriptors({channel.fileno()})
    _seed_loop(state, channel)


def _make_scratch(state: _SeedState) -> str | OSError:
    """A new directory for one judge (its home, temporary directory and copy), in the
    judge's temporary directory or, where the workspace does not fit there, in the workspace;
    or why it could not be made."""
    with _environment(state.environment):
        base = _scratch_base(state.workspace, state.limits)
        try:
            return tempfile.mkdtemp(prefix=".aenv-judge-" if base else "aenv-judge-", dir=base)
        except OSError as exc:
            return exc


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """``os.environ`` (and so ``tempfile``'s choice of directory) as ``variables`` inside."""
    before = dict(os.environ)
    os.environ.clear()
    os.environ.update(variables)
    tempfile.tempdir = None
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)
        tempfile.tempdir = None


# -- one judge ---------------------------------------------------------------------------------
def _judge_main(
    state: _SeedState, request: dict[str, Any], result: int, scratch: str | OSError
) -> NoReturn:
    """In the judge process: its context, then the reward; the answer goes to ``result``.
    ``scratch``: its directory (the seed made it, and removes it), or why there is none."""
    answer: dict[str, Any]
    try:
        os.setsid()
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        os.set_inheritable(result, False)
        _only_descriptors({result})
        workspace = state.workspace
        os.environ.clear()
        os.environ.update(state.environment)
        tempfile.tempdir = None
        if isinstance(scratch, OSError):
            raise _Unavailable(
                f"the judge could not make its directory: {scratch}; give the instance more "
                "room in its temporary directory"
            )
        home, tmp = os.path.join(scratch, "home"), os.path.join(scratch, "tmp")
        os.mkdir(home, 0o700)
        os.mkdir(tmp, 0o700)
        copy = os.path.join(scratch, "workspace")
        try:
            copied = copy_workspace(
                workspace,
                copy,
                skip=os.path.realpath(scratch),
                limits=state.limits,
                room=_room(scratch),
            )
        except WorkspaceTooLarge as exc:  # the agent's doing: graded 0, the reward not run
            shutil.rmtree(copy, ignore_errors=True)
            answer = {
                "ok": True,
                "value": {"reward": 0.0, "reason": str(exc)},
                "over_limit": exc.report(),
            }
            raise _Answered(answer) from None
        except OSError as exc:
            raise _Unavailable(
                f"the judge could not copy the workspace {workspace} into {scratch}: {exc}; "
                + (
                    "give the instance more room (the temporary directory and the workspace)"
                    if exc.errno == errno.ENOSPC
                    else "make every file of the workspace readable by the runtime"
                )
            ) from None
        kept = _kept_under_places(scratch, state.project, workspace)
        fresh = fresh_scratch_places(kept)
        if contain._confining:  # the runtime confines what it starts: so is the judge
            contain.confine_self()
        os.environ.update(HOME=home, TMPDIR=tmp, AENV_WORKSPACE=copy, PWD=copy)
        tempfile.tempdir = None
        os.chdir(copy)
        answer = {"ok": True, "copy": copied, "fresh": fresh}
        answer["value"] = _call(state.registry.reward, request.get("arguments"))
    except _Answered as given:
        answer = given.answer
    except _Unavailable as exc:
        answer = {"ok": False, "unavailable": str(exc)}
    except _Invalid as exc:
        answer = {"ok": False, "invalid": str(exc)}
    except BaseException as exc:
        name = getattr(exc, "original_type", type(exc).__name__)
        answer = {"ok": False, "type": name, "message": f"{type(exc).__name__}: {exc}"}
    try:
        data = orjson.dumps(answer)
    except TypeError as exc:
        data = orjson.dumps({"ok": False, "type": "TypeError", "message": f"not JSON: {exc}"})
    with contextlib.suppress(OSError):
        view = memoryview(struct.pack("!Q", len(data)) + data)
        while view:
            view = view[os.write(result, view) :]
    os._exit(0)


class _Unavailable(Exception):
    """The judge could not grade (not the reward's failure)."""


class _Answered(Exception):
    """The judge has its answer without running the reward (a workspace past its limits)."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__("answered")
        self.answer = answer


class _Invalid(Exception):
    """The arguments do not fit the reward's signature."""


def _call(entry: Registered | None, arguments: Any) -> Any:
    if entry is None:
        raise _Unavailable("the judge's copy of the environment registers no reward")
    try:
        kwargs = entry.signature.validate(arguments or {})
    except pydantic.ValidationError as exc:
        raise _Invalid(str(exc)) from None
    value = entry.fn(**kwargs)
    if asyncio.iscoroutine(value):
        value = asyncio.run(value)
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    return pydantic_core.to_jsonable_python(value)


# -- the runtime's side ------------------------------------------------------------------------
@dataclass(frozen=True)
class JudgeOutcome:
    """What one judge call gave: the reward's ``value`` (when ``error`` is None), or ``error``
    (``(kind, message)``: ``"raised"``, ``"invalid"`` or ``"timeout"``), and ``report`` (what
    the judge did: :class:`aenv_ray.protocol.JudgeReport`'s fields)."""

    value: Any
    error: tuple[str, str] | None
    report: dict[str, Any]


class Judge:
    """The runtime's handle on its judge seed (one per runtime; calls are serialised)."""

    def __init__(
        self,
        registry: DefinitionRegistry,
        *,
        project: str,
        env_ref: str,
        environment: dict[str, str],
        workspace: str,
        ignored: list[dict[str, str]] | None = None,
        limits: WorkspaceLimits | None = None,
    ) -> None:
        self.registry = registry
        self.limits = limits or WorkspaceLimits()
        """How much of the workspace the judge copies (past it: reward 0, ``over_limit``)."""
        self.ignored = list(ignored or [])
        """What of the instance's environment the judge left out (:func:`judge_ignored`)."""
        self.project = project
        self.env_ref = env_ref
        self.environment = environment
        self.workspace = workspace
        self.pid: int | None = None
        self.source = "none"
        self._channel: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._exit_pending = False  # the seed's word on the last judge's end is still unread
        self._lock = threading.Lock()

    # seeds
    def start(self, *, pristine: bool) -> None:
        """Start the seed: forked from this process when it is ``pristine`` (nothing ran in it:
        call before the runtime's threads start), else a fresh interpreter."""
        if pristine:
            self._fork_seed()
        else:
            self._exec_seed()

    def _fork_seed(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        state = _SeedState(
            self.registry,
            self.environment,
            self.workspace,
            self.env_ref,
            self.limits,
            self.project,
        )
        with contain.runtime_fork():
            pid = os.fork()
            if pid == 0:
                ours.close()
                _become_seed(state, theirs)
        theirs.close()
        self._channel, self.pid, self.source = ours, pid, "forked"

    def _exec_seed(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        settings = {
            "project": self.project,
            "environment": self.environment,
            "workspace": self.workspace,
            "limits": dataclasses.asdict(self.limits),
            "fd": theirs.fileno(),
        }
        command = [sys.executable, "-I", "-c", _FRESH_SEED, json.dumps(settings)]
        tracker = contain.calls()
        spared = tracker.spared() if tracker is not None else contextlib.nullcontext()
        try:
            with spared, contain.runtime_fork():
                process = subprocess.Popen(
                    command,
                    pass_fds=(theirs.fileno(),),
                    env=self.environment,
                    cwd="/",
                    stdin=subprocess.DEVNULL,
                    start_new_session=False,
                )
        except OSError as exc:
            ours.close()
            raise JudgeUnavailableError(
                f"the judge of `{self.env_ref}` cannot start a fresh interpreter "
                f"({sys.executable}): {exc}; replace the instance",
                env_name=self.env_ref,
            ) from exc
        finally:
            theirs.close()
        self._channel, self._process, self.pid = ours, process, process.pid
        self.source = "fresh interpreter"

    def _alive(self) -> bool:
        if self.pid is None or self._channel is None:
            return False
        found = contain.process_stat(str(self.pid))
        return found is not None and found[2] not in (b"Z", b"X")

    def close(self) -> None:
        """End the seed (idempotent)."""
        self._exit_pending = False
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None
        elif self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(self.pid, 0)
        self.pid = None

    # one call
    def run(self, arguments: Any, *, deadline: float, label: str) -> JudgeOutcome:
        """End the agent's processes, then grade ``arguments`` in a fresh judge; blocking
        (run it on a thread). Raises :class:`JudgeUnavailableError` when no judge can run."""
        with self._lock:
            started = time.monotonic()
            if self._exit_pending and self._judge_ended() is None:
                self.close()  # the last judge never ended: a fresh seed below
            tracker = contain.calls() or contain.Calls(whole_namespace=os.getpid() <= 2)
            spare = {self.pid} if self._alive() and self.pid is not None else set()
            ended = tracker.end_for_judge(spare=spare)
            if not self._alive():
                restarted = self.pid is not None
                self.close()
                self._exec_seed()
                self.source = "fresh interpreter (the seed was gone)" if restarted else self.source
            answer, pid, timed_out = self._ask(arguments, deadline, label)
            report = {
                "killed": len(ended),
                "processes": [{"pid": p, "command": c} for p, c in ended[:_MAX_LISTED]],
                "scope": "pid namespace" if tracker.whole_namespace else "descendants",
                "seed": self.source,
                "judge_pid": pid,
                "ignored": self.ignored[:_MAX_LISTED],
                "seconds": round(time.monotonic() - started, 4),
            }
        raw = answer.get("copy")
        copied: dict[str, Any] = raw if isinstance(raw, dict) else {}
        raw_fresh = answer.get("fresh")
        fresh: dict[str, Any] = raw_fresh if isinstance(raw_fresh, dict) else {}
        report["fresh_places"] = list(fresh.get("places", []))
        report["fresh_kept"] = list(fresh.get("kept", []))[:_MAX_LISTED]
        if fresh.get("refused"):
            report["fresh_refused"] = str(fresh["refused"])
        for key in ("files", "bytes", "allocated"):
            report[f"workspace_{key}"] = int(copied.get(key, 0))
        if isinstance(answer.get("over_limit"), dict):
            report["over_limit"] = answer["over_limit"]
        report["removed"] = list(copied.get("removed", []))[:_MAX_LISTED]
        report["links_out"] = list(copied.get("links_out", []))[:_MAX_LISTED]
        if timed_out:
            return JudgeOutcome(None, ("timeout", ""), report)
        if answer.get("ok") is True:
            return JudgeOutcome(answer.get("value"), None, report)
        if "unavailable" in answer:
            raise JudgeUnavailableError(
                f"{label} of `{self.env_ref}`: {answer['unavailable']}", env_name=self.env_ref
            )
        if "invalid" in answer:
            return JudgeOutcome(None, ("invalid", str(answer["invalid"])), report)
        message = f"{answer.get('message', 'no message')}"
        return JudgeOutcome(None, ("raised", message), report | {"error_type": answer.get("type")})

    def _ask(self, arguments: Any, deadline: float, label: str) -> tuple[dict[str, Any], int, bool]:
        channel = self._channel
        if channel is None:
            raise self._gone(label, "it has no seed")
        read, write = os.pipe()
        try:
            try:
                _send(channel, {"arguments": arguments}, [write])
                os.close(write)
                write = -1
                reply, _ = _receive(channel)
            except OSError as exc:
                raise self._gone(label, f"its seed does not answer ({exc})") from exc
            if reply is None or not isinstance(reply.get("pid"), int):
                raise self._gone(label, "its seed ended before it started a judge")
            pid = int(reply["pid"])
            data, timed_out = _read_until(read, deadline)
            if timed_out:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            ended: dict[str, Any] | None = None
            if data and not timed_out:
                self._exit_pending = True  # read before the next call: no wait for its exit
            else:
                ended = self._judge_ended()
        finally:
            os.close(read)
            if write >= 0:
                os.close(write)
        if timed_out:
            return {}, pid, True
        if not data:
            status = ended.get("exit") if ended else None
            raise JudgeUnavailableError(
                f"{label} of `{self.env_ref}`: the judge process ended (status {status}) "
                "without an answer; it was killed (the instance's memory limit?) or the reward "
                "ended its own process; give the instance more memory or look at the reward",
                env_name=self.env_ref,
            )
        try:
            answer = orjson.loads(data)
        except orjson.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise JudgeUnavailableError(
                f"{label} of `{self.env_ref}`: the judge's answer is not JSON",
                env_name=self.env_ref,
            )
        return answer, pid, False

    def _judge_ended(self) -> dict[str, Any] | None:
        """The seed's word that the last judge ended (``{"exit": status}``); None when the
        seed says nothing within ``_JUDGE_END_WAIT`` seconds."""
        channel = self._channel
        self._exit_pending = False
        if channel is None:
            return None
        channel.settimeout(_JUDGE_END_WAIT)
        try:
            ended, _ = _receive(channel)
        except (OSError, ValueError):
            ended = None
        finally:
            channel.settimeout(None)
        return ended

    def _gone(self, label: str, why: str) -> JudgeUnavailableError:
        self.close()
        return JudgeUnavailableError(
            f"{label} of `{self.env_ref}` cannot run in the judge: {why}; the next call starts a "
            "fresh seed, or replace the instance",
            env_name=self.env_ref,
        )


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """The judge's answer on ``fd`` (8 bytes of length, then that many): ``(data, False)``;
    ``(b"", False)`` when the pipe ended first; ``(.., True)`` at ``deadline``. Its length
    ends the read, not the pipe's end: a process the reward forked may still hold the pipe."""
    data = bytearray()
    length: int | None = None
    with selectors.DefaultSelector() as watch:
        watch.register(fd, selectors.EVENT_READ)
        while length is None or len(data) < length + 8:
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(data), True
            if not watch.select(left):
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"", False
            data += chunk
            if length is None and len(data) >= 8:
                (length,) = struct.unpack("!Q", data[:8])
                if length > MAX_RESPONSE_BYTES + (1 << 20):
                    return b"", False
    return bytes(data[8 : 8 + length]), False


_FRESH_SEED = "import sys; from sandbox_runtime._judge import fresh_seed; fresh_seed(sys.argv[1])"


def fresh_seed(arguments: str) -> NoReturn:
    """A seed in a fresh interpreter (``python -I -c``, :data:`_FRESH_SEED`): it loads the
    project, then serves as a forked seed does. ``arguments``: JSON of ``project``,
    ``environment``, ``workspace`` and ``fd`` (its end of the channel)."""
    settings = json.loads(arguments)
    channel = socket.socket(fileno=int(settings["fd"]))
    os.chdir("/")
    from sandbox_runtime._loader import load_project

    sys.argv = ["sandbox_runtime"]
    project = load_project(settings["project"])
    state = _SeedState(
        project.registry,
        dict(settings["environment"]),
        str(settings["workspace"]),
        project.config.ref,
        WorkspaceLimits(**settings.get("limits", {})),
        str(settings["project"]),
    )
    _become_seed(state, channel)
