"""Every error aenv-ray raises, rooted at :class:`AEnvError`.

The tree, by what the caller should do::

    AEnvError
    ├── ConfigurationError (ValueError)          fix your settings or arguments
    │   └── DefinitionError                      fix the project (config.json, decorators)
    ├── EnvironmentNotFoundError (LookupError)   the name@version is unknown; check the spelling
    ├── RunNotFoundError (LookupError)           no such rollout run, or no such episode in it
    ├── ToolError                                a tool call failed in the tool's domain
    │   ├── ToolNotFoundError (LookupError)      no such tool; the message suggests the closest
    │   ├── ToolArgumentError (ValueError)       the arguments do not match the tool's schema
    │   ├── ToolExecutionError                   the tool raised; its type and message are kept
    │   │   └── ToolResourceLimitError           the call hit the instance's memory or process limit
    │   └── ToolTimeoutError (+ AEnvTimeoutError) the tool ran past its timeout and was interrupted
    ├── FunctionError                            a function, reward or health check failed
    │   └── FunctionNotFoundError (LookupError)
    ├── ClosedError                              you closed that engine, pool or client; new one
    ├── MissingExtraError (ImportError)          an optional part is not installed: the extra to add
    ├── InstanceError                            the instance itself is the problem
    │   ├── InstanceClosedError (+ ClosedError)  you released it; create a new one
    │   ├── InstanceBrokenError                  it died under you (cause in __cause__); retryable
    │   ├── InstanceUnreachableError             nothing answers at its address; retryable
    │   ├── InstanceExpiredError                 its TTL ran out; retryable on a fresh instance
    │   ├── InstanceNotFoundError (LookupError)  the engine has no such instance; retryable anew
    │   ├── LeaseLostError                       a pool took your lease back; retryable on a new one
    │   └── JudgeUnavailableError                a judge reward could not run: nothing was graded
    ├── CapacityError                            the engine cannot start more now; retryable
    ├── NotSupportedError (NotImplementedError)  this engine cannot do that (e.g. fork); use another
    ├── RequestTooLargeError (ValueError)        arguments larger than the instance takes (HTTP 413)
    ├── DatasourceError                          a DualContainer's second container failed a call
    │   ├── DatasourceNotConfiguredError (+ NotSupportedError)  this instance has no such container
    │   ├── DatasourceUnreachableError           its exec helper does not answer; retryable
    │   └── DatasourceTimeoutError (+ AEnvTimeoutError) the command ran past its timeout: killed
    ├── RegistryError                            EnvHub refused a registry operation
    │   ├── VersionConflictError                 that name@version is published (or was): bump it
    │   ├── ArtifactError (ValueError)           an upload is corrupt or not a bundle; rebuild it
    │   │   └── ArtifactTooLargeError            an upload is over the hub's size limit
    │   └── ServiceNotFoundError (LookupError)   no service with that id (for your key)
    ├── AuthenticationError                      no API key, or a wrong or revoked one (HTTP 401)
    ├── RateLimitedError                         too many failures or connections; retryable later
    ├── PermissionDeniedError                    the key may not do that (HTTP 403)
    │   ├── QuotaExceededError                   over a hub's quota or cap; free some, ask less
    │   └── PodTemplateRefusedError              a pod template sets a field tenants may not set
    ├── HubUnreachableError                      nothing answers at AENV_SYSTEM_URL; retryable
    ├── StoreError                               the hub's store failed (SQLite file, Redis)
    ├── ClusterError                             the Kubernetes API refused a request
    │   ├── ClusterConflictError                 another writer changed the object first; retryable
    │   └── ClusterUnreachableError              the API server does not answer (or 5xx); retryable
    ├── AEnvTimeoutError (TimeoutError)
    │   ├── AcquireTimeoutError                  no pooled instance became free in time; retryable
    │   ├── CallTimeoutError                     no answer within the call's timeout; retryable
    │   └── StartupTimeoutError                  the instance did not become healthy in time
    └── ProtocolError                            the server answered something we cannot read
        └── ResponseTooLargeError                an answer over protocol.MAX_RESPONSE_BYTES

Retryability is the class attribute ``retryable``: every retry policy reads it (through
:func:`is_retryable`) and nothing else. It means: the same work may succeed if run again, on a
fresh instance when the instance is the problem; it never means a call that may have run is
safe to send twice. Every class survives :mod:`pickle` with its attributes, because Ray ships
errors between processes.

On the wire (the runtime, the engine daemon, EnvHub) an error is one JSON object, written by
:func:`encode_error` and read back by :func:`decode_error`::

    {"error": MESSAGE, "type": CLASS NAME, "retryable": BOOL, <the class's typed fields>}

    >>> wire = encode_error(VersionConflictError("x@1 is taken", existing_digest="sha256:ab"))
    >>> wire["type"], wire["retryable"], wire["existing_digest"]
    ('VersionConflictError', False, 'sha256:ab')
    >>> error = decode_error(wire, 409)
    >>> type(error).__name__, error.existing_digest
    ('VersionConflictError', 'sha256:ab')

May import: the standard library only.
"""

