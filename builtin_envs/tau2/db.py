"""Domain databases: parsed once per process, forked cheaply per episode, hashed as tau2 hashes.

:class:`Tau2DB` is the base of every domain's database (a pydantic model, ``extra="forbid"``).
Its hash is tau2's: SHA-256 of ``json.dumps(db.model_dump(), sort_keys=True, default=str)``.
:meth:`Tau2DB.fork` gives an independent copy for one episode; the base class deep-copies, which
suits small databases (telecom's).

:class:`TableDB` is for databases made of tables (``dict[str, Record]`` fields, as airline's and
retail's): a fork copies the tables' dicts only and shares the records with the database it came
from until a tool asks to change one (:meth:`TableDB.writable` copies it then). Hashing reuses
the serialized form of every shared record, computed once per process, so a fork's hash costs
the records it changed plus one pass of SHA-256; :meth:`Tau2DB.same_state` compares two forks of
one database by their changed records only.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import tomllib
import typing
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, PrivateAttr

__all__ = [
    "TableDB",
    "Tau2DB",
    "deep_copy",
    "dict_hash",
    "frozen_copier",
    "merge_update",
    "read_data_file",
]


def dict_hash(obj: Any) -> str:
    """tau2's hash of a JSON-like value: SHA-256 of its sorted-keys JSON (``default=str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


# how deep_copy copies a value, by its exact type: shared as it is (what deepcopy gives back as
# it is, or as an equal immutable copy), a list, a dict, a model, or by ``copy.deepcopy``
_SHARE, _LIST, _DICT, _MODEL, _OTHER = range(5)
_KINDS: dict[type, int] = {
    **dict.fromkeys(
        (str, int, float, bool, type(None), bytes, datetime.date, datetime.datetime), _SHARE
    ),
    list: _LIST,
    dict: _DICT,
}


def _kind(cls: type) -> int:
    kind = _KINDS.get(cls)
    if kind is None:
        if issubclass(cls, Enum):
            kind = _SHARE
        elif issubclass(cls, BaseModel) and not cls.__private_attributes__:
            kind = _MODEL
        else:
            kind = _OTHER
        _KINDS[cls] = kind
    return kind


