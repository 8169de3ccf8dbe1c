"""aenv_ray: environments as code for agentic RL, and the SDK that calls them.

Owns the public SDK (:class:`Environment`, :class:`ToolResult`), the decorators that define an
environment (:func:`register_tool`, :func:`register_function`, :func:`register_reward`,
:func:`register_health`), the error tree (:mod:`aenv_ray.errors`), the engine contract
(:class:`SandboxEngine`), ``config.json`` and wire models, environment references
(:mod:`aenv_ray.envref`), the bundle format (:mod:`aenv_ray.bundle`), the preview an
environment names for browsers (:mod:`aenv_ray.preview`), the allow-list of a tenant's pod
template (:mod:`aenv_ray.pod_template`), settings, structured logging and the EnvHub client
(:mod:`aenv_ray.hub`). It is the foundation: every other package stands on it, and it imports
none of them. Engines are made by name (:func:`aenv_ray.engine.new_engine`) and built-in
environments found (:mod:`aenv_ray.resolve`) through entry points (``aenv_ray.engines``,
``aenv_ray.builtins``), so a third party's plug in the same way; the command line that
assembles engines, hub and pools is ``aenv_cli``, above them all.

May import: pydantic, pydantic-settings, httpx (the hub's client), orjson, mcp (the MCP
client), packaging (requirement specifiers in a bundle's lock); lazily, inside functions:
platformdirs (where the settings file lives), yaml (a pod template's text,
:mod:`aenv_ray.pod_template`), prometheus_client (:mod:`aenv_ray.prometheus`, the servers'
metrics) and agents (the OpenAI Agents SDK, :mod:`aenv_ray.openai_tools`).
Must not import: ``aenv_cli``, ``sandbox_runtime``, ``local_backend``, ``k8s_backend``,
``envhub``, ``rollout``, ``builtin_envs``, ``aenv`` (the rooms above it), ray, kubernetes,
gymnasium.

``import aenv_ray`` imports the error tree and nothing else: every other public name is imported
on first use (``aenv_ray.Environment``, ``from aenv_ray import register_tool``), so that a
program, a test or the CLI that needs none of them starts at the speed of Python itself. In a
fresh interpreter (``tests/test_architecture.py`` checks it)::

    import aenv_ray, sys
    assert not any(m in sys.modules for m in ("ray", "kubernetes", "gymnasium", "pydantic"))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from aenv_ray.errors import (
    AcquireTimeoutError,
    AEnvError,
    AEnvTimeoutError,
    ArtifactError,
    ArtifactTooLargeError,
    AuthenticationError,
    CallTimeoutError,
    CapacityError,
    ClosedError,
    ClusterConflictError,
    ClusterError,
    ClusterUnreachableError,
    ConfigurationError,
    DatasourceError,
    DatasourceNotConfiguredError,
    DatasourceTimeoutError,
    DatasourceUnreachableError,
    DefinitionError,
    EnvironmentNotFoundError,
    FunctionError,
    FunctionErrorKind,
    FunctionNotFoundError,
    HubUnreachableError,
    InstanceBrokenError,
    InstanceClosedError,
    InstanceError,
    InstanceExpiredError,
    InstanceNotFoundError,
    InstanceUnreachableError,
    JudgeUnavailableError,
    LeaseLostError,
    MissingExtraError,
    NotSupportedError,
    PermissionDeniedError,
    PodTemplateRefusedError,
    ProtocolError,
    QuotaExceededError,
    RateLimitedError,
    RegistryError,
    RequestTooLargeError,
    ResponseTooLargeError,
    RunNotFoundError,
    ServiceNotFoundError,
    StartupTimeoutError,
    StoreError,
    ToolArgumentError,
    ToolError,
    ToolExecutionError,
    ToolNotFoundError,
    ToolResourceLimitError,
    ToolTimeoutError,
    VersionConflictError,
)

if TYPE_CHECKING:
    from aenv_ray.config import EnvConfig
    from aenv_ray.engine import (
        InstanceInfo,
        InstanceSpec,
        InstanceState,
        Route,
        SandboxEngine,
        TerminationReason,
    )
    from aenv_ray.environment import Environment, EnvironmentState
    from aenv_ray.processes import keep_processes
    from aenv_ray.protocol import JudgeReport, ToolErrorKind, ToolResult
    from aenv_ray.registry import (
        DefinitionRegistry,
        register_function,
        register_health,
        register_reward,
        register_tool,
    )
    from aenv_ray.resolve import available_environments

# Imported on first use (PEP 562), so that ``import aenv_ray`` costs little more than starting
# Python: the SDK, the engine contract and the decorators bring pydantic, asyncio and orjson, the
# error tree above only the standard library. ``tests/test_architecture.py`` checks both.
_LAZY = {
    "DefinitionRegistry": "aenv_ray.registry",
    "EnvConfig": "aenv_ray.config",
    "Environment": "aenv_ray.environment",
    "EnvironmentState": "aenv_ray.environment",
    "InstanceInfo": "aenv_ray.engine",
    "JudgeReport": "aenv_ray.protocol",
    "InstanceSpec": "aenv_ray.engine",
    "InstanceState": "aenv_ray.engine",
    "Route": "aenv_ray.engine",
    "SandboxEngine": "aenv_ray.engine",
    "TerminationReason": "aenv_ray.engine",
    "ToolErrorKind": "aenv_ray.protocol",
    "ToolResult": "aenv_ray.protocol",
    "available_environments": "aenv_ray.resolve",
    "keep_processes": "aenv_ray.processes",
    "register_function": "aenv_ray.registry",
    "register_health": "aenv_ray.registry",
    "register_reward": "aenv_ray.registry",
    "register_tool": "aenv_ray.registry",
}
# the submodules ``import aenv_ray`` used to import, still reachable as attributes after it alone
_SUBMODULES = frozenset(
    {
        "config",
        "engine",
        "environment",
        "envref",
        "openai_tools",
        "processes",
        "protocol",
        "registry",
        "resolve",
        "settings",
        "signature",
    }
)

__version__ = "0.1.0"

__all__ = [
    "AEnvError",
    "AEnvTimeoutError",
    "AcquireTimeoutError",
    "ArtifactError",
    "ArtifactTooLargeError",
    "AuthenticationError",
    "CallTimeoutError",
    "CapacityError",
    "ClosedError",
    "ClusterConflictError",
    "ClusterError",
    "ClusterUnreachableError",
    "ConfigurationError",
    "DatasourceError",
    "DatasourceNotConfiguredError",
    "DatasourceTimeoutError",
    "DatasourceUnreachableError",
    "DefinitionError",
    "DefinitionRegistry",
    "EnvConfig",
    "Environment",
    "EnvironmentNotFoundError",
    "EnvironmentState",
    "FunctionError",
    "FunctionErrorKind",
    "FunctionNotFoundError",
    "HubUnreachableError",
    "InstanceBrokenError",
    "InstanceClosedError",
    "InstanceError",
    "InstanceExpiredError",
    "InstanceInfo",
    "InstanceNotFoundError",
    "InstanceSpec",
    "InstanceState",
    "InstanceUnreachableError",
    "JudgeReport",
    "JudgeUnavailableError",
    "LeaseLostError",
    "MissingExtraError",
    "NotSupportedError",
    "PermissionDeniedError",
    "PodTemplateRefusedError",
    "ProtocolError",
    "QuotaExceededError",
    "RateLimitedError",
    "RegistryError",
    "RequestTooLargeError",
    "ResponseTooLargeError",
    "Route",
    "RunNotFoundError",
    "SandboxEngine",
    "ServiceNotFoundError",
    "StartupTimeoutError",
    "StoreError",
    "TerminationReason",
    "ToolArgumentError",
    "ToolError",
    "ToolErrorKind",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolResourceLimitError",
    "ToolResult",
    "ToolTimeoutError",
    "VersionConflictError",
    "__version__",
    "available_environments",
    "keep_processes",
    "register_function",
    "register_health",
    "register_reward",
    "register_tool",
]


def __getattr__(name: str) -> Any:
    """The public names above, imported on first use; a submodule (``aenv_ray.config``) the same
    way, as before they were imported eagerly; ``aenv_ray.Registry``: the old name of
    :class:`DefinitionRegistry`, kept for a while."""
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name == "Registry":
        import warnings

        warnings.warn(
            "aenv_ray.Registry is now aenv_ray.DefinitionRegistry (the hub's registry of "
            "versions is envhub.registry.VersionRegistry); import the new name",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__("DefinitionRegistry")
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'aenv_ray' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
