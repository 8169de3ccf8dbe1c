"""aenv: AEnvironment's Python SDK, as a thin layer over aenv_ray's public API.

Owns the ``aenv`` import name, so that code written against AEnvironment (``pip install
aenvironment``, 0.1.7) runs unchanged on aenv-ray: environment projects (``from aenv import
register_tool, register_function, register_reward, register_health``) and agents (``from aenv
import Environment``, ``from aenv.core.environment import Environment``). Each name does what
AEnvironment's does, by calling aenv-ray (:class:`aenv_ray.Environment`, its decorators, its
error tree); ``Environment.native`` is the :class:`aenv_ray.Environment` underneath. What still
differs, and why: docs/migrating.md.

AEnvironment itself installs a package named ``aenv`` too: importing this one where AEnvironment
is installed raises :class:`ImportError` saying what to do (:mod:`aenv._conflict`).

May import: ``aenv_ray``'s public API, pydantic (AEnvironment's models are pydantic models);
lazily, inside functions: agents (the OpenAI Agents SDK, for ``list_openai_tools``).
Must not import: ray, kubernetes, the runtime, ``local_backend``, ``k8s_backend``.
"""

import aenv._conflict  # noqa: F401 - raises ImportError beside AEnvironment, before the rest
from aenv.core.environment import Environment, ToolResult
from aenv.core.exceptions import (
    AEnvError,
    EnvironmentError,
    ToolError,
    UnrecoverableEnvironmentError,
)
from aenv.core.function_registry import register_function, register_health, register_reward
from aenv.core.logging import setup_logging
from aenv.core.models import EnvInstance, EnvStatus
from aenv.core.tool import Tool, get_registry, register_tool

__version__ = "0.1.7"
"""The AEnvironment release whose API this package follows (aenv-ray's own version is
``aenv_ray.__version__``)."""

__all__ = [
    "AEnvError",
    "EnvInstance",
    "EnvStatus",
    "Environment",
    "EnvironmentError",
    "Tool",
    "ToolError",
    "ToolResult",
    "UnrecoverableEnvironmentError",
    "__version__",
    "get_registry",
    "register_function",
    "register_health",
    "register_reward",
    "register_tool",
    "setup_logging",
]
