"""aenv_ray: environments as code for agentic RL, and the SDK that calls them.

Owns the public SDK (:class:`Environment`, :class:`ToolResult`), the decorators that define an
environment (:func:`register_tool`, :func:`register_function`, :func:`register_reward`,
:func:`register_health`), the error tree (:mod:`aenv_ray.errors`), the engine contract
(:class:`SandboxEngine`), ``config.json`` and wire models, environment references
(:mod:`aenv_ray.envref`), the bundle format (:mod:`aenv_ray.bundle`), the preview an
environment names for browsers (:mod:`aenv_ray.preview`), the allow-list of a tenant's pod
template (:mod:`aenv_ray.pod_template`), settings, structured logging, the
EnvHub client (:mod:`aenv_ray.hub`) and the ``aenv`` CLI.

May import: pydantic, pydantic-settings, httpx (the hub's client), orjson, the mcp/fastmcp
clients, packaging (requirement specifiers in a bundle's lock), typer and rich (CLI only); lazily,
inside functions: ``local_backend`` and ``k8s_backend`` (the engines, made by name in
:func:`aenv_ray.engine.new_engine`, the one place that imports an engine), ``builtin_envs``
(finding built-ins by name), platformdirs (where the settings file lives) and yaml (a pod
template's text, :mod:`aenv_ray.pod_template`).
Must not import at import time: ray, kubernetes, gymnasium, the runtime, ``local_backend``,
``k8s_backend``.

In a fresh interpreter (``tests/test_architecture.py`` checks it)::

    import aenv_ray, sys
    assert not any(m in sys.modules for m in ("ray", "kubernetes", "gymnasium"))
"""

from typing import Any

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
from aenv_ray.processes import keep_processes
from aenv_ray.protocol import ToolErrorKind, ToolResult
from aenv_ray.registry import (
    DefinitionRegistry,
    register_function,
    register_health,
    register_reward,
    register_tool,
)
from aenv_ray.resolve import available_environments

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
    """``aenv_ray.Registry``: the old name of :class:`DefinitionRegistry`, kept for a while."""
    if name == "Registry":
        import warnings

        warnings.warn(
            "aenv_ray.Registry is now aenv_ray.DefinitionRegistry (the hub's registry of "
            "versions is envhub.registry.VersionRegistry); import the new name",
            DeprecationWarning,
            stacklevel=2,
        )
        return DefinitionRegistry
    raise AttributeError(f"module 'aenv_ray' has no attribute {name!r}")
