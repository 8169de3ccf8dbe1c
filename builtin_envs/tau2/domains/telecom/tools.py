"""The telecom agent's tools (tau2's ``TelecomTools``): outputs, errors and database changes.

Checks run in tau2's order and arguments are used as given (no validation first), so a bad
argument fails where and how it fails there. A record is taken with ``db.writable`` before it is
changed: the episode's database copies a shared record then. Methods that are not tools (``set_data_usage``,
``suspend_line_for_overdue_bill``, the ``assert_*`` functions) are what tasks name in their
initialization actions and assertions.
"""

from __future__ import annotations

import uuid
from datetime import date, timedelta
from typing import Any, Self

from builtin_envs.tau2.domains.telecom.models import (
    Bill,
    BillStatus,
    Customer,
    Device,
    Line,
    LineItem,
    LineStatus,
    Plan,
    TelecomDB,
)
from builtin_envs.tau2.toolkit import ToolKind, Toolkit, tool

__all__ = ["TODAY", "TelecomTools"]

TODAY = date(2025, 2, 25)  # the domain's "today"


def _first_of_next_month(day: date) -> date:
    return (day.replace(day=1) + timedelta(days=32)).replace(day=1)


def _first_positions(records: list[Any], key: str) -> dict[str, int] | None:
    """Each value of ``key`` with its first position; None if one is not a plain ``str``."""
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        value = getattr(record, key)
        if type(value) is not str:  # compared as tau2 compares it: by scanning
            return None
        first.setdefault(value, i)
    return first


