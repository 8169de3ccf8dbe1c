"""The telecom agent's database: plans, customers, lines, bills and devices (lists, as in tau2).

Field names, order, types and defaults are tau2's: they decide a tool's JSON output and the
database hash. Values are not re-validated on assignment, as in tau2. The enums are ``str``
mixins as there (a value compares equal to its string; ``repr`` names the class).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
from enum import Enum
from typing import ClassVar, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from builtin_envs.tau2.db import Tau2DB

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
    "RebuiltForkDB",
    "Record",
    "TelecomDB",
]

# the original's default creation time is a date (not a datetime): it hashes as "2025-01-01"
_DEFAULT_CREATED = datetime.date(2025, 1, 1)


class Record(BaseModel):
    """A record: no extra fields; assignment is not validated, as in tau2."""

    model_config = ConfigDict(extra="forbid")


class RebuiltForkDB(Tau2DB):
    """A database forked by rebuilding it from its dump: ~6x faster than a deep copy here.

    The first fork of a database checks that the rebuilt copy hashes as the original does (a
    value the models would convert, a default date where a datetime belongs, would not); if
    not, that database forks by deep copy. Forks are taken of loaded databases, never changed.
    """

    _rebuild_ok: bool | None = PrivateAttr(default=None)

    def fork(self) -> Self:
        """An independent copy for one episode."""
        if self._rebuild_ok is False:
            return super().fork()
        try:
            copy = type(self).model_validate(self.model_dump(warnings=False))
        except ValidationError:
            copy = None
        if self._rebuild_ok is None:
            self._rebuild_ok = copy is not None and copy.get_hash() == self.get_hash()
        return copy if copy is not None and self._rebuild_ok else super().fork()


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


def _record_json(record: BaseModel) -> str:
    return json.dumps(record.model_dump(warnings=False), sort_keys=True, default=str)


class TelecomDB(Tau2DB):
    """The agent's side: every record of the telecom carrier, in lists (as in tau2).

    Forked copy-on-write: a fork copies the five lists and shares the records with the loaded
    database until a tool asks to change one (:meth:`writable` copies it then; every tool that
    changes a record asks first). Its hash reuses the serialized form of every shared record,
    computed once per process, so it costs the records the episode changed.
    """

    _LISTS: ClassVar[tuple[str, ...]] = ("bills", "customers", "devices", "lines", "plans")

    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)

    _root: TelecomDB | None = PrivateAttr(default=None)
    _shared: dict[int, tuple[BaseModel, str]] | None = PrivateAttr(default=None)

    def fork(self) -> Self:
        """A copy sharing the records of this (loaded) database until they are changed."""
        if self._root is not None:  # a fork of a fork: an independent deep copy
            copies: dict[str, object] = {n: copy.deepcopy(getattr(self, n)) for n in self._LISTS}
            return self.model_construct(**copies)  # type: ignore[arg-type]
        lists: dict[str, object] = {name: list(getattr(self, name)) for name in self._LISTS}
        new = self.model_construct(**lists)  # type: ignore[arg-type]
        new._root = self
        return new

    def _shared_records(self) -> dict[int, tuple[BaseModel, str]]:
        """The loaded database's records by ``id``, each with its JSON (computed once)."""
        if self._shared is None:
            self._shared = {
                id(record): (record, _record_json(record))
                for name in self._LISTS
                for record in getattr(self, name)
            }
        return self._shared

    def _shared_json(self, record: BaseModel) -> str | None:
        if self._root is None:
            return None
        hit = self._root._shared_records().get(id(record))
        return hit[1] if hit is not None and hit[0] is record else None

    def writable(self, record: _R) -> _R:
        """``record`` ready to be changed: copied first if still shared with the loaded database."""
        if self._shared_json(record) is None:
            return record
        mine = record.model_copy(deep=True)
        for name in self._LISTS:
            records = getattr(self, name)
            for i, candidate in enumerate(records):
                if candidate is record:
                    records[i] = mine
                    return mine
        return record  # pragma: no cover - every record lives in one of the lists

    def get_hash(self) -> str:
        """tau2's hash, from the shared records' cached JSON and this fork's own records."""
        root = self._root
        if root is None:
            return super().get_hash()
        shared = root._shared_records()
        parts = []
        for name in self._LISTS:
            items = []
            for record in getattr(self, name):
                hit = shared.get(id(record))
                items.append(
                    hit[1] if hit is not None and hit[0] is record else _record_json(record)
                )
            parts.append(f'"{name}": [{", ".join(items)}]')
        return hashlib.sha256(("{" + ", ".join(parts) + "}").encode()).hexdigest()
