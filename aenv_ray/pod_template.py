"""A tenant's own pod template (``deployConfig.customPodTemplate``): its text read into a Pod,
its placeholders filled, and the allow-list it is checked against.

The template is part of an environment definition, as untrusted as the environment's code.
It is checked by an **allow-list**, :data:`ALLOWED`: a tree of the Pod fields a tenant may set,
each leaf bounded (a type, an enum, a range, a pattern, a length, a cap on resources). A field
the tree does not name is refused with its full path; a value out of its bounds likewise. So a
field Kubernetes adds next year is refused until someone decides it is safe. What the tree
allows tightens a pod or places it; it never loosens it: ``runAsNonRoot`` only ``true``,
``allowPrivilegeEscalation`` only ``false``, capabilities only dropped, seccomp and AppArmor
only ``RuntimeDefault`` or a ``Localhost`` profile, variables only literal values, volumes only
``emptyDir``, labels and annotations outside the reserved domains.

An operator widens it explicitly (:class:`PodTemplatePolicy`, ``allow``): each entry is a path
such as ``spec.tolerations`` or ``spec.containers[].securityContext.seLinuxOptions`` (``[]``
for any list item, ``[key]`` for one key of a map, e.g.
``spec.containers[].resources.limits[nvidia.com/gpu]``), and everything at and below it is
then accepted as written. The refusal's message names the entry to add. The engine's own
settings still win over an allowed field in the merge (:mod:`k8s_backend.templates`).

Pure functions over plain data; ``yaml`` is imported only to read a template's text.

    >>> template = parse_pod_template('''
    ... spec:
    ...   nodeSelector: {pool: "${ENV_NAME}"}
    ...   serviceAccountName: hub-admin
    ... ''')
    >>> check_pod_template(render_pod_template(template, {**SAMPLE_VALUES, "ENV_NAME": "swe"}))
    Traceback (most recent call last):
    ...
    aenv_ray.errors.PodTemplateRefusedError: customPodTemplate.spec.serviceAccountName is not \
allowed: a tenant's pod template may not set it. Remove it from deployConfig.customPodTemplate, \
or an operator can allow it with `spec.serviceAccountName` (aenv serve --pod-template-allow, \
`pod_template_allow` in --limits, or KubernetesEngine(pod_template_allow=[...]))
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from aenv_ray.config import DeployConfig, parse_cpu, parse_memory
from aenv_ray.errors import ConfigurationError, PodTemplateRefusedError

__all__ = [
    "ALLOWED",
    "PLACEHOLDERS",
    "SAMPLE_VALUES",
    "PodTemplatePolicy",
    "check_deploy_template",
    "check_pod_template",
    "parse_pod_template",
    "render_pod_template",
    "template_of",
]

GIB = 1024**3
PLACEHOLDERS = (
    "COMMAND",  # the runtime's command, a list: only as a whole value or a whole list item
    "ENV_NAME",
    "ENV_REF",  # name@version
    "ENV_VERSION",
    "IMAGE",  # the runtime container's image
    "INSTANCE_ID",  # an instance's id; for a service's replicas, the service's id
    "NAME",  # the pod's name; for a service, its Deployment's
    "PORT",  # the runtime's port (an integer as a whole `port:` or `containerPort:` value)
)
SAMPLE_VALUES: Mapping[str, str | int | Sequence[str]] = {
    "COMMAND": ["python", "-m", "sandbox_runtime", "/env"],
    "ENV_NAME": "env",
    "ENV_REF": "env@1.0.0",
    "ENV_VERSION": "1.0.0",
    "IMAGE": "registry.local/env:1.0.0",
    "INSTANCE_ID": "0123456789ab",
    "NAME": "aenv-env-0123456789ab",
    "PORT": 8080,
}
"""Values of the shape the engines fill in: what a check before any pod exists renders with
(the hub's, at push and create; see :func:`check_deploy_template`)."""

_PLACEHOLDER = re.compile(r"\$(\$)?\{([^{}]*)\}")  # ${NAME}; $${NAME} is a literal ${NAME}
_INT_FIELDS = frozenset({"port", "containerPort"})  # where a whole ${PORT} is an integer
_TOP = frozenset({"apiVersion", "kind", "metadata", "spec"})
_HOW = (
    "aenv serve --pod-template-allow, `pod_template_allow` in --limits, or "
    "KubernetesEngine(pod_template_allow=[...])"
)


# -- reading and rendering -------------------------------------------------------------------


def parse_pod_template(source: str | Mapping[str, Any]) -> dict[str, Any]:
    """A template from YAML text (or an already parsed mapping, as ``config.json`` may hold it):
    a Pod (``apiVersion: v1``, ``kind: Pod``) or just its ``metadata`` and ``spec``."""
    return copy.deepcopy(template_of(source))


def template_of(source: str | Mapping[str, Any]) -> dict[str, Any]:
    """:func:`parse_pod_template` without the copy, for the builders: YAML text is parsed once
    per distinct text (a pool creating many pods of one environment pays some milliseconds once,
    not per pod). The result is shared: read it, or render it (which copies), never change it."""
    if isinstance(source, str):
        return _parsed(source)
    return _shaped(dict(source))


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> dict[str, Any]:
    import yaml

    try:
        loaded = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigurationError(
            f"the pod template is not valid YAML: {exc}; fix the YAML of "
            "deployConfig.customPodTemplate"
        ) from exc
    return _shaped(loaded)


def _shaped(loaded: Any) -> dict[str, Any]:
    """``loaded`` checked to be a Pod's shape, with ``metadata`` and ``spec`` always present
    (only its top level is changed)."""
    if not isinstance(loaded, dict):
        raise ConfigurationError(
            "the pod template must be a mapping with `metadata` and `spec` (a Pod), "
            f"not {type(loaded).__name__}"
        )
    unknown = sorted(str(key) for key in loaded if key not in _TOP)
    if unknown:
        raise ConfigurationError(
            f"the pod template has unknown top-level fields {unknown}; a template is a Pod: "
            "apiVersion, kind, metadata, spec"
        )
    if loaded.get("kind", "Pod") != "Pod" or loaded.get("apiVersion", "v1") != "v1":
        raise ConfigurationError(
            f"the pod template is a {loaded.get('apiVersion', 'v1')}/{loaded.get('kind', 'Pod')}; "
            "write a Pod (apiVersion: v1, kind: Pod): aenv-ray makes the Deployment of a service "
            "itself"
        )
    for key in ("metadata", "spec"):
        if not isinstance(loaded.get(key) or {}, dict):
            raise ConfigurationError(f"the pod template's `{key}` must be a mapping")
        loaded[key] = loaded.get(key) or {}
    for key in ("containers", "initContainers", "volumes"):
        items = loaded["spec"].get(key) or []
        if not isinstance(items, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str) for item in items
        ):
            raise ConfigurationError(
                f"the pod template's `spec.{key}` must be a list of mappings, each with a name"
            )
    return loaded


