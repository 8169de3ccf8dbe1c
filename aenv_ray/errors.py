"""Every error aenv-ray raises, rooted at :class:`AEnvError`.

The tree, by what the caller should do::

    AEnvError
    ├── ConfigurationError (ValueError)          fix your settings or arguments
    │   └── DefinitionError                      fix the project (config.json, decorators)
    ├── EnvironmentNotFoundError (LookupError)   the name@version is unknown; check the spelling
    ├── ToolError                                a tool call failed in the tool's domain
    │   ├── ToolNotFoundError (LookupError)      no such tool; the message suggests the closest
    │   ├── ToolArgumentError (ValueError)       the arguments do not match the tool's schema
    │   ├── ToolExecutionError                   the tool raised; its type and message are kept
    │   │   └── ToolResourceLimitError           the call hit the instance's memory or process limit
    │   └── ToolTimeoutError (+ AEnvTimeoutError) the tool ran past its timeout and was interrupted
    ├── FunctionError                            a function, reward or health check failed
    │   └── FunctionNotFoundError (LookupError)
    ├── ClosedError                              you closed that engine, pool or client; new one
    ├── InstanceError                            the instance itself is the problem
    │   ├── InstanceClosedError (+ ClosedError)  you released it; create a new one
    │   ├── InstanceBrokenError                  it died under you (cause in __cause__); retryable
    │   ├── InstanceUnreachableError             nothing answers at its address; retryable
    │   ├── InstanceExpiredError                 its TTL ran out; retryable on a fresh instance
    │   ├── InstanceNotFoundError (LookupError)  the engine has no instance with that id
    │   └── LeaseLostError                       a pool took your lease back; retryable on a new one
    ├── CapacityError                            the engine cannot start more now; retryable
    ├── NotSupportedError (NotImplementedError)  this engine cannot do that (e.g. fork); use another
    ├── RegistryError                            EnvHub refused a registry operation
    │   ├── VersionConflictError                 that name@version is published (or was): bump it
    │   ├── ArtifactError (ValueError)           an upload is corrupt or not a bundle; rebuild it
    │   │   └── ArtifactTooLargeError            an upload is over the hub's size limit
    │   └── ServiceNotFoundError (LookupError)   no service with that id (for your key)
    ├── AuthenticationError                      no API key, or a wrong or revoked one (HTTP 401)
    ├── PermissionDeniedError                    the key may not do that (HTTP 403)
│   └── QuotaExceededError                   over a hub's quota or cap; free some, ask less
    ├── HubUnreachableError                      nothing answers at AENV_SYSTEM_URL; retryable
    ├── StoreError                               the hub's store failed (SQLite file, Redis)
    ├── AEnvTimeoutError (TimeoutError)
    │   ├── AcquireTimeoutError                  no pooled instance became free in time; retryable
    │   ├── CallTimeoutError                     no answer within the call's timeout
    │   └── StartupTimeoutError                  the instance did not become healthy in time
    └── ProtocolError                            the server answered something we cannot read
        └── ResponseTooLargeError                an answer over protocol.MAX_RESPONSE_BYTES

Retryability is the class attribute ``retryable``: a retry policy reads it and nothing else.
Every class survives :mod:`pickle` with its attributes, because Ray ships errors between processes.

May import: the standard library only.
"""

from __future__ import annotations

from typing import Any, ClassVar

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
    "ConfigurationError",
    "DefinitionError",
    "EnvironmentNotFoundError",
    "FunctionError",
    "FunctionNotFoundError",
    "HubUnreachableError",
    "InstanceBrokenError",
    "InstanceClosedError",
    "InstanceError",
    "InstanceExpiredError",
    "InstanceNotFoundError",
    "InstanceUnreachableError",
    "LeaseLostError",
    "NotSupportedError",
    "PermissionDeniedError",
    "ProtocolError",
    "QuotaExceededError",
    "RegistryError",
    "ResponseTooLargeError",
    "ServiceNotFoundError",
    "StartupTimeoutError",
    "StoreError",
    "ToolArgumentError",
    "ToolError",
    "ToolExecutionError",
    "ToolNotFoundError",
    "ToolResourceLimitError",
    "ToolTimeoutError",
    "VersionConflictError",
]


class AEnvError(Exception):
    """Root of every aenv-ray error.

    ``message`` says which object, what happened and what to do. Optional context travels as
    attributes (``instance_id``, ``env_name``) so handlers need not parse the message.
    """

    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str = "",
        *,
        env_name: str | None = None,
        instance_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.env_name = env_name
        self.instance_id = instance_id

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception pickles as cls(*args) plus __dict__; keyword-only arguments live in __dict__.
        return (type(self), (self.message,), self.__dict__)


class ConfigurationError(AEnvError, ValueError):
    """Settings, arguments or a project's config.json are invalid."""


