"""The rollout runs drivers push to the hub (``/v1/runs``): kept as run directories, per tenant.

``aenv rollout`` against a hub registers its run here and sends its records as it writes them
(:mod:`aenv_ray.hubruns` is the contract). Each run is a directory under the hub's data
directory, ``runs/TENANT/RUN``: ``run.json`` (the run's settings, as the driver's own
``run.json``), ``trajectories.jsonl`` (a byte-for-byte copy of the driver's, up to what was
received) and :data:`aenv_ray.hubruns.STATE` (live or finished, the last heartbeat, the
driver, the bytes received). The Environment Center reads these directories as it reads any
run (:mod:`aenv_ui`); a tenant's key reaches its own tenant's runs only, and another tenant's
run id is not found.

Records arrive as the bytes of ``trajectories.jsonl`` from an offset: a post is idempotent
(what the hub holds already is skipped), one from past the end is refused with the offset the
hub expects (``received``), and ``reset`` starts the copy again (the driver's file was
rewritten: ``--retry-failed`` compacts it). Every line must be a JSON object with an
``episode_id``; a line that is not is refused with its number, and nothing of that post is kept.

A tenant's runs hold at most its ``run_bytes`` of records together (:mod:`envhub.limits`; a
post past it is refused with :class:`~aenv_ray.errors.QuotaExceededError`); deleting a run frees
its bytes. The runs live on the hub that received them (its data directory): hubs that share a
Redis store list each other's runs only when they share the data directory too (each counts the
bytes it was sent since it started, and what it found on disk).

May import: the standard library, ``aenv_ray``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray.errors import ArtifactTooLargeError, ConfigurationError, RunNotFoundError
from aenv_ray.hubruns import MAX_POST, STATE, is_live
from envhub.limits import Limits, over

__all__ = ["RunStore"]

JSONL = "trajectories.jsonl"
RUN_JSON = "run.json"
MAX_SETTINGS = 64 << 10  # bytes of run.json
MAX_DRIVER = 4 << 10  # bytes of the driver's description
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def _slug(name: str) -> str:
    """``name`` as the readable start of a run id: ``runs/demo 2`` -> ``demo-2``."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", name.rsplit("/", 1)[-1]).strip("-._")
    return base[:40] or "run"


def _bounded(value: Any, what: str, limit: int) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"`{what}` must be a JSON object, not {type(value).__name__}")
    data = dict(value)
    if len(json.dumps(data)) > limit:
        raise ConfigurationError(f"`{what}` is over {limit} bytes of JSON: send less")
    return data


def _checked_lines(data: bytes, first_line: int) -> None:
    """Refuse ``data`` unless it is whole lines, each empty or a JSON object with an
    ``episode_id`` (what ``aenv rollout`` writes)."""
    if data and not data.endswith(b"\n"):
        raise ConfigurationError(
            "records must be whole lines (the last one ends with a newline): send a line once "
            "it is complete"
        )
    for number, line in enumerate(data.splitlines(), start=first_line):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or record.get("episode_id") is None:
            raise ConfigurationError(
                f"record line {number} of this post is not a JSON object with an `episode_id`: "
                "send the lines of trajectories.jsonl as `aenv rollout` wrote them"
            )


