"""Seeded tool calls for telecom's differential tests: both sides, from a task's initial state.

A sequence starts from a task's initial state (its phone broken in the task's ways) and mixes
the agent's tools (on the carrier's records: real customers, lines and bills, sometimes the
wrong owner or a made-up id) with the user's tools (toggles, checks, payments, permissions, APN
objects, modes), with a few arguments of the wrong type. ``refuel_data`` is kept off customers
without a draft bill: there the original opens a bill with a random id, which no two runs share.

Reads a database through attribute access only, so the same code runs on the original's models
(``oracle_driver.py``) and on ours (the live test); needs nothing but the standard library.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["ODD_VALUES", "USER_CALLS", "telecom_calls"]

ODD_VALUES: list[Any] = [None, 0, -2, 2.5, True, "", "ünïcödé ✈", [], ["x"], {}, {"a": 1}]

# the user's tools and plausible arguments (besides odd ones)
USER_CALLS: dict[str, dict[str, list[Any]]] = {
    "check_status_bar": {},
    "check_network_status": {},
    "check_network_mode_preference": {},
    "set_network_mode_preference": {
        "mode": ["4g_5g_preferred", "4g_only", "3g_only", "2g_only", "5g", "4G_ONLY"]
    },
    "run_speed_test": {},
    "toggle_airplane_mode": {},
    "check_sim_status": {},
    "reseat_sim_card": {},
    "toggle_data": {},
    "toggle_roaming": {},
    "check_data_restriction_status": {},
    "toggle_data_saver_mode": {},
    "check_apn_settings": {},
    "set_apn_settings": {
        "apn_settings": [
            {},
            {"apn_name": "internet"},
            {"apn_name": "broken", "mmsc_url": None},
            {"apn_name": "internet", "mms_port": 8080, "mms_proxy": "10.0.0.1"},
            {"apn_name": "nope"},
            {"apn_name": "internet", "extra": 1},
            {"mms_port": "eighty"},
        ]
    },
    "reset_apn_settings": {},
    "check_wifi_status": {},
    "toggle_wifi": {},
    "check_wifi_calling_status": {},
    "toggle_wifi_calling": {},
    "check_vpn_status": {},
    "connect_vpn": {},
    "disconnect_vpn": {},
    "check_installed_apps": {},
    "check_app_status": {"app_name": ["messaging", "browser", "camera", "Messaging"]},
    "check_app_permissions": {"app_name": ["messaging", "browser", "camera"]},
    "grant_app_permission": {
        "app_name": ["messaging", "browser", "camera"],
        "permission": ["sms", "storage", "STORAGE", "phone", "network", "camera"],
    },
    "can_send_mms": {},
    "reboot_device": {},
    "check_payment_request": {},
    "make_payment": {},
}
_AGENT_TOOLS = (
    "get_customer_by_phone",
    "get_customer_by_id",
    "get_customer_by_name",
    "get_details_by_id",
    "suspend_line",
    "resume_line",
    "get_bills_for_customer",
    "send_payment_request",
    "get_data_usage",
    "enable_roaming",
    "disable_roaming",
    "transfer_to_human_agents",
    "refuel_data",
)


def _agent_args(rng: random.Random, db: Any, name: str, customer: Any) -> dict[str, Any]:
    lines = list(customer.line_ids) or ["L1001"]
    other_lines = [line.line_id for line in db.lines]
    line_id = rng.choice(lines) if rng.random() < 0.85 else rng.choice(other_lines)
    cid = customer.customer_id if rng.random() < 0.9 else rng.choice(["C9999", "c1001", ""])
    bills = list(customer.bill_ids) or ["B1001"]
    bill_id = rng.choice(bills) if rng.random() < 0.85 else rng.choice(["B1234321", "B9999"])
    phones = [line.phone_number for line in db.lines] + [c.phone_number for c in db.customers]
    if name == "get_customer_by_phone":
        return {"phone_number": rng.choice([*phones, "555-000-0000"])}
    if name == "get_customer_by_id":
        return {"customer_id": cid}
    if name == "get_customer_by_name":
        return {
            "full_name": rng.choice([customer.full_name, customer.full_name.upper(), "Nobody"]),
            "dob": rng.choice([customer.date_of_birth, "1900-01-01"]),
        }
    if name == "get_details_by_id":
        ids = [
            line_id,
            bill_id,
            cid,
            rng.choice([p.plan_id for p in db.plans]),
            rng.choice([d.device_id for d in db.devices]),
            "X1",
            "L0000",
        ]
        return {"id": rng.choice(ids)}
    if name == "suspend_line":
        return {"customer_id": cid, "line_id": line_id, "reason": "travel"}
    if name in ("resume_line", "get_data_usage", "enable_roaming", "disable_roaming"):
        return {"customer_id": cid, "line_id": line_id}
    if name == "get_bills_for_customer":
        args: dict[str, Any] = {"customer_id": cid}
        if rng.random() < 0.5:
            args["limit"] = rng.choice([1, 2, 0, 12, -1])
        return args
    if name == "send_payment_request":  # never a draft bill: refuel_data needs C1001's
        payable = [b for b in bills if b != "B1003"] or ["B1001"]
        return {"customer_id": cid, "bill_id": rng.choice([*payable, "B1234321"])}
    if name == "transfer_to_human_agents":
        return {"summary": "The user needs help."}
    # refuel_data: only C1001 has a draft bill (elsewhere the original makes a random bill id)
    return {
        "customer_id": rng.choice(["C1001", "C1001", "C9999"]),
        "line_id": rng.choice(["L1001", "L1002", "L1003", "L1004"]),
        "gb_amount": rng.choice([1.0, 2.0, 0.5, 3, 0, -1.0]),
    }


def telecom_calls(db: Any, seed: int, count: int, user_share: float = 0.6) -> list[dict[str, Any]]:
    """``count`` calls (``{"name", "arguments", "requestor"}``), drawn with ``seed``."""
    rng = random.Random(seed)
    customer = rng.choice([c for c in db.customers if c.line_ids])
    calls: list[dict[str, Any]] = []
    for _ in range(count):
        if rng.random() < user_share:
            name = rng.choice(list(USER_CALLS))
            args = {p: rng.choice(values) for p, values in USER_CALLS[name].items()}
            requestor = "user"
        else:
            name = rng.choice(_AGENT_TOOLS)
            args = _agent_args(rng, db, name, customer)
            requestor = "assistant"
        roll = rng.random()
        if args and roll < 0.06:  # a wrong type
            key = rng.choice(list(args))
            if not (name == "refuel_data" and key == "customer_id"):
                args[key] = rng.choice(ODD_VALUES)
        elif args and roll < 0.09:  # a missing argument
            args.pop(rng.choice(list(args)))
        elif roll < 0.11:  # an unexpected one
            args["unexpected"] = 1
        calls.append({"name": name, "arguments": args, "requestor": requestor})
    return calls
