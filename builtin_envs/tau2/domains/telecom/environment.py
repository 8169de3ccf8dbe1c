"""Telecom's environment: after every call, the phone is brought in line with the carrier's side.

tau2's ``TelecomEnvironment.sync_tools``: once the user is known (their phone number), the line
behind that number decides whether the phone's line is active, whether roaming is allowed and
whether the data limit is exceeded; a payment the user made marks its bill paid; a bill awaiting
payment becomes the user's payment request.
"""

from __future__ import annotations

from typing import Self

from builtin_envs.tau2.domains.telecom.models import LineStatus
from builtin_envs.tau2.domains.telecom.tools import TelecomTools
from builtin_envs.tau2.domains.telecom.user_models import PaymentRequest
from builtin_envs.tau2.domains.telecom.user_tools import TelecomUserTools
from builtin_envs.tau2.environment import Tau2Environment

__all__ = ["TelecomEnvironment"]


class TelecomEnvironment(Tau2Environment):
    """A telecom episode: the agent's :class:`TelecomTools`, the user's phone tools."""

    tools: TelecomTools
    user_tools: TelecomUserTools
    _frozen = False
    _user_hash: str | None = None  # a frozen state's user database hash, computed once

    def freeze(self) -> None:
        """This state no longer changes (a task's initialized state, a gold outcome): forks
        share its records; its user database hash is computed once, when first asked."""
        super().freeze()
        self._frozen = True

    def fork(self) -> Self:
        """A new episode in this state (see :meth:`Tau2Environment.fork`)."""
        new = super().fork()
        new.__dict__.pop("_frozen", None)
        new.__dict__.pop("_user_hash", None)
        return new

    def reproducible(self) -> bool:
        """False once a random bill id was drawn (``refuel_data`` without a draft bill)."""
        return not self.tools.drew_random_id

    def user_db_hash(self) -> str:
        """tau2's hash of the user's database (remembered for a frozen state)."""
        if self._user_hash is not None:
            return self._user_hash
        user_hash = self.user_tools.db.get_hash()
        if self._frozen:
            self._user_hash = user_hash
        return user_hash

    def same_db_state(self, other: Tau2Environment) -> bool:
        """Whether both databases hash as ``other``'s do (the agent's compared record by record
        where both fork one base, see :meth:`TelecomDB.same_state`)."""
        if isinstance(other, TelecomEnvironment):
            return (
                self.tools.db.same_state(other.tools.db)
                and self.user_db_hash() == other.user_db_hash()
            )
        return super().same_db_state(other)

    def sync_tools(self) -> None:
        """Bring the user's surroundings in line with their line, plan and bills (tau2's rules)."""
        where = self.user_tools.db.surroundings
        phone_number = where.phone_number
        if phone_number is None:
            return
        line = self.tools._get_line_by_phone(phone_number)
        # the values tau2 sets, in its order; assigned only when they change (not free)
        active = line.status == LineStatus.ACTIVE
        if where.line_active is not active:
            where.line_active = active
        roaming = bool(line.roaming_enabled)
        if where.roaming_allowed is not roaming:
            where.roaming_allowed = roaming
        plan = self.tools._get_plan_by_id(line.plan_id)
        exceeded = line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
        if where.mobile_data_usage_exceeded is not exceeded:
            where.mobile_data_usage_exceeded = exceeded
        if where.payment_request is not None and where.payment_request.paid:
            self.tools._set_bill_to_paid(where.payment_request.bill_id)
            where.payment_request = None
        if where.payment_request is None:
            customer = self.tools.get_customer_by_phone(phone_number)
            awaiting = self.tools._get_bills_awaiting_payment(customer)
            if awaiting:
                where.payment_request = PaymentRequest(
                    bill_id=awaiting[0].bill_id, amount_due=awaiting[0].total_due
                )
