"""``aenv tau2 grade FILE.jsonl``: grade finished tau2 trajectories offline (tau2's evaluator).

One trajectory per input line: ``{"domain", "task_id", "messages", "termination_reason",
"solo_mode"?}`` (messages in the chat shape of ``builtin_envs.tau2.messages``). One result per
output line, in input order: ``{"line", "domain", "task_id", "reward", "components", "db_match",
"termination_reason", ...tau2's reward info}``, or ``{"line", ..., "error", "error_type"}`` for a
trajectory that cannot be graded (a stored tool result that differs from the replay, an unknown
task, a malformed message). Results go to ``--out`` (default: stdout); a summary goes to stderr.
Exit 0 when every line was graded, 1 when some could not be.

May import: typer, ``aenv_ray``; ``builtin_envs.tau2`` inside the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from aenv_cli._common import EXIT_FAILURE, EXIT_USAGE, die

__all__ = ["app"]

app = typer.Typer(help="tau2 (airline, retail, telecom): grade trajectories offline.")


def _grade_line(number: int, line: str) -> dict[str, Any]:
    from builtin_envs.tau2 import grade
    from builtin_envs.tau2.errors import Tau2DataError

    head: dict[str, Any] = {"line": number}
    try:
        item = json.loads(line)
        if not isinstance(item, dict):
            raise ValueError("a line must hold one JSON object")
        head.update(domain=item.get("domain"), task_id=item.get("task_id"))
        missing = [
            k for k in ("domain", "task_id", "messages", "termination_reason") if k not in item
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


@app.command("grade")
def grade_command(
    file: Annotated[Path, typer.Argument(help="trajectories, one JSON object per line")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="write results here (default: stdout)")
    ] = None,
) -> None:
    """Grade each trajectory of FILE with tau2's evaluator; one JSON result per line."""
    if not file.is_file():
        die(f"{file}: no such file; give a JSON-lines file of trajectories", EXIT_USAGE)
    sink: TextIO = sys.stdout if out is None else out.open("w", encoding="utf-8")
    graded = failed = 0
    total = 0.0
    try:
        with file.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                result = _grade_line(number, line)
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
