"""The tau2 library's own rules: forks stay apart, hashes follow state, inputs are checked, the CLI.

Fidelity to the original is tested in ``test_tau2_golden.py``; these are the properties ours adds
(copy-on-write forks, cached gold outcomes, the chat-shape parser, ``aenv tau2 grade``).
"""

from __future__ import annotations

import copy
import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from aenv_cli import main
from aenv_ray.errors import ConfigurationError
from builtin_envs.tau2 import get_domain, grade
from builtin_envs.tau2._docstring import parse_docstring
from builtin_envs.tau2.db import deep_copy, dict_hash, frozen_copier
from builtin_envs.tau2.environment import to_json_str
from builtin_envs.tau2.errors import (
    ReplayMismatchError,
    Tau2NotFoundError,
    TrajectoryError,
)
from tests._tau2 import require_tau2_data

require_tau2_data()


USER = "mia_li_3668"


def _gold_messages(domain: str, task_id: str) -> list[dict[str, Any]]:
    the_domain = get_domain(domain)
    task = the_domain.task(task_id)
    env = the_domain.new_environment()
    messages: list[dict[str, Any]] = []
    for i, action in enumerate(task.evaluation_criteria.actions or []):  # type: ignore[union-attr]
        result = env.respond(action.name, action.arguments, call_id=f"c{i}")
        messages.append(
            {
                "role": "assistant",
                "tool_calls": [{"id": f"c{i}", "name": action.name, "arguments": action.arguments}],
            }
        )
        messages.append(
            {"role": "tool", "id": f"c{i}", "content": result.content, "error": result.error}
        )
    info = task.evaluation_criteria.communicate_info or []  # type: ignore[union-attr]
    messages.append({"role": "assistant", "content": "Done: " + ", ".join(info)})
    return messages


def test_forks_share_nothing_that_changes() -> None:
    domain = get_domain("airline")
    root_hash = domain.base_db.get_hash()
    a, b = domain.new_environment(), domain.new_environment()
    out = a.respond("send_certificate", {"user_id": USER, "amount": 100})
    assert not out.error
    assert a.get_db_hash() != root_hash
    assert b.get_db_hash() == root_hash == domain.base_db.get_hash()
    assert not a.same_db_state(b)
    b.respond("send_certificate", {"user_id": USER, "amount": 100})
    assert a.same_db_state(b)
    assert a.get_db_hash() == b.get_db_hash()
    # the same change reached another way still compares equal; a different one does not
    b.respond("send_certificate", {"user_id": USER, "amount": 5})
    assert not a.same_db_state(b)


def test_a_fork_hash_equals_the_hash_of_its_full_dump() -> None:
    env = get_domain("retail").new_environment()
    order = "#W5918442"  # pending: cancelling it changes the order and maybe a gift card
    env.respond("get_order_details", {"order_id": order})
    out = env.respond("cancel_pending_order", {"order_id": order, "reason": "no longer needed"})
    assert not out.error, out.content
    env.respond("modify_user_address", {"user_id": "mei_davis_8935", "address1": "1 Ünï Way",
                                        "address2": "", "city": "X", "state": "Y",
                                        "country": "Z", "zip": "00000"})  # fmt: skip
    db = env.tools.db
    assert db is not None
    assert db.get_hash() == dict_hash(db.model_dump(warnings=False))


def test_gold_outcome_is_computed_once_per_task() -> None:
    domain = get_domain("retail")
    first = domain.gold_environment("0")
    assert domain.gold_environment("0") is first


def test_gold_trajectory_scores_one_and_a_tampered_result_is_rejected() -> None:
    messages = _gold_messages("retail", "0")
    result = grade("retail", "0", messages, "user_stop")
    assert result["reward"] == 1.0
    assert result["db_match"] is True
    assert result["components"] == {"DB": 1.0, "COMMUNICATE": 1.0}
    tool_at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    messages[tool_at] = {**messages[tool_at], "content": "something else"}
    with pytest.raises(ReplayMismatchError, match="does not come from this task's state"):
        grade("retail", "0", messages, "agent_stop")