class DefinitionError(ConfigurationError):
    """An environment project cannot be loaded: a decorator misuse, a bad signature, a clash.

    ``location`` is ``"path/to/file.py:LINE"`` of the offending function when known.
    """

    def __init__(self, message: str = "", *, location: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.location = location


class EnvironmentNotFoundError(AEnvError, LookupError):
    """No environment definition with that name (and version) exists."""


class ToolError(AEnvError):
    """A tool call failed for a reason inside the tool's domain (the instance is fine)."""

    def __init__(self, message: str = "", *, tool: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.tool = tool


class ToolNotFoundError(ToolError, LookupError):
    """The instance serves no tool of that name."""


class ToolArgumentError(ToolError, ValueError):
    """The arguments do not match the tool's input schema; nothing ran."""


class ToolExecutionError(ToolError):
    """The tool raised. ``error_type`` is the exception's class name inside the instance."""

    def __init__(self, message: str = "", *, error_type: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.error_type = error_type


class AEnvTimeoutError(AEnvError, TimeoutError):
    """Something did not finish in time. ``timeout`` is the limit in seconds."""

    retryable = True

    def __init__(self, message: str = "", *, timeout: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.timeout = timeout


class ToolTimeoutError(ToolError, AEnvTimeoutError):
    """The tool ran past its timeout and was interrupted; the instance answers the next call."""

    retryable = False

    def __init__(
        self, message: str = "", *, tool: str | None = None, timeout: float | None = None, **kw: Any
    ) -> None:
        AEnvError.__init__(self, message, **kw)
        self.tool = tool
        self.timeout = timeout


class AcquireTimeoutError(AEnvTimeoutError):
    """No instance of a pool became free within ``acquire(timeout=...)``; try again later or
    grow the pool."""


class CallTimeoutError(AEnvTimeoutError):
    """The instance did not answer a call within the call's timeout."""


class StartupTimeoutError(AEnvTimeoutError):
    """The instance did not become healthy within the startup timeout."""


class FunctionError(AEnvError):
    """A registered function, the reward or the health check failed inside the instance."""

    def __init__(
        self,
        message: str = "",
        *,
        function: str | None = None,
        error_type: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.function = function
        self.error_type = error_type


class FunctionNotFoundError(FunctionError, LookupError):
    """The instance has no function (or no reward) of that name."""


class ClosedError(AEnvError):
    """You closed this object (an engine, a pool, a hub client, a run directory) and then used
    it; create a new one. ``except ClosedError`` also catches :class:`InstanceClosedError`."""


class InstanceError(AEnvError):
    """The instance, not the call, is the problem."""


class InstanceClosedError(InstanceError, ClosedError):
    """You released this environment; create a new one to go on."""


class InstanceBrokenError(InstanceError):
    """The instance died or stopped answering while in use. The cause is in ``__cause__``."""

    retryable = True


class InstanceUnreachableError(InstanceError):
    """Nothing answers at the instance's address."""

    retryable = True


class InstanceExpiredError(InstanceError):
    """The instance's TTL ran out and it was terminated."""

    retryable = True


class InstanceNotFoundError(InstanceError, LookupError):
    """The engine has no instance with that id (never created, or forgotten long ago)."""


class LeaseLostError(InstanceError):
    """A pool no longer holds your lease: its pool actor died, or the pool reclaimed it (idle
    past the pool's lease timeout, its owner died, the pool closed). Acquire a new one."""

    retryable = True


class CapacityError(AEnvError):
    """The engine cannot start another instance now (a limit or the host is full)."""

    retryable = True


class NotSupportedError(AEnvError, NotImplementedError):
    """This engine cannot do that at all (e.g. fork an instance): the contract's typed refusal.

    Not retryable: no retry makes it possible; use an engine that can, or do without."""


class RegistryError(AEnvError):
    """EnvHub refused a registry or control-plane operation."""


class VersionConflictError(RegistryError):
    """That ``name@version`` is already published (or was, and was deleted): published versions
    are immutable and never reused. Bump the version in config.json and push again."""


class ArtifactError(RegistryError, ValueError):
    """An uploaded bundle is corrupt: its digest does not match, it is not a bundle made by
    ``aenv build``, or its config.json is invalid. Rebuild it with ``aenv build``."""


class ArtifactTooLargeError(ArtifactError):
    """An upload is larger than the hub accepts (``aenv serve --max-bundle``)."""


class ServiceNotFoundError(RegistryError, LookupError):
    """No service with that id (for this API key's tenant)."""


class AuthenticationError(AEnvError):
    """The hub wants an API key (none was sent, or it is unknown or revoked: set
    ``AENV_API_KEY`` or ``aenv config set api-key KEY``), or an instance's runtime wants its
    token (``Environment.attach(url, token=info.token)``)."""


class PermissionDeniedError(AEnvError):
    """The API key is valid but may not do this (e.g. publish a name another tenant owns)."""


class QuotaExceededError(PermissionDeniedError):
    """A request is over one of the hub's quotas (a tenant's running instances, services,
    replicas, stored bundle bytes) or caps (what one instance or request may ask: memory, cpu,
    pids, TTL, instances at once). ``limit`` names it (``"memory"``, ``"instances"``),
    ``requested`` is what the request would reach and ``allowed`` the most the hub allows.
    Not retryable as is: free something (release instances, delete versions) or ask for less."""

    def __init__(
        self,
        message: str = "",
        *,
        limit: str | None = None,
        requested: float | None = None,
        allowed: float | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.limit = limit
        self.requested = requested
        self.allowed = allowed


class HubUnreachableError(AEnvError):
    """Nothing answers at the control plane's URL (``AENV_SYSTEM_URL``)."""

    retryable = True


class StoreError(AEnvError):
    """The hub's store failed: the SQLite file cannot be opened or Redis does not answer."""


class ProtocolError(AEnvError):
    """The server answered with something that is not the protocol we speak."""


class ToolResourceLimitError(ToolExecutionError):
    """The call hit the instance's memory or process limit: the kernel killed a process, a fork
    failed, or the tool ran out of memory (the message names the limit). The instance answers
    the next call; use less, or give the environment more (``deployConfig``)."""


class ResponseTooLargeError(ProtocolError):
    """An answer is larger than :data:`aenv_ray.protocol.MAX_RESPONSE_BYTES`: the SDK stopped
    reading it. A runtime never sends one (it turns a result that large into an error result),
    so something else answered, or a proxy in between."""
