"""A user's own pod template (``deployConfig.customPodTemplate``): YAML with placeholders that
gives the frame of an instance's pod or a service's replicas, merged with what aenv-ray must have.

The template is part of an environment definition, so it is as untrusted as the environment's
code: it may add node selectors, tolerations, affinity, a runtime class, extra volumes, sidecars
and init containers, resources beyond cpu and memory; it may not weaken the pod's isolation. A
field that would (privileged, host namespaces, hostPath and other node or secret volumes, added
capabilities, root, a service-account token, host ports) is a :class:`ConfigurationError` naming
the field. After the merge aenv-ray's parts win: its labels and annotations, the ``runtime``
container's image, args, env, port, readiness probe, cpu and memory, and the secure defaults of
every container. Pure functions, no API calls.

    >>> template = parse_pod_template('''
    ... spec:
    ...   nodeSelector: {pool: "${ENV_NAME}"}
    ...   containers:
    ...   - name: runtime
    ...     resources: {limits: {nvidia.com/gpu: 1}}
    ... ''')
    >>> render_pod_template(template, {**dict.fromkeys(PLACEHOLDERS, ""), "ENV_NAME": "swe"})[
    ...     "spec"]["nodeSelector"]
    {'pool': 'swe'}
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from aenv_ray.errors import ConfigurationError

__all__ = [
    "PLACEHOLDERS",
    "check_pod_template",
    "merge_pod_template",
    "parse_pod_template",
    "render_pod_template",
    "template_of",
]

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
_PLACEHOLDER = re.compile(r"\$(\$)?\{([^{}]*)\}")  # ${NAME}; $${NAME} is a literal ${NAME}
_INT_FIELDS = frozenset({"port", "containerPort"})  # where a whole ${PORT} is an integer
_TOP = frozenset({"apiVersion", "kind", "metadata", "spec"})
# the volume types of Kubernetes' "restricted" Pod Security Standard, less those that read what
# belongs to the namespace's operator (secret, persistentVolumeClaim, csi)
_VOLUMES = frozenset({"emptyDir", "configMap", "downwardAPI", "projected", "ephemeral"})
_PROJECTED = frozenset({"configMap", "downwardAPI"})
_SECURE = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}


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


def check_pod_template(template: Mapping[str, Any]) -> None:
    """Refuse a template that weakens the pod's isolation: a :class:`ConfigurationError` that
    names the first such field (see the module docstring for the list)."""
    spec = template.get("spec") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC", "automountServiceAccountToken"):
        if spec.get(key) is True:
            _refuse(f"spec.{key}: true")
    for key in ("ephemeralContainers", "activeDeadlineSeconds"):
        if key in spec:
            _refuse(f"spec.{key}", "aenv-ray decides how long a pod lives")
    pod_security = spec.get("securityContext") or {}
    _check_security(pod_security, "spec.securityContext")
    if pod_security.get("sysctls"):
        _refuse("spec.securityContext.sysctls")
    for volume in spec.get("volumes") or []:
        where = f"spec.volumes[{volume['name']}]"
        kinds = [key for key in volume if key != "name"]
        for kind in kinds:
            if kind not in _VOLUMES:
                _refuse(f"{where}.{kind}", f"volumes may be {', '.join(sorted(_VOLUMES))}")
        for source in (volume.get("projected") or {}).get("sources") or []:
            for kind in source:
                if kind not in _PROJECTED:
                    _refuse(f"{where}.projected.sources.{kind}")
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            _check_container(container, f"spec.{key}[{container['name']}]")


def _check_container(container: Mapping[str, Any], where: str) -> None:
    security = container.get("securityContext") or {}
    _check_security(security, f"{where}.securityContext")
    if security.get("privileged") is True:
        _refuse(f"{where}.securityContext.privileged: true")
    if security.get("allowPrivilegeEscalation") is True:
        _refuse(f"{where}.securityContext.allowPrivilegeEscalation: true")
    if (security.get("capabilities") or {}).get("add"):
        _refuse(f"{where}.securityContext.capabilities.add")
    if security.get("procMount", "Default") != "Default":
        _refuse(f"{where}.securityContext.procMount")
    for port in container.get("ports") or []:
        if port.get("hostPort") or port.get("hostIP"):
            _refuse(f"{where}.ports.hostPort")
    for variable in container.get("env") or []:
        if "secretKeyRef" in (variable.get("valueFrom") or {}):
            _refuse(f"{where}.env[{variable.get('name')}].valueFrom.secretKeyRef")
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            _refuse(f"{where}.envFrom.secretRef")
    for mount in container.get("volumeMounts") or []:
        if mount.get("mountPropagation") == "Bidirectional":
            _refuse(f"{where}.volumeMounts[{mount.get('name')}].mountPropagation")


def _check_security(security: Mapping[str, Any], where: str) -> None:
    if security.get("runAsUser") == 0:
        _refuse(f"{where}.runAsUser: 0", "pods run as a non-root user")
    if security.get("runAsNonRoot") is False:
        _refuse(f"{where}.runAsNonRoot: false")
    if (security.get("seccompProfile") or {}).get("type") == "Unconfined":
        _refuse(f"{where}.seccompProfile: Unconfined")
    if (security.get("windowsOptions") or {}).get("hostProcess") is True:
        _refuse(f"{where}.windowsOptions.hostProcess")


def _refuse(field: str, why: str = "") -> None:
    raise ConfigurationError(
        f"the pod template sets `{field}`, which would weaken the isolation of environment "
        f"pods{f' ({why})' if why else ''}; remove it from deployConfig.customPodTemplate"
    )


def merge_pod_template(ours: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod (``metadata`` and ``spec``) that aenv-ray builds, ``ours``, framed by a rendered
    and checked ``template``: the template's fields stay unless aenv-ray sets them; labels,
    annotations, env vars, volumes and mounts are unions in which aenv-ray's win (a volume or
    mount path of aenv-ray's own in the template is an error); containers named as aenv-ray's
    (``runtime``, ``datasource``) are merged into them, the others kept with the secure
    defaults; aenv-ray's init containers run before the template's. The runtime's command is
    the template's when it gives one that holds ``${COMMAND}`` (a wrapper such as ``tini
    --``); a ``datasource`` command of the template's runs under the exec helper, which stays
    that container's command. Neither argument is changed; the result shares the parts it
    leaves as they were."""
    spec = dict(template.get("spec") or {})
    mine = dict(ours["spec"])
    metadata = template.get("metadata") or {}
    merged_meta = dict(ours["metadata"])
    merged_meta["labels"] = {
        **{str(k): str(v) for k, v in (metadata.get("labels") or {}).items()},
        **merged_meta.get("labels", {}),
    }
    merged_meta["annotations"] = {
        **{str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()},
        **merged_meta.get("annotations", {}),
    }

    theirs = {c["name"]: c for c in spec.pop("containers", None) or []}
    containers = [_merge_container(c, theirs.pop(c["name"], None)) for c in mine.pop("containers")]
    containers += [_secure(c) for c in theirs.values()]
    my_init = mine.pop("initContainers", [])
    their_init = [_secure(c) for c in spec.pop("initContainers", None) or []]
    if {c["name"] for c in my_init} & {c.get("name") for c in their_init}:
        raise ConfigurationError(
            f"the pod template has an init container named {my_init[0]['name']}, which is "
            "aenv-ray's own; rename it in deployConfig.customPodTemplate"
        )
    if my_init or their_init:  # aenv-ray's first: the exec helper is in place before theirs
        spec["initContainers"] = my_init + their_init

    my_volumes = mine.pop("volumes", [])
    clash = {v["name"] for v in my_volumes} & {v["name"] for v in spec.get("volumes") or []}
    if clash:
        raise ConfigurationError(
            f"the pod template declares volumes {sorted(clash)}, which are aenv-ray's own; "
            "rename them in deployConfig.customPodTemplate"
        )
    spec["volumes"] = my_volumes + list(spec.get("volumes") or [])

    security = {**(spec.get("securityContext") or {})}
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        security.setdefault(key, mine["securityContext"][key])
    profile = security.get("seccompProfile") or {}
    if profile.get("type") != "Localhost":  # a profile of the node's is as strict or stricter
        security["seccompProfile"] = mine["securityContext"]["seccompProfile"]
    security["runAsNonRoot"] = True
    mine.pop("securityContext")

    affinity = mine.pop("affinity", None)
    if affinity:
        spec["affinity"] = _merge_affinity(spec.get("affinity") or {}, affinity)
    return {
        "metadata": merged_meta,
        "spec": {**spec, **mine, "securityContext": security, "containers": containers},
    }


