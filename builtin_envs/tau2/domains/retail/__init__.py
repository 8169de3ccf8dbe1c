"""tau2's retail domain: products, users and orders; the agent's tools only."""

from __future__ import annotations

from builtin_envs.tau2.db import Tau2DB
from builtin_envs.tau2.domain import Domain, register_domain
from builtin_envs.tau2.domains.retail.models import RetailDB
from builtin_envs.tau2.domains.retail.tools import RetailTools
from builtin_envs.tau2.toolkit import Toolkit

__all__ = ["RetailDB", "RetailDomain", "RetailTools"]


@register_domain
class RetailDomain(Domain):
    """The retail domain."""

    name = "retail"

    def load_db(self) -> RetailDB:
        """Parse ``db.json`` (once per process)."""
        return RetailDB.load(self.dir / "db.json")

    def make_toolkits(self, db: Tau2DB, user_db: Tau2DB | None) -> tuple[Toolkit, Toolkit | None]:
        """The agent's tools; retail has no user tools."""
        assert isinstance(db, RetailDB)
        return RetailTools(db), None
