"""tau2@1.0.0: tau2-bench's airline, retail and telecom, one task per episode.

The tools are the active domain's agent tools under tau2's names, descriptions and JSON schemas,
answering tau2's output strings (a failure is ``Error: ...`` with the error flag). The domain and
task come from ``TAU2_*`` variables at creation or from ``tau2_reset`` on a running instance, so
one warm instance serves any task of any domain. Functions: ``tau2_reset``,
``tau2_get_task_info``, ``tau2_get_system_prompt``, ``tau2_get_available_tools``,
``tau2_get_status``, ``tau2_send_message``, ``tau2_done``, ``tau2_get_trajectory``; the reward
``tau2_reward`` grades the episode with tau2's evaluator. See docs/tau2.md.

At import (in the template process, once) every domain's database, tasks, tool schemas and the
gold outcomes of ``TAU2_PRELOAD_GOLD``'s domains are loaded: an instance forked from it pays
only for a copy-on-write fork of the database per episode.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any

from _tau2_episode import Episode, Settings, task_summary
from _tau2_tooltable import install

from aenv_ray import ToolResult, register_function, register_health, register_reward
from aenv_ray.errors import ConfigurationError
from builtin_envs.tau2 import get_domain
from builtin_envs.tau2.domain import DOMAIN_MODULES
from builtin_envs.tau2.errors import Tau2NotFoundError

log = logging.getLogger("tau2")

_LOCK = threading.RLock()
_EPISODE: Episode | None = None
_STARTED_FROM_ENV = False
_LISTINGS: dict[tuple[str, bool], list[dict[str, Any]]] = {}
_START_ERROR: str | None = None


def _available_domains() -> list[str]:
    names = []
    for name in DOMAIN_MODULES:
        try:
            get_domain(name)
        except Tau2NotFoundError:  # a domain whose module is not there (yet)
            continue
        names.append(name)
    return names


def _preload() -> list[str]:
    """Parse every domain's data once (in the template), so forks share it."""
    names = _available_domains()
    gold = os.environ.get("TAU2_PRELOAD_GOLD", "airline,retail")
    for name in names:
        domain = get_domain(name)
        env = domain.new_environment()
        type(env.tools).tool_specs()
        if env.user_tools is not None:
            type(env.user_tools).tool_specs()
        domain.task_ids(None)
        if name in gold.split(","):
            for task_id in domain.task_ids(None):
                domain.gold_environment(task_id)
    return names


DOMAINS = _preload()


def _call_tool(name: str, **arguments: Any) -> ToolResult:
    with _LOCK:
        episode = _episode()
        return episode.call_tool(name, arguments)


def _listing() -> list[dict[str, Any]] | None:
    episode = _current()
    if episode is None:
        return None
    key = (episode.settings.domain, episode.settings.solo_mode)
    listing = _LISTINGS.get(key)
    if listing is None:
        tools = [
            {
                "name": schema["function"]["name"],
                "description": schema["function"]["description"],
                "inputSchema": schema["function"]["parameters"],
            }
            for schema in episode.tool_schemas()
        ]
        listing = _LISTINGS[key] = tools
    return listing


def _register_tools() -> None:
    table = install(_call_tool, _listing)
    for name in DOMAINS:
        env = get_domain(name).new_environment()
        toolkits = [env.tools] + ([env.user_tools] if env.user_tools is not None else [])
        for toolkit in toolkits:
            for spec in type(toolkit).tool_specs().values():
                table.add(spec.name, spec.description, spec.parameters)
    table.add(
        "done",
        "Call this function when you are done with the task.",
        {"properties": {}, "title": "parameters", "type": "object"},
    )


_register_tools()


def _current() -> Episode | None:
    """The active episode, started from the ``TAU2_*`` variables on first use."""
    global _EPISODE, _STARTED_FROM_ENV, _START_ERROR
    if _EPISODE is None and not _STARTED_FROM_ENV:
        with _LOCK:
            if _EPISODE is None and not _STARTED_FROM_ENV:
                _STARTED_FROM_ENV = True
                try:
                    _EPISODE = Episode(Settings.from_environ(os.environ))
                except Exception as exc:  # reported by the next call that needs an episode
                    _START_ERROR = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "tau2: no episode from TAU2_* variables", extra={"error": _START_ERROR}
                    )
    return _EPISODE


def _episode() -> Episode:
    episode = _current()
    if episode is None:
        raise ConfigurationError(
            f"no tau2 episode: the TAU2_* variables did not start one ({_START_ERROR}); "
            "call tau2_reset(domain, task_id) or fix the variables"
        )
    return episode