def _merge_container(ours: dict[str, Any], theirs: Mapping[str, Any] | None) -> dict[str, Any]:
    if theirs is None:
        return ours
    merged = {**theirs, **ours}
    if ours["name"] == "runtime" and theirs.get("command"):
        command = list(theirs["command"])
        if not _contains(command, ours["command"]):
            raise ConfigurationError(
                "the pod template's runtime container sets a command without ${COMMAND}; the "
                'runtime must still run (e.g. command: [tini, "--", "${COMMAND}"]) or drop '
                "`command` from it"
            )
        merged["command"] = command
    if ours["name"] == "datasource" and theirs.get("command"):
        # the exec helper stays the command; it runs and supervises the template's (with args)
        merged["command"] = [*ours["command"], *theirs["command"]]
    names = {v["name"] for v in ours.get("env", [])}
    merged["env"] = ours.get("env", []) + [
        {**v, "value": str(v["value"])} if "value" in v else v
        for v in theirs.get("env") or []
        if v.get("name") not in names
    ]
    paths = {m["mountPath"] for m in ours.get("volumeMounts", [])}
    extra = list(theirs.get("volumeMounts") or [])
    taken = sorted(m.get("mountPath") for m in extra if m.get("mountPath") in paths)
    if taken:
        raise ConfigurationError(
            f"the pod template mounts volumes at {taken} in container `{ours['name']}`, where "
            "aenv-ray mounts its own; choose other paths"
        )
    if ours.get("volumeMounts") or extra:
        merged["volumeMounts"] = ours.get("volumeMounts", []) + extra
    if "ports" in ours:
        mine = {p.get("name") for p in ours["ports"]} | {p["containerPort"] for p in ours["ports"]}
        merged["ports"] = ours["ports"] + [
            p
            for p in theirs.get("ports") or []
            if p.get("name") not in mine and p.get("containerPort") not in mine
        ]
    theirs_resources = theirs.get("resources") or {}
    ours_resources = ours.get("resources") or {}
    resources = {
        key: {**_quantities(theirs_resources.get(key)), **(ours_resources.get(key) or {})}
        for key in ("requests", "limits")
        if theirs_resources.get(key) or ours_resources.get(key)
    }
    if resources:
        merged["resources"] = resources
    merged["securityContext"] = {**(theirs.get("securityContext") or {}), **ours["securityContext"]}
    return merged