def render_pod_template(
    template: Mapping[str, Any], values: Mapping[str, str | int | Sequence[str]]
) -> dict[str, Any]:
    """``template`` with every ``${NAME}`` in its string values replaced by ``values[NAME]``.

    Values are put in after parsing, so they are never read as YAML. Every value is text, but
    ``${COMMAND}`` is a list (as a whole value, or spliced as a whole list item; inside a longer
    string it is an error) and a whole ``${PORT}`` is an integer as the value of a ``port`` or
    ``containerPort`` field. ``$${NAME}`` is a literal ``${NAME}``. An unknown name is a
    :class:`ConfigurationError` naming it and listing the known ones."""
    unknown: set[str] = set()

    def text(match: re.Match[str]) -> str:
        if match.group(1):
            return match.group(0)[1:]
        name = match.group(2)
        if name not in values:
            unknown.add(name)
            return match.group(0)
        value = values[name]
        if not isinstance(value, str | int):
            raise ConfigurationError(
                f"${{{name}}} is a list: use it as a whole value or a whole list item, not "
                "inside a string, in the pod template"
            )
        return str(value)

    def walk(node: Any, key: Any = None) -> Any:
        if isinstance(node, dict):
            return {k: walk(value, k) for k, value in node.items()}
        if isinstance(node, list):
            out: list[Any] = []
            for item in node:
                whole = _whole(item, values)
                if isinstance(whole, list):
                    out.extend(whole)  # ${COMMAND} as a list item: its items, spliced
                else:
                    out.append(walk(item))
            return out
        if isinstance(node, str):
            whole = _whole(node, values)
            if isinstance(whole, list) or (isinstance(whole, int) and key in _INT_FIELDS):
                return whole
            return _PLACEHOLDER.sub(text, node)
        return node

    rendered: dict[str, Any] = walk(dict(template))
    if unknown:
        raise ConfigurationError(
            f"the pod template uses unknown placeholders {sorted(unknown)}; the known ones are "
            f"{', '.join('${' + name + '}' for name in PLACEHOLDERS)} (write $${{NAME}} for a "
            "literal ${NAME})"
        )
    return rendered


