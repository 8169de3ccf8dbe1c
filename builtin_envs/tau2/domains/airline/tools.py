"""The airline agent's tools, with tau2's behaviour: outputs, errors, and changes to the database.

Every check runs in tau2's order, so a call that breaks two rules reports the same one, and an
argument of the wrong type fails where and how it fails there. Records are taken with
``write=True`` before a tool changes them: the episode's database copies a shared record then.
"""

from copy import deepcopy
from typing import Any

from builtin_envs.tau2.domains.airline.models import (
    AirportCode,
    CabinClass,
    Certificate,
    DirectFlight,
    Flight,
    FlightDateStatus,
    FlightDateStatusAvailable,
    FlightDB,
    FlightInfo,
    FlightType,
    Insurance,
    Passenger,
    Payment,
    Reservation,
    ReservationFlight,
    User,
)
from builtin_envs.tau2.toolkit import ToolKind, Toolkit, tool

__all__ = ["AirlineTools"]

_NOW = "2024-05-15T15:00:00"
_NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
_NEW_CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
_AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)


def _calculate(expression: str) -> str:
    if not all(char in "0123456789+-*/(). " for char in expression):
        raise ValueError("Invalid characters in expression")
    # Only digits, operators, brackets and spaces got here: no names to resolve.
    return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))


