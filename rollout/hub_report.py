"""A run's records mirrored to a hub while its driver writes them (:class:`HubReporter`).

``aenv rollout`` against a hub (``AENV_SYSTEM_URL``) mirrors its run there, so that the hub's
Environment Center lists it, live, next to the environments it runs (the contract:
:mod:`aenv_ray.hubruns`). The reporter is a thread of its own with its own event loop: it
registers the run (its ``run.json`` and driver), then follows ``trajectories.jsonl`` as a
reader would, sending complete lines from the offset the hub holds, and a heartbeat every
:data:`~aenv_ray.hubruns.BEAT_EVERY` seconds while nothing new is written; at the end it sends
the rest and ends the run. It never stops the rollout: a hub that does not answer gets one
warning and is tried again; a hub without ``/v1/runs`` one warning, and nothing more.

The hub's run id is kept in the run directory (:data:`LOCAL`), so a resumed run (the same
``--out``, the same hub) goes on in the same hub run; a ``trajectories.jsonl`` rewritten in
place (``--retry-failed`` compacts it) is sent again from its start.

May import: the standard library, ``aenv_ray``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from aenv_ray.errors import AEnvError, ConfigurationError, HubUnreachableError
from aenv_ray.hubruns import BEAT_EVERY, MAX_POST

__all__ = ["LOCAL", "HubReporter"]

log = logging.getLogger("rollout.hub_report")

LOCAL = "hub.json"
"""In the run directory: ``{"url", "id", "file"}``, the hub run this directory is mirrored to
(``file``: the identity of the ``trajectories.jsonl`` it copied)."""

JSONL = "trajectories.jsonl"
_SECRET_OPTION = re.compile(r"(--api-key(?:=|\s+))\S+")


def _driver(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """Who drives the run (pid, host, started, command), the command without the value of an
    ``--api-key``."""
    driver = dict(given or {})
    if isinstance(driver.get("command"), str):
        driver["command"] = _SECRET_OPTION.sub(r"\1***", driver["command"])
    return driver


def _identity(path: Path) -> str | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return f"{stat.st_dev}:{stat.st_ino}"


class HubReporter:
    """Mirrors the run directory ``directory`` to the hub at ``url`` (as ``api_key``'s
    tenant) while it is open: :meth:`start`, then :meth:`close` (or ``with``). ``driver``:
    who drives the run (:attr:`rollout.run_directory.RunDirectory.holder`'s fields: the
    reporter never opens ``rollout.lock``, whose closing would drop the driver's lock);
    ``warn`` gets each problem worth a user's eye (once per kind); ``every``: seconds between
    looks at the records."""

    def __init__(
        self,
        directory: Path,
        url: str,
        api_key: str | None,
        *,
        name: str | None = None,
        driver: Mapping[str, Any] | None = None,
        every: float = 0.5,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.driver = _driver(driver)
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.name = name or self.directory.name
        self.every = every
        self.warn = warn or (lambda message: log.warning(message))
        self.run_id: str | None = None
        self.opened = threading.Event()  # set once the run is registered (or cannot be)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    # -- life ----------------------------------------------------------------------------------
    def start(self, *, wait: float = 10.0) -> str | None:
        """Start mirroring; the hub's id of the run once registered (None: not within ``wait``
        seconds, or the hub refused; the records are then sent once it answers)."""
        self._thread = threading.Thread(target=self._main, name="aenv-hub-report", daemon=True)
        self._thread.start()
        self.opened.wait(wait)
        return self.run_id

    def close(self, *, wait: float = 30.0) -> None:
        """Send what is left, end the run on the hub, stop (waiting at most ``wait`` s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)
            self._thread = None

    def __enter__(self) -> HubReporter:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            self.warn(message)

    # -- the thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            asyncio.run(self._mirror())
        except Exception as exc:  # never the rollout's problem: said, and the mirror stops
            self._once("crash", f"the run's mirror on {self.url} stopped: {exc}")
        finally:
            self.opened.set()

    async def _mirror(self) -> None:
        from aenv_ray.hub import HubClient

        async with HubClient(self.url, api_key=self.api_key, timeout=30.0) as hub:
            opened = await self._open(hub)
            self.opened.set()
            if opened is None:
                return
            received, reset = opened
            beat = 0.0
            loop = asyncio.get_running_loop()
            while True:
                stopping = self._stop.is_set()  # read before the file: the last look is whole
                try:
                    received, reset, sent = await self._send(hub, received, reset)
                except HubUnreachableError as exc:
                    self._once(
                        "unreachable", f"the hub does not answer; the run's mirror lags: {exc}"
                    )
                    sent = False
                except AEnvError as exc:
                    self._once("refused", f"the hub refused the run's records: {exc}")
                    return
                now = loop.time()
                if not sent and now - beat >= BEAT_EVERY and not stopping:
                    with contextlib.suppress(HubUnreachableError):
                        await hub.send_run_records(self._id(), received, b"")
                    beat = now
                elif sent:
                    beat = now
                if stopping and not sent:
                    break
                if not sent:
                    await asyncio.to_thread(self._stop.wait, self.every)
            with contextlib.suppress(AEnvError):
                await hub.end_run(self._id())

    def _id(self) -> str:
        assert self.run_id is not None
        return self.run_id

    async def _open(self, hub: Any) -> tuple[int, bool] | None:
        """Register (or take up) the run; ``(the offset to send from, whether the hub's copy
        starts again)``, or None when the hub will not take it."""
        local = self.directory / LOCAL
        known: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(local.read_text())
            if isinstance(loaded, dict) and loaded.get("url") == self.url:
                known = loaded
        try:
            settings = json.loads((self.directory / "run.json").read_text())
        except (OSError, ValueError):
            settings = {}
        record: dict[str, Any] | None = None
        while record is None:
            try:
                record = await hub.open_run(
                    self.name,
                    settings=settings if isinstance(settings, dict) else {},
                    driver=self.driver,
                    run_id=known.get("id"),
                )
            except HubUnreachableError as exc:
                self._once("unreachable", f"the hub does not answer; the run's mirror lags: {exc}")
                self.opened.set()
                if self._stop.wait(BEAT_EVERY):
                    return None
            except AEnvError as exc:
                if known.get("id") and not isinstance(exc, ConfigurationError):
                    known = {}  # that run is gone from the hub: a new one
                    continue
                self._once("refused", f"the hub keeps no copy of this run: {exc}")
                return None
        self.run_id = str(record["id"])
        identity = _identity(self.directory / JSONL)
        received = int(record.get("received") or 0)
        try:
            size = (self.directory / JSONL).stat().st_size
        except FileNotFoundError:
            size = 0
        reset = bool(known) and (known.get("file") != identity or size < received)
        tmp = local.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": self.url, "id": self.run_id, "file": identity}) + "\n")
        os.replace(tmp, local)
        return (0, True) if reset else (received, False)

    async def _send(self, hub: Any, received: int, reset: bool) -> tuple[int, bool, bool]:
        """Send the complete lines past ``received`` (a part at most :data:`MAX_POST` bytes
        long); ``(received, reset, whether anything was sent)``."""
        jsonl = self.directory / JSONL
        identity = _identity(jsonl)
        if identity is None:
            return received, reset, False
        known = json.loads((self.directory / LOCAL).read_text()).get("file")
        if known != identity:  # rewritten in place: the hub's copy starts again
            (self.directory / LOCAL).write_text(
                json.dumps({"url": self.url, "id": self.run_id, "file": identity}) + "\n"
            )
            received, reset = 0, True
        data = await asyncio.to_thread(self._read, jsonl, received)
        if not data and not reset:
            return received, reset, False
        answer = await hub.send_run_records(self._id(), received, data, reset=reset)
        return int(answer["received"]), False, bool(data) or reset

    def _read(self, jsonl: Path, offset: int) -> bytes:
        with jsonl.open("rb") as file:
            file.seek(offset)
            chunk = file.read(MAX_POST)
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) == MAX_POST:
                self._once(
                    "long",
                    f"a record of {jsonl} is over {MAX_POST} bytes, more than the hub takes in "
                    "one post: the hub's copy stops before it",
                )
            return b""
        return chunk[: end + 1]