def _whole(node: Any, values: Mapping[str, Any]) -> Any:
    """The value of ``node`` when it is exactly one known placeholder, else None."""
    if not isinstance(node, str):
        return None
    match = _PLACEHOLDER.fullmatch(node)
    if match is None or match.group(1) or match.group(2) not in values:
        return None
    value = values[match.group(2)]
    return list(value) if isinstance(value, list | tuple) else value


# -- the policy ------------------------------------------------------------------------------

_ALLOW_ENTRY = re.compile(r"(metadata|spec)(\.[A-Za-z][A-Za-z0-9]*|\[\]|\[[^\[\]]+\])*")


@dataclass(frozen=True)
class PodTemplatePolicy:
    """What a pod template may set: :data:`ALLOWED`, widened by ``allow`` (paths, see the
    module docstring), with the caps its resource amounts are bounded by. ``cpu`` (cores) and
    ``memory`` (bytes) bound each amount a template's container asks and their sum over its own
    containers (the runtime's cpu and memory are ``deployConfig``'s); ``ephemeral_storage``
    bounds each ``ephemeral-storage`` amount and each ``emptyDir.sizeLimit``.

        >>> PodTemplatePolicy(allow=frozenset({"spec.tolerations"})).allows("spec.tolerations[]")
        True
    """

    allow: frozenset[str] = frozenset()
    cpu: float = 4.0
    memory: int = 4 * GIB
    ephemeral_storage: int = 16 * GIB

    def __post_init__(self) -> None:
        bad = sorted(entry for entry in self.allow if not _ALLOW_ENTRY.fullmatch(entry))
        if bad:
            raise ConfigurationError(
                f"pod template allow-list entries {bad} are not field paths; write e.g. "
                "spec.tolerations, spec.containers[].securityContext.seLinuxOptions or "
                "spec.containers[].resources.limits[nvidia.com/gpu]"
            )

    def widened(
        self,
        allow: Iterable[str] = (),
        *,
        cpu: float | None = None,
        memory: int | None = None,
        ephemeral_storage: int | None = None,
    ) -> PodTemplatePolicy:
        """This policy with ``allow`` added and the caps raised to the ones given (never
        lowered)."""
        return replace(
            self,
            allow=self.allow | frozenset(allow),
            cpu=max(self.cpu, cpu or 0.0),
            memory=max(self.memory, memory or 0),
            ephemeral_storage=max(self.ephemeral_storage, ephemeral_storage or 0),
        )

    def allows(self, pattern: str) -> bool:
        """Whether ``pattern`` (a field's path, list items as ``[]``) is at or below an entry
        of ``allow``."""
        return any(
            pattern == entry or pattern.startswith((entry + ".", entry + "["))
            for entry in self.allow
        )


@dataclass(frozen=True)
class _Where:
    shown: str  # as the tenant wrote it: list items by name (or index), map keys in brackets
    pattern: str  # as an allow entry matches it: list items as []

    def key(self, name: str) -> _Where:
        return _Where(f"{self.shown}.{name}", f"{self.pattern}.{name}")

    def item(self, label: str) -> _Where:
        return _Where(f"{self.shown}[{label}]", f"{self.pattern}[]")

    def entry(self, key: str) -> _Where:
        return _Where(f"{self.shown}[{key}]", f"{self.pattern}[{key}]")


def _refuse(where: _Where, problem: str) -> PodTemplateRefusedError:
    return PodTemplateRefusedError(
        f"customPodTemplate.{where.shown} {problem}. Remove it from "
        f"deployConfig.customPodTemplate, or an operator can allow it with `{where.pattern}` "
        f"({_HOW})",
        field=f"customPodTemplate.{where.shown}",
        allow=where.pattern,
    )


