"""tau2's evaluator ("all" evaluation): the reward of a finished trajectory, and why.

Only episodes ended by the agent or the user (``agent_stop``, ``user_stop``) are graded; any other
ending scores 0 with tau2's note. Otherwise the reward is the product of the components in the
task's reward basis (airline and retail: DB and COMMUNICATE; telecom: ENV_ASSERTION, sometimes
ACTION):

- DB: the trajectory's tool calls replayed on the task's initialized state (each stored result
  must equal the replay, see :meth:`Tau2Environment.set_state`) give the same database hash(es)
  as the task's gold actions (computed once per task, :meth:`Domain.gold_environment`);
- ENV_ASSERTION: the task's assertion functions hold on the replayed state;
- ACTION: every gold action appears among the tool calls (same name, same compared arguments);
- COMMUNICATE: every ``communicate_info`` string appears in an agent message (case-insensitive,
  the message's commas removed).

The result is tau2's ``RewardInfo`` as JSON (``reward``, ``db_check``, ``env_assertions``,
``action_checks``, ``nl_assertions``, ``communicate_checks``, ``reward_basis``,
``reward_breakdown``, ``info``) plus ``components`` (= ``reward_breakdown``), ``db_match`` and
``termination_reason``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from builtin_envs.tau2.domain import Domain, get_domain
from builtin_envs.tau2.environment import Tau2Environment, replay_pairs
from builtin_envs.tau2.errors import TrajectoryError
from builtin_envs.tau2.messages import Message, ParticipantMessage, ToolCall, parse_messages
from builtin_envs.tau2.tasks import Action, RewardType, Task

__all__ = ["COUNTING_TERMINATIONS", "TERMINATION_REASONS", "evaluate", "grade"]

TERMINATION_REASONS = (
    "user_stop",
    "agent_stop",
    "judge_stop",
    "max_steps",
    "too_many_errors",
    "agent_error",
    "user_error",
)
COUNTING_TERMINATIONS = frozenset({"agent_stop", "user_stop"})
_ENV_BASES = {RewardType.DB, RewardType.ENV_ASSERTION}


def _reward_info(
    reward: float,
    *,
    db_check: dict[str, Any] | None = None,
    env_assertions: list[dict[str, Any]] | None = None,
    action_checks: list[dict[str, Any]] | None = None,
    communicate_checks: list[dict[str, Any]] | None = None,
    reward_basis: list[str] | None = None,
    reward_breakdown: dict[str, float] | None = None,
    info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "reward": reward,
        "db_check": db_check,
        "env_assertions": env_assertions,
        "action_checks": action_checks,
        "nl_assertions": None,
        "communicate_checks": communicate_checks,
        "reward_basis": reward_basis,
        "reward_breakdown": reward_breakdown,
        "info": info,
    }


def _tool_calls(messages: Sequence[Message]) -> list[ToolCall]:
    return [
        call
        for m in messages
        if isinstance(m, ParticipantMessage) and m.tool_calls is not None
        for call in m.tool_calls
    ]


def _env_part(
    domain: Domain, task: Task, messages: list[Message], solo_mode: bool
) -> dict[str, Any]:
    criteria = task.evaluation_criteria
    assert criteria is not None
    if criteria.actions is None and criteria.env_assertions is None:
        return _reward_info(
            1.0,
            db_check={"db_match": True, "db_reward": 1.0},
            info={"note": "No expected actions or env assertions"},
        )
    # tau2's set_state, in its order: the mode, the trajectory's shape, the task's
    # initialization (computed once per task, forked here), then the replay
    domain.check_solo_mode(solo_mode)
    pairs = replay_pairs(messages, solo_mode)
    predicted: Tau2Environment = domain.initialized_environment(task, solo_mode)
    predicted.replay(pairs)
    gold = domain.gold_environment(task.id)
    db_match = predicted.same_db_state(gold)
    db_reward = 1.0 if db_match else 0.0

    checks = []
    assertion_reward = 1.0
    for assertion in criteria.env_assertions or []:
        met = predicted.run_env_assertion(assertion, raise_assertion_error=False)
        checks.append(
            {
                "env_assertion": assertion.model_dump(mode="json"),
                "met": met,
                "reward": 1.0 if met else 0.0,
            }
        )
        assertion_reward *= 1.0 if met else 0.0

    reward = 1.0
    breakdown: dict[str, float] = {}
    if RewardType.DB in criteria.reward_basis:
        breakdown[RewardType.DB.value] = db_reward
        reward *= db_reward
    if RewardType.ENV_ASSERTION in criteria.reward_basis:
        breakdown[RewardType.ENV_ASSERTION.value] = assertion_reward
        reward *= assertion_reward
    return _reward_info(
        reward,
        db_check={"db_match": db_match, "db_reward": db_reward},
        env_assertions=checks,
        reward_basis=[b.value for b in criteria.reward_basis],
        reward_breakdown=breakdown,
    )


def _action_part(gold_actions: list[Action] | None, messages: list[Message]) -> dict[str, Any]:
    if not gold_actions:
        return _reward_info(
            1.0,
            info={"note": "No actions to evaluate"},
            reward_breakdown={RewardType.ACTION.value: 1.0},
        )
    calls_by_name: dict[str, list[ToolCall]] = {}
    for call in _tool_calls(messages):
        calls_by_name.setdefault(call.name, []).append(call)
    checks = []
    for action in gold_actions:
        # only a call of the action's name can match it
        same_name = calls_by_name.get(action.name, ())
        found = any(action.matches(c.name, c.arguments) for c in same_name)
        checks.append(
            {
                "action": action.model_dump(mode="json"),
                "action_match": found,
                "action_reward": 1.0 if found else 0.0,
            }
        )
    reward = 1.0 if all(c["action_match"] for c in checks) else 0.0
    return _reward_info(
        reward, action_checks=checks, reward_breakdown={RewardType.ACTION.value: reward}
    )


def _communicate_part(infos: list[str] | None, messages: list[Message]) -> dict[str, Any]:
    if not infos:
        return _reward_info(
            1.0,
            info={"note": "No communicate_info to evaluate"},
            reward_breakdown={RewardType.COMMUNICATE.value: 1.0},
        )
    texts = [
        m.content
        for m in messages
        if isinstance(m, ParticipantMessage) and m.role == "assistant" and m.has_text_content()
    ]
    lowered = [t.lower().replace(",", "") for t in texts if t is not None]
    checks = []
    for info in infos:
        needle = info.lower()
        where = next((i for i, text in enumerate(lowered) if needle in text), None)
        if where is not None:
            justification = f"Information '{info}' communicated in the message:\n '{texts[where]}'"
        else:
            justification = f"Information '{info}' not communicated."
        checks.append({"info": info, "met": where is not None, "justification": justification})
    reward = 1.0 if all(c["met"] for c in checks) else 0.0
    return _reward_info(
        reward,
        communicate_checks=checks,
        reward_breakdown={RewardType.COMMUNICATE.value: reward},
    )


def evaluate(
    domain: Domain,
    task: Task,
    messages: list[Message],
    termination_reason: str,
    solo_mode: bool = False,
) -> dict[str, Any]:
    """tau2's ``RewardInfo`` (as JSON) of ``messages`` for ``task``."""
    if termination_reason not in COUNTING_TERMINATIONS:
        return _reward_info(
            0.0,
            info={
                "note": "Simulation terminated prematurely. "
                f"Termination reason: {termination_reason}"
            },
        )
    criteria = task.evaluation_criteria
    if criteria is None:
        return _reward_info(1.0, info={"note": "No evaluation criteria"})
    env = _env_part(domain, task, messages, solo_mode)
    action = _action_part(criteria.actions, messages)
    communicate = _communicate_part(criteria.communicate_info, messages)

    basis = set(criteria.reward_basis)
    reward = 1.0
    breakdown: dict[str, float] = {}
    if basis & _ENV_BASES:
        breakdown.update(env["reward_breakdown"] or {})
        reward *= env["reward"]
    if RewardType.ACTION in basis:
        breakdown.update(action["reward_breakdown"] or {})
        reward *= action["reward"]
    if RewardType.NL_ASSERTION in basis:
        raise ValueError(
            "NL assertions are part of the reward basis, but they are not being evaluated."
        )
    if RewardType.COMMUNICATE in basis:
        breakdown.update(communicate["reward_breakdown"] or {})
        reward *= communicate["reward"]
    return _reward_info(
        reward,
        db_check=env["db_check"],
        env_assertions=env["env_assertions"],
        action_checks=action["action_checks"],
        communicate_checks=communicate["communicate_checks"],
        reward_basis=[b.value for b in criteria.reward_basis],
        reward_breakdown=breakdown,
        info={
            "env": env["info"],
            "nl": None,
            "communicate": communicate["info"],
            "action": action["info"],
        },
    )