def test_non_counting_endings_score_zero_with_the_originals_note() -> None:
    result = grade("airline", "1", _gold_messages("airline", "1"), "max_steps")
    assert result["reward"] == 0.0
    assert result["info"] == {
        "note": "Simulation terminated prematurely. Termination reason: max_steps"
    }
    assert result["db_match"] is None


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("hotel", "0", [], "agent_stop"), Tau2NotFoundError, "domain 'hotel' not found"),
        (("airline", "9999", [], "agent_stop"), Tau2NotFoundError, "task '9999' not found"),
        (("airline", "0", [], "gave_up"), TrajectoryError, "not one of tau2's"),
        (("airline", "0", [], "agent_stop", True), ConfigurationError, "does not support solo"),
        (("airline", "0", [{"role": "robot"}], "agent_stop"), TrajectoryError, "unknown role"),
        (
            ("airline", "0", [{"role": "tool", "id": "x", "content": "1"}], "agent_stop"),
            TrajectoryError,
            "Tool message not expected",
        ),
        (
            (
                "airline",
                "0",
                [{"role": "assistant", "tool_calls": [{"id": "a", "name": "f", "arguments": "{"}]}],
                "agent_stop",
            ),
            TrajectoryError,
            "not valid JSON",
        ),
    ],
)
def test_bad_input_is_a_named_error(args: tuple[Any, ...], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        grade(*args)


def test_splits_select_tasks() -> None:
    domain = get_domain("airline")
    train, test = domain.task_ids("train"), domain.task_ids("test")
    assert len(train) == 30
    assert len(test) == 20
    assert not set(train) & set(test)
    assert domain.task_ids(None)[: len(domain.task_ids("base"))] == domain.task_ids("base")
    with pytest.raises(Tau2NotFoundError, match="split 'dev' not found"):
        domain.task_ids("dev")


def test_to_json_str_follows_tau2s_rules() -> None:
    assert to_json_str("plain") == "plain"
    assert to_json_str({"n": 1, "ok": True, "x": None, "l": [1.5]}) == (
        '{"n": "1", "ok": "True", "x": null, "l": ["1.5"]}'
    )
    assert to_json_str(["é"]) == '["\\u00e9"]'
    with pytest.raises(ValueError, match="Unsupported type"):
        to_json_str({1, 2})


def test_docstring_summary_is_the_first_line_only() -> None:
    doc = parse_docstring(
        """Do a thing. If the thing
        wraps, the rest is the long part.

        Args:
            a: The first.
            b: The second,
                continued.
        """
    )
    assert doc.short == "Do a thing. If the thing"
    assert doc.long == "wraps, the rest is the long part."
    assert doc.params == {"a": "The first.", "b": "The second,\ncontinued."}


def test_cli_grades_each_line_and_reports_the_bad_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = {
        "domain": "retail",
        "task_id": "0",
        "messages": _gold_messages("retail", "0"),
        "termination_reason": "agent_stop",
    }
    lines = [json.dumps(good), json.dumps({**good, "task_id": "nope"}), "not json"]
    src, out = tmp_path / "t.jsonl", tmp_path / "r.jsonl"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["tau2", "grade", str(src), "--out", str(out)]) == 1
    results = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in results] == [1, 2, 3]
    assert results[0]["reward"] == 1.0
    assert results[1]["error_type"] == "Tau2NotFoundError"
    assert results[2]["error_type"] == "JSONDecodeError"
    assert "graded 1, failed 2" in capsys.readouterr().err
    assert main(["tau2", "grade", str(tmp_path / "missing.jsonl")]) == 2


class _Leaf(BaseModel):
    n: float = 0.0
    tags: list[str] = []


class _Tree(BaseModel):
    when: datetime.date = datetime.date(2025, 1, 1)
    leaves: dict[str, _Leaf] = {}
    first: _Leaf | None = None
    odd: object = None  # anything: copied by copy.deepcopy


def _tree(odd: object = None) -> _Tree:
    leaf = _Leaf(n=1.5, tags=["a"])
    return _Tree(leaves={"x": leaf, "y": _Leaf()}, first=_Leaf(n=2), odd=odd)


def test_deep_copy_and_frozen_copier_copy_as_deepcopy_does() -> None:
    shared = _tree(({"k": [1]},))
    shared.first = shared.leaves["x"]  # one object reached twice: copied once
    # planned by frozen_copier; with a tuple (left to copy.deepcopy); with sharing
    for tree in (_tree(), _tree(({"k": [1]},)), shared):
        made = [deep_copy(tree), frozen_copier(tree)(), frozen_copier(tree)()]
        for new in made:
            assert new == copy.deepcopy(tree) == tree
            assert new.model_dump() == tree.model_dump()
            assert new.model_fields_set == tree.model_fields_set
            assert new.leaves["x"] is not tree.leaves["x"]
            assert new.leaves["x"].tags is not tree.leaves["x"].tags
            if tree.odd is not None:
                assert new.odd is not tree.odd
                assert new.odd[0]["k"] is not tree.odd[0]["k"]
            assert (new.first is new.leaves["x"]) == (tree.first is tree.leaves["x"])
            new.leaves["x"].tags.append("changed")
            new.leaves["y"].n = 9.0
        assert tree.leaves["x"].tags == ["a"]
        assert tree.leaves["y"].n == 0.0
    # one memo over several values keeps what they share shared, as deepcopy's memo does
    memo: dict[int, Any] = {}
    a, b = deep_copy(shared.leaves, memo), deep_copy(shared.first, memo)
    assert a["x"] is b