def _out_of_bounds(where: _Where, value: Any, bound: str) -> PodTemplateRefusedError:
    shown = repr(value) if not isinstance(value, dict | list) else type(value).__name__
    return _refuse(where, f"is {shown[:80]}, but a tenant's pod template may only set {bound}")


class _Node:
    """One field of the allow-list: :meth:`check` raises when ``value`` is out of bounds."""

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        raise NotImplementedError

    def visit(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if not policy.allows(where.pattern):
            self.check(value, where, policy)


@dataclass(frozen=True)
class _Str(_Node):
    pattern: str = r"[^\x00]*"
    max_len: int = 253
    what: str = "text"
    refuse: Callable[[str], bool] = lambda _: False

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if (
            not isinstance(value, str)
            or len(value) > self.max_len
            or not re.fullmatch(self.pattern, value)
            or self.refuse(value)
        ):
            raise _out_of_bounds(where, value, f"{self.what} (at most {self.max_len} characters)")


@dataclass(frozen=True)
class _Enum(_Node):
    values: tuple[Any, ...]

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if isinstance(value, bool) != isinstance(self.values[0], bool) or value not in self.values:
            raise _out_of_bounds(where, value, " or ".join(repr(v) for v in self.values))


@dataclass(frozen=True)
class _Int(_Node):
    lo: int
    hi: int

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not self.lo <= value <= self.hi:
            raise _out_of_bounds(where, value, f"a whole number from {self.lo} to {self.hi}")


@dataclass(frozen=True)
class _Literal(_Node):
    """A variable's value: text or a number (written as text), at most ``max_len``."""

    max_len: int = 32768

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)
        if not ok or len(str(value)) > self.max_len:
            raise _out_of_bounds(where, value, f"a literal value (at most {self.max_len} chars)")


@dataclass(frozen=True)
class _Amount(_Node):
    """A resource amount bounded by the policy's cap of ``kind``."""

    kind: str  # cpu, memory, ephemeral_storage

    def amount(self, value: Any) -> float:
        if self.kind == "cpu":
            return parse_cpu(value)
        return float(parse_memory(value))

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        cap: float = getattr(policy, self.kind)
        shown = f"{cap:g} cores" if self.kind == "cpu" else f"{cap / 2**20:g} MiB"
        try:
            amount = self.amount(value)
        except ConfigurationError:
            amount = math.inf
        if amount > cap:
            raise _out_of_bounds(where, value, f"an amount of at most {shown} (this hub's cap)")


@dataclass(frozen=True)
class _Obj(_Node):
    fields: Mapping[str, _Node]
    required: tuple[str, ...] = ()

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if not isinstance(value, dict):
            raise _out_of_bounds(where, value, "a mapping")
        for name in self.required:
            if name not in value:
                missing = where.key(name)
                raise PodTemplateRefusedError(
                    f"customPodTemplate.{missing.shown} is missing: a tenant's pod template must "
                    f"set it here. Set it in deployConfig.customPodTemplate, or an operator can "
                    f"allow any `{where.pattern}` with that entry ({_HOW})",
                    field=f"customPodTemplate.{missing.shown}",
                    allow=where.pattern,
                )
        for name, item in value.items():
            child = where.key(str(name))
            node = self.fields.get(str(name))
            if node is None:
                if not policy.allows(child.pattern):
                    raise _refuse(child, "is not allowed: a tenant's pod template may not set it")
                continue
            node.visit(item, child, policy)


@dataclass(frozen=True)
class _List(_Node):
    item: _Node
    max_items: int = 16

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if not isinstance(value, list) or len(value) > self.max_items:
            raise _out_of_bounds(where, value, f"a list of at most {self.max_items} items")
        for index, item in enumerate(value):
            name = item.get("name") if isinstance(item, dict) else None
            self.item.visit(item, where.item(name if isinstance(name, str) else str(index)), policy)