class AirlineTools(Toolkit):
    """All the tools for the airline domain."""

    db: FlightDB

    def __init__(self, db: FlightDB) -> None:
        super().__init__(db)

    # -- lookups (write=True: the record is about to change) --------------------------------------

    def _get_user(self, user_id: str, write: bool = False) -> User:
        if user_id not in self.db.users:
            raise ValueError(f"User {user_id} not found")
        user: User = self.db.writable("users", user_id) if write else self.db.users[user_id]
        return user

    def _get_reservation(self, reservation_id: str, write: bool = False) -> Reservation:
        if reservation_id not in self.db.reservations:
            raise ValueError(f"Reservation {reservation_id} not found")
        if write:
            reservation: Reservation = self.db.writable("reservations", reservation_id)
            return reservation
        return self.db.reservations[reservation_id]

    def _get_flight(self, flight_number: str, write: bool = False) -> Flight:
        if flight_number not in self.db.flights:
            raise ValueError(f"Flight {flight_number} not found")
        if write:
            flight: Flight = self.db.writable("flights", flight_number)
            return flight
        return self.db.flights[flight_number]

    def _get_flight_instance(
        self, flight_number: str, date: str, write: bool = False
    ) -> FlightDateStatus:
        flight = self._get_flight(flight_number, write)
        if date not in flight.dates:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight.dates[date]

    def _new_reservation_id(self) -> str:
        for reservation_id in _NEW_RESERVATION_IDS:
            if reservation_id not in self.db.reservations:
                return reservation_id
        raise ValueError("Too many reservations")

    def _search_direct_flight(
        self,
        date: str,
        origin: str | None = None,
        destination: str | None = None,
        leave_after: str | None = None,
    ) -> list[DirectFlight]:
        found = []
        for flight in self.db.flights.values():
            if origin is not None and flight.origin != origin:
                continue
            if destination is not None and flight.destination != destination:
                continue
            if date not in flight.dates or flight.dates[date].status != "available":
                continue
            if leave_after is not None and not flight.scheduled_departure_time_est >= leave_after:
                continue
            day = flight.dates[date]
            assert isinstance(day, FlightDateStatusAvailable)
            found.append(
                DirectFlight(
                    flight_number=flight.flight_number,
                    origin=flight.origin,
                    destination=flight.destination,
                    status="available",
                    scheduled_departure_time_est=flight.scheduled_departure_time_est,
                    scheduled_arrival_time_est=flight.scheduled_arrival_time_est,
                    available_seats=day.available_seats,
                    prices=day.prices,
                )
            )
        return found

    def _payment_for_update(self, user: User, payment_id: str, total_price: int) -> Payment | None:
        if payment_id not in user.payment_methods:
            raise ValueError("Payment method not found")
        method = user.payment_methods[payment_id]
        if method.source == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method.source == "gift_card" and method.amount < total_price:
            raise ValueError("Gift card balance is not enough")
        if method.source == "gift_card":
            method.amount -= total_price
        if total_price != 0:
            return Payment(payment_id=payment_id, amount=total_price)
        return None

    # -- tools ------------------------------------------------------------------------------------

    @tool(ToolKind.WRITE)
    def book_reservation(
        self,
        user_id: str,
        origin: str,
        destination: str,
        flight_type: FlightType,
        cabin: CabinClass,
        flights: list[FlightInfo | dict],  # type: ignore[type-arg]
        passengers: list[Passenger | dict],  # type: ignore[type-arg]
        payment_methods: list[Payment | dict],  # type: ignore[type-arg]
        total_baggages: int,
        nonfree_baggages: int,
        insurance: Insurance,
    ) -> Reservation:
        """
        Book a reservation.

        Args:
            user_id: The ID of the user to book the reservation such as 'sara_doe_496'`.
            origin: The IATA code for the origin city such as 'SFO'.
            destination: The IATA code for the destination city such as 'JFK'.
            flight_type: The type of flight such as 'one_way' or 'round_trip'.
            cabin: The cabin class such as 'basic_economy', 'economy', or 'business'.
            flights: An array of objects containing details about each piece of flight.
            passengers: An array of objects containing details about each passenger.
            payment_methods: An array of objects containing details about each payment method.
            total_baggages: The total number of baggage items to book the reservation.
            nonfree_baggages: The number of non-free baggage items to book the reservation.
            insurance: Whether the reservation has insurance.
        """
        # The arguments arrive unchecked (as in tau2): anything may be in them.
        infos: Any = flights
        travellers: Any = passengers
        payments: Any = payment_methods
        if all(isinstance(f, dict) for f in infos):
            infos = [FlightInfo(**f) for f in infos]
        if all(isinstance(p, dict) for p in travellers):
            travellers = [Passenger(**p) for p in travellers]
        if all(isinstance(p, dict) for p in payments):
            payments = [Payment(**p) for p in payments]
        user = self._get_user(user_id, write=True)
        reservation_id = self._new_reservation_id()
        reservation = Reservation(
            reservation_id=reservation_id,
            user_id=user_id,
            origin=origin,
            destination=destination,
            flight_type=flight_type,
            cabin=cabin,
            flights=[],
            passengers=deepcopy(travellers),
            payment_history=deepcopy(payments),
            created_at=_NOW,
            total_baggages=total_baggages,
            nonfree_baggages=nonfree_baggages,
            insurance=insurance,
        )

        total_price = 0
        days: list[FlightDateStatusAvailable] = []
        for info in infos:
            number = info.flight_number
            flight = self._get_flight(number, write=True)
            day = self._get_flight_instance(number, info.date, write=True)
            if not isinstance(day, FlightDateStatusAvailable):
                raise ValueError(f"Flight {number} not available on date {info.date}")
            if day.available_seats[cabin] < len(travellers):
                raise ValueError(f"Not enough seats on flight {number}")
            price = day.prices[cabin]
            reservation.flights.append(
                ReservationFlight(
                    origin=flight.origin,
                    destination=flight.destination,
                    flight_number=number,
                    date=info.date,
                    price=price,
                )
            )
            days.append(day)
            total_price += price * len(travellers)
        if insurance == "yes":
            total_price += 30 * len(travellers)
        total_price += 50 * nonfree_baggages

        for payment in payments:
            payment_id, amount = payment.payment_id, payment.amount
            if payment_id not in user.payment_methods:
                raise ValueError(f"Payment method {payment_id} not found")
            method = user.payment_methods[payment_id]
            if method.source in {"gift_card", "certificate"} and method.amount < amount:
                raise ValueError(f"Not enough balance in payment method {payment_id}")
        total_payment = sum(p.amount for p in payments)
        if total_payment != total_price:
            raise ValueError(
                f"Payment amount does not add up, total price is {total_price}, "
                f"but paid {total_payment}"
            )

        for payment in payments:
            payment_id, amount = payment.payment_id, payment.amount
            method = user.payment_methods[payment_id]
            if method.source == "gift_card":
                method.amount -= amount
            elif method.source == "certificate":
                user.payment_methods.pop(payment_id)
        for day in days:
            day.available_seats[cabin] -= len(travellers)
        self.db.insert("reservations", reservation_id, reservation)
        self._get_user(user_id, write=True).reservations.append(reservation_id)
        return reservation

    @tool(ToolKind.GENERIC)
    def calculate(self, expression: str) -> str:
        """
        Calculate the result of a mathematical expression.

        Args:
            expression: The mathematical expression to calculate, such as '2 + 2'. The expression can contain numbers, operators (+, -, *, /), parentheses, and spaces.

        Returns:
            The result of the mathematical expression.

        Raises:
            ValueError: If the expression is invalid.
        """
        return _calculate(expression)

    @tool(ToolKind.WRITE)
    def cancel_reservation(self, reservation_id: str) -> Reservation:
        """
        Cancel the whole reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.

        Returns:
            The updated reservation.

        Raises:
            ValueError: If the reservation is not found.
        """
        reservation = self._get_reservation(reservation_id, write=True)
        refunds = [
            Payment(payment_id=p.payment_id, amount=-p.amount) for p in reservation.payment_history
        ]
        reservation.payment_history.extend(refunds)
        reservation.status = "cancelled"
        return reservation

    @tool(ToolKind.READ)
    def get_reservation_details(self, reservation_id: str) -> Reservation:
        """
        Get the details of a reservation.

        Args:
            reservation_id: The reservation ID, such as '8JX2WO'.

        Returns:
            The reservation details.

        Raises:
            ValueError: If the reservation is not found.
        """
        return self._get_reservation(reservation_id)

    @tool(ToolKind.READ)
    def get_user_details(self, user_id: str) -> User:
        """
        Get the details of a user, including their reservations.

        Args:
            user_id: The user ID, such as 'sara_doe_496'.

        Returns:
            The user details.

        Raises:
            ValueError: If the user is not found.
        """
        return self._get_user(user_id)

    @tool(ToolKind.READ)
    def list_all_airports(self) -> list[AirportCode]:
        """Returns a list of all available airports.

        Returns:
            A dictionary mapping IATA codes to AirportInfo objects.
        """
        return [AirportCode(iata=iata, city=city) for iata, city in _AIRPORTS]

    @tool(ToolKind.READ)
    def search_direct_flight(self, origin: str, destination: str, date: str) -> list[DirectFlight]:
        """
        Search for direct flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-01-01'.

        Returns:
            The direct flights between the two cities on the specific date.
        """
        return self._search_direct_flight(date=date, origin=origin, destination=destination)

    @tool(ToolKind.READ)
    def search_onestop_flight(
        self, origin: str, destination: str, date: str
    ) -> list[tuple[DirectFlight, DirectFlight]]:
        """
        Search for one-stop flights between two cities on a specific date.

        Args:
            origin: The origin city airport in three letters, such as 'JFK'.
            destination: The destination city airport in three letters, such as 'LAX'.
            date: The date of the flight in the format 'YYYY-MM-DD', such as '2024-05-01'.

        Returns:
            A list of pairs of DirectFlight objects.
        """
        pairs = []
        for first in self._search_direct_flight(date=date, origin=origin, destination=None):
            first.date = date
            arrives_next_day = "+1" in first.scheduled_arrival_time_est
            date2 = f"2024-05-{int(date[-2:]) + 1}" if arrives_next_day else date
            for second in self._search_direct_flight(
                date=date2,
                origin=first.destination,
                destination=destination,
                leave_after=first.scheduled_arrival_time_est,
            ):
                second.date = date2
                pairs.append([first, second])
        return pairs  # type: ignore[return-value]

    @tool(ToolKind.WRITE)
    def send_certificate(self, user_id: str, amount: int) -> str:
        """
        Send a certificate to a user. Be careful!

        Args:
            user_id: The ID of the user to book the reservation, such as 'sara_doe_496'.
            amount: The amount of the certificate to send.

        Returns:
            A message indicating the certificate was sent.

        Raises:
            ValueError: If the user is not found.
        """
        user = self._get_user(user_id, write=True)
        for payment_id in _NEW_CERTIFICATE_IDS:
            if payment_id not in user.payment_methods:
                user.payment_methods[payment_id] = Certificate(
                    id=payment_id, amount=amount, source="certificate"
                )
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

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
    def update_reservation_baggages(
        self,
        reservation_id: str,
        total_baggages: int,
        nonfree_baggages: int,
        payment_id: str,
    ) -> Reservation:
        """
        Update the baggage information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'
            total_baggages: The updated total number of baggage items included in the reservation.
            nonfree_baggages: The updated number of non-free baggage items included in the reservation.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.

        Returns:
            The updated reservation.

        Raises:
            ValueError: If the reservation is not found.
            ValueError: If the user is not found.
            ValueError: If the payment method is not found.
            ValueError: If the certificate cannot be used to update reservation.
            ValueError: If the gift card balance is not enough.
        """
        reservation = self._get_reservation(reservation_id, write=True)
        user = self._get_user(reservation.user_id, write=True)
        total_price = 50 * max(0, nonfree_baggages - reservation.nonfree_baggages)
        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.total_baggages = total_baggages
        reservation.nonfree_baggages = nonfree_baggages
        return reservation

    @tool(ToolKind.WRITE)
    def update_reservation_flights(
        self,
        reservation_id: str,
        cabin: CabinClass,
        flights: list[FlightInfo | dict],  # type: ignore[type-arg]
        payment_id: str,
    ) -> Reservation:
        """
        Update the flight information of a reservation.


        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            cabin: The cabin class of the reservation
            flights: An array of objects containing details about each piece of flight in the ENTIRE new reservation. Even if the a flight segment is not changed, it should still be included in the array.
            payment_id: The payment id stored in user profile, such as 'credit_card_7815826', 'gift_card_7815826', 'certificate_7815826'.

        Returns:
            The updated reservation.

        Raises:
            ValueError: If the reservation is not found.
            ValueError: If the user is not found.
            ValueError: If the payment method is not found.
            ValueError: If the certificate cannot be used to update reservation.
            ValueError: If the gift card balance is not enough.
        """
        infos: Any = flights
        if all(isinstance(f, dict) for f in infos):
            infos = [FlightInfo(**f) for f in infos]
        reservation = self._get_reservation(reservation_id, write=True)
        user = self._get_user(reservation.user_id, write=True)
        n_passengers = len(reservation.passengers)

        total_price = 0
        new_flights = []
        for info in infos:
            kept = next(
                (
                    f
                    for f in reservation.flights
                    if f.flight_number == info.flight_number
                    and f.date == info.date
                    and cabin == reservation.cabin
                ),
                None,
            )
            if kept:
                total_price += kept.price * n_passengers
                new_flights.append(kept)
                continue
            flight = self._get_flight(info.flight_number)
            day = self._get_flight_instance(info.flight_number, info.date)
            if not isinstance(day, FlightDateStatusAvailable):
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if day.available_seats[cabin] < n_passengers:
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            segment = ReservationFlight(
                flight_number=info.flight_number,
                date=info.date,
                price=day.prices[cabin],
                origin=flight.origin,
                destination=flight.destination,
            )
            total_price += segment.price * n_passengers
            new_flights.append(segment)
        total_price -= sum(f.price for f in reservation.flights) * n_passengers

        payment = self._payment_for_update(user, payment_id, total_price)
        if payment is not None:
            reservation.payment_history.append(payment)
        reservation.flights = new_flights
        reservation.cabin = cabin
        return reservation

    @tool(ToolKind.WRITE)
    def update_reservation_passengers(
        self,
        reservation_id: str,
        passengers: list[Passenger | dict],  # type: ignore[type-arg]
    ) -> Reservation:
        """
        Update the passenger information of a reservation.

        Args:
            reservation_id: The reservation ID, such as 'ZFA04Y'.
            passengers: An array of objects containing details about each passenger.

        Returns:
            The updated reservation.

        Raises:
            ValueError: If the reservation is not found.
            ValueError: If the number of passengers does not match.
        """
        travellers: Any = passengers
        if all(isinstance(p, dict) for p in travellers):
            travellers = [Passenger(**p) for p in travellers]
        reservation = self._get_reservation(reservation_id, write=True)
        if len(travellers) != len(reservation.passengers):
            raise ValueError("Number of passengers does not match")
        reservation.passengers = deepcopy(travellers)
        return reservation

    @tool(ToolKind.READ)
    def get_flight_status(self, flight_number: str, date: str) -> str:
        """
        Get the status of a flight.

        Args:
            flight_number: The flight number.
            date: The date of the flight.

        Returns:
            The status of the flight.

        Raises:
            ValueError: If the flight is not found.
        """
        return self._get_flight_instance(flight_number, date).status