from __future__ import annotations

import enum
import math
import typing
from collections.abc import Mapping
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
    "ClusterConflictError",
    "ClusterError",
    "ClusterUnreachableError",
    "ConfigurationError",
    "DatasourceError",
    "DatasourceNotConfiguredError",
    "DatasourceTimeoutError",
    "DatasourceUnreachableError",
    "DefinitionError",
    "EnvironmentNotFoundError",
    "FunctionError",
    "FunctionErrorKind",
    "FunctionNotFoundError",
    "HubUnreachableError",
    "InstanceBrokenError",
    "InstanceClosedError",
    "InstanceError",
    "InstanceExpiredError",
    "InstanceNotFoundError",
    "InstanceUnreachableError",
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
    "RunNotFoundError",
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
    "decode_error",
    "encode_error",
    "is_retryable",
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


class RunNotFoundError(AEnvError, LookupError):
    """No rollout run directory at that path or of that name (``aenv ui``), or no episode of
    that id recorded in it (yet): check the name; a live run records an episode when it ends."""


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
    """The instance did not answer a call within the call's timeout (plus ``AENV_CALL_GRACE``).

    Retryable, as every :class:`AEnvTimeoutError` but :class:`ToolTimeoutError`: the runtime
    answers a tool that overruns its own limit within that grace, so silence means the
    instance (or the host, or the network) is stuck: run the work again on a fresh instance.
    The call may have run: a policy repeats whole episodes, never this call on this instance."""


class StartupTimeoutError(AEnvTimeoutError):
    """The instance did not become healthy within the startup timeout."""


class FunctionErrorKind(enum.Enum):
    """Why a function, the reward or the health check failed (:attr:`FunctionError.kind`); the
    values are those of :class:`~aenv_ray.protocol.ToolErrorKind` for the same causes.

        >>> FunctionErrorKind("timeout")
        <FunctionErrorKind.TIMEOUT: 'timeout'>
    """

    NOT_FOUND = "not_found"
    """No function of that name (the message suggests the closest), or no reward registered."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The arguments are not an object, or do not fit the signature; nothing ran."""
    EXECUTION = "execution"
    """It raised (``error_type`` is the exception's class name), or returned no JSON value."""
    TIMEOUT = "timeout"
    """It ran past its limit and was interrupted."""
    RESOURCE_LIMIT = "resource_limit"
    """The call hit the instance's memory or process limit; the message names the limit."""