def grade(
    domain: str,
    task_id: str,
    messages: Sequence[Any],
    termination_reason: str,
    solo_mode: bool = False,
) -> dict[str, Any]:
    """Grade a finished trajectory without an instance.

    ``messages`` in the chat shape of :mod:`builtin_envs.tau2.messages`; ``termination_reason``
    one of :data:`TERMINATION_REASONS`. Returns tau2's reward info (see the module docstring)
    with ``components``, ``db_match`` and ``termination_reason``. Raises
    :class:`~builtin_envs.tau2.errors.TrajectoryError` for a trajectory that cannot be graded
    (:class:`~builtin_envs.tau2.errors.ReplayMismatchError` when a stored result differs from
    the replay) and :class:`~builtin_envs.tau2.errors.Tau2NotFoundError` for an unknown
    domain or task.
    """
    reason = str(getattr(termination_reason, "value", termination_reason))
    if reason not in TERMINATION_REASONS:
        raise TrajectoryError(
            f"termination_reason {reason!r} is not one of tau2's: {', '.join(TERMINATION_REASONS)}"
        )
    the_domain = get_domain(domain)
    task = the_domain.task(str(task_id))
    parsed = parse_messages(messages)
    result = evaluate(the_domain, task, parsed, reason, solo_mode=solo_mode)
    db_check = result["db_check"]
    return {
        **result,
        "components": result["reward_breakdown"] or {},
        "db_match": None if db_check is None else db_check["db_match"],
        "termination_reason": reason,
    }