class TelecomTools(Toolkit):
    """Tools for the telecom domain implementing the functions described in the PRD."""

    db: TelecomDB

    def __init__(self, db: TelecomDB) -> None:
        super().__init__(db)
        self.drew_random_id = False  # a new draft bill got a random id (see refuel_data)
        # field -> (the list indexed, its length then, field value -> first position, its table)
        self._positions: dict[str, tuple[list[Any], int, dict[str, int] | None, str]] = {}

    def fork(self) -> Self:
        """These tools over a fork of the database."""
        new = super().fork()
        new.drew_random_id = self.drew_random_id
        for key, (records, length, positions, table) in self._positions.items():
            if records is getattr(self.db, table) and length == len(records):
                # the fork's list holds the same records, or copies, in the same order
                new._positions[key] = (getattr(new.db, table), length, positions, table)
        return new

    # -- lookups ----------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def get_customer_by_phone(self, phone_number: str) -> Customer:
        """
        Finds a customer by their primary contact or line phone number.

        Args:
            phone_number: The phone number to search for.

        Returns:
            Customer object if found, None otherwise.
        """
        for customer in self.db.customers:
            if customer.phone_number == phone_number:
                return customer
            for line_id in customer.line_ids:
                if self._get_line_by_id(line_id).phone_number == phone_number:
                    return customer
        raise ValueError(f"Customer with phone number {phone_number} not found")

    @tool(ToolKind.READ)
    def get_customer_by_id(self, customer_id: str) -> Customer:
        """
        Retrieves a customer directly by their unique ID.

        Args:
            customer_id: The unique identifier of the customer.

        Returns:
            Customer object if found, None otherwise.
        """
        customer: Customer = self._find("customers", "customer_id", customer_id, "Customer with ID")
        return customer

    @tool(ToolKind.READ)
    def get_customer_by_name(self, full_name: str, dob: str) -> list[Customer]:
        """
        Searches for customers by name and DOB. May return multiple matches if names are similar,
        DOB helps disambiguate.

        Args:
            full_name: The full name of the customer.
            dob: Date of birth for verification, in the format YYYY-MM-DD.

        Returns:
            List of matching Customer objects.
        """
        return [
            c
            for c in self.db.customers
            if c.full_name.lower() == full_name.lower() and c.date_of_birth == dob
        ]

    def _find(self, table: str, key: str, value: Any, what: str) -> Any:
        """The first record of ``table`` whose ``key`` equals ``value``, else ``ValueError``.

        tau2 scans the list. Here a plain ``str`` value is looked up in an index: each value of
        ``key`` with its first position, rebuilt when the list is another or its length
        changed (records are appended, never removed), a hit checked against the record now at
        that position (a record a tool copied before changing it sits where the shared one
        was). No tool changes an id or a line's phone number, so a first position stays first.
        Anything else, and a miss, is tau2's scan.
        """
        records: list[Any] = getattr(self.db, table)
        if type(value) is str:
            entry = self._positions.get(key)
            if entry is None or entry[0] is not records or entry[1] != len(records):
                positions = _first_positions(records, key)
                entry = self._positions[key] = (records, len(records), positions, table)
            positions = entry[2]
            if positions is not None:
                where = positions.get(value)
                if where is not None:
                    record = records[where]
                    if getattr(record, key) == value:
                        return record
        for record in records:
            if getattr(record, key) == value:
                return record
        raise ValueError(f"{what} {value} not found")

    def _get_line_by_phone(self, phone_number: str) -> Line:
        line: Line = self._find("lines", "phone_number", phone_number, "Line with phone number")
        return line

    def _get_line_by_id(self, line_id: str) -> Line:
        line: Line = self._find("lines", "line_id", line_id, "Line with ID")
        return line

    def _get_plan_by_id(self, plan_id: str) -> Plan:
        plan: Plan = self._find("plans", "plan_id", plan_id, "Plan with ID")
        return plan

    def _get_device_by_id(self, device_id: str) -> Device:
        device: Device = self._find("devices", "device_id", device_id, "Device with ID")
        return device

    def _get_bill_by_id(self, bill_id: str) -> Bill:
        bill: Bill = self._find("bills", "bill_id", bill_id, "Bill with ID")
        return bill

    def _get_target_line(self, customer_id: str, line_id: str) -> Line:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.line_ids:
            raise ValueError(f"Line {line_id} not found for customer {customer_id}")
        return self._get_line_by_id(line_id)

    def get_available_plan_ids(self) -> list[str]:
        """Every plan's id."""
        return [plan.plan_id for plan in self.db.plans]

    @tool(ToolKind.READ)
    def get_details_by_id(self, id: str) -> dict[str, Any]:
        """
        Retrieves the details for a given ID.
        The ID must be a valid ID for a Customer, Line, Device, Bill, or Plan.

        Args:
            id: The ID of the object to retrieve.

        Returns:
            The object corresponding to the ID.

        Raises:
            ValueError: If the ID is not found or if the ID format is invalid.
        """
        lookups = (
            ("L", self._get_line_by_id),
            ("D", self._get_device_by_id),
            ("B", self._get_bill_by_id),
            ("C", self.get_customer_by_id),
            ("P", self._get_plan_by_id),
        )
        for prefix, lookup in lookups:
            if id.startswith(prefix):
                found: Any = lookup(id)
                return found  # type: ignore[no-any-return]
        raise ValueError(f"Unknown ID format or type: {id}")

    # -- lines ------------------------------------------------------------------------------------

    @tool(ToolKind.WRITE)
    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict[str, Any]:
        """
        Suspends a specific line (max 6 months).
        Checks: Line status must be Active.
        Logic: Sets line status to Suspended, records suspension_start_date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to suspend.
            reason: Reason for suspension.

        Returns:
            Dictionary with success status, message, and updated line if applicable.

        Raises:
            ValueError: If customer or line not found, or if line is not active.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend")
        line = self.db.writable(line)
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        return {
            "message": "Line suspended successfully. $5/month holding fee will apply.",
            "line": line,
        }

    @tool(ToolKind.WRITE)
    def resume_line(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """
        Resumes a suspended line.
        Checks: Line status must be Suspended or Pending Activation.
        Logic: Sets line status to Active, clears suspension_start_date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to resume.

        Returns:
            Dictionary with success status, message, and updated line if applicable.

        Raises:
            ValueError: If customer or line not found, or if line is not suspended or pending activation.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.status not in (LineStatus.SUSPENDED, LineStatus.PENDING_ACTIVATION):
            raise ValueError("Line must be suspended to resume")
        line = self.db.writable(line)
        line.status = LineStatus.ACTIVE
        line.suspension_start_date = None
        return {"message": "Line resumed successfully", "line": line}

    # -- bills ------------------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[Bill]:
        """
        Retrieves a list of the customer's bills, most recent first.

        Args:
            customer_id: ID of the customer.
            limit: Maximum number of bills to return.

        Returns:
            List of Bill objects, ordered by issue date (newest first).

        Raises:
            ValueError: If the customer is not found.
        """
        customer = self.get_customer_by_id(customer_id)
        bills = [self._get_bill_by_id(bill_id) for bill_id in customer.bill_ids]
        return sorted(bills, key=lambda bill: bill.issue_date, reverse=True)[:limit]

    @tool(ToolKind.WRITE)
    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        """
        Sends a payment request to the customer for a specific bill.
        Checks:
            - Customer exists
            - Bill exists and belongs to the customer
            - No other bills are already awaiting payment for this customer
        Logic: Sets bill status to AWAITING_PAYMENT and notifies customer.
        Warning: This method does not check if the bill is already PAID.
        Always check the bill status before calling this method.

        Args:
            customer_id: ID of the customer who owns the bill.
            bill_id: ID of the bill to send payment request for.

        Returns:
            Message indicating the payment request has been sent.

        Raises:
            ValueError: If customer not found, bill not found, or if another bill is already awaiting payment.
        """
        customer = self.get_customer_by_id(customer_id)
        if self._get_bills_awaiting_payment(customer):
            raise ValueError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.bill_ids:
            raise ValueError(f"Bill {bill_id} not found for customer {customer_id}")
        bill = self.db.writable(self._get_bill_by_id(bill_id))
        bill.status = BillStatus.AWAITING_PAYMENT
        return f"Payment request sent to the customer for bill {bill.bill_id}"

    def _get_bills_awaiting_payment(self, customer: Customer) -> list[Bill]:
        bills = [self._get_bill_by_id(bill_id) for bill_id in customer.bill_ids]  # all looked up
        return [bill for bill in bills if bill.status == BillStatus.AWAITING_PAYMENT]

    def _set_bill_to_paid(self, bill_id: str) -> str:
        self.db.writable(self._get_bill_by_id(bill_id)).status = BillStatus.PAID
        return f"Bill {bill_id} set to paid"

    def _apply_one_time_charge(self, customer_id: str, amount: float, description: str) -> None:
        """Add a charge (or credit) to the customer's draft bill, opening one if there is none.

        A new draft bill gets a random id, as in tau2 (``B`` + 8 hex digits).
        """
        customer = self.get_customer_by_id(customer_id)
        draft = None
        for bill_id in customer.bill_ids:
            bill = self._get_bill_by_id(bill_id)
            if bill.status == BillStatus.DRAFT:
                draft = bill
                break
        if draft is None:
            start = _first_of_next_month(TODAY)
            draft = Bill(
                bill_id=f"B{uuid.uuid4().hex[:8]}",
                customer_id=customer_id,
                period_start=start,
                period_end=_first_of_next_month(start) - timedelta(days=1),
                issue_date=start,
                total_due=0,
                due_date=start + timedelta(days=14),
                status=BillStatus.DRAFT,
            )
            self.drew_random_id = True
            self.db.bills.append(draft)
            self.db.writable(customer).bill_ids.append(draft.bill_id)
        draft = self.db.writable(draft)
        draft.line_items.append(
            LineItem(
                description=description,
                amount=amount,
                date=TODAY,
                item_type="Credit" if amount < 0 else "Charge",
            )
        )
        draft.total_due += amount

    # -- usage and roaming ------------------------------------------------------------------------

    @tool(ToolKind.READ)
    def get_data_usage(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """
        Retrieves current billing cycle data usage for a line, including data
        refueling amount, data limit, and cycle end date.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to check usage for.

        Returns:
            Dictionary with usage information.

        Raises:
            ValueError: If customer, line, or plan not found.
        """
        line = self._get_target_line(customer_id, line_id)
        plan = self._get_plan_by_id(line.plan_id)
        return {
            "line_id": line_id,
            "data_used_gb": line.data_used_gb,
            "data_limit_gb": plan.data_limit_gb,
            "data_refueling_gb": line.data_refueling_gb,
            "cycle_end_date": _first_of_next_month(TODAY) - timedelta(days=1),
        }

    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        """Set a line's data used this cycle (a task's initialization)."""
        self.db.writable(self._get_target_line(customer_id, line_id)).data_used_gb = data_used_gb
        return f"Data usage set to {data_used_gb} GB for line {line_id}"

    @tool(ToolKind.WRITE)
    def enable_roaming(self, customer_id: str, line_id: str) -> dict[str, Any]:
        """
        Enables international roaming on a line.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to enable roaming for.

        Returns:
            Message indicating the roaming has been enabled.

        Raises:
            ValueError: If customer or line not found.
        """
        line = self._get_target_line(customer_id, line_id)
        if line.roaming_enabled:
            return "Roaming was already enabled"  # type: ignore[return-value]
        self.db.writable(line).roaming_enabled = True
        return "Roaming enabled successfully"  # type: ignore[return-value]

    @tool(ToolKind.WRITE)
    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        """
        Disables international roaming on a line.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to disable roaming for.

        Returns:
            Message indicating the roaming has been enabled.

        Raises:
            ValueError: If customer or line not found.
        """
        line = self._get_target_line(customer_id, line_id)
        if not line.roaming_enabled:
            return "Roaming was already disabled"
        self.db.writable(line).roaming_enabled = False
        return "Roaming disabled successfully"

    @tool(ToolKind.GENERIC)
    def transfer_to_human_agents(self, summary: str) -> str:
        """
        Transfer the user to a human agent, with a summary of the user's issue.
        Only transfer if
         -  the user explicitly asks for a human agent
         -  given the policy and the available tools, you cannot solve the user's issue.

        Args:
            summary: A summary of the user's issue.

        Returns:
            A message indicating the user has been transferred to a human agent.
        """
        return "Transfer successful"

    @tool(ToolKind.WRITE)
    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict[str, Any]:
        """
        Refuels data for a specific line, adding to the customer's bill.
        Checks: Line status must be Active, Customer owns the line.
        Logic: Adds data to the line and charges customer based on the plan's refueling rate.

        Args:
            customer_id: ID of the customer who owns the line.
            line_id: ID of the line to refuel data for.
            gb_amount: Amount of data to add in gigabytes.

        Returns:
            Dictionary with success status, message, charge amount, and updated line if applicable.

        Raises:
            ValueError: If customer, line, or plan not found, or if checks fail.
        """
        line = self._get_target_line(customer_id, line_id)
        if gb_amount <= 0:
            raise ValueError("Refuel amount must be positive")
        plan = self._get_plan_by_id(line.plan_id)
        charge = gb_amount * plan.data_refueling_price_per_gb
        line = self.db.writable(line)
        line.data_refueling_gb += gb_amount
        self._apply_one_time_charge(
            customer_id,
            charge,
            f"Data refueling: {gb_amount} GB at ${plan.data_refueling_price_per_gb}/GB",
        )
        return {
            "message": f"Successfully added {gb_amount} GB of data for line {line_id} "
            f"for ${charge:.2f}",
            "new_data_refueling_gb": line.data_refueling_gb,
            "charge": charge,
        }

    # -- tasks' initialization ("break") functions ------------------------------------------------

    def suspend_line_for_overdue_bill(
        self, customer_id: str, line_id: str, new_bill_id: str, contract_ended: bool
    ) -> str:
        """Suspend a line for an unpaid bill: an overdue bill for last month's plan charge."""
        line = self._get_line_by_id(line_id)
        if line.status != LineStatus.ACTIVE:
            raise ValueError("Line must be active to suspend for unpaid bill")
        amount = self._get_plan_by_id(line.plan_id).price_per_month
        if amount <= 0:
            raise ValueError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        statuses = [self._get_bill_by_id(b).status for b in customer.bill_ids]  # all looked up
        if BillStatus.OVERDUE in statuses:
            raise ValueError("Customer already has an overdue bill")
        last_day = TODAY.replace(day=1) - timedelta(days=1)
        first_day = last_day.replace(day=1)
        bill = Bill(
            bill_id=new_bill_id,
            customer_id=customer_id,
            period_start=first_day,
            period_end=last_day,
            issue_date=first_day,
            total_due=0,
            due_date=first_day + timedelta(days=14),
            status=BillStatus.OVERDUE,
        )
        bill.line_items.append(
            LineItem(
                description=f"Charge for line {line.line_id}",
                amount=amount,
                date=TODAY,
                item_type="Charge" if amount > 0 else "Credit",
            )
        )
        bill.total_due += amount
        self.db.bills.append(bill)
        self.db.writable(customer).bill_ids.append(new_bill_id)
        line = self.db.writable(line)
        line.status = LineStatus.SUSPENDED
        line.suspension_start_date = TODAY
        if contract_ended:
            line.contract_end_date = last_day
        return (
            f"Line {line_id} suspended for unpaid bill {new_bill_id}. "
            f"Contract ended: {contract_ended}"
        )

    # -- tasks' assertions ------------------------------------------------------------------------

    def assert_data_refueling_amount(
        self, customer_id: str, line_id: str, expected_amount: float
    ) -> bool:
        """Whether the line's refueled data is ``expected_amount`` GB."""
        line = self._get_target_line(customer_id, line_id)
        return abs(line.data_refueling_gb - expected_amount) < 1e-6

    def assert_line_status(
        self, customer_id: str, line_id: str, expected_status: LineStatus
    ) -> bool:
        """Whether the line's status is ``expected_status``."""
        return self._get_target_line(customer_id, line_id).status == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        """True if the customer's bill is overdue; raises otherwise."""
        customer = self.get_customer_by_id(customer_id)
        if overdue_bill_id not in customer.bill_ids:
            raise ValueError(f"Overdue bill {overdue_bill_id} not found")
        if self._get_bill_by_id(overdue_bill_id).status != BillStatus.OVERDUE:
            raise ValueError(f"Overdue bill {overdue_bill_id} is not overdue")
        return True

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """Whether the bill is gone or paid."""
        try:
            bill = self._get_bill_by_id(overdue_bill_id)
        except ValueError:
            return True
        return bill.status == BillStatus.PAID
