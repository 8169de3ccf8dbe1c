"""The environment author's check: does a project load, declare sound tool schemas and answer a
call per tool, inside a sandbox?

:func:`check_environment` starts one instance of the project (on the given engine, by default the
embedded local engine: the project's code runs in the sandbox, never in the calling process),
checks every tool's name, description and input schema, calls each tool once (with the
arguments you give, else with arguments made from its schema) and checks health. It raises
:class:`~aenv_ray.testing.ConformanceError` listing every problem, or returns an
:class:`EnvironmentReport`::

    report = await check_environment("path/to/project", calls={"add": {"a": 1, "b": 2}})
    assert report.results["add"].structured == 3
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aenv_ray.engine import SandboxEngine
from aenv_ray.environment import Environment
from aenv_ray.errors import AEnvError
from aenv_ray.protocol import ToolResult
from aenv_ray.testing.engines import ConformanceError

__all__ = ["EnvironmentReport", "check_environment", "sample_arguments"]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")  # what MCP clients and OpenAI accept


@dataclass
class EnvironmentReport:
    """What :func:`check_environment` saw: the tools, the arguments it called each with, and
    each result."""

    env_ref: str
    tools: list[str] = field(default_factory=list)
    arguments: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: dict[str, ToolResult] = field(default_factory=dict)
    healthy: bool = False


def sample_arguments(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments a tool's input schema accepts: each required property's default, first enum
    value, or a plain value of its type.

        >>> sample_arguments({"type": "object", "required": ["n", "s"],
        ...     "properties": {"n": {"type": "integer"}, "s": {"enum": ["a", "b"]},
        ...                    "opt": {"type": "string"}}})
        {'n': 1, 's': 'a'}
    """
    properties = schema.get("properties") or {}
    return {
        name: _sample(properties.get(name) or {}, schema.get("$defs") or {})
        for name in schema.get("required") or []
    }


_PLAIN: dict[str, Any] = {
    "string": "x",
    "integer": 1,
    "number": 1.0,
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}


def _sample(prop: Mapping[str, Any], defs: Mapping[str, Any]) -> Any:
    if "default" in prop:
        return prop["default"]
    if "const" in prop:
        return prop["const"]
    if prop.get("enum"):
        return prop["enum"][0]
    ref = prop.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = defs.get(ref.rsplit("/", 1)[1]) or {}
        if target.get("type") == "object":
            return {**sample_arguments({**target, "$defs": defs})}
        return _sample(target, defs)
    for options in (prop.get("anyOf"), prop.get("oneOf")):
        if options:
            return _sample(options[0], defs)
    kind = prop.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" and prop.get("properties"):
        return sample_arguments({**prop, "$defs": defs})
    if kind == "array" and prop.get("minItems"):
        return [_sample(prop.get("items") or {}, defs)] * int(prop["minItems"])
    return _PLAIN.get(str(kind), "x")


def _bare(name: object) -> str:
    """A tool's own name: ``mini-terminal@1.0.0/execute_command`` -> ``execute_command``."""
    return str(name).rsplit("/", 1)[-1]


def _schema_problems(tool: Mapping[str, Any]) -> list[str]:
    name = _bare(tool.get("name", ""))
    problems = []
    if not _TOOL_NAME.match(name):
        problems.append(
            f"tool name {name!r} is not 1-64 letters, digits, '_', '.' or '-' (clients refuse it)"
        )
    if not str(tool.get("description") or "").strip():
        problems.append(f"tool {name}: no description (give the function a docstring)")
    schema = tool.get("inputSchema")
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        problems.append(f"tool {name}: inputSchema is not a JSON schema of type object")
        return problems
    properties = schema.get("properties") or {}
    missing = [r for r in schema.get("required") or [] if r not in properties]
    if missing:
        problems.append(f"tool {name}: required {missing} are not among its properties")
    return problems


async def check_environment(
    project: str | Path,
    *,
    calls: Mapping[str, Mapping[str, Any]] | None = None,
    engine: SandboxEngine | None = None,
    timeout: float = 60.0,
    environment_variables: Mapping[str, str] | None = None,
) -> EnvironmentReport:
    """Load ``project`` in an instance, check its tools' schemas, call each tool once, check
    health; raise :class:`~aenv_ray.testing.ConformanceError` listing every problem.

    ``calls`` maps tool names to the arguments to call them with (tools left out are called with
    :func:`sample_arguments` of their schema). A tool call that ends in an error result is a
    problem, whatever the kind: give ``calls`` that a correct tool answers.
    ``environment_variables`` are the instance's, as ``Environment(...)`` passes them (the
    settings of an environment configured at creation, such as ``agent@1.0.0``'s model).
    """
    calls = dict(calls or {})
    problems: list[str] = []
    env = Environment.from_project(
        project,
        engine=engine,
        timeout=timeout,
        environment_variables=dict(environment_variables or {}),
    )
    report = EnvironmentReport(env.env_name)
    try:
        await env.initialize()
    except AEnvError as exc:  # the project did not load (in the sandbox): that is the report
        raise ConformanceError(f"{project}: the environment did not start: {exc}") from exc
    try:
        tools = await env.list_tools()
        report.tools = [_bare(t.get("name")) for t in tools]
        if not tools:
            problems.append("it registers no tools (@register_tool)")
        unknown = sorted(set(calls) - set(report.tools))
        if unknown:
            problems.append(f"calls names tools it does not have: {unknown}")
        for tool in tools:
            problems.extend(_schema_problems(tool))
        await env.list_openai_tools()  # the names and schemas an OpenAI-style agent sees
        for tool in tools:
            name = _bare(tool.get("name"))
            arguments = dict(calls.get(name) or sample_arguments(tool.get("inputSchema") or {}))
            report.arguments[name] = arguments
            try:
                result = await env.call_tool(name, arguments)
            except AEnvError as exc:
                problems.append(f"tool {name}: calling it with {arguments} raised {exc!r}")
                continue
            report.results[name] = result
            if result.is_error:
                kind = result.error_kind.value if result.error_kind else "error"
                hint = "" if name in calls else " (pass calls={...} with arguments it accepts)"
                problems.append(
                    f"tool {name}: {arguments} gave a {kind} result: {result.text[:300]}{hint}"
                )
        health = await env.check_health()
        report.healthy = health.get("status") == "healthy"
        if not report.healthy:
            problems.append(f"its health check says it is not healthy: {health}")
    finally:
        await env.release()
    if problems:
        listing = "\n".join(f"  - {p}" for p in problems)
        raise ConformanceError(f"{report.env_ref} ({project}):\n{listing}")
    return report
