"""Telecom's environment: after every call, the phone is brought in line with the carrier's side.

tau2's ``TelecomEnvironment.sync_tools``: once the user is known (their phone number), the line
behind that number decides whether the phone's line is active, whether roaming is allowed and
whether the data limit is exceeded; a payment the user made marks its bill paid; a bill awaiting
payment becomes the user's payment request.
"""

from __future__ import annotations

from typing import Self

from builtin_envs.tau2.domains.telecom.models import LineStatus, TelecomDB
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
    # sync's lookups of the carrier's side, with the state they were made in (see sync_tools)
    _line_memo: tuple[TelecomDB, tuple[int, int, str], tuple[bool, bool, bool]] | None = None
    _bill_memo: tuple[TelecomDB, tuple[int, int, str], tuple[str, float] | None] | None = None

    def freeze(self) -> None:
        """This state no longer changes (a task's initialized state, a gold outcome): forks
        share its records; its user database hash is computed once, when first asked."""
        super().freeze()
        self._frozen = True

    def fork(self) -> Self:
        """A new episode in this state (see :meth:`Tau2Environment.fork`)."""
        new = super().fork()
        for name in ("_frozen", "_user_hash", "_line_memo", "_bill_memo"):
            new.__dict__.pop(name, None)
        # sync's lookups still hold if this database did not change since: the fork's holds
        # the same records
        db, new_db = self.tools.db, new.tools.db
        for name in ("_line_memo", "_bill_memo"):
            memo = self.__dict__.get(name)
            if memo is not None and memo[0] is db and memo[1][:2] == (db.changes(), len(db.bills)):
                state = (new_db.changes(), len(new_db.bills), memo[1][2])
                new.__dict__[name] = (new_db, state, memo[2])
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
        """Bring the user's surroundings in line with their line, plan and bills (tau2's rules).

        What the carrier's side says (the line's state, the first bill awaiting payment) is
        looked up again only when that side changed since the last sync (:meth:`TelecomDB.
        changes`) or the user's number did; the surroundings are compared and set every time.
        """
        where = self.user_tools.db.surroundings
        phone_number = where.phone_number
        if phone_number is None:
            return
        tools = self.tools
        db = tools.db
        state = (db.changes(), len(db.bills), phone_number)
        memo = self._line_memo
        if memo is not None and memo[0] is db and memo[1] == state:
            active, roaming, exceeded = memo[2]
            if where.line_active is not active:
                where.line_active = active
            if where.roaming_allowed is not roaming:
                where.roaming_allowed = roaming
            if where.mobile_data_usage_exceeded is not exceeded:
                where.mobile_data_usage_exceeded = exceeded
        else:
            line = tools._get_line_by_phone(phone_number)
            # the values tau2 sets, in its order; assigned only when they change (not free)
            active = line.status == LineStatus.ACTIVE
            if where.line_active is not active:
                where.line_active = active
            roaming = bool(line.roaming_enabled)
            if where.roaming_allowed is not roaming:
                where.roaming_allowed = roaming
            plan = tools._get_plan_by_id(line.plan_id)
            exceeded = line.data_used_gb >= plan.data_limit_gb + line.data_refueling_gb
            if where.mobile_data_usage_exceeded is not exceeded:
                where.mobile_data_usage_exceeded = exceeded
            self._line_memo = (db, state, (active, roaming, exceeded))
        if where.payment_request is not None and where.payment_request.paid:
            tools._set_bill_to_paid(where.payment_request.bill_id)
            where.payment_request = None
            state = (db.changes(), len(db.bills), phone_number)  # paying changed it
        if where.payment_request is None:
            bill_memo = self._bill_memo
            if bill_memo is not None and bill_memo[0] is db and bill_memo[1] == state:
                first = bill_memo[2]
            else:
                customer = tools.get_customer_by_phone(phone_number)
                awaiting = tools._get_bills_awaiting_payment(customer)
                first = (awaiting[0].bill_id, awaiting[0].total_due) if awaiting else None
                self._bill_memo = (db, state, first)
            if first is not None:
                where.payment_request = PaymentRequest(bill_id=first[0], amount_due=first[1])
