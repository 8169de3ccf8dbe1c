"""AEnvironment's exceptions (``aenv.core.exceptions``), rooted in aenv-ray's error tree.

Each is an :class:`aenv_ray.errors.AEnvError` too, so ``except aenv_ray.AEnvError`` catches
them; the aenv-ray error behind one is its ``__cause__``. ``EnvironmentError`` shadows Python's
builtin of that name (an alias of ``OSError``) inside modules that import it, as in AEnvironment:
it is here for code written against AEnvironment, and aenv-ray's own modules never use it.
"""

from __future__ import annotations

from typing import Any

from aenv_ray import errors

__all__ = [
    "AEnvError",
    "EnvironmentError",
    "NetworkError",
    "ToolError",
    "ToolServerError",
    "ToolTimeoutError",
    "UnrecoverableEnvironmentError",
    "ValidationError",
]


class AEnvError(errors.AEnvError):
    """Base of AEnvironment's exceptions; ``details`` is a dict of context."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class ToolError(AEnvError):
    """A tool call failed where AEnvironment raises: another environment's tool name, a call
    past its timeout, an instance that broke during the call."""

    def __init__(
        self,
        message: str,
        tool_name: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, details)
        self.tool_name = tool_name


class EnvironmentError(AEnvError):
    """An environment operation failed: creating, listing, a function, the reward, health."""

    def __init__(
        self,
        message: str,
        env_name: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, details)
        self.env_name = env_name


class ToolTimeoutError(ToolError):
    """A tool ran past its timeout (it was interrupted in its instance)."""

    def __init__(
        self,
        message: str,
        tool_name: str | None = None,
        timeout: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, tool_name, details)
        self.timeout = timeout


class ToolServerError(ToolError):
    """The tool's server answered an error status."""

    def __init__(
        self,
        message: str,
        tool_name: str | None = None,
        status_code: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message, tool_name, details)
        self.status_code = status_code


class UnrecoverableEnvironmentError(EnvironmentError):
    """Five tool calls in a row failed to reach the instance: the circuit breaker is open."""


class NetworkError(AEnvError):
    """A network failure."""


class ValidationError(AEnvError):
    """Input that does not validate."""
