"""tau2 (tau2-bench's airline, retail and telecom) as a library: tools, databases, evaluator.

The tools' schemas and outputs, the database hashes and the rewards equal tau2-bench's (checked
against recordings of the original in ``tests/tau2_golden``). Usable without any sandbox::

    from builtin_envs.tau2 import get_domain, grade
    env = get_domain("airline").new_environment()          # one episode
    env.respond("get_user_details", {"user_id": "mia_li_3668"}).content
    grade("airline", "0", messages, "agent_stop")["reward"]

Modules: :mod:`.toolkit` (tools), :mod:`.db` (databases), :mod:`.environment` (an episode),
:mod:`.domain` (domains, tasks, gold outcomes), :mod:`.evaluator` (rewards), :mod:`.messages`.

May import: pydantic, ``aenv_ray``'s public API (errors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from builtin_envs.tau2.domain import Domain

__all__ = ["get_domain", "grade"]


def get_domain(name: str) -> Domain:
    """The process's domain ``name`` (``airline``, ``retail``, ``telecom``)."""
    from builtin_envs.tau2.domain import get_domain as _get

    return _get(name)


def grade(
    domain: str,
    task_id: str,
    messages: list[Any],
    termination_reason: str,
    solo_mode: bool = False,
) -> dict[str, Any]:
    """Grade a finished trajectory as tau2's evaluator does; see :func:`.evaluator.grade`."""
    from builtin_envs.tau2.evaluator import grade as _grade

    return _grade(domain, task_id, messages, termination_reason, solo_mode=solo_mode)
