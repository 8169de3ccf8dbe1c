"""``aenv tau2 grade FILE``: grade finished tau2 trajectories offline (tau2's evaluator).

FILE is either of two things:

- a JSON-lines file, one trajectory per line: ``{"domain", "task_id", "messages",
  "termination_reason", "solo_mode"?}`` (messages in the chat shape of
  ``builtin_envs.tau2.messages``);
- what ``aenv rollout tau2@...`` wrote: its run directory, its ``trajectories.jsonl`` or its
  ``trajectories.parquet``. Each episode's record (the last one of an episode run again) is
  graded from what tau2's reward put in its ``reward_components``: ``domain``, ``task_id``,
  ``solo_mode``, ``termination_reason`` and the ``trajectory``.

One result per output line, in input order: ``{"line", "domain", "task_id", "reward",
"components", "db_match", "termination_reason", ...tau2's reward info}`` (a record's also has
``episode_id`` and ``recorded_reward``, the reward the rollout recorded), or ``{"line", ...,
"error", "error_type"}`` for a trajectory that cannot be graded (a stored tool result that
differs from the replay, an unknown task, a malformed message, an episode that failed before
tau2 graded it). Results go to ``--out`` (default: stdout); a summary goes to stderr. Exit 0
when every line was graded, 1 when some could not be.

May import: typer, ``aenv_ray``; lazily, inside functions: ``builtin_envs.tau2``, ``rollout``
(a run's records).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from aenv_cli._common import EXIT_FAILURE, EXIT_USAGE, die

__all__ = ["app"]

app = typer.Typer(help="tau2 (airline, retail, telecom): grade trajectories offline.")


def _grade_line(number: int, line: str) -> dict[str, Any]:
    head: dict[str, Any] = {"line": number}
    try:
        item = json.loads(line)
        if not isinstance(item, dict):
            raise ValueError("a line must hold one JSON object")
    except ValueError as exc:
        return {**head, "error": str(exc), "error_type": type(exc).__name__}
    return _grade(head, item)


def _grade_record(number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A rollout record graded from what tau2's reward recorded in its components."""
    head: dict[str, Any] = {"line": number, "episode_id": record.get("episode_id")}
    components = record.get("reward_components")
    if not isinstance(components, dict) or "trajectory" not in components:
        outcome = record.get("outcome")
        if outcome != "ok":
            why = f"the episode ended `{outcome}` ({record.get('reason')}) before tau2 graded it"
        else:
            why = (
                "its reward_components hold no tau2 trajectory (not a record of tau2@..., or "
                "one written before tau2's reward recorded it: run the episode again)"
            )
        return {**head, "error": f"nothing to grade: {why}", "error_type": "NoTrajectory"}
    item = {
        "domain": components.get("domain"),
        "task_id": components.get("task_id"),
        "messages": components["trajectory"],
        "termination_reason": components.get("termination_reason"),
        "solo_mode": components.get("solo_mode", False),
    }
    return {**_grade(head, item), "recorded_reward": record.get("reward")}


def _grade(head: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    from builtin_envs.tau2 import grade
    from builtin_envs.tau2.errors import Tau2DataError

    head = {**head, "domain": item.get("domain"), "task_id": item.get("task_id")}
    try:
        missing = [
            k
            for k in ("domain", "task_id", "messages", "termination_reason")
            if item.get(k) is None
        ]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        result = grade(
            str(item["domain"]),
            str(item["task_id"]),
            item["messages"],
            str(item["termination_reason"]),
            solo_mode=bool(item.get("solo_mode", False)),
        )
    except Tau2DataError:
        raise
    except Exception as exc:  # every other failure is this line's result
        return {**head, "error": str(exc), "error_type": type(exc).__name__}
    return {**head, **result}


def _is_record(line: str) -> bool:
    """Whether a JSON line is a rollout record (it has ``episode_id`` and ``outcome``)."""
    try:
        item = json.loads(line)
    except ValueError:
        return False
    return isinstance(item, dict) and "episode_id" in item and "outcome" in item


def _results(file: Path) -> Iterator[dict[str, Any]]:
    """Each trajectory's result, in input order."""
    if file.is_file() and file.suffix != ".parquet":
        with file.open(encoding="utf-8") as lines:
            first = next((line for line in lines if line.strip()), "")
        if not _is_record(first):
            with file.open(encoding="utf-8") as lines:
                for number, line in enumerate(lines, start=1):
                    if line.strip():
                        yield _grade_line(number, line)
            return
    from rollout.synthesis import read_trajectories  # a run's records (the last per episode)

    for number, record in enumerate(read_trajectories(file), start=1):
        yield _grade_record(number, record)


@app.command("grade")
def grade_command(
    file: Annotated[
        Path,
        typer.Argument(
            help="trajectories, one JSON object per line; or an `aenv rollout` run directory, "
            "its trajectories.jsonl or trajectories.parquet"
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="write results here (default: stdout)")
    ] = None,
) -> None:
    """Grade each trajectory of FILE with tau2's evaluator; one JSON result per line."""
    if file.is_dir():
        if not (file / "trajectories.jsonl").is_file():
            die(f"{file}: no trajectories.jsonl; give an `aenv rollout` run directory", EXIT_USAGE)
    elif not file.is_file():
        die(
            f"{file}: no such file; give a JSON-lines file of trajectories or an `aenv rollout` "
            "run directory",
            EXIT_USAGE,
        )
    sink: TextIO = sys.stdout if out is None else out.open("w", encoding="utf-8")
    graded = failed = 0
    total = 0.0
    try:
        for result in _results(file):
            sink.write(json.dumps(result) + "\n")
            if "error" in result:
                failed += 1
            else:
                graded += 1
                total += float(result["reward"])
    finally:
        if out is not None:
            sink.close()
    mean = total / graded if graded else 0.0
    print(f"graded {graded}, failed {failed}, mean reward {mean:.4f}", file=sys.stderr)
    if failed:
        raise typer.Exit(EXIT_FAILURE)
