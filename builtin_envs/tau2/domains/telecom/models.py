"""The telecom agent's database: plans, customers, lines, bills and devices (lists, as in tau2).

Field names, order, types and defaults are tau2's: they decide a tool's JSON output and the
database hash. Values are not re-validated on assignment, as in tau2. The enums are ``str``
mixins as there (a value compares equal to its string; ``repr`` names the class).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from enum import Enum
from typing import Any, ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from builtin_envs.tau2.db import Tau2DB, deep_copy

__all__ = [
    "AccountStatus",
    "Address",
    "Bill",
    "BillStatus",
    "Customer",
    "Device",
    "DeviceType",
    "Line",
    "LineItem",
    "LineStatus",
    "PaymentMethod",
    "PaymentMethodType",
    "Plan",
    "Record",
    "TelecomDB",
]

# the original's default creation time is a date (not a datetime): it hashes as "2025-01-01"
_DEFAULT_CREATED = datetime.date(2025, 1, 1)


class Record(BaseModel):
    """A record: no extra fields; assignment is not validated, as in tau2."""

    model_config = ConfigDict(extra="forbid")


class Address(Record):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(Record):
    plan_id: str
    name: str
    data_limit_gb: float
    price_per_month: float
    data_refueling_price_per_gb: float


class DeviceType(str, Enum):  # noqa: UP042 - tau2's str mixin (its repr and str() differ)
    PHONE = "phone"
    ROUTER = "router"
    TABLET = "tablet"
    WATCH = "watch"
    OTHER = "other"


class Device(Record):
    device_id: str
    device_type: DeviceType
    model: str
    imei: str | None = None
    is_esim_capable: bool
    activated: bool = False
    activation_date: datetime.datetime | None = None
    last_esim_transfer_date: datetime.datetime | None = None


class LineStatus(str, Enum):  # noqa: UP042
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_ACTIVATION = "Pending Activation"
    CLOSED = "Closed"


class Line(Record):
    line_id: str
    phone_number: str
    status: LineStatus = LineStatus.PENDING_ACTIVATION
    plan_id: str
    device_id: str | None = None
    data_used_gb: float = 0.0
    data_refueling_gb: float = 0.0
    roaming_enabled: bool = False
    contract_end_date: datetime.date | None = None
    last_plan_change_date: datetime.date | None = None
    last_sim_replacement_date: datetime.date | None = None
    suspension_start_date: datetime.date | None = None


class LineItem(Record):
    description: str
    amount: float
    date: datetime.date
    item_type: str


class BillStatus(str, Enum):  # noqa: UP042
    DRAFT = "Draft"
    ISSUED = "Issued"
    AWAITING_PAYMENT = "Awaiting Payment"
    PAID = "Paid"
    OVERDUE = "Overdue"
    DISPUTED = "Disputed"


class Bill(Record):
    bill_id: str
    customer_id: str
    period_start: datetime.date
    period_end: datetime.date
    issue_date: datetime.date
    total_due: float
    due_date: datetime.date
    line_items: list[LineItem] = Field(default_factory=list)
    status: BillStatus = BillStatus.DRAFT


class AccountStatus(str, Enum):  # noqa: UP042
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_VERIFICATION = "Pending Verification"
    CLOSED = "Closed"


class PaymentMethodType(str, Enum):  # noqa: UP042
    CREDIT_CARD = "Credit Card"
    DEBIT_CARD = "Debit Card"
    PAYPAL = "PayPal"


class PaymentMethod(Record):
    method_type: PaymentMethodType
    account_number_last_4: str
    expiration_date: str


class Customer(Record):
    customer_id: str
    full_name: str
    date_of_birth: str
    email: str
    phone_number: str
    address: Address
    account_status: AccountStatus = AccountStatus.PENDING_VERIFICATION
    payment_methods: list[PaymentMethod] = Field(default_factory=list)
    line_ids: list[str] = Field(default_factory=list)
    bill_ids: list[str] = Field(default_factory=list)
    created_at: datetime.datetime = _DEFAULT_CREATED  # type: ignore[assignment]
    last_extension_date: datetime.date | None = None
    goodwill_credit_used_this_year: float = 0.0


_R = TypeVar("_R", bound=BaseModel)


_PRIVATE_DEFAULTS: dict[type, dict[str, Any]] = {}


def _record_json(record: BaseModel) -> str:
    return json.dumps(record.model_dump(warnings=False), sort_keys=True, default=str)


class TelecomDB(Tau2DB):
    """The agent's side: every record of the telecom carrier, in lists (as in tau2).

    Forked copy-on-write: a fork copies the five lists and shares the records with the database
    it came from (its *base*: the loaded database, or a fork :meth:`frozen <freeze>` since, as a
    task's initialized state is) until a tool asks to change one (:meth:`writable` copies it
    then; every tool that changes a record asks first). The base's records are serialized once,
    so a fork's hash costs the records the episode changed, and two forks of one base compare
    (:meth:`same_state`) by the records either changed.
    """

    _LISTS: ClassVar[tuple[str, ...]] = ("bills", "customers", "devices", "lines", "plans")

    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)

    # pydantic reads private attributes through ``__getattr__`` (microseconds each): the hot
    # paths below read ``__pydantic_private__`` itself
    _base: TelecomDB | None = PrivateAttr(default=None)
    _frozen: bool = PrivateAttr(default=False)
    _records_json: dict[int, tuple[BaseModel, str]] | None = PrivateAttr(default=None)
    _changes: int = PrivateAttr(default=0)

    def _private(self) -> dict[str, Any]:
        private: dict[str, Any] = self.__pydantic_private__  # type: ignore[assignment]
        return private

    def freeze(self) -> None:
        """Promise that this database no longer changes: its forks share its records."""
        self._private()["_frozen"] = True

    def fork(self) -> Self:
        """A copy sharing this database's records until they are changed.

        This database must be the loaded one or frozen; a fork of one that may still change is
        an independent deep copy.
        """
        private = self._private()
        if private["_base"] is not None and not private["_frozen"]:
            copies = {name: deep_copy(getattr(self, name)) for name in self._LISTS}
            return self.model_construct(**copies)
        # built as model_construct builds it, without its per-field work: the fields are lists
        new = object.__new__(type(self))
        object.__setattr__(new, "__dict__", {k: list(v) for k, v in self.__dict__.items()})
        object.__setattr__(new, "__pydantic_fields_set__", set(self.__pydantic_fields_set__))
        object.__setattr__(new, "__pydantic_extra__", None)
        object.__setattr__(new, "__pydantic_private__", {**self._fresh_private(), "_base": self})
        return new

    @classmethod
    def _fresh_private(cls) -> dict[str, Any]:
        """The private attributes' defaults (immutable values: one dict serves every fork)."""
        defaults = _PRIVATE_DEFAULTS.get(cls)
        if defaults is None:
            defaults = {n: a.get_default() for n, a in cls.__private_attributes__.items()}
            assert all(v is None or type(v) in (bool, int) for v in defaults.values())
            _PRIVATE_DEFAULTS[cls] = defaults
        return defaults

    def _shared(self) -> dict[int, tuple[BaseModel, str]]:
        """This (unchanging) database's records by ``id``, each with its JSON (computed once)."""
        private = self._private()
        shared: dict[int, tuple[BaseModel, str]] | None = private["_records_json"]
        if shared is None:
            base: TelecomDB | None = private["_base"]
            inherited = base._shared() if base is not None else {}
            shared = {}
            for name in self._LISTS:
                for record in getattr(self, name):
                    hit = inherited.get(id(record))
                    if hit is None or hit[0] is not record:
                        hit = (record, _record_json(record))
                    shared[id(record)] = hit
            private["_records_json"] = shared
        return shared

    def _json_function(self) -> Any:
        """``record -> JSON`` for this database's records, from the cached JSON where shared."""
        private = self._private()
        source: TelecomDB | None = self if private["_frozen"] else private["_base"]
        shared = source._shared() if source is not None else {}

        def record_json(record: BaseModel) -> str:
            hit = shared.get(id(record))
            return hit[1] if hit is not None and hit[0] is record else _record_json(record)

        return record_json

    def changes(self) -> int:
        """How many times a record was taken to be changed (:meth:`writable`): the same count
        (and the same number of bills) means the same contents."""
        changes: int = self._private()["_changes"]
        return changes

    def writable(self, record: _R) -> _R:
        """``record`` ready to be changed: copied first if still shared with the base.

        Every change of a record goes through here first (tools, initialization functions,
        the environment's sync); records are only ever appended besides. It is counted
        (:meth:`changes`).
        """
        private = self._private()
        if private["_frozen"]:
            raise RuntimeError("a frozen telecom database does not change: fork it")
        private["_changes"] += 1
        base: TelecomDB | None = private["_base"]
        if base is None:
            return record
        hit = base._shared().get(id(record))
        if hit is None or hit[0] is not record:
            return record
        mine = deep_copy(record)
        for name in self._LISTS:
            records = getattr(self, name)
            for i, candidate in enumerate(records):
                if candidate is record:
                    records[i] = mine
                    return mine  # type: ignore[no-any-return]
        return record  # pragma: no cover - every record lives in one of the lists

    def get_hash(self) -> str:
        """tau2's hash, from the shared records' cached JSON and this fork's own records."""
        if self._private()["_base"] is None:
            return super().get_hash()
        record_json = self._json_function()
        parts = []
        for name in self._LISTS:
            items = ", ".join([record_json(record) for record in getattr(self, name)])
            parts.append(f'"{name}": [{items}]')
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()

    def same_state(self, other: Tau2DB) -> bool:
        """Whether ``other`` hashes as this one does; two forks of one base compare the records
        either changed (the rest is the same objects), anything else compares hashes."""
        if not isinstance(other, TelecomDB):
            return super().same_state(other)
        base = self._private()["_base"]
        if base is None or other._private()["_base"] is not base:
            return super().same_state(other)
        # the hash is of the lists' JSON: equal iff every list has the same records' JSON
        mine_json, theirs_json = self._json_function(), other._json_function()
        for name in self._LISTS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if len(mine) != len(theirs):
                return False
            for a, b in zip(mine, theirs, strict=True):
                if a is not b and mine_json(a) != theirs_json(b):
                    return False
        return True
