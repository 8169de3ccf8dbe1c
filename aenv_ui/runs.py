"""The runs under one directory and the answers of the UI's run API, whoever serves them.

:class:`RunSet` is what ``aenv ui DIR`` (:mod:`aenv_ui.server`, aiohttp) and the hub's page
(:mod:`aenv_ui.hub`, a tenant's pushed runs, Starlette) share: the runs under a directory
(``.`` when the directory is itself a run), one index each (:func:`aenv_ui.index.open_index`,
refreshed at most once a second while pages ask, so a live run's pages follow it), and the
JSON each request of the API answers, from its path's names and its query's strings:

==============================================  ==================================================
``GET .../runs``                                every run: settings (``run.json``) and summary
``GET .../runs/{run}``                          one run: settings, summary, tools, kinds of end
``GET .../runs/{run}/episodes``                 a page of episodes; filters ``task``, ``kind``
                                                (``ok``, ``failed``, a kind), ``tool``,
                                                ``min_reward``, ``max_reward``, ``q``,
                                                ``errors=1``; ``sort`` (``-reward``, ...)
``GET .../runs/{run}/episodes/{id}``            one episode's whole record
``GET .../runs/{run}/rewards``                  histogram, pass rate, kinds, tool and turn
                                                latency, per-task table (``task``, ``passing``)
``GET .../compare?a=RUN&b=RUN``                 two runs per task: better, worse, same
==============================================  ==================================================

May import: the standard library, ``aenv_ray.errors``, :mod:`aenv_ui.index`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aenv_ray.errors import ConfigurationError, RunNotFoundError
from aenv_ui.index import EpisodeQuery, RunIndex, compare, iter_runs, open_index

__all__ = ["RunSet"]


def _float(query: Mapping[str, str], name: str) -> float | None:
    value = query.get(name, "").strip()
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        raise ConfigurationError(f"`{name}` must be a number, not `{value}`") from None


def _int(query: Mapping[str, str], name: str, default: int) -> int:
    value = query.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit():
        raise ConfigurationError(f"`{name}` must be a whole number >= 0, not `{value}`")
    return int(value)


class RunSet:
    """The runs under ``root`` and their indexes (in ``index_dir``; None: the default).
    ``title`` names the set on the Runs page (default: ``root``'s path); ``paths``: whether
    answers show where a run lies (not a hub's: its paths are its own)."""

    def __init__(
        self,
        root: Path,
        *,
        index_dir: Path | None = None,
        title: str | None = None,
        paths: bool = True,
    ) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise ConfigurationError(
                f"{root} is not a directory: pass a run directory (`aenv rollout --out DIR`) "
                "or a directory holding run directories"
            )
        self.index_dir = index_dir
        self.title = title if title is not None else str(self.root)
        self.paths = paths
        self._indexes: dict[str, RunIndex] = {}
        self._opening = threading.Lock()

    def runs(self) -> dict[str, Path]:
        """The runs by name (a directory's name; ``.`` when ``root`` is itself a run)."""
        return {("." if path == self.root else path.name): path for path in iter_runs(self.root)}

    def index(self, name: str) -> RunIndex:
        """The refreshed index of run ``name``."""
        with self._opening:  # one index per run, whichever thread asks first
            index = self._indexes.get(name)
            if index is not None and not index.run.is_dir():  # deleted (or moved) since
                self._drop(name)
                index = None
            if index is None:
                path = self.runs().get(name)
                if path is None:
                    known = ", ".join(self.runs()) or "none"
                    raise RunNotFoundError(f"no run `{name}` in {self.title}; the runs: {known}")
                index = self._indexes[name] = open_index(path, self.index_dir)
        index.refresh(at_most_every=1.0)
        return index

    def _drop(self, name: str) -> None:
        """Forget the index of run ``name``, which is gone: close it, remove its file."""
        index = self._indexes.pop(name)
        index.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index.path}{suffix}").unlink(missing_ok=True)

    async def aindex(self, name: str) -> RunIndex:
        """:meth:`index` in a worker thread: reading a large run's records the first time
        takes seconds, and the server goes on answering meanwhile."""
        return await asyncio.to_thread(self.index, name)

    def close(self) -> None:
        """Close every index."""
        with self._opening:
            for index in self._indexes.values():
                index.close()
            self._indexes.clear()

    # -- the API's answers ---------------------------------------------------------------------
    async def list_runs(self) -> dict[str, Any]:
        """``GET .../runs``."""
        out: list[dict[str, Any]] = []
        names = self.runs()
        with self._opening:
            for gone in [
                n for n, i in self._indexes.items() if n not in names or not i.run.is_dir()
            ]:
                self._drop(gone)
        for name in names:
            index = await self.aindex(name)
            out.append({"name": name, "settings": index.settings(), "summary": index.summary()})
        return {"root": self.title, "runs": out}

    async def run(self, name: str) -> dict[str, Any]:
        """``GET .../runs/{run}``."""
        index = await self.aindex(name)
        return {
            "name": name,
            "path": str(index.run) if self.paths else None,
            "settings": index.settings(),
            "summary": index.summary(),
            "tools": index.tools(),
            "kinds": index.kinds(),
            "tasks": [t["task_id"] for t in index.tasks()],
        }

    async def episodes(self, name: str, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET .../runs/{run}/episodes``."""
        index = await self.aindex(name)
        wanted = EpisodeQuery(
            task=query.get("task") or None,
            kind=query.get("kind") or None,
            tool=query.get("tool") or None,
            min_reward=_float(query, "min_reward"),
            max_reward=_float(query, "max_reward"),
            text=query.get("q") or None,
            errors=query.get("errors") in ("1", "true"),
        )
        return index.episodes(
            wanted,
            offset=_int(query, "offset", 0),
            limit=_int(query, "limit", 50),
            sort=query.get("sort") or "arrival",
        )

    async def episode(self, name: str, episode_id: str) -> dict[str, Any]:
        """``GET .../runs/{run}/episodes/{id}``."""
        index = await self.aindex(name)
        return index.episode(episode_id)

    async def rewards(self, name: str, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET .../runs/{run}/rewards``."""
        index = await self.aindex(name)
        passing = _float(query, "passing")
        return index.rewards(
            passing=1.0 if passing is None else passing, task=query.get("task") or None
        )

    async def compare(self, query: Mapping[str, str]) -> dict[str, Any]:
        """``GET .../compare?a=RUN&b=RUN``."""
        a, b = query.get("a"), query.get("b")
        if not a or not b:
            raise ConfigurationError("compare takes two runs: .../compare?a=RUN&b=RUN")
        passing = _float(query, "passing")
        data = compare(
            await self.aindex(a), await self.aindex(b), passing=1.0 if passing is None else passing
        )
        return {"a_name": a, "b_name": b, **data}