@dataclass
class RunStore:
    """The pushed runs under ``root`` (the hub's ``DATA_DIR/runs``), each tenant's within its
    ``run_bytes`` of ``limits``."""

    root: Path
    limits: Limits = field(default_factory=Limits)
    _locks: dict[str, asyncio.Lock] = field(default_factory=dict, repr=False)
    _used: dict[str, int] = field(default_factory=dict, repr=False)  # tenant -> bytes held

    async def used(self, tenant: str) -> int:
        """Bytes of records ``tenant``'s runs hold (counted on disk once, then kept)."""
        if tenant not in self._used:
            self._used[tenant] = sum(int(r.get("received") or 0) for r in await self.list(tenant))
        return self._used[tenant]

    def tenant_dir(self, tenant: str) -> Path:
        """The directory of ``tenant``'s runs (named by a digest: a tenant's name is never
        a path)."""
        return self.root / hashlib.sha256(tenant.encode()).hexdigest()[:24]

    def _dir(self, tenant: str, run_id: str) -> Path:
        path = self.tenant_dir(tenant) / run_id
        if not _ID.match(run_id) or not (path / STATE).is_file():
            raise RunNotFoundError(
                f"no run `{run_id}` of your tenant on this hub: list them with GET /v1/runs"
            )
        return path

    def _lock(self, tenant: str, run_id: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{tenant}\0{run_id}", asyncio.Lock())

    @staticmethod
    def _read(path: Path) -> dict[str, Any]:
        state: dict[str, Any] = json.loads((path / STATE).read_text())
        return state

    @staticmethod
    def _write(path: Path, state: Mapping[str, Any]) -> None:
        tmp = path / (STATE + ".tmp")
        tmp.write_text(json.dumps(state, sort_keys=True))
        os.replace(tmp, path / STATE)

    @staticmethod
    def _shown(state: Mapping[str, Any], path: Path) -> dict[str, Any]:
        """A run as the API answers it: its state, ``live`` now, and its settings."""
        try:
            settings = json.loads((path / RUN_JSON).read_text())
        except (OSError, ValueError):
            settings = {}
        return {**state, "live": is_live(state), "settings": settings}

    # -- a driver's side -----------------------------------------------------------------------
    async def open(
        self,
        tenant: str,
        *,
        name: str,
        settings: Mapping[str, Any] | None = None,
        driver: Mapping[str, Any] | None = None,
        run_id: str | None = None,
    ) -> dict[str, Any]:
        """Register a run of ``tenant`` (live from now), or, with ``run_id``, take up one it
        registered before (a resumed run: its records so far are kept, ``received`` says how
        many bytes). Its ``settings`` become its ``run.json``."""
        given = _bounded(settings, "settings", MAX_SETTINGS)
        who = _bounded(driver, "driver", MAX_DRIVER)
        now = time.time()
        if run_id is not None:
            path = self._dir(tenant, run_id)
            async with self._lock(tenant, run_id):
                state = self._read(path)
                state.update(state="live", beat_at=now, ended_at=None, driver=who)
                self._write(path, state)
                if given:
                    (path / RUN_JSON).write_text(json.dumps(given, indent=1, sort_keys=True))
            return self._shown(state, path)
        new_id = f"{_slug(name)}-{secrets.token_hex(4)}"
        path = self.tenant_dir(tenant) / new_id
        await asyncio.to_thread(path.mkdir, parents=True)
        (path / RUN_JSON).write_text(json.dumps(given, indent=1, sort_keys=True))
        (path / JSONL).touch()
        state = {
            "id": new_id,
            "name": name[:200],
            "state": "live",
            "created_at": now,
            "beat_at": now,
            "ended_at": None,
            "driver": who,
            "received": 0,
        }
        self._write(path, state)
        return self._shown(state, path)

    async def append(
        self, tenant: str, run_id: str, *, offset: int, data: bytes, reset: bool = False
    ) -> dict[str, Any]:
        """Add ``data``, the bytes of the driver's ``trajectories.jsonl`` from ``offset``, to
        the run's copy (a heartbeat too, even when empty); ``reset``: start the copy again
        (``offset`` must then be 0). Answers ``{"received": bytes held, "accepted": bytes
        added}``: a post from past ``received`` adds nothing (send from ``received``)."""
        if offset < 0:
            raise ConfigurationError(f"`offset` must be >= 0, not {offset}")
        if reset and offset != 0:
            raise ConfigurationError("a reset copy starts again at offset 0")
        if len(data) > MAX_POST:
            raise ArtifactTooLargeError(
                f"a post carries at most {MAX_POST} bytes of records, not {len(data)}: send "
                "them in several posts"
            )
        path = self._dir(tenant, run_id)
        async with self._lock(tenant, run_id):
            state = self._read(path)
            received = 0 if reset else int(state.get("received") or 0)
            accepted = 0
            if offset <= received < offset + len(data):
                new = data[received - offset :]
                start = received - offset
                if start and data[start - 1 : start] != b"\n":
                    raise ConfigurationError(
                        f"offset {offset} does not start a line of what the hub holds "
                        f"({received} bytes): send from offset {received}"
                    )
                await asyncio.to_thread(_checked_lines, new, 1)
                held = int(state.get("received") or 0)
                total = await self.used(tenant) - held + received + len(new)
                allowed = self.limits.for_tenant(tenant).run_bytes
                if total > allowed:
                    raise over(
                        tenant,
                        "run_bytes",
                        total,
                        allowed,
                        "with these records your runs on this hub would take",
                        "delete runs you no longer need (DELETE /v1/runs/ID), or ask the hub's "
                        "operator",
                    )
                await asyncio.to_thread(self._append_bytes, path / JSONL, new, received)
                accepted = len(new)
                received += accepted
            elif reset:
                await asyncio.to_thread(self._append_bytes, path / JSONL, b"", 0)
            self._used[tenant] = (
                await self.used(tenant) - int(state.get("received") or 0) + received
            )
            state.update(received=received, beat_at=time.time())
            if state.get("state") != "live":  # a driver that posts again is live again
                state.update(state="live", ended_at=None)
            self._write(path, state)
        return {"id": run_id, "received": received, "accepted": accepted}

    @staticmethod
    def _append_bytes(jsonl: Path, data: bytes, at: int) -> None:
        with jsonl.open("r+b" if jsonl.exists() else "wb") as file:
            file.truncate(at)  # what a crash left past `received` is not the run's
            file.seek(at)
            file.write(data)
            file.flush()
            os.fsync(file.fileno())

    async def end(self, tenant: str, run_id: str) -> dict[str, Any]:
        """Mark the run finished (its driver ended)."""
        path = self._dir(tenant, run_id)
        async with self._lock(tenant, run_id):
            state = self._read(path)
            now = time.time()
            state.update(state="finished", ended_at=now, beat_at=now)
            self._write(path, state)
        return self._shown(state, path)

    async def delete(self, tenant: str, run_id: str) -> dict[str, Any]:
        """Delete a run and its records (the driver's own run directory is untouched)."""
        path = self._dir(tenant, run_id)
        async with self._lock(tenant, run_id):
            state = self._read(path)
            used = await self.used(tenant)
            gone = path.with_name(f".deleted-{run_id}-{secrets.token_hex(4)}")
            os.replace(path, gone)  # out of every listing at once
            await asyncio.to_thread(shutil.rmtree, gone, True)
            self._used[tenant] = max(0, used - int(state.get("received") or 0))
        self._locks.pop(f"{tenant}\0{run_id}", None)
        return {"id": run_id, "deleted": True}

    # -- a reader's side -----------------------------------------------------------------------
    async def get(self, tenant: str, run_id: str) -> dict[str, Any]:
        """One run of ``tenant``."""
        path = self._dir(tenant, run_id)
        return self._shown(self._read(path), path)

    async def list(self, tenant: str) -> list[dict[str, Any]]:
        """``tenant``'s runs, the newest first."""
        base = self.tenant_dir(tenant)
        if not base.is_dir():
            return []
        found = []
        for path in base.iterdir():
            if path.name.startswith("."):
                continue  # being deleted
            try:
                found.append(self._shown(self._read(path), path))
            except (OSError, ValueError):
                continue  # being created, or not a run
        found.sort(key=lambda r: r.get("created_at") or 0.0, reverse=True)
        return found
