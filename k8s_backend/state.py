"""What a Pod says about its instance: the :class:`~aenv_ray.engine.InstanceInfo` read from the
pod object alone (labels, annotations, status), and why a pod that will never serve will not.

Pure functions over the API's JSON, so every state the cluster can report is tested on its own
(a real kubelet's OOMKilled, Evicted or ImagePullBackOff, which a test cluster cannot produce).

    >>> pod = {"metadata": {"name": "aenv-demo-ab12", "labels": {LABEL_INSTANCE: "ab12"},
    ...        "annotations": {ANNOTATION_ENV: "demo@1.0.0", ANNOTATION_EXPIRES: "1900000000.000"}},
    ...        "status": {"phase": "Running", "podIP": "10.1.2.3",
    ...                   "conditions": [{"type": "Ready", "status": "True"}]}}
    >>> info = pod_info(pod)
    >>> info.state.value, info.url, info.expires_at
    ('running', 'http://10.1.2.3:8080', 1900000000.0)
    >>> pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "runtime",
    ...     "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}
    >>> pod_info(pod).describe_end()
    'instance ab12 ended: out of memory (the runtime container was OOMKilled: it used more \
memory than deployConfig.memory)'
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from aenv_ray.engine import InstanceInfo, InstanceState, TerminationReason
from aenv_ray.errors import AEnvError, CapacityError, ConfigurationError
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, TOKEN_SHA256_ENV
from k8s_backend.manifests import (
    ANNOTATION_CREATED,
    ANNOTATION_ENV,
    ANNOTATION_EXPIRES,
    ANNOTATION_OWNER,
    LABEL_INSTANCE,
    OUR_LABELS,
)

__all__ = [
    "instance_id",
    "last_words",
    "memory_limit",
    "pod_info",
    "pull_error",
    "resource_version",
    "runtime_message",
    "slim",
    "startup_failure",
    "startup_wait",
    "timestamp",
]

# An image the kubelet gave up on: it failed a pull and now backs off (ImagePullBackOff), or can
# never pull it. A first failed pull (ErrImagePull) is retried by the kubelet at once (a registry
# that was slow, a node's network not up yet): the create waits on it, quoting it.
_IMAGE_PROBLEMS = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})
_CONFIG_PROBLEMS = frozenset({"CreateContainerConfigError", "CreateContainerError"})
# The scheduler's reasons that pass on their own within seconds: a claim the provisioner is still
# binding, a node that is starting or under pressure it will shed (its taints). Any other reason
# (Insufficient cpu/memory, affinity, a missing claim, a cordoned node) waits for a person.
_PASSING_SCHEDULER_REASONS = (
    "unbound immediate persistentvolumeclaims",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure",
    "node.kubernetes.io/pid-pressure",
    "node.kubernetes.io/network-unavailable",
)
_DELETIONS = (TerminationReason.DELETED, TerminationReason.EXPIRED)
_DETAILS = {
    TerminationReason.EXPIRED: "its TTL ran out",
    TerminationReason.OWNER_GONE: "the engine session that created it ended",
}


def timestamp(text: str | None) -> float | None:
    """An RFC 3339 time of the API (``2026-11-25T10:00:00Z``) as seconds since the epoch.

    >>> timestamp("1970-01-01T00:01:00Z"), timestamp(None)
    (60.0, None)
    """
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def resource_version(obj: Mapping[str, Any]) -> int:
    """The object's resourceVersion as a number (0 when it is not one: the API calls it opaque;
    every server this engine supports writes etcd's revision, which only grows)."""
    text = (obj.get("metadata") or {}).get("resourceVersion") or ""
    return int(text) if str(text).isdigit() else 0


def instance_id(pod: Mapping[str, Any]) -> str | None:
    """The instance id a pod of ours carries (None: not an instance's pod)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    value = labels.get(LABEL_INSTANCE)
    return str(value) if value else None


def _container(pod: Mapping[str, Any], name: str = "runtime") -> Mapping[str, Any]:
    statuses: list[Mapping[str, Any]] = (pod.get("status") or {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == name), {})


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    conditions: list[Mapping[str, Any]] = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


_KEPT_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)


def slim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of ``pod`` the engine reads (this module, the reaper, claims): metadata without
    ``managedFields``, the runtime container's token digest and ports, the whole status. A
    watch cache of thousands of pods keeps a sixth of the objects (Python's collector walks
    them all, and a pause of the full pods stalls every call in the process).

        >>> pod = {"metadata": {"name": "p", "managedFields": [{"manager": "x"}]},
        ...        "spec": {"containers": [{"name": "runtime", "image": "i", "ports": [
        ...            {"containerPort": 9}]}]}, "status": {"phase": "Running"}}
        >>> slim(pod)["metadata"], slim(pod)["spec"]["containers"][0]["ports"]
        ({'name': 'p'}, [{'containerPort': 9}])
    """
    meta = pod.get("metadata") or {}
    containers = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "runtime":
            env = [v for v in container.get("env") or [] if v.get("name") == TOKEN_SHA256_ENV]
            containers.append(
                {
                    "name": "runtime",
                    "env": env,
                    "ports": container.get("ports") or [],
                    "resources": container.get("resources") or {},
                }
            )
    return {
        "metadata": {key: meta[key] for key in _KEPT_METADATA if key in meta},
        "spec": {"containers": containers},
        "status": pod.get("status") or {},
    }


def memory_limit(pod: Mapping[str, Any]) -> str | None:
    """The runtime container's memory limit as the pod spec gives it (``2Gi``), or None.

    >>> memory_limit({"spec": {"containers": [{"name": "runtime",
    ...     "resources": {"limits": {"memory": "256Mi"}}}]}})
    '256Mi'
    """
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "runtime":
            limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
            return str(limit) if limit else None
    return None


def _port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "runtime":
            for port in container.get("ports") or []:
                if isinstance(port.get("containerPort"), int):
                    return int(port["containerPort"])
    return DEFAULT_FUNCTIONS_PORT