@dataclass(frozen=True)
class _Map(_Node):
    """A mapping of free keys (labels, selectors, resources): each key must match ``keys``
    (else it is refused as a field of its own, which an operator may allow by name)."""

    keys: _Str
    value: _Node
    max_items: int = 32

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if not isinstance(value, dict) or len(value) > self.max_items:
            raise _out_of_bounds(where, value, f"a mapping of at most {self.max_items} entries")
        for key, item in value.items():
            child = where.entry(str(key))
            if policy.allows(child.pattern):
                continue
            try:
                self.keys.check(key, child, policy)
            except PodTemplateRefusedError:
                raise _refuse(
                    child,
                    f"is not allowed: a tenant's pod template may not use this key "
                    f"({self.keys.what})",
                ) from None
            self.value.visit(item, child, policy)


# -- the allow-list --------------------------------------------------------------------------

_DNS_LABEL = _Str(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", 63, "a DNS label")
_QUALIFIED = r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_RESERVED = re.compile(r"(.*\.)?(kubernetes\.io|k8s\.io|aenv-ray\.io)/.*|[^/]*managed-by")
# well-known keys of Kubernetes' domains that only place a pod (never raise its rights)
_PLACEMENT_KEYS = frozenset(
    {
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    }
)


def _reserved(key: str) -> bool:
    """A key of Kubernetes' or aenv-ray's own domains (``*.kubernetes.io/``, ``*.k8s.io/``,
    ``aenv-ray.io/``) or a ``managed-by``: these steer the cluster (AppArmor and seccomp
    annotations, node roles) or aenv-ray's bookkeeping. ``app.kubernetes.io/`` keys (the
    recommended labels: name, part-of, ...) other than ``managed-by`` are free."""
    if key.startswith("app.kubernetes.io/") and not key.endswith("/managed-by"):
        return False
    return bool(_RESERVED.fullmatch(key))


_META_KEY = _Str(
    _QUALIFIED,
    316,
    "a qualified name outside the kubernetes.io, k8s.io and aenv-ray.io domains",
    refuse=_reserved,
)
_SELECTOR_KEY = _Str(
    _QUALIFIED,
    316,
    "a label key outside the kubernetes.io, k8s.io and aenv-ray.io domains, or one of "
    + ", ".join(sorted(_PLACEMENT_KEYS)),
    refuse=lambda key: _reserved(key) and key not in _PLACEMENT_KEYS,
)
_LABEL_VALUE = _Str(r"[^\x00-\x1f]*", 253, "text without control characters")
_ABS_PATH = _Str(r"/[^\x00]*", 1024, "an absolute path without `..`", refuse=lambda p: ".." in p)
_NON_ROOT_ID = _Int(1, 2**31 - 1)
_TRUE, _FALSE = _Enum((True,)), _Enum((False,))
_PROFILE = _Obj(
    {
        "type": _Enum(("RuntimeDefault", "Localhost")),
        "localhostProfile": _Str(
            r"[A-Za-z0-9][-A-Za-z0-9_./]*",
            253,
            "a profile's relative path",
            refuse=lambda p: ".." in p,
        ),
    },
    required=("type",),
)
_SECCOMP, _APPARMOR = _PROFILE, _PROFILE
_POD_SECURITY = _Obj(
    {
        "runAsUser": _NON_ROOT_ID,
        "runAsGroup": _NON_ROOT_ID,
        "fsGroup": _NON_ROOT_ID,
        "supplementalGroups": _List(_NON_ROOT_ID, 16),
        "fsGroupChangePolicy": _Enum(("OnRootMismatch", "Always")),
        "runAsNonRoot": _TRUE,
        "seccompProfile": _SECCOMP,
        "appArmorProfile": _APPARMOR,
    }
)
_CONTAINER_SECURITY = _Obj(
    {
        "runAsUser": _NON_ROOT_ID,
        "runAsGroup": _NON_ROOT_ID,
        "runAsNonRoot": _TRUE,
        "readOnlyRootFilesystem": _TRUE,
        "allowPrivilegeEscalation": _FALSE,
        "privileged": _FALSE,
        "capabilities": _Obj({"drop": _List(_Str(r"[A-Z_]+", 32, "a capability's name"), 64)}),
        "seccompProfile": _SECCOMP,
        "appArmorProfile": _APPARMOR,
    }
)
_CAPPED = {
    "cpu": _Amount("cpu"),
    "memory": _Amount("memory"),
    "ephemeral-storage": _Amount("ephemeral_storage"),
}


@dataclass(frozen=True)
class _Quantities(_Node):
    """``requests`` or ``limits``: cpu, memory and ephemeral-storage, each within its cap;
    another resource (a GPU) is a field of its own an operator may allow by name."""

    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if not isinstance(value, dict):
            raise _out_of_bounds(where, value, "a mapping of resource amounts")
        for key, amount in value.items():
            child = where.entry(str(key))
            node = _CAPPED.get(str(key))
            if node is None:
                if not policy.allows(child.pattern):
                    raise _refuse(
                        child,
                        "is not allowed: a tenant's pod template may ask only cpu, memory and "
                        "ephemeral-storage",
                    )
                continue
            node.visit(amount, child, policy)


_PORT = _Int(1, 65535)


@dataclass(frozen=True)
class _PortRef(_Node):
    def check(self, value: Any, where: _Where, policy: PodTemplatePolicy) -> None:
        if isinstance(value, str):
            _Str(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", 15, "a port's name").check(value, where, policy)
        else:
            _PORT.check(value, where, policy)


_PROBE = _Obj(
    {
        # no `host`: the kubelet would send the probe wherever it says
        "httpGet": _Obj(
            {
                "path": _Str(r"/[^\x00-\x1f]*", 1024, "a path"),
                "port": _PortRef(),
                "scheme": _Enum(("HTTP", "HTTPS")),
            },
            required=("port",),
        ),
        "tcpSocket": _Obj({"port": _PortRef()}, required=("port",)),
        "exec": _Obj({"command": _List(_Str(max_len=4096), 64)}),
        "initialDelaySeconds": _Int(0, 3600),
        "periodSeconds": _Int(1, 3600),
        "timeoutSeconds": _Int(1, 3600),
        "failureThreshold": _Int(1, 1000),
        "successThreshold": _Int(1, 1000),
    }
)


def _container(*, init: bool) -> _Obj:
    fields: dict[str, _Node] = {
        "name": _DNS_LABEL,
        "image": _Str(r"[^\s\x00]+", 512, "an image reference"),
        "imagePullPolicy": _Enum(("Always", "IfNotPresent", "Never")),
        "command": _List(_Str(max_len=4096), 64),
        "args": _List(_Str(max_len=4096), 256),
        "workingDir": _ABS_PATH,
        "env": _List(
            _Obj(
                {
                    "name": _Str(r"[-._A-Za-z][-._A-Za-z0-9]*", 256, "a variable's name"),
                    "value": _Literal(),
                },
                required=("name",),
            ),
            64,
        ),
        "ports": _List(
            _Obj(
                {
                    "name": _Str(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", 15, "a port's name"),
                    "containerPort": _PORT,
                    "protocol": _Enum(("TCP", "UDP", "SCTP")),
                },
                required=("containerPort",),
            ),
            16,
        ),
        "resources": _Obj({"requests": _Quantities(), "limits": _Quantities()}),
        "volumeMounts": _List(
            _Obj(
                {"name": _DNS_LABEL, "mountPath": _ABS_PATH, "readOnly": _Enum((True, False))},
                required=("name", "mountPath"),
            ),
            16,
        ),
        "securityContext": _CONTAINER_SECURITY,
        "terminationMessagePolicy": _Enum(("File", "FallbackToLogsOnError")),
    }
    if not init:
        fields.update(readinessProbe=_PROBE, livenessProbe=_PROBE, startupProbe=_PROBE)
    return _Obj(fields, required=("name",))


ALLOWED: _Obj = _Obj(
    {
        "apiVersion": _Enum(("v1",)),
        "kind": _Enum(("Pod",)),
        "metadata": _Obj(
            {
                # values as text (a YAML number too); label values are cleaned into valid ones
                "labels": _Map(_META_KEY, _Literal(253), 32),
                "annotations": _Map(_META_KEY, _Literal(4096), 32),
            }
        ),
        "spec": _Obj(
            {
                "nodeSelector": _Map(_SELECTOR_KEY, _LABEL_VALUE, 16),
                "tolerations": _List(
                    _Obj(
                        {
                            # a key is required: without one, `Exists` tolerates every taint
                            "key": _SELECTOR_KEY,
                            "operator": _Enum(("Equal", "Exists")),
                            "value": _LABEL_VALUE,
                            "effect": _Enum(("NoSchedule", "PreferNoSchedule", "NoExecute")),
                            "tolerationSeconds": _Int(0, 86400),
                        },
                        required=("key",),
                    ),
                    8,
                ),
                "terminationGracePeriodSeconds": _Int(0, 300),
                "hostUsers": _FALSE,  # a user namespace of the pod's own: tighter
                "shareProcessNamespace": _FALSE,
                "hostNetwork": _FALSE,
                "hostPID": _FALSE,
                "hostIPC": _FALSE,
                "automountServiceAccountToken": _FALSE,
                "securityContext": _POD_SECURITY,
                "initContainers": _List(_container(init=True), 8),
                "containers": _List(_container(init=False), 8),
                "volumes": _List(
                    _Obj(
                        {
                            "name": _DNS_LABEL,
                            "emptyDir": _Obj(
                                {
                                    "medium": _Enum(("", "Memory")),
                                    "sizeLimit": _Amount("ephemeral_storage"),
                                }
                            ),
                        },
                        required=("name",),
                    ),
                    16,
                ),
            }
        ),
    }
)
"""The fields a tenant's pod template may set and their bounds (see the module docstring and
docs/kubernetes.md, which lists them)."""


def check_pod_template(
    template: Mapping[str, Any], policy: PodTemplatePolicy | None = None
) -> None:
    """Refuse a (rendered) template that sets a field ``policy`` does not allow, or a value out
    of its bounds: :class:`~aenv_ray.errors.PodTemplateRefusedError` naming the field's full
    path and the allow-list entry that would let it through. Also bounds the sum of the
    template's own containers' cpu and memory by the policy's caps."""
    policy = policy or PodTemplatePolicy()
    for key, node in ALLOWED.fields.items():
        if key in template:
            node.visit(template[key], _Where(key, key), policy)
    unknown = sorted(str(k) for k in template if k not in ALLOWED.fields)
    for key in unknown:
        if not policy.allows(key):
            raise _refuse(
                _Where(key, key), "is not allowed: a tenant's pod template may not set it"
            )
    _check_sums(template, policy)


def _check_sums(template: Mapping[str, Any], policy: PodTemplatePolicy) -> None:
    spec = template.get("spec") or {}
    containers = [
        c
        for c in spec.get("containers") or []
        if isinstance(c, dict) and c.get("name") != "runtime"
    ]
    for kind, cap_name in (("cpu", "cpu"), ("memory", "memory")):
        node = _CAPPED[kind]
        assert isinstance(node, _Amount)
        for part in ("requests", "limits"):
            where = f"spec.containers[].resources.{part}[{kind}]"
            if policy.allows(where):
                continue
            total = 0.0
            for container in containers:
                amount = ((container.get("resources") or {}).get(part) or {}).get(kind)
                if amount is not None:
                    try:
                        total += node.amount(amount)
                    except ConfigurationError:
                        total = math.inf
            cap: float = getattr(policy, cap_name)
            if total > cap:
                raise _refuse(
                    _Where(f"spec.containers[*].resources.{part}[{kind}]", where),
                    f"add up to {total:g}{' cores' if kind == 'cpu' else ' bytes'} over the "
                    f"template's containers, over this hub's cap of {cap:g}",
                )


def check_deploy_template(
    deploy: DeployConfig, policy: PodTemplatePolicy | None = None, *, ref: str = ""
) -> None:
    """Check ``deploy.custom_pod_template``, if any, before any pod exists (the hub does, at
    push and at create): parsed, rendered with :data:`SAMPLE_VALUES` (with the definition's
    own name and version when ``ref`` gives them) and checked against ``policy``."""
    source = deploy.custom_pod_template
    if not source:
        return
    values = dict(SAMPLE_VALUES)
    if ref:
        name, _, version = ref.partition("@")
        values.update(ENV_NAME=name, ENV_REF=ref, ENV_VERSION=version)
    try:
        check_pod_template(render_pod_template(template_of(source), values), policy)
    except PodTemplateRefusedError as exc:
        if not ref:
            raise
        raise PodTemplateRefusedError(
            f"`{ref}`: {exc.message}", field=exc.field, allow=exc.allow, env_name=ref
        ) from None
