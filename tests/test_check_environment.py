"""``aenv_ray.testing.check_environment``: an author's check of a project, run in a sandbox.

Every built-in environment passes it; a project with problems gets every problem named at once;
a project that does not load is reported as such; the project's code runs in an instance of the
local engine, never in this process.
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from aenv_ray.testing import ConformanceError, check_environment
from builtin_envs import builtin_refs
from tests._chat_server import AgentModel, ChatServer
from tests._tau2 import require_tau2_data


def _project(root: Path, name: str, source: str) -> Path:
    project = root / name
    (project / "src").mkdir(parents=True)
    (project / "config.json").write_text(json.dumps({"name": name, "version": "1.0.0"}))
    (project / "src" / "tools.py").write_text(textwrap.dedent(source))
    return project


def _tau2_calls() -> dict[str, dict[str, Any]]:
    """tau2's default episode (airline's first task): for each tool, in the order the check
    calls them, arguments that succeed there (a gold action's, else a plain read)."""
    from builtin_envs.tau2 import get_domain

    airline = get_domain("airline")
    env = airline.initial_environment(airline.task(airline.task_ids("base")[0]))
    candidates: dict[str, list[dict[str, Any]]] = {
        "search_onestop_flight": [{"origin": "ORD", "destination": "PHL", "date": "2024-05-26"}],
        "get_flight_status": [{"flight_number": "HAT001", "date": "2024-05-01"}],
    }
    for task_id in airline.task_ids(None):
        criteria = airline.task(task_id).evaluation_criteria
        for action in (criteria.actions if criteria else None) or []:
            candidates.setdefault(action.name, []).append(action.arguments)
    calls = {}
    for schema in type(env.tools).openai_schemas():
        name = schema["function"]["name"]
        for arguments in [*candidates.get(name, []), {}]:
            if not env.respond(name, arguments).error:
                calls[name] = arguments
                break
    return calls


# swe's default episode is the first demo row (calc): arguments its tools accept there
_SWE_CALLS: dict[str, dict[str, Any]] = {
    "run_command": {"command": "git status --short"},
    "view": {"path": "calc/ops.py", "view_range": [1, 5]},
    "search": {"pattern": "def mean", "include": "*.py"},
    "create_file": {"path": "notes/check.txt", "file_text": "checked\n"},
    "str_replace": {"path": "calc/ops.py", "old_str": "return a + b", "new_str": "return b + a"},
}


@pytest.mark.parametrize("ref", sorted(builtin_refs()))
async def test_every_builtin_environment_passes(ref: str) -> None:
    if ref == "tau2@1.0.0":
        require_tau2_data()
    calls = _tau2_calls() if ref == "tau2@1.0.0" else _SWE_CALLS if ref == "swe@1.0.0" else None
    with contextlib.ExitStack() as stack:
        variables = None
        if ref == "agent@1.0.0":  # configured at creation: a model (a stand-in), no environment
            model = stack.enter_context(ChatServer(AgentModel()))
            variables = {"AGENT_BASE_URL": model.url, "AGENT_MODEL": "stand-in"}
        report = await check_environment(
            builtin_refs()[ref], calls=calls, environment_variables=variables
        )
    assert report.env_ref == ref
    assert report.healthy
    assert set(report.results) == set(report.tools)
    assert not any(r.is_error for r in report.results.values())
    if ref == "agent@1.0.0":
        assert report.results["chat"].text == "echo: x"  # the model answered the chat


async def test_a_sound_project_is_called_once_per_tool(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        "sound",
        """
        from typing import Literal
        from aenv_ray import register_tool

        @register_tool
        def add(a: int, b: int) -> int:
            '''Add two numbers.'''
            return a + b

        @register_tool
        def greet(name: str, tone: Literal["warm", "cold"]) -> str:
            '''Greet someone.'''
            return f"{tone} hello, {name}"
        """,
    )
    report = await check_environment(project, calls={"add": {"a": 2, "b": 3}})
    assert report.tools == ["add", "greet"]
    assert report.arguments == {"add": {"a": 2, "b": 3}, "greet": {"name": "x", "tone": "warm"}}
    assert report.results["add"].structured == 5
    assert report.results["greet"].text == "warm hello, x"


async def test_every_problem_is_named_at_once(tmp_path: Path) -> None:
    project = _project(
        tmp_path,
        "flawed",
        """
        from aenv_ray import register_tool

        @register_tool
        def undocumented(n: int) -> int:
            return n

        @register_tool
        def picky(word: str) -> str:
            '''Only likes one word.'''
            if word != "please":
                raise ValueError(f"not {word!r}")
            return word
        """,
    )
    with pytest.raises(ConformanceError) as caught:
        await check_environment(project, calls={"nonexistent": {}})
    message = str(caught.value)
    assert message.startswith(f"flawed@1.0.0 ({project}):")
    assert "calls names tools it does not have: ['nonexistent']" in message
    assert "tool undocumented: no description (give the function a docstring)" in message
    assert "tool picky: {'word': 'x'} gave a execution result: " in message
    assert "not 'x'" in message
    assert "(pass calls={...} with arguments it accepts)" in message


async def test_a_project_that_does_not_load_is_reported(tmp_path: Path) -> None:
    project = _project(tmp_path, "broken", "raise RuntimeError('import-time failure')\n")
    with pytest.raises(ConformanceError, match="the environment did not start") as caught:
        await check_environment(project)
    assert "import-time failure" in str(caught.value)


async def test_the_projects_code_runs_in_the_sandbox_not_here(tmp_path: Path) -> None:
    marker = tmp_path / "touched-by-import"
    project = _project(
        tmp_path,
        "nosy",
        f"""
        import os
        from aenv_ray import register_tool

        try:
            open({str(marker)!r}, "w").write(str(os.getpid()))
        except OSError:
            pass

        @register_tool
        def pid() -> int:
            '''The process id the tool runs in.'''
            return os.getpid()
        """,
    )
    modules_before = set(sys.modules)
    report = await check_environment(project)
    assert not marker.exists()  # the instance sees its own read-only copy, not this directory
    assert not {m for m in set(sys.modules) - modules_before if m.startswith("tools")}
    assert report.results["pid"].structured != __import__("os").getpid()
