"""The telecom agent's database: plans, customers, lines, bills and devices (lists, as in tau2).

Field names, order, types and defaults are tau2's: they decide a tool's JSON output and the
database hash. Values are not re-validated on assignment, as in tau2. The enums are ``str``
mixins as there (a value compares equal to its string; ``repr`` names the class).
"""

from __future__ import annotations

import datetime
from enum import Enum
from typing import Self

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
    "TelecomDB",
]

# the original's default creation time is a date (not a datetime): it hashes as "2025-01-01"
_DEFAULT_CREATED = datetime.date(2025, 1, 1)


class _Strict(BaseModel):
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


class Address(_Strict):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(_Strict):
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


class Device(_Strict):
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


class Line(_Strict):
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


class LineItem(_Strict):
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


class Bill(_Strict):
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


class PaymentMethod(_Strict):
    method_type: PaymentMethodType
    account_number_last_4: str
    expiration_date: str


class Customer(_Strict):
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


class TelecomDB(RebuiltForkDB):
    """The agent's side: every record of the telecom carrier (small: a deep copy per episode)."""

    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)