def _contains(command: list[Any], runtime: list[str]) -> bool:
    return any(command[i : i + len(runtime)] == runtime for i in range(len(command)))


def _secure(container: Mapping[str, Any]) -> dict[str, Any]:
    """A template's own container with the secure defaults: no privilege, no capability,
    non-root; a read-only root unless the template says ``readOnlyRootFilesystem: false``."""
    security = {"readOnlyRootFilesystem": True, **(container.get("securityContext") or {})}
    secured = {**container, "securityContext": {**security, **_SECURE}}
    if isinstance(container.get("resources"), dict):
        secured["resources"] = {
            key: _quantities(value) if key in ("requests", "limits") else value
            for key, value in container["resources"].items()
        }
    return secured


def _quantities(amounts: Any) -> dict[str, Any]:
    """Resource amounts as quantity strings (YAML reads ``gpu: 1`` as a number; the API takes
    either, the official client's models only text)."""
    if not isinstance(amounts, dict):
        return {}
    return {str(k): v if isinstance(v, str) else str(v) for k, v in amounts.items()}


def _merge_affinity(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(theirs))
    for kind, rules in ours.items():
        target = merged.setdefault(kind, {})
        for when, terms in rules.items():
            target[when] = list(target.get(when) or []) + list(terms)
    return merged
