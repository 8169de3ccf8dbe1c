"""Telecom's environment: after every call, the phone is brought in line with the carrier's side.

tau2's ``TelecomEnvironment.sync_tools``: once the user is known (their phone number), the line
behind that number decides whether the phone's line is active, whether roaming is allowed and
whether the data limit is exceeded; a payment the user made marks its bill paid; a bill awaiting
payment becomes the user's payment request.
"""

from __future__ import annotations

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
    _frozen_hashes: tuple[str | None, str | None] | None = None

    def freeze_hashes(self) -> None:
        """Remember both hashes: this environment will not change again (a gold outcome)."""
        self._frozen_hashes = (self.get_db_hash(), self.get_user_db_hash())

    def db_hashes(self) -> tuple[str | None, str | None]:
        """tau2's hashes of the agent's and the user's databases."""
        if self._frozen_hashes is not None:
            return self._frozen_hashes
        return (self.get_db_hash(), self.get_user_db_hash())

    def same_db_state(self, other: Tau2Environment) -> bool:
        """Whether both databases hash as ``other``'s do (a gold outcome's hashes, remembered)."""
        if isinstance(other, TelecomEnvironment):
            return self.db_hashes() == other.db_hashes()
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