class FunctionError(AEnvError):
    """A registered function, the reward or the health check failed inside the instance.

    ``kind`` says why (a :class:`FunctionErrorKind`); ``error_type`` is the seeds' string for
    it: the exception's class name when the function raised (``"RuntimeError"``), else the
    kind's value (``"invalid_arguments"``).
    """

    def __init__(
        self,
        message: str = "",
        *,
        function: str | None = None,
        error_type: str | None = None,
        kind: FunctionErrorKind | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.function = function
        self.error_type = error_type
        self.kind = kind


class FunctionNotFoundError(FunctionError, LookupError):
    """The instance has no function (or no reward) of that name."""


class ClosedError(AEnvError):
    """You closed this object (an engine, a pool, a hub client, a run directory) and then used
    it; create a new one. ``except ClosedError`` also catches :class:`InstanceClosedError`."""


class MissingExtraError(AEnvError, ImportError):
    """A part of aenv-ray was used whose optional dependencies are not installed; ``extra``
    names what brings them: ``pip install 'aenv-ray[EXTRA]'``, from a checkout
    ``pip install -e '.[EXTRA]'`` (:func:`aenv_ray.extras.install_hint`).
    The message is that one line."""

    def __init__(self, message: str = "", *, extra: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.extra = extra


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
    """The engine has no instance with that id (never created, or forgotten long ago).

    Retryable: met in use, the instance is gone under you (the engine or the hub restarted and
    forgot it, a reaper took it), and work run again on a fresh instance succeeds, as after
    :class:`InstanceExpiredError`. A mistyped id fails again the same way; bounded retries
    show that soon enough."""

    retryable = True


class LeaseLostError(InstanceError):
    """A pool no longer holds your lease: its pool actor died, or the pool reclaimed it (idle
    past the pool's lease timeout, its owner died, the pool closed). Acquire a new one."""

    retryable = True


class JudgeUnavailableError(InstanceError):
    """A reward registered with ``judge=True`` could not run in the judge: its seed is gone
    and no fresh one starts, the workspace does not fit the judge's scratch space, the judge
    process died without an answer. Nothing was graded: this is no reward of the agent's (never
    record it as 0): an instance error, so rollout counts it as the infrastructure's. The message
    says what to do (more memory or room for the instance, a new instance)."""


class CapacityError(AEnvError):
    """The engine cannot start another instance now (a limit or the host is full)."""

    retryable = True


class NotSupportedError(AEnvError, NotImplementedError):
    """This engine cannot do that at all (e.g. fork an instance): the contract's typed refusal.

    Not retryable: no retry makes it possible; use an engine that can, or do without."""


class DatasourceError(AEnvError):
    """The second container of a ``DualContainer`` instance (its ``datasource``) could not do
    what a tool asked through :mod:`aenv_ray.datasource`: no such file, a command that is not
    in its image, a file over the size asked for. ``code`` is the errno's name when the
    container's helper gave one (``"ENOENT"``, ``"EACCES"``, ``"EFBIG"``)."""

    def __init__(self, message: str = "", *, code: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.code = code


class DatasourceNotConfiguredError(DatasourceError, NotSupportedError):
    """This instance has no second container: its environment's ``deployConfig.podTemplate`` is
    not ``DualContainer``, or the engine runs one container only (the local engine does; the
    Kubernetes engine runs both)."""


class DatasourceUnreachableError(DatasourceError):
    """The second container's exec helper does not answer on its socket: the container has not
    started, has died, or was replaced. Retryable on a fresh instance."""

    retryable = True


class DatasourceTimeoutError(DatasourceError, AEnvTimeoutError):
    """A command in the second container ran past its ``timeout`` and was killed with its whole
    process group, or the helper did not answer in time. ``result``, when set, holds what the
    command wrote until then (an :class:`aenv_ray.datasource.CommandResult`). Not retryable:
    the same command would time out again."""

    retryable = False

    def __init__(
        self, message: str = "", *, code: str | None = None, timeout: float | None = None, **kw: Any
    ) -> None:
        AEnvError.__init__(self, message, **kw)
        self.code = code
        self.timeout = timeout


class RegistryError(AEnvError):
    """EnvHub refused a registry or control-plane operation."""


class VersionConflictError(RegistryError):
    """That ``name@version`` is already published (or was, and was deleted): published versions
    are immutable and never reused. Bump the version in config.json and push again.
    ``existing_digest`` is the published bundle's digest (pushing the very same bundle again is
    then no conflict at all)."""

    def __init__(self, message: str = "", *, existing_digest: str | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.existing_digest = existing_digest


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


class RateLimitedError(AEnvError):
    """A hub refuses your address for a while (HTTP 429): too many failed authentications
    from it, or more connections from it at once than the hub allows one client.
    ``retry_after`` is how many seconds to wait (also the answer's ``Retry-After``); then fix
    the key (``AENV_API_KEY``) or open fewer connections at once."""

    retryable = True

    def __init__(self, message: str = "", *, retry_after: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


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


class PodTemplateRefusedError(PermissionDeniedError):
    """A pod template (``deployConfig.customPodTemplate``) sets a field that is not on the
    allow-list of what a tenant may set, or a value outside that field's bounds
    (:mod:`aenv_ray.pod_template`). ``field`` is the field's full path as written
    (``customPodTemplate.spec.containers[sidecar].securityContext.seLinuxOptions``), ``allow``
    the allow-list entry an operator would add to let it through (``aenv serve
    --pod-template-allow``, ``pod_template_allow`` in ``--limits``, or
    ``KubernetesEngine(pod_template_allow=...)``). No pod was created."""

    def __init__(
        self, message: str = "", *, field: str | None = None, allow: str | None = None, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.field = field
        self.allow = allow


class HubUnreachableError(AEnvError):
    """Nothing answers at the control plane's URL (``AENV_SYSTEM_URL``)."""

    retryable = True


class StoreError(AEnvError):
    """The hub's store failed: the SQLite file cannot be opened or Redis does not answer."""


class ClusterError(AEnvError):
    """The Kubernetes API refused a request for a reason no narrower class names (a 401, 403,
    422 or missing namespace is a :class:`AuthenticationError`, :class:`PermissionDeniedError`
    or :class:`ConfigurationError`); the message carries the API's own words."""


class ClusterConflictError(ClusterError):
    """Another writer changed the object first (HTTP 409: a claimed warm pod, a renewed lease).
    Retryable: read it again and decide anew."""

    retryable = True


class ClusterUnreachableError(ClusterError):
    """The Kubernetes API server does not answer, or kept answering 429 or 5xx through every
    retry. Check the kubeconfig's server and the cluster's health."""

    retryable = True


class ProtocolError(AEnvError):
    """The server answered with something that is not the protocol we speak.

    Not retryable: it is not the agent's failure (rollout counts it as the infrastructure's),
    but the same URL, version mismatch or proxy answers the same way on the next instance."""


class ToolResourceLimitError(ToolExecutionError):
    """The call hit the instance's memory or process limit: the kernel killed a process, a fork
    failed, or the tool ran out of memory (the message names the limit). The instance answers
    the next call; use less, or give the environment more (``deployConfig``)."""


class RequestTooLargeError(AEnvError, ValueError):
    """A request's arguments are larger than the instance takes: over
    :data:`aenv_ray.protocol.MAX_REQUEST_BYTES`, or more than its memory can hold while it
    reads them (the message names the limit). The instance answers the next call; pass large
    data as a file in the workspace instead. Not retryable as it is."""


class ResponseTooLargeError(ProtocolError):
    """An answer is larger than :data:`aenv_ray.protocol.MAX_RESPONSE_BYTES`: the SDK stopped
    reading it. A runtime never sends one (it turns a result that large into an error result),
    so something else answered, or a proxy in between."""


# -- the wire ---------------------------------------------------------------------------------

_TREE: dict[str, type[AEnvError]] = {
    cls.__name__: cls
    for cls in list(globals().values())
    if isinstance(cls, type) and issubclass(cls, AEnvError) and cls.__module__ == __name__
}
"""Every class a wire may name: a decoder instantiates nothing else."""

_BY_STATUS: dict[int, type[AEnvError]] = {
    400: ConfigurationError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    429: RateLimitedError,
}
_FIELDS: dict[type[AEnvError], dict[str, Any]] = {}


def _fields(cls: type[AEnvError]) -> dict[str, Any]:
    """The typed attributes of ``cls`` (its constructors' keyword-only parameters along the
    MRO, with their type hints), in declaration order, root's last."""
    found = _FIELDS.get(cls)
    if found is None:
        found = {}
        for klass in cls.__mro__:
            init = vars(klass).get("__init__")
            if init is None or not issubclass(klass, AEnvError):
                continue
            hints = typing.get_type_hints(init)
            code = init.__code__
            names = code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]
            for name in names:
                found.setdefault(name, hints[name])
            if not code.co_flags & 0x08:  # no **kw: this constructor passes nothing further up
                break
        _FIELDS[cls] = found
    return found


def _coerce(value: Any, hint: Any) -> Any:
    """``value`` as one of the types ``hint`` allows (``str | None``, ``float | None``, an
    enum), or None when it is none of them: a wire's values are checked, not trusted."""
    for kind in typing.get_args(hint) or (hint,):
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            try:
                return kind(value)
            except ValueError:
                continue
        if kind is str and isinstance(value, str):
            return value
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if kind is float and number and math.isfinite(value):
            return float(value)
    return None


def _known(cls: type[AEnvError]) -> type[AEnvError]:
    """The nearest class of this module's tree (a subclass defined elsewhere is sent as it)."""
    return next(k for k in cls.__mro__ if _TREE.get(k.__name__) is k)


def encode_error(exc: AEnvError) -> dict[str, Any]:
    """``exc`` as the JSON object every aenv-ray server answers an error with.

    ``error`` is the message, ``type`` the class's name in this module's tree (the nearest one
    for a subclass defined elsewhere), ``retryable`` the class's (for clients in other
    languages; :func:`decode_error` takes it from the class, never from the wire), and each
    typed attribute of the class that is set, under its own name (an enum as its value).

        >>> encode_error(QuotaExceededError("too much", limit="memory", allowed=4.0))
        {'error': 'too much', 'type': 'QuotaExceededError', 'retryable': False, \
'limit': 'memory', 'allowed': 4.0}
    """
    cls = _known(type(exc))
    body: dict[str, Any] = {"error": exc.message, "type": cls.__name__, "retryable": cls.retryable}
    for name in _fields(cls):
        value = getattr(exc, name, None)
        if value is not None:
            body[name] = value.value if isinstance(value, enum.Enum) else value
    return body


def decode_error(
    payload: Any, status: int, *, fallback: type[AEnvError] | None = None, **context: Any
) -> AEnvError:
    """The error an answer of HTTP ``status`` with the JSON ``payload`` carries, as its class.

    Only a class of this module's tree is made: a ``type`` that names none (or none given)
    gives ``fallback``, else the class of the status (400 :class:`ConfigurationError`, 401
    :class:`AuthenticationError`, 403 :class:`PermissionDeniedError`), else :class:`AEnvError`.
    A typed field is taken when its value has the field's type (else left unset); ``retryable``
    is the class's. ``context`` (``env_name="x@1"``, ``function="reward"``) is what the
    caller knows better than the server: it wins over the wire, for the fields the class has.
    A payload that is no error envelope gives :class:`ProtocolError`.

        >>> error = decode_error({"error": "gone", "type": "InstanceBrokenError"}, 503,
        ...                      instance_id="i-1")
        >>> type(error).__name__, error.retryable, error.instance_id
        ('InstanceBrokenError', True, 'i-1')
        >>> type(decode_error({"error": "no", "type": "SystemExit"}, 401)).__name__
        'AuthenticationError'
    """
    if not isinstance(payload, Mapping) or not isinstance(payload.get("error"), str):
        shown = repr(payload)[:200]
        return ProtocolError(
            f"an error answer (HTTP {status}) that is not aenv-ray's error envelope: {shown}",
            env_name=context.get("env_name"),
            instance_id=context.get("instance_id"),
        )
    name = payload.get("type")
    cls = _TREE.get(name) if isinstance(name, str) else None
    if cls is None:
        cls = fallback or _BY_STATUS.get(status, AEnvError)
    values: dict[str, Any] = {}
    for field, hint in _fields(cls).items():
        value = context.get(field)
        if value is None:
            value = _coerce(payload.get(field), hint)
        if value is not None:
            values[field] = value
    return cls(payload["error"], **values)


def is_retryable(exc: BaseException | None) -> bool:
    """The one retry rule: whether the work that raised ``exc`` may succeed if run again.

    An :class:`AEnvError` answers with its class's ``retryable``. Any other exception is
    retryable when what it was raised ``from`` is (a policy that wraps a broken instance's
    error still lost its instance), and an exception group when one of its members is.

        >>> is_retryable(InstanceBrokenError("gone")), is_retryable(ToolTimeoutError("slow"))
        (True, False)
        >>> try:
        ...     try:
        ...         raise CapacityError("full")
        ...     except CapacityError as exc:
        ...         raise RuntimeError("my policy gave up") from exc
        ... except RuntimeError as wrapped:
        ...     is_retryable(wrapped)
        True
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AEnvError):
            return exc.retryable
        if isinstance(exc, BaseExceptionGroup):
            return any(is_retryable(inner) for inner in exc.exceptions)
        exc = exc.__cause__
    return False
