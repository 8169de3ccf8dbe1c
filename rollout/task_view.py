"""What of a task the policy is given, and what of it the rollout record keeps.

A task (:mod:`rollout.synthesis`) holds what the agent is told (``prompt``), how the episode is
set up (``setup``) and how it is graded (``reward_arguments``: mini-terminal's expected answer,
say); a task converted from a dataset may also carry a reference solution (``solution``, a
SWE-bench row's ``patch`` and ``test_patch``). The policy, and through it the model, gets
:func:`policy_view`: the task without what grades it (:data:`GRADER_KEYS`) and without any
reference solution (:data:`GOLD_KEYS`). The reward gets the task's ``reward_arguments`` from
the driver, never from the policy. The record's ``task`` is :func:`record_view`: the task
without the reference solution, its ``reward_arguments`` kept (re-grading a record, as
``aenv tau2 grade`` does, needs them; they are the reward's input, not its answer key).

    >>> task = {"id": "1", "prompt": "Write 42 into out.txt", "setup": [],
    ...         "reward_arguments": {"expected": "42"}, "patch": "diff ..."}
    >>> sorted(policy_view(task))
    ['id', 'prompt', 'setup']
    >>> sorted(record_view(task))
    ['id', 'prompt', 'reward_arguments', 'setup']

A scripted policy that replays a reference solution (the built-in demos' policies) reads it on
the driver's side by the task's id (``builtin_envs.demos.swe.gold_patch``), never from the
task. Both views are deep copies: nothing a policy does to its task reaches the reward's
arguments or the record.

May import: the standard library only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["GOLD_KEYS", "GRADER_KEYS", "policy_view", "record_view"]

GRADER_KEYS = ("reward_arguments", "FAIL_TO_PASS", "PASS_TO_PASS")
"""What grades the episode: out of the policy's view, kept in the record (re-grading needs
them). ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are a SWE-bench row's tests that decide it."""

GOLD_KEYS = ("solution", "gold_patch", "patch", "test_patch")
"""A reference solution or hidden tests (a SWE-bench row's ``patch`` and ``test_patch``, a
scripted policy's ``solution``): in neither the policy's view nor the record."""


def policy_view(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task as the policy is given it (a deep copy): without :data:`GRADER_KEYS` and
    :data:`GOLD_KEYS`.

        >>> policy_view({"id": "a", "prompt": "p", "reward_arguments": {"expected": "55"}})
        {'id': 'a', 'prompt': 'p'}
    """
    hidden = (*GRADER_KEYS, *GOLD_KEYS)
    return {key: copy.deepcopy(value) for key, value in task.items() if key not in hidden}


def record_view(task: Mapping[str, Any]) -> dict[str, Any]:
    """The task as the rollout record keeps it (a deep copy): without :data:`GOLD_KEYS`.

    >>> record_view({"id": "a", "reward_arguments": {}, "solution": "echo 55"})
    {'id': 'a', 'reward_arguments': {}}
    """
    return {key: copy.deepcopy(value) for key, value in task.items() if key not in GOLD_KEYS}
