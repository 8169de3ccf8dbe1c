"""tau2 demo: every task of every domain, and a policy that replays each task's gold actions.

A task's ``setup`` calls ``tau2_reset`` (so one warm instance serves any task) and its
``reward_arguments`` are empty (``tau2_reward`` grades the episode). A task holds no gold
actions nor what the agent must tell the user (nothing a policy is given, nor the rollout
record's ``task``, does): the scripted policy reads them from tau2's task data on the driver's
side, for the domain and task its ``tau2_reset`` names (:func:`reference_solution`). It calls
the actions through the tools, tells the user the ``communicate`` strings in one message (the
scripted user then says ``###STOP###``: ``user_stop``) and ends the episode (``tau2_done``).
Tasks whose gold actions include the user's own tools (telecom) run in solo mode, where the
agent holds the user's tools too, and end with the ``done`` tool. The replay reaches reward 1.0
on every task.

    aenv rollout tau2@1.0.0                         # these tasks, this policy
    aenv rollout tau2@1.0.0 --tasks my_tasks.jsonl  # the same task format

:data:`DIALOGUE` is the user's side for a model playing the agent (``aenv rollout tau2@1.0.0
--base-url URL --model M``, ``rollout.areal.AEnvWorkflow``): the conversation opens with tau2's
system prompt, the agent's greeting and the user's first message, and each text answer of the
model goes to the user (``tau2_send_message``), whose reply continues it until the episode ends.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from aenv_ray.errors import ConfigurationError

__all__ = [
    "DIALOGUE",
    "TASKS",
    "Reference",
    "Tau2Dialogue",
    "policy",
    "reference_solution",
    "task_for",
]

_DOMAINS = ("airline", "retail", "telecom")


@dataclass(frozen=True)
class Reference:
    """A tau2 task's reference episode: its gold ``actions`` (``{"name", "arguments",
    "requestor"}``), what the agent must tell the user (``communicate``), and whether its
    actions include the user's own tools (``solo``: the episode runs in solo mode)."""

    actions: list[dict[str, Any]]
    communicate: list[str]
    solo: bool


def _reference(domain: str, task_id: str) -> Reference:
    from builtin_envs.tau2 import get_domain

    task = get_domain(domain).task(task_id)
    criteria = task.evaluation_criteria
    actions = [a.model_dump(mode="json") for a in (criteria.actions or [])] if criteria else []
    return Reference(
        actions=[
            {"name": a["name"], "arguments": a["arguments"], "requestor": a["requestor"]}
            for a in actions
        ],
        communicate=list(criteria.communicate_info or []) if criteria else [],
        solo=any(a["requestor"] == "user" for a in actions) and task.ticket is not None,
    )


def reference_solution(task: dict[str, Any]) -> Reference:
    """The reference episode of a task in this module's form, read from tau2's task data for
    the ``domain`` and ``task_id`` its ``tau2_reset`` setup call names (never from the task).

        >>> reference = reference_solution(task_for("airline", "1"))
        >>> reference.actions[0]["name"], reference.solo
        ('get_user_details', False)

    Raises :class:`~aenv_ray.errors.ConfigurationError` when the task has no such setup call:
    the scripted policy does not know which task to replay (a run with it stops, saying so).
    """
    for call in task.get("setup") or []:
        arguments = call.get("arguments") or {}
        named = arguments.get("domain") and arguments.get("task_id") is not None
        if call.get("function") == "tau2_reset" and named:
            return _reference(str(arguments["domain"]), str(arguments["task_id"]))
    raise ConfigurationError(
        f"the tau2 demo policy replays the task a setup call tau2_reset(domain=..., "
        f"task_id=...) names; task {task.get('id')!r} has none: give it one (as "
        "builtin_envs.demos.tau2.task_for does), or give a policy (--policy MODULE:CALLABLE, "
        "or --base-url and --model)"
    )


def task_for(domain: str, task_id: str, split: str | None = None) -> dict[str, Any]:
    """The demo task (``aenv rollout`` form) of task ``task_id`` of ``domain``."""
    from builtin_envs.tau2 import get_domain

    task = get_domain(domain).task(task_id)
    reset: dict[str, Any] = {"domain": domain, "task_id": task.id, "user_mode": "scripted"}
    if split is None:
        reset["all_tasks"] = True
    else:
        reset["split"] = split
    if _reference(domain, task.id).solo:
        reset["solo_mode"] = True
    return {
        "id": f"{domain}-{task.id}",
        "prompt": f"tau2 {domain} task {task.id}",
        "setup": [{"function": "tau2_reset", "arguments": reset}],
        "reward_arguments": {},
    }


def _tasks() -> list[dict[str, Any]]:
    from builtin_envs.tau2 import get_domain
    from builtin_envs.tau2.domain import DOMAIN_MODULES

    tasks = []
    for domain in _DOMAINS:
        try:
            importlib.import_module(DOMAIN_MODULES[domain])
        except ModuleNotFoundError:  # a domain not there (yet)
            continue
        for task_id in get_domain(domain).task_ids("base"):
            tasks.append(task_for(domain, task_id, "base"))
    return tasks


TASKS: list[dict[str, Any]] = _tasks()


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Replay the gold actions, say what must be said, end the episode."""
    reference = reference_solution(task)
    for action in reference.actions:
        await env.call_tool(action["name"], dict(action["arguments"]))
    if reference.solo:
        await env.call_tool("done", {})
        return None
    said = " ".join(reference.communicate) or "Is there anything else I can help with?"
    reply = await env.call_function("tau2_send_message", {"message": said})
    if not reply.get("done"):
        await env.call_function("tau2_done", {})
    return said


class Tau2Dialogue:
    """tau2's user, for a model playing the agent (a ``rollout.synthesis.Dialogue``)."""

    async def opening(self, task: dict[str, Any], env: Any) -> list[dict[str, Any]]:
        """tau2's system prompt, then the conversation so far as the agent sees it: its
        greeting and the user's text (never the user's own tool calls; none in solo mode)."""
        system = await env.call_function("tau2_get_system_prompt", {})
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for message in await env.call_function("tau2_get_trajectory", {}):
            content, role = message.get("content"), message.get("role")
            said = isinstance(content, str) and not message.get("tool_calls")
            if said and role in ("assistant", "user"):
                messages.append({"role": role, "content": content})
        return messages

    async def reply(self, answer: str, task: dict[str, Any], env: Any) -> str | None:
        """The user's answer to the agent's ``answer``; ``None`` once the episode is over."""
        observation = await env.call_function("tau2_send_message", {"message": answer})
        if observation.get("done"):
            return None
        return str(observation.get("observation") or "")


DIALOGUE = Tau2Dialogue()
