"""harbor-pod: a Harbor task's machine on Kubernetes, where the pod is the box.

The pod's second container (``datasource``) runs the task's own image, built with aenv-ray's
Harbor layer (:mod:`aenv_harbor.kube`), and aenv-ray's exec helper (``aenv-exec``, placed by the
pod's init container). This runtime, in the pod's first container, serves the same functions as
the local engine's ``harbor-box`` and relays each to the helper through
:mod:`aenv_ray.datasource`:

- ``harbor_exec(command, cwd, env, timeout_sec, no_network, stdin_key, stdout_key, run_id)``:
  ``bash -c command`` (``sh -c`` where the image has no bash) in the task's container, in
  ``cwd`` (exit 126 with the shell's message when it is not a directory), with the image's
  environment plus ``env``; past ``timeout_sec`` the command's process group is killed.
  ``{"stdout", "stderr", "return_code", "timed_out"}``.
- ``harbor_kill(run_id)``: end a running command (its caller gave up).
- ``harbor_stage`` / ``harbor_unstage`` / ``harbor_drop``: bytes in chunks between the caller and
  a staging file in *this* container's private ``/tmp``, given to a command as its stdin or
  filled with its stdout: the task's container never sees a staged file, so nothing running
  there (the agent's leftovers) can change the tests on their way in or the verifier's output
  on its way out.

The helper's socket is pinned: its inode is noted at the first call and checked before and
after each connection, so a socket bound in its place by a process of the task's container is
refused (:class:`SocketReplacedError`) instead of being trusted with the verifier's commands.
"""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

from aenv_ray import datasource, register_function
from aenv_ray.errors import AEnvError, DatasourceTimeoutError

MAX_CHUNK = 8 << 20
MAX_OUTPUT = datasource.MAX_OUTPUT
MAX_TIMEOUT = 24 * 3600.0 - 60  # under a call's limit of a day, with the helper's grace
STAGE = Path(os.environ.get("TMPDIR") or "/tmp") / "aenv-harbor-stage"
# cd into the directory, then run the command with bash (sh where the image has none)
_INNER = (
    'cd -- "$1" || exit 126; '
    'if command -v bash >/dev/null 2>&1; then exec bash -c "$2"; else exec sh -c "$2"; fi'
)
_running: dict[str, asyncio.Task[datasource.CommandResult]] = {}
_pinned: list[tuple[int, int]] = []


class SocketReplacedError(AEnvError):
    """The exec helper's socket is not the one this runtime first talked to: a process of the
    task's container replaced it. Nothing more is run there (the trial's verdict would come
    from whoever bound it)."""


def _stage(key: str) -> Path:
    if not key or not key.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"a staging key is letters, digits, - and _: {key!r}")
    STAGE.mkdir(mode=0o700, exist_ok=True)
    return STAGE / key


def _socket_identity() -> tuple[int, int]:
    path = datasource.Datasource().socket
    if path is None:
        raise AEnvError("harbor-pod runs only in a DualContainer pod (no exec helper socket)")
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return (0, 0)  # not there yet: the helper is starting (the call waits for it)
    return (found.st_dev, found.st_ino)


def _check_socket() -> None:
    now = _socket_identity()
    if now == (0, 0):
        return
    if not _pinned:
        _pinned.append(now)
    elif _pinned[0] != now:
        raise SocketReplacedError(
            "the exec helper's socket in the task's container was replaced since this pod's "
            "first command (a process there bound its own): refusing to run more commands or "
            "to trust what they print; the trial cannot be graded"
        )


@register_function(timeout=86400.0)
async def harbor_exec(
    command: str,
    cwd: str = "/",
    env: dict[str, str] | None = None,
    timeout_sec: float | None = None,
    no_network: bool = False,
    stdin_key: str | None = None,
    stdout_key: str | None = None,
    run_id: str | None = None,
) -> dict[str, object]:
    """Run ``command`` in the task's container (see the module docstring). ``no_network`` is
    refused: a pod's network is the pod's (the provider tells Harbor so)."""
    if no_network:
        raise AEnvError("harbor-pod cannot take a command off the network: the pod has one")
    stdin = await asyncio.to_thread(_stage(stdin_key).read_bytes) if stdin_key else b""
    timeout = min(float(timeout_sec), MAX_TIMEOUT) if timeout_sec else MAX_TIMEOUT
    _check_socket()
    call = asyncio.ensure_future(
        datasource.run(
            ["/bin/sh", "-c", _INNER, "harbor", cwd, command],
            env=env or {},
            stdin=stdin,
            timeout=timeout,
            max_output=MAX_OUTPUT,
        )
    )
    if run_id:
        _running[run_id] = call
    timed_out = False
    try:
        result = await call
    except DatasourceTimeoutError as exc:
        timed_out = True
        result = getattr(exc, "result", None) or datasource.CommandResult(argv=(), returncode=-9)
    finally:
        if run_id:
            _running.pop(run_id, None)
    _check_socket()
    if stdout_key:
        if result.stdout_truncated:
            raise AEnvError(f"the command's output is over {MAX_OUTPUT >> 20} MiB: too much")
        await asyncio.to_thread(_stage(stdout_key).write_bytes, result.stdout)
    return {
        "stdout": "" if stdout_key else result.stdout_text,
        "stderr": result.stderr_text,
        "return_code": result.returncode,
        "timed_out": timed_out,
    }


@register_function
def harbor_kill(run_id: str) -> bool:
    """End the running command ``run_id``: its connection to the helper closes, and the helper
    kills its process group."""
    call = _running.get(run_id)
    if call is None:
        return False
    call.cancel()
    return True


@register_function
def harbor_stage(key: str, data: str, append: bool = False) -> int:
    """Write (or append) base64 ``data`` to the staging file ``key``; its size after."""
    path = _stage(key)
    with open(path, "ab" if append else "wb") as file:
        file.write(base64.b64decode(data))
    return path.stat().st_size


@register_function
def harbor_unstage(key: str, offset: int = 0, size: int = MAX_CHUNK) -> dict[str, object]:
    """``size`` bytes (at most 8 MiB) of the staging file ``key`` from ``offset``, base64, and
    the file's whole size."""
    path = _stage(key)
    with open(path, "rb") as file:
        file.seek(offset)
        chunk = file.read(min(size, MAX_CHUNK))
    return {"data": base64.b64encode(chunk).decode(), "total": path.stat().st_size}


@register_function
def harbor_drop(key: str) -> bool:
    """Remove the staging file ``key``."""
    path = _stage(key)
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed
