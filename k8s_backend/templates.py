"""A user's own pod template (``deployConfig.customPodTemplate``): YAML with placeholders that
gives the frame of an instance's pod or a service's replicas, merged with what aenv-ray must have.

Reading, rendering and checking live in :mod:`aenv_ray.pod_template` (the hub checks there too,
at push and create) and are re-exported here. The template is as untrusted as the environment's
code: it is checked against an allow-list of the fields a tenant may set, each bounded
(:data:`aenv_ray.pod_template.ALLOWED`), which an operator widens explicitly
(:class:`PodTemplatePolicy`); anything else is a
:class:`~aenv_ray.errors.PodTemplateRefusedError` naming the field. After the merge aenv-ray's
parts win, even over a field an operator allowed: its labels and annotations, the ``runtime``
container's image, args, env, port, readiness probe, cpu and memory, the pod's restart policy,
service-account token, ``runAsNonRoot`` and seccomp, and the secure defaults of every container
(no privilege or privilege escalation, every capability dropped, non-root). Pure functions, no
API calls.

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
from collections.abc import Mapping
from typing import Any

from aenv_ray.errors import ConfigurationError
from aenv_ray.pod_template import (
    PLACEHOLDERS,
    PodTemplatePolicy,
    check_pod_template,
    parse_pod_template,
    render_pod_template,
    template_of,
)

__all__ = [
    "PLACEHOLDERS",
    "PodTemplatePolicy",
    "check_pod_template",
    "merge_pod_template",
    "parse_pod_template",
    "render_pod_template",
    "template_of",
]

# every container's, whatever a template (or an operator's widened allow-list) says
_SECURE = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "privileged": False,
    "runAsNonRoot": True,
}


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
    merged["securityContext"] = {
        **(theirs.get("securityContext") or {}),
        **ours["securityContext"],
        **_SECURE,
    }
    return merged


def _contains(command: list[Any], runtime: list[str]) -> bool:
    return any(command[i : i + len(runtime)] == runtime for i in range(len(command)))


def _secure(container: Mapping[str, Any]) -> dict[str, Any]:
    """A template's own container with the secure defaults: no privilege, no capability,
    non-root; a read-only root unless the template says ``readOnlyRootFilesystem: false``
    (which the allow-list refuses unless an operator allowed it)."""
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
