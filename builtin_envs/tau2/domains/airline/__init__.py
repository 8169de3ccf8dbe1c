"""tau2's airline domain: flights, users and reservations; the agent's tools only."""

from __future__ import annotations

from builtin_envs.tau2.db import Tau2DB
from builtin_envs.tau2.domain import Domain, register_domain
from builtin_envs.tau2.domains.airline.models import FlightDB
from builtin_envs.tau2.domains.airline.tools import AirlineTools
from builtin_envs.tau2.toolkit import Toolkit

__all__ = ["AirlineDomain", "AirlineTools", "FlightDB"]


@register_domain
class AirlineDomain(Domain):
    """The airline domain."""

    name = "airline"

    def load_db(self) -> FlightDB:
        """Parse ``db.json`` (about 0.6 s: once per process)."""
        return FlightDB.load(self.dir / "db.json")

    def make_toolkits(self, db: Tau2DB, user_db: Tau2DB | None) -> tuple[Toolkit, Toolkit | None]:
        """The agent's tools; airline has no user tools."""
        assert isinstance(db, FlightDB)
        return AirlineTools(db), None
