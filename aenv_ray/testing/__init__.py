"""aenv_ray.testing: helpers for testing environments, tools and engines built on aenv-ray.

Owns :class:`RuntimeProcess` (a project served in a child process on free loopback ports, the
way ``aenv run`` does), the engine conformance kit (:func:`check_sandbox_engine`: does an engine
keep the :class:`~aenv_ray.engine.SandboxEngine` contract?) and the environment author's check
(:func:`check_environment`: does a project load, declare sound schemas, and answer a call per
tool, inside a sandbox?).

    with RuntimeProcess("path/to/project") as runtime:
        async with runtime.environment() as env:
            result = await env.call_tool("echo", {"text": "hi"})

May import: ``aenv_ray`` (it starts the runtime as a process, ``python -m sandbox_runtime``,
and imports none of it).
"""

from aenv_ray.testing.engines import (
    ENGINE_CHECKS,
    ConformanceError,
    EngineFactory,
    StateProbe,
    check_sandbox_engine,
)
from aenv_ray.testing.environments import EnvironmentReport, check_environment, sample_arguments
from aenv_ray.testing.runtime import RuntimeProcess, free_port

__all__ = [
    "ENGINE_CHECKS",
    "ConformanceError",
    "EngineFactory",
    "EnvironmentReport",
    "RuntimeProcess",
    "StateProbe",
    "check_environment",
    "check_sandbox_engine",
    "free_port",
    "sample_arguments",
]
