"""Seeded random tool calls whose arguments hang together, for differential tests of tau2.

Random arguments mostly hit "not found". These are drawn from one user's world: their orders and
reservations, the items in those orders and other variants of the same products, their payment
methods (gift cards and certificates included), flights that exist on dates that exist, bookings
whose payments add up (or nearly), so the deeper rules (balances, seats, item matching, the
order of checks) are reached. A few arguments stay wrong on purpose.

Reads a database through attribute access only (``db.users[...].payment_methods``), so the same
code runs on the original's models (``oracle_driver.py``) and on ours (the live test), and needs
nothing but the standard library.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["relational_calls"]


def _maybe(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def _retail(rng: random.Random, db: Any, count: int) -> list[dict[str, Any]]:
    users = list(db.users)
    user = db.users[rng.choice(users)]
    while not user.orders:
        user = db.users[rng.choice(users)]
    orders = [o for o in user.orders if o in db.orders] or list(db.orders)[:1]
    methods = list(user.payment_methods)
    calls: list[dict[str, Any]] = []
    pending = [o for o in orders if db.orders[o].status == "pending"]
    delivered = [o for o in orders if db.orders[o].status == "delivered"]
    for _ in range(count):
        tool = rng.choice(
            [
                "cancel_pending_order",
                "exchange_delivered_order_items",
                "modify_pending_order_items",
                "modify_pending_order_payment",
                "modify_pending_order_address",
                "return_delivered_order_items",
                "modify_user_address",
                "get_order_details",
                "get_user_details",
                "get_product_details",
                "find_user_id_by_email",
                "find_user_id_by_name_zip",
                "list_all_product_types",
                "calculate",
            ]
        )
        # mostly an order the tool applies to (a pending one to modify, a delivered one to return)
        fitting = delivered if tool.endswith("delivered_order_items") else pending
        if "pending" not in tool and "delivered" not in tool:
            fitting = orders
        order = db.orders[rng.choice(fitting if fitting and _maybe(rng, 0.85) else orders)]
        items = [i.item_id for i in order.items]
        picked = rng.sample(items, k=min(len(items), rng.randint(1, 3)))
        if _maybe(rng, 0.15):
            picked.append(picked[0])
        if _maybe(rng, 0.1):
            picked.append("0000000000")
        new = []
        for item_id in picked:
            item = next((i for i in order.items if i.item_id == item_id), None)
            product = db.products.get(item.product_id) if item is not None else None
            variants = list(product.variants) if product is not None else ["1"]
            roll = rng.random()
            if roll < 0.1:
                new.append(item_id)
            elif roll < 0.2:
                other = db.products[rng.choice(list(db.products))]
                new.append(rng.choice(list(other.variants)))
            else:
                new.append(rng.choice(variants))
        if _maybe(rng, 0.1):
            new = new[:-1]
        method = rng.choice(methods) if not _maybe(rng, 0.1) else "gift_card_0000000"
        address = {
            "address1": rng.choice(["1 Main St", "9 Ünter Straße"]),
            "address2": rng.choice(["", "Apt 2"]),
            "city": "Springfield",
            "state": "IL",
            "country": "USA",
            "zip": rng.choice(["62701", "00000"]),
        }
        args: dict[str, Any]
        if tool == "cancel_pending_order":
            reason = rng.choice(["no longer needed", "ordered by mistake", "changed my mind"])
            args = {"order_id": order.order_id, "reason": reason}
        elif tool in ("exchange_delivered_order_items", "modify_pending_order_items"):
            args = {
                "order_id": order.order_id,
                "item_ids": picked,
                "new_item_ids": new,
                "payment_method_id": method,
            }
        elif tool == "return_delivered_order_items":
            args = {"order_id": order.order_id, "item_ids": picked, "payment_method_id": method}
        elif tool == "modify_pending_order_payment":
            args = {"order_id": order.order_id, "payment_method_id": method}
        elif tool == "modify_pending_order_address":
            args = {"order_id": order.order_id, **address}
        elif tool == "modify_user_address":
            args = {"user_id": user.user_id, **address}
        elif tool == "get_order_details":
            args = {"order_id": order.order_id}
        elif tool == "get_user_details":
            args = {"user_id": user.user_id}
        elif tool == "get_product_details":
            args = {"product_id": order.items[0].product_id if order.items else "1"}
        elif tool == "find_user_id_by_email":
            args = {"email": user.email.upper() if _maybe(rng, 0.5) else user.email}
        elif tool == "find_user_id_by_name_zip":
            args = {
                "first_name": user.name.first_name.lower(),
                "last_name": user.name.last_name,
                "zip": user.address.zip if _maybe(rng, 0.8) else "99999",
            }
        elif tool == "calculate":
            args = {"expression": f"{rng.randint(1, 999)} * {rng.random():.3f} - 7 / 3"}
        else:
            args = {}
        calls.append({"name": tool, "arguments": args})
    return calls


def _airline(rng: random.Random, db: Any, count: int) -> list[dict[str, Any]]:
    users = [u for u in db.users.values() if u.reservations]
    user = rng.choice(users)
    methods = list(user.payment_methods)
    reservations = [r for r in user.reservations if r in db.reservations]
    flights = list(db.flights.values())
    calls: list[dict[str, Any]] = []
    for _ in range(count):
        reservation = db.reservations[rng.choice(reservations)]
        flight = rng.choice(flights)
        available = [d for d, s in flight.dates.items() if s.status == "available"]
        day = rng.choice(available) if available else rng.choice(list(flight.dates))
        cabin = rng.choice(["economy", "business", "basic_economy"])
        method = rng.choice(methods) if not _maybe(rng, 0.1) else "credit_card_0000000"
        tool = rng.choice(
            [
                "book_reservation",
                "book_reservation",
                "update_reservation_flights",
                "update_reservation_baggages",
                "update_reservation_passengers",
                "cancel_reservation",
                "send_certificate",
                "get_reservation_details",
                "get_user_details",
                "search_direct_flight",
                "search_onestop_flight",
                "get_flight_status",
                "list_all_airports",
            ]
        )
        args: dict[str, Any]
        if tool == "book_reservation":
            passengers = [
                {"first_name": p.first_name, "last_name": p.last_name, "dob": p.dob}
                for p in (user.saved_passengers or reservation.passengers)[: rng.randint(1, 2)]
            ]
            legs = [{"flight_number": flight.flight_number, "date": day}]
            if _maybe(rng, 0.2):
                legs.append(dict(legs[0]))
            status = flight.dates[day]
            price = status.prices[cabin] if status.status == "available" else 100
            insurance = rng.choice(["yes", "no"])
            bags = rng.randint(0, 2)
            total = price * len(passengers) * len(legs) + 50 * bags
            total += 30 * len(passengers) if insurance == "yes" else 0
            if _maybe(rng, 0.2):
                total += rng.choice([-1, 1])
            payments = [{"payment_id": method, "amount": total}]
            if _maybe(rng, 0.3) and len(methods) > 1:
                other = rng.choice(methods)
                payments = [
                    {"payment_id": other, "amount": min(total, 100)},
                    {"payment_id": method, "amount": total - min(total, 100)},
                ]
            args = {
                "user_id": user.user_id,
                "origin": flight.origin,
                "destination": flight.destination,
                "flight_type": rng.choice(["one_way", "round_trip"]),
                "cabin": cabin,
                "flights": legs,
                "passengers": passengers,
                "payment_methods": payments,
                "total_baggages": bags + rng.randint(0, 2),
                "nonfree_baggages": bags,
                "insurance": insurance,
            }
        elif tool == "update_reservation_flights":
            legs = [{"flight_number": f.flight_number, "date": f.date} for f in reservation.flights]
            if legs and _maybe(rng, 0.6):
                legs[rng.randrange(len(legs))] = {
                    "flight_number": flight.flight_number,
                    "date": day,
                }
            args = {
                "reservation_id": reservation.reservation_id,
                "cabin": cabin if _maybe(rng, 0.5) else reservation.cabin,
                "flights": legs,
                "payment_id": method,
            }
        elif tool == "update_reservation_baggages":
            bags = rng.randint(0, 4)
            args = {
                "reservation_id": reservation.reservation_id,
                "total_baggages": bags + 1,
                "nonfree_baggages": bags,
                "payment_id": method,
            }
        elif tool == "update_reservation_passengers":
            people = [
                {"first_name": p.first_name, "last_name": p.last_name + "é", "dob": p.dob}
                for p in reservation.passengers
            ]
            if _maybe(rng, 0.2):
                people = people[:-1]
            args = {"reservation_id": reservation.reservation_id, "passengers": people}
        elif tool == "cancel_reservation":
            args = {"reservation_id": reservation.reservation_id}
        elif tool == "send_certificate":
            args = {"user_id": user.user_id, "amount": rng.choice([50, 100, 150])}
        elif tool == "get_reservation_details":
            args = {"reservation_id": reservation.reservation_id}
        elif tool == "get_user_details":
            args = {"user_id": user.user_id}
        elif tool in ("search_direct_flight", "search_onestop_flight"):
            args = {"origin": flight.origin, "destination": flight.destination, "date": day}
            if tool == "search_onestop_flight":
                args["destination"] = rng.choice(flights).destination
        elif tool == "get_flight_status":
            args = {"flight_number": flight.flight_number, "date": day}
        else:
            args = {}
        calls.append({"name": tool, "arguments": args})
    return calls


def relational_calls(domain: str, db: Any, seed: int, count: int) -> list[dict[str, Any]]:
    """``count`` calls of ``domain``'s tools over one user's world in ``db``, from ``seed``."""
    rng = random.Random(seed)
    if domain == "retail":
        return _retail(rng, db, count)
    if domain == "airline":
        return _airline(rng, db, count)
    raise ValueError(f"no relational calls for domain {domain!r}")