def deep_copy(value: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy(value)`` for trees of models, lists and dicts, several times faster.

    Models (without private attributes), lists and dicts are copied here, each once (``memo``:
    an object reached twice is copied once, as deepcopy does, and one memo may be passed to
    several calls); enum members and immutable scalars are shared, as deepcopy shares them (or
    gives an equal immutable copy); anything else goes to ``copy.deepcopy`` with the same memo.
    """
    kind = _kind(type(value))
    if kind == _SHARE:
        return value
    if memo is None:
        memo = {}
    done = memo.get(id(value))
    if done is not None:
        return done
    if kind == _OTHER:
        return copy.deepcopy(value, memo)
    kinds = _KINDS
    if kind == _LIST:
        new_list: list[Any] = []
        memo[id(value)] = new_list
        new_list.extend(
            [item if kinds.get(type(item)) == _SHARE else deep_copy(item, memo) for item in value]
        )
        return new_list
    if kind == _DICT:
        new_dict: dict[Any, Any] = {}
        memo[id(value)] = new_dict
        for key, item in value.items():
            new_dict[key if kinds.get(type(key)) == _SHARE else deep_copy(key, memo)] = (
                item if kinds.get(type(item)) == _SHARE else deep_copy(item, memo)
            )
        return new_dict
    model = object.__new__(type(value))
    memo[id(value)] = model
    fields = {
        name: item if kinds.get(type(item)) == _SHARE else deep_copy(item, memo)
        for name, item in value.__dict__.items()
    }
    extra = value.__pydantic_extra__
    object.__setattr__(model, "__dict__", fields)
    object.__setattr__(
        model, "__pydantic_extra__", None if extra is None else deep_copy(extra, memo)
    )
    object.__setattr__(model, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
    object.__setattr__(model, "__pydantic_private__", None)
    return model


_SHARED = object()  # a plan's leaf: the value is shared, not copied
_Plan = tuple[Any, ...]


def _plan(value: Any, seen: set[int]) -> _Plan | object | None:
    """How to copy ``value``: ``_SHARED``, a plan, or None (not planned: something reached
    twice, or something ``deep_copy`` leaves to ``copy.deepcopy``)."""
    kind = _kind(type(value))
    if kind == _SHARE:
        return _SHARED
    if kind == _OTHER or id(value) in seen:
        return None
    seen.add(id(value))
    if kind == _MODEL:
        if value.__pydantic_extra__ is not None:
            return None
        items = value.__dict__.items()
    elif kind == _DICT:
        if any(_kind(type(key)) != _SHARE for key in value):
            return None
        items = value.items()
    else:
        items = enumerate(value)
    children = []
    for key, item in items:
        plan = _plan(item, seen)
        if plan is None:
            return None
        if plan is not _SHARED:
            children.append((key, plan))
    return (kind, type(value), tuple(children))


def _copy_by(plan: _Plan, value: Any) -> Any:
    kind, cls, children = plan
    if kind == _MODEL:
        fields = value.__dict__.copy()
        for name, child in children:
            fields[name] = _copy_by(child, fields[name])
        model = object.__new__(cls)
        object.__setattr__(model, "__dict__", fields)
        object.__setattr__(model, "__pydantic_extra__", None)
        object.__setattr__(model, "__pydantic_fields_set__", set(value.__pydantic_fields_set__))
        object.__setattr__(model, "__pydantic_private__", None)
        return model
    new = value.copy()
    for key, child in children:
        new[key] = _copy_by(child, new[key])
    return new


def frozen_copier(value: Any) -> Callable[[], Any]:
    """A function giving a :func:`deep_copy` of ``value``, which must not change again.

    Where each model, list and dict of ``value`` sits is worked out once, so a copy copies
    those and shares every scalar without looking at it (a model of 25 scalar fields costs one
    dict copy). A value with something reached twice, or something ``deep_copy`` leaves to
    ``copy.deepcopy``, is copied by :func:`deep_copy` each time.
    """
    plan = _plan(value, set())
    if plan is _SHARED:
        return lambda: value
    if plan is None:
        return lambda: deep_copy(value)
    assert isinstance(plan, tuple)
    return lambda: _copy_by(plan, value)


def read_data_file(path: Path) -> Any:
    """The contents of a ``.json`` or ``.toml`` data file."""
    if path.suffix == ".toml":
        with path.open("rb") as fh:
            return tomllib.load(fh)
    with path.open("r", encoding="utf-8") as fh:
        return json.load(fh)


def merge_update(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``update`` as tau2 does (nested dicts merged key by key)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_update(merged[key], value)
        else:
            merged[key] = value
    return merged


class Tau2DB(BaseModel):
    """Base of a domain's database."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def load(cls, path: Path) -> Self:
        """Parse and validate a database file (JSON or TOML). Slow: do it once per process."""
        return cls.model_validate(read_data_file(path))

    def fork(self) -> Self:
        """An independent copy for one episode."""
        return self.model_copy(deep=True)

    def freeze(self) -> None:
        """Promise that this database no longer changes (its forks may then share its contents;
        here they do not)."""

    def get_hash(self) -> str:
        """tau2's ``get_hash()`` of this state."""
        return dict_hash(self.model_dump(warnings=False))

    def same_state(self, other: Tau2DB) -> bool:
        """Whether ``other`` would hash as this one does."""
        return self.get_hash() == other.get_hash()

    def updated(self, data: dict[str, Any]) -> Self:
        """A new database: this one's contents updated with ``data`` (a task's initialization)."""
        return type(self).model_validate(merge_update(self.model_dump(warnings=False), data))


def _dumps(record: Any) -> str:
    if isinstance(record, BaseModel):
        record = record.model_dump(warnings=False)
    return json.dumps(record, sort_keys=True, default=str)


class TableDB(Tau2DB):
    """A database of tables, forked copy-on-write. Every field must be a ``dict[str, Model]``."""

    _tables: ClassVar[tuple[str, ...]] = ()
    _root: TableDB | None = PrivateAttr(default=None)
    _owned: set[tuple[str, str]] = PrivateAttr(default_factory=set)
    _fragments: dict[str, dict[str, str]] | None = PrivateAttr(default=None)
    _table_cache: dict[str, tuple[dict[str, int], list[str], str]] = PrivateAttr(
        default_factory=dict
    )

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for name, info in cls.model_fields.items():
            if typing.get_origin(info.annotation) is not dict:
                raise TypeError(f"{cls.__name__}.{name}: a TableDB field must be a dict table")
        cls._tables = tuple(sorted(cls.model_fields))

    def _table(self, name: str) -> dict[str, Any]:
        table: dict[str, Any] = getattr(self, name)
        return table

    @property
    def root(self) -> TableDB:
        """The loaded database this one was forked from (itself if it was loaded)."""
        return self._root if self._root is not None else self

    def fork(self) -> Self:
        """A copy sharing every record until :meth:`writable` copies it."""
        tables: dict[str, Any] = {t: dict(self._table(t)) for t in self._tables}
        new = self.model_construct(None, **tables)
        new._root = self.root
        if self._root is not None:  # a fork of a fork: its changed records are its own
            for table, key in self._owned:
                records = new._table(table)
                if key in records:
                    records[key] = records[key].model_copy(deep=True)
                    new._owned.add((table, key))
        return new

    def writable(self, table: str, key: str) -> Any:
        """Record ``key`` of ``table``, copied first if still shared (``KeyError`` if none)."""
        records = self._table(table)
        record = records[key]
        if self._root is not None and (table, key) not in self._owned:
            record = record.model_copy(deep=True)
            records[key] = record
            self._owned.add((table, key))
        return record

    def insert(self, table: str, key: str, record: Any) -> None:
        """Add (or replace) record ``key`` of ``table``."""
        self._table(table)[key] = record
        self._owned.add((table, key))

    def _changed(self) -> set[tuple[str, str]]:
        """Keys whose record may differ from the root's: copied, inserted or removed ones."""
        changed = set(self._owned)
        root = self.root
        if root is not self:
            for t in self._tables:
                mine, theirs = self._table(t), root._table(t)
                if len(mine) != len(theirs) or mine.keys() != theirs.keys():
                    changed.update((t, k) for k in mine.keys() ^ theirs.keys())
        return changed

    def _root_fragments(self) -> dict[str, dict[str, str]]:
        root = self.root
        if root._fragments is None:
            root._fragments = {
                t: {k: _dumps(r) for k, r in root._table(t).items()} for t in self._tables
            }
        return root._fragments

    def _fragment(self, table: str, key: str) -> str:
        record = self._table(table)[key]
        root_record = self.root._table(table).get(key)
        if record is root_record:
            return self._root_fragments()[table][key]
        return _dumps(record)

    def _root_table_parts(self, table: str) -> tuple[dict[str, int], list[str], str]:
        """The root's table serialized: key positions, ``"key": record`` parts, the whole."""
        root = self.root
        cached = root._table_cache.get(table)
        if cached is None:
            fragments = self._root_fragments()[table]
            keys = sorted(fragments)
            parts = [f"{json.dumps(k)}: {fragments[k]}" for k in keys]
            cached = ({k: i for i, k in enumerate(keys)}, parts, "{" + ", ".join(parts) + "}")
            root._table_cache[table] = cached
        return cached

    def _table_json(self, table: str, changed: set[str]) -> str:
        positions, parts, whole = self._root_table_parts(table)
        if not changed:
            return whole
        records = self._table(table)
        if records.keys() == positions.keys():  # same keys: patch the changed parts
            patched = list(parts)
            for key in changed:
                patched[positions[key]] = f"{json.dumps(key)}: {self._fragment(table, key)}"
            return "{" + ", ".join(patched) + "}"
        return (
            "{"
            + ", ".join(f"{json.dumps(k)}: {self._fragment(table, k)}" for k in sorted(records))
            + "}"
        )

    def get_hash(self) -> str:
        """tau2's hash, from the root's cached serialization and this fork's changed records."""
        changed: dict[str, set[str]] = {t: set() for t in self._tables}
        if self._root is not None:
            for table, key in self._changed():
                changed[table].add(key)
        body = ", ".join(
            f"{json.dumps(t)}: {self._table_json(t, changed[t])}" for t in self._tables
        )
        return hashlib.sha256(("{" + body + "}").encode()).hexdigest()

    def same_state(self, other: Tau2DB) -> bool:
        """Whether ``other`` hashes as this one does; only changed records are compared."""
        if not isinstance(other, TableDB) or other.root is not self.root:
            return super().same_state(other)
        for table, key in self._changed() | other._changed():
            mine, theirs = self._table(table), other._table(table)
            if (key in mine) != (key in theirs):
                return False
            if key in mine and self._fragment(table, key) != other._fragment(table, key):
                return False
        return True
