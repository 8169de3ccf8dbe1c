"""Domains: what a tau2 domain is made of, loaded once per process and shared by every episode.

A domain subclasses :class:`Domain` and registers with :func:`register_domain`. It says how to
load its database(s) (:meth:`Domain.load_db`, :meth:`Domain.load_user_db`), how to build its
toolkits over them (:meth:`Domain.make_toolkits`) and which :class:`Tau2Environment` class joins
them. Everything else is shared: the databases are parsed once (the first episode pays) and each
:meth:`Domain.new_environment` forks them; tasks and splits are read once; a task's initialized
state (its initialization applied, :meth:`Domain.initialized_environment`) and its gold outcome
(the state after its gold actions, :meth:`Domain.gold_environment`) are computed once, frozen and
cached; episodes and grades fork the initialized state.

:func:`get_domain` finds a domain by name, importing its module on first use.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
import threading
from collections import OrderedDict
from functools import cached_property
from pathlib import Path
from typing import ClassVar, TypeVar

from aenv_ray.errors import ConfigurationError
from builtin_envs.tau2.data import data_dir
from builtin_envs.tau2.db import Tau2DB
from builtin_envs.tau2.environment import Tau2Environment, replay_pairs
from builtin_envs.tau2.errors import Tau2NotFoundError
from builtin_envs.tau2.messages import parse_messages
from builtin_envs.tau2.tasks import Task
from builtin_envs.tau2.toolkit import Toolkit

__all__ = ["DOMAIN_MODULES", "Domain", "domain_names", "get_domain", "register_domain"]

log = logging.getLogger(__name__)

# name -> module that registers it (imported on first use)
DOMAIN_MODULES: dict[str, str] = {
    "airline": "builtin_envs.tau2.domains.airline",
    "retail": "builtin_envs.tau2.domains.retail",
    "telecom": "builtin_envs.tau2.domains.telecom",
    "telecom-workflow": "builtin_envs.tau2.domains.telecom",
}
_REGISTRY: dict[str, type[Domain]] = {}
_INSTANCES: dict[str, Domain] = {}
_LOCK = threading.RLock()
_GOLD_CACHE_SIZE = 512
_INITIALIZED_CACHE_SIZE = 512

_D = TypeVar("_D", bound="type[Domain]")


def register_domain(cls: _D) -> _D:
    """Class decorator: make ``cls`` the domain named ``cls.name``."""
    _REGISTRY[cls.name] = cls
    return cls


def domain_names() -> list[str]:
    """Every domain that can be loaded."""
    return sorted(set(DOMAIN_MODULES) | set(_REGISTRY))


def get_domain(name: str) -> Domain:
    """The process's :class:`Domain` called ``name`` (:class:`Tau2NotFoundError` if none)."""
    with _LOCK:
        if name in _INSTANCES:
            return _INSTANCES[name]
        if name not in _REGISTRY and name in DOMAIN_MODULES:
            try:
                importlib.import_module(DOMAIN_MODULES[name])
            except ModuleNotFoundError as exc:
                if exc.name != DOMAIN_MODULES[name]:
                    raise
        if name not in _REGISTRY:
            close = difflib.get_close_matches(str(name), domain_names(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise Tau2NotFoundError(
                f"tau2 domain {name!r} not found (known: {', '.join(domain_names())}){hint}"
            )
        domain = _REGISTRY[name](data_dir())
        _INSTANCES[name] = domain
        return domain


class Domain:
    """A tau2 domain: its data, toolkits, policy and tasks. One instance per process."""

    name: ClassVar[str]
    environment_class: ClassVar[type[Tau2Environment]] = Tau2Environment
    supports_solo: ClassVar[bool] = False
    tasks_file: ClassVar[str] = "tasks.json"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "domains" / self.name
        self._lock = threading.RLock()
        self._db: Tau2DB | None = None
        self._user_db: Tau2DB | None = None
        self._loaded = False
        self._gold: OrderedDict[str, Tau2Environment] = OrderedDict()
        self._initialized: OrderedDict[tuple[str, bool], Tau2Environment] = OrderedDict()
        self._texts: dict[str, str] = {}

    # -- what a domain defines --------------------------------------------------------------------

    def load_db(self) -> Tau2DB:
        """Parse the agent's database (once per process)."""
        raise NotImplementedError

    def load_user_db(self) -> Tau2DB | None:
        """Parse the user's database, if the domain has one (once per process)."""
        return None

    def make_toolkits(self, db: Tau2DB, user_db: Tau2DB | None) -> tuple[Toolkit, Toolkit | None]:
        """The agent's toolkit and the user's (or None) over one episode's databases."""
        raise NotImplementedError

    def policy(self, solo_mode: bool = False) -> str:
        """The agent's policy text (``policy.md``)."""
        return self._read("policy.md")

    # -- shared machinery -------------------------------------------------------------------------

    def _read(self, filename: str) -> str:
        """A text file of the domain's data directory, read once."""
        text = self._texts.get(filename)
        if text is None:
            text = self._texts[filename] = (self.dir / filename).read_text(encoding="utf-8")
        return text

    def _load(self) -> None:
        with self._lock:
            if not self._loaded:
                self._db = self.load_db()
                self._user_db = self.load_user_db()
                self._loaded = True

    @property
    def base_db(self) -> Tau2DB:
        """The database as loaded (never changed: episodes fork it)."""
        self._load()
        assert self._db is not None
        return self._db

    @property
    def base_user_db(self) -> Tau2DB | None:
        """The user's database as loaded, if any."""
        self._load()
        return self._user_db

    def check_solo_mode(self, solo_mode: bool) -> None:
        """:class:`ConfigurationError` if ``solo_mode`` is asked of a domain without it."""
        if solo_mode and not self.supports_solo:
            raise ConfigurationError(f"{self.name.capitalize()} domain does not support solo mode")

    def new_environment(self, solo_mode: bool = False) -> Tau2Environment:
        """A fresh episode: toolkits over forks of the loaded databases."""
        self.check_solo_mode(solo_mode)
        self._load()
        assert self._db is not None
        user_db = self._user_db.fork() if self._user_db is not None else None
        tools, user_tools = self.make_toolkits(self._db.fork(), user_db)
        return self.environment_class(
            domain_name=self.name,
            policy=self.policy(solo_mode),
            tools=tools,
            user_tools=user_tools,
            solo_mode=solo_mode,
        )

    @cached_property
    def _tasks(self) -> dict[str, Task]:
        raw = json.loads((self.dir / self.tasks_file).read_text(encoding="utf-8"))
        return {t.id: t for t in (Task.model_validate(item) for item in raw)}

    @cached_property
    def splits(self) -> dict[str, list[str]]:
        """The task splits (``base``, ``train``, ``test``, ...): task ids by split name."""
        path = self.dir / f"split_{Path(self.tasks_file).stem}.json"
        if not path.exists():
            return {}
        splits: dict[str, list[str]] = json.loads(path.read_text(encoding="utf-8"))
        return splits

    def task_ids(self, split: str | None = "base") -> list[str]:
        """Task ids in file order, those of ``split`` only (None: every task)."""
        if split is None:
            return list(self._tasks)
        if split not in self.splits:
            raise Tau2NotFoundError(
                f"task split {split!r} not found in tau2 domain {self.name!r} "
                f"(splits: {', '.join(self.splits) or 'none'})"
            )
        wanted = set(self.splits[split])
        return [tid for tid in self._tasks if tid in wanted]

    def task(self, task_id: str) -> Task:
        """Task ``task_id`` (:class:`Tau2NotFoundError` if the domain has none)."""
        task = self._tasks.get(str(task_id))
        if task is None:
            close = difflib.get_close_matches(str(task_id), list(self._tasks), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise Tau2NotFoundError(
                f"task {task_id!r} not found in tau2 domain {self.name!r} "
                f"({len(self._tasks)} tasks){hint}"
            )
        return task

    def initialized_environment(self, task: Task, solo_mode: bool = False) -> Tau2Environment:
        """A fresh episode with ``task``'s initialization (data and actions) applied, not its
        message history.

        The initialized state is computed once per task and mode (kept for the
        :data:`_INITIALIZED_CACHE_SIZE` tasks used last, frozen) and forked for each episode:
        the same state, as initialization draws nothing at random (a state that did is not
        kept). ``task`` is one of this domain's tasks (:meth:`task`).
        """
        state = task.initial_state
        if state is None or (
            state.initialization_data is None and not state.initialization_actions
        ):
            return self.new_environment(solo_mode)
        key = (task.id, solo_mode)
        with self._lock:
            cached = self._initialized.get(key)
            if cached is not None:
                self._initialized.move_to_end(key)
        if cached is None:
            env = self.new_environment(solo_mode)
            env.initialize(state.initialization_data, state.initialization_actions)
            if not env.reproducible():
                return env
            env.freeze()
            with self._lock:
                cached = self._initialized.setdefault(key, env)
                while len(self._initialized) > _INITIALIZED_CACHE_SIZE:
                    self._initialized.popitem(last=False)
        return cached.fork()

    def initial_environment(self, task: Task, solo_mode: bool = False) -> Tau2Environment:
        """A fresh episode set to ``task``'s initial state (its data, actions and history)."""
        state = task.initial_state
        history = parse_messages(state.message_history or []) if state is not None else []
        pairs = replay_pairs(history, solo_mode)
        env = self.initialized_environment(task, solo_mode)
        if state is not None:
            env.replay(pairs)
        return env

    def gold_environment(self, task_id: str) -> Tau2Environment:
        """The state after ``task_id``'s gold actions, computed once (do not change it).

        As in tau2: the initial state, then each gold action as a tool call of its requestor; an
        action that fails is logged and skipped.
        """
        with self._lock:
            cached = self._gold.get(task_id)
            if cached is not None:
                self._gold.move_to_end(task_id)
                return cached
        task = self.task(task_id)
        env = self.initial_environment(task)
        for action in (
            task.evaluation_criteria.actions if task.evaluation_criteria else None
        ) or []:
            try:
                env.make_tool_call(action.name, action.requestor, action.arguments)
            except (
                Exception
            ) as exc:  # tau2 logs and goes on (some tasks' gold actions fail there too)
                log.info(
                    "gold action failed; skipped, as tau2 does",
                    extra={
                        "domain": self.name,
                        "task_id": task_id,
                        "action": action.name,
                        "error": str(exc),
                    },
                )
        env.freeze()
        with self._lock:
            self._gold[task_id] = env
            while len(self._gold) > _GOLD_CACHE_SIZE:
                self._gold.popitem(last=False)
        return env
