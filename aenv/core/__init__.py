"""AEnvironment's ``aenv.core``: the environment, its decorators, exceptions and models."""

from aenv.core.environment import Environment
from aenv.core.exceptions import (
    EnvironmentError,
    NetworkError,
    ToolError,
    ToolTimeoutError,
    UnrecoverableEnvironmentError,
)
from aenv.core.function_registry import (
    get_function_registry,
    register_function,
    register_health,
    register_reward,
)
from aenv.core.tool import get_registry, register_tool

__all__ = [
    "Environment",
    "EnvironmentError",
    "NetworkError",
    "ToolError",
    "ToolTimeoutError",
    "UnrecoverableEnvironmentError",
    "get_function_registry",
    "get_registry",
    "register_function",
    "register_health",
    "register_reward",
    "register_tool",
]