def last_words(output: str) -> str:
    """What a runtime that stopped said about why: its last ``sandbox_runtime: error:`` line,
    else its last line that is not empty (at most 500 characters; "" when it said nothing).

        >>> last_words("starting\\nsandbox_runtime: error: digest sha256:aa, expected sha256:bb\\n")
        'sandbox_runtime: error: digest sha256:aa, expected sha256:bb'
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("sandbox_runtime: error:")]
    chosen = errors[-1] if errors else (lines[-1] if lines else "")
    return chosen[:500]


def runtime_message(pod: Mapping[str, Any]) -> str:
    """The termination message of the pod's runtime container (its last log lines when it
    failed, ``terminationMessagePolicy: FallbackToLogsOnError``), as :func:`last_words`."""
    terminated = (_container(pod).get("state") or {}).get("terminated") or {}
    return last_words(str(terminated.get("message") or ""))


def _ended(
    pod: Mapping[str, Any], expires_at: float | None, deleted_at: float | None
) -> tuple[TerminationReason, str] | None:
    """Why the pod's instance ended, or None while it has not."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if status.get("reason") == "Evicted":  # the kubelet's message names the resource and use
        limit = memory_limit(pod)
        return TerminationReason.CRASHED, f"its pod was evicted: {status.get('message', '')}" + (
            f" (its memory limit: {limit})" if limit else ""
        )
    if status.get("reason") == "DeadlineExceeded":
        return TerminationReason.EXPIRED, (
            "its pod reached activeDeadlineSeconds (the engine's max_lifetime backstop)"
        )
    if phase in ("Failed", "Succeeded"):
        terminated = (_container(pod).get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            limit = memory_limit(pod)
            return TerminationReason.OUT_OF_MEMORY, (
                "the runtime container was OOMKilled: it used more memory than "
                + (f"its limit, {limit} (deployConfig.memory)" if limit else "deployConfig.memory")
            )
        code = terminated.get("exitCode")
        why = terminated.get("reason") or status.get("reason") or phase
        said = runtime_message(pod)
        return TerminationReason.CRASHED, f"the runtime exited (code {code}, {why})" + (
            f": {said}" if said else ""
        )
    if deleted_at is not None:
        if expires_at is not None and deleted_at >= expires_at - 1.0:
            return TerminationReason.EXPIRED, "its TTL ran out"
        return TerminationReason.DELETED, "its pod was deleted"
    return None


def pod_info(
    pod: Mapping[str, Any],
    *,
    deleted: bool = False,
    reason: TerminationReason | None = None,
    token: str | None = None,
) -> InstanceInfo:
    """The instance a pod of ours holds. ``deleted``: the pod is gone (a watch's DELETED);
    ``reason``: why, when this process knows better (it deleted it itself); ``token``: its
    token, which the pod does not hold (:mod:`k8s_backend.tokens` derives it)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    notes = meta.get("annotations") or {}
    iid = instance_id(pod) or str(meta.get("name", ""))
    created = _number(notes.get(ANNOTATION_CREATED)) or timestamp(meta.get("creationTimestamp"))
    expires = _number(notes.get(ANNOTATION_EXPIRES))
    deleting = meta.get("deletionTimestamp")
    deleted_at = time.time() if deleted else (timestamp(deleting) if deleting else None)
    if deleting and deleted_at is not None:
        # deletionTimestamp is when the grace period ends; the request came just before it
        grace = _number(meta.get("deletionGracePeriodSeconds")) or 0.0
        deleted_at -= grace
    ended = _ended(pod, expires, deleted_at)
    status = pod.get("status") or {}
    if reason is not None and (ended is None or ended[0] in _DELETIONS):
        ended = (reason, _DETAILS.get(reason, ""))
    if ended is not None:
        why, detail = ended
        state, url = InstanceState.TERMINATED, None
    else:
        why, detail = None, ""
        ready = (
            status.get("phase") == "Running" and _condition(pod, "Ready").get("status") == "True"
        )
        ip = status.get("podIP")
        state = InstanceState.RUNNING if ready and ip else InstanceState.PENDING
        url = f"http://{ip}:{_port(pod)}" if state is InstanceState.RUNNING else None
        if state is InstanceState.PENDING:
            problem = startup_failure(pod)
            detail = str(problem) if problem else startup_wait(pod)
    return InstanceInfo(
        id=iid,
        env_ref=str(notes.get(ANNOTATION_ENV, "")),
        state=state,
        url=url,
        created_at=created or 0.0,
        expires_at=expires,
        reason=why,
        detail=detail,
        owner=notes.get(ANNOTATION_OWNER),
        labels={k: v for k, v in labels.items() if k not in OUR_LABELS},
        token=token,
    )


def startup_failure(pod: Mapping[str, Any], *, pull_error: str = "") -> AEnvError | None:
    """Why a pending pod will not come up without someone acting, as the error its create
    raises: the scheduler's Unschedulable (a :class:`CapacityError` quoting it), an image the
    kubelet gave up pulling (``ImagePullBackOff``, ``InvalidImageName``: named, with
    ``pull_error``, the failed pull's own message the caller saw before the back-off, since
    the back-off's says only "Back-off pulling image"), a container the kubelet cannot create.
    None while it may still start, which includes a first failed pull (``ErrImagePull``: the
    kubelet tries again) and the scheduler's reasons that pass by themselves (a claim still
    being bound, a node not ready yet or under pressure: :func:`startup_wait` says which),
    waited on within the create's deadline.

    >>> pod = {"metadata": {"name": "p"}, "status": {"containerStatuses": [{"name": "runtime",
    ...     "image": "r.io/x:1", "state": {"waiting": {"reason": "ErrImagePull",
    ...     "message": "r.io/x:1: not found"}}}]}}
    >>> startup_failure(pod) is None
    True
    >>> pod["status"]["containerStatuses"][0]["state"] = {"waiting": {
    ...     "reason": "ImagePullBackOff", "message": 'Back-off pulling image "r.io/x:1"'}}
    >>> error = startup_failure(pod, pull_error="r.io/x:1: not found")
    >>> type(error).__name__, "the pull failed with: r.io/x:1: not found" in str(error)
    ('ConfigurationError', True)
    """
    meta = pod.get("metadata") or {}
    name = meta.get("name", "?")
    scheduled = _condition(pod, "PodScheduled")
    if (
        scheduled.get("status") == "False"
        and scheduled.get("reason") == "Unschedulable"
        and not _passes(str(scheduled.get("message", "")))
    ):
        return CapacityError(
            f"pod {name} cannot be scheduled: {scheduled.get('message', 'no node fits it')}. "
            "Free capacity, lower deployConfig.cpu/memory, or add nodes"
        )
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        why = waiting.get("reason")
        said = waiting.get("message") or ""
        if why in _IMAGE_PROBLEMS:
            cause = f"; the pull failed with: {pull_error}" if pull_error else ""
            return ConfigurationError(
                f"pod {name}: container {status.get('name')}'s image {status.get('image', '?')} "
                f"cannot be pulled ({why}: {said}{cause}). Build and push it (`aenv build`), "
                "fix deployConfig.imagePrefix or artifacts, or give the cluster pull access"
            )
        if why in _CONFIG_PROBLEMS:
            return ConfigurationError(
                f"pod {name}: container {status.get('name')} cannot be created ({why}: {said})"
            )
    return None


def startup_wait(pod: Mapping[str, Any]) -> str:
    """What a pending pod waits on that passes by itself (a claim still binding, a node under
    pressure, an image being pulled), in the cluster's words; "" when there is nothing to say.
    A create that runs out of time quotes it, so the user knows which wait was too long.

    >>> startup_wait({"status": {"conditions": [{"type": "PodScheduled", "status": "False",
    ...     "reason": "Unschedulable", "message": "0/1 nodes are available: 1 pod has unbound "
    ...     "immediate PersistentVolumeClaims."}]}})
    'not scheduled: 0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims.'
    """
    scheduled = _condition(pod, "PodScheduled")
    if scheduled.get("status") == "False":
        return f"not scheduled: {scheduled.get('message') or scheduled.get('reason', '?')}"
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            said = waiting.get("message")
            return f"container {status.get('name')}: {waiting['reason']}" + (
                f" ({said})" if said else ""
            )
    return ""


def pull_error(pod: Mapping[str, Any]) -> str:
    """The message of a failed image pull the pod reports now (``ErrImagePull``: the
    registry's answer, which the back-off that follows no longer quotes), else "".

    >>> pull_error({"status": {"containerStatuses": [{"name": "runtime", "state": {"waiting": {
    ...     "reason": "ErrImagePull", "message": "manifest unknown"}}}]}})
    'manifest unknown'
    """
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == "ErrImagePull":
            return str(waiting.get("message") or "ErrImagePull")
    return ""


def _passes(message: str) -> bool:
    """Whether every reason the scheduler gives for not placing a pod passes by itself.

    The message reads ``0/3 nodes are available: 1 REASON, 2 REASON.``, a newer scheduler
    adding `` preemption: ...``; a message without that shape is judged whole."""
    said = message.lower().split(" preemption:", 1)[0]
    _, _, reasons = said.partition("nodes are available:")
    parts = [part.strip(" .") for part in re.split(r",\s*(?=\d+ )", reasons or said)]
    parts = [part for part in parts if part]
    return bool(parts) and all(
        any(passing in part for passing in _PASSING_SCHEDULER_REASONS) for part in parts
    )
