"""tau2's telecom domain: a carrier's customers, lines and bills, and the user's own phone.

Two toolkits (dual control): the agent's :class:`TelecomTools` over the carrier's database
(``db.toml``) and the user's :class:`TelecomUserTools` over their phone (``user_db.toml``), kept
consistent by :class:`TelecomEnvironment`. In solo mode the agent calls both. Tasks are graded on
assertions about the final state (ENV_ASSERTION), some on gold actions too (ACTION).

Two domains are registered, as in tau2: ``telecom`` (the tech-support manual as policy) and
``telecom-workflow`` (the workflow version); both read ``domains/telecom``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from builtin_envs.tau2.db import Tau2DB
from builtin_envs.tau2.domain import Domain, register_domain
from builtin_envs.tau2.domains.telecom.environment import TelecomEnvironment
from builtin_envs.tau2.domains.telecom.models import TelecomDB
from builtin_envs.tau2.domains.telecom.tools import TelecomTools
from builtin_envs.tau2.domains.telecom.user_models import TelecomUserDB
from builtin_envs.tau2.domains.telecom.user_tools import TelecomUserTools
from builtin_envs.tau2.environment import Tau2Environment
from builtin_envs.tau2.toolkit import Toolkit

__all__ = [
    "TelecomDB",
    "TelecomDomain",
    "TelecomEnvironment",
    "TelecomTools",
    "TelecomUserDB",
    "TelecomUserTools",
    "TelecomWorkflowDomain",
]


@register_domain
class TelecomDomain(Domain):
    """The telecom domain with the tech-support manual (tau2's ``telecom``)."""

    name = "telecom"
    environment_class: ClassVar[type[Tau2Environment]] = TelecomEnvironment
    supports_solo = True
    tech_support: ClassVar[tuple[str, str]] = ("tech_support_manual.md", "tech_support_manual.md")

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.dir = root / "domains" / "telecom"

    def load_db(self) -> TelecomDB:
        """Parse ``db.toml`` (small: a few milliseconds)."""
        return TelecomDB.load(self.dir / "db.toml")

    def load_user_db(self) -> TelecomUserDB:
        """Parse ``user_db.toml``: the phone as every task starts from."""
        return TelecomUserDB.load(self.dir / "user_db.toml")

    def make_toolkits(self, db: Tau2DB, user_db: Tau2DB | None) -> tuple[Toolkit, Toolkit | None]:
        """The agent's tools over ``db``, the user's over ``user_db``."""
        assert isinstance(db, TelecomDB)
        assert isinstance(user_db, TelecomUserDB)
        return TelecomTools(db), TelecomUserTools(user_db)

    def policy(self, solo_mode: bool = False) -> str:
        """tau2's composition: the main policy and the tech-support policy, each in its tag.

        Solo mode reads ``main_policy_solo.md`` (and, for the workflow, its solo version).
        """
        main = self._read("main_policy_solo.md" if solo_mode else "main_policy.md")
        tech = self._read(self.tech_support[1] if solo_mode else self.tech_support[0])
        return (
            f"<main_policy>\n{main}\n</main_policy>\n"
            f"<tech_support_policy>\n{tech}\n</tech_support_policy>"
        )


@register_domain
class TelecomWorkflowDomain(TelecomDomain):
    """The same tasks with the tech-support workflow as policy (tau2's ``telecom-workflow``)."""

    name = "telecom-workflow"
    tech_support = ("tech_support_workflow.md", "tech_support_workflow_solo.md")