@register_function
def tau2_reset(
    domain: str | None = None,
    task_id: str | None = None,
    split: str | None = None,
    solo_mode: bool | None = None,
    user_mode: str | None = None,
    user_script: list[Any] | None = None,
    max_steps: int | None = None,
    max_errors: int | None = None,
    all_tasks: bool = False,
    user_llm: str | None = None,
) -> dict[str, Any]:
    """Start a new episode: a task of a domain on a fresh copy of its database.

    Unset arguments take the instance's TAU2_* variables (or their defaults). Returns the first
    observation (the user's opening message), the tools' names and the settings.

    Args:
        domain: airline, retail or telecom.
        task_id: the task's id (default: the split's first task).
        split: base, train or test (default: base).
        solo_mode: no user; the agent works from the task's ticket (telecom).
        user_mode: llm (TAU2_USER_LLM*), scripted (user_script, then ###STOP###) or none.
        user_script: the scripted user's lines, in order.
        max_steps: the orchestrator's step limit (default 100).
        max_errors: the orchestrator's tool-error limit (default 10).
        all_tasks: look the task up among every task, whatever the split.
        user_llm: the user simulator's model (the endpoint and key stay the instance's).
    """
    global _EPISODE, _STARTED_FROM_ENV
    with _LOCK:
        settings = Settings.from_environ(os.environ).with_changes(
            domain=domain,
            task_id=task_id,
            split=split,
            solo_mode=solo_mode,
            user_mode=user_mode,
            user_script=tuple(user_script) if user_script is not None else None,
            max_steps=max_steps,
            max_errors=max_errors,
            user_llm=user_llm,
        )
        if all_tasks:
            settings = dataclasses.replace(settings, split=None)
        episode = Episode(settings)
        _EPISODE, _STARTED_FROM_ENV = episode, True
        episode.open()
        out = episode.observation()
        out["tools"] = [t["function"]["name"] for t in episode.tool_schemas()]
        out.update(episode.settings.public())
        return out


@register_function
def tau2_get_task_info() -> dict[str, Any]:
    """The task as the agent may know it: domain, id, ticket (solo), tools, policy preview."""
    with _LOCK:
        episode = _episode()
        return task_summary(episode, episode.tool_schemas())


@register_function
def tau2_get_system_prompt() -> str:
    """tau2's agent system prompt for the active domain and mode (policy included)."""
    with _LOCK:
        return _episode().system_prompt()


@register_function
def tau2_get_available_tools() -> list[dict[str, Any]]:
    """The active domain's tools as tau2's openai_schema list (names, descriptions, schemas)."""
    with _LOCK:
        return _episode().tool_schemas()


@register_function
def tau2_get_status(hashes: bool = True) -> dict[str, Any]:
    """The episode: done, termination reason, last observation, steps, database hashes.

    Args:
        hashes: include the databases' hashes (tau2's get_hash; ~50 ms on airline).
    """
    with _LOCK:
        return _episode().status(hashes=hashes)


@register_function(timeout=600)
def tau2_send_message(message: str) -> dict[str, Any]:
    """Send the agent's message to the user; returns the user's reply as the observation.

    Args:
        message: the agent's text to the user.
    """
    with _LOCK:
        return _episode().send_message(message)


@register_function
def tau2_user_message(message: str) -> dict[str, Any]:
    """User mode none: say ``message`` as the user (the caller simulates the user).

    Args:
        message: the user's text (###STOP### ends the episode).
    """
    with _LOCK:
        episode = _episode()
        if episode.settings.effective_user_mode != "none" or episode.settings.solo_mode:
            raise ConfigurationError(
                "tau2_user_message is for user mode 'none'; this episode's user is "
                f"{episode.settings.effective_user_mode!r}"
            )
        return episode.user_says(message)


@register_function
def tau2_done() -> dict[str, Any]:
    """End the episode as the agent (tau2's stop: termination reason agent_stop)."""
    with _LOCK:
        return _episode().stop()


@register_function
def tau2_get_trajectory() -> list[dict[str, Any]]:
    """The episode's messages in the chat shape builtin_envs.tau2.grade reads."""
    with _LOCK:
        return _episode().trajectory()


@register_reward
def tau2_reward() -> dict[str, Any]:
    """tau2's reward of this episode: reward, components, basis, termination reason, checks."""
    with _LOCK:
        return _episode().reward()


@register_health
def tau2_health() -> dict[str, Any]:
    """Healthy once the data is loaded; names the active domain and task."""
    episode = _current()
    if episode is None:
        return {"status": "healthy", "domain": None, "task_id": None, "error": _START_ERROR}
    return {
        "status": "healthy",
        "domain": episode.settings.domain,
        "task_id": episode.task.id,
    }
