"""The one module that imports the official ``kubernetes`` client: a connection to a cluster's
API, and the translation of every API failure into aenv-ray's error tree.

Objects cross this module as plain dicts (the JSON the API server speaks, read with orjson), not
as the client's generated models: the engine's hot paths (a create, a warm pod's claim, the
watch) pay for no model round trip. The client still does what only it should: read a
kubeconfig or the in-cluster service account, TLS, and credentials (token refresh included).

Every call goes through :meth:`Kube.request`, which retries 429 (honouring ``Retry-After``), 5xx
and dropped connections with backoff (:func:`aenv_ray.retry.retry`), and :func:`translate`
turns what is left into one error:

======  ======================================================================
401     :class:`~aenv_ray.errors.AuthenticationError`
403     :class:`~aenv_ray.errors.PermissionDeniedError` (a ResourceQuota's refusal:
        :class:`~aenv_ray.errors.CapacityError`)
404     the caller's (an instance's id: ``InstanceNotFoundError``); a missing namespace:
        :class:`~aenv_ray.errors.ConfigurationError`
409     :class:`~aenv_ray.errors.ClusterConflictError`
400/422 :class:`~aenv_ray.errors.ConfigurationError`, with the fields the API names
429/5xx :class:`~aenv_ray.errors.ClusterUnreachableError` once retries are spent
other   :class:`~aenv_ray.errors.ClusterError`
======  ======================================================================

    >>> error = translate(403, {"kind": "Status", "reason": "Forbidden",
    ...     "message": 'pods is forbidden: User "bob" cannot create resource "pods"'},
    ...     what="create pod aenv-x")
    >>> type(error).__name__
    'PermissionDeniedError'
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from aenv_ray.errors import (
    AEnvError,
    AuthenticationError,
    CapacityError,
    ClusterConflictError,
    ClusterError,
    ClusterUnreachableError,
    ConfigurationError,
    PermissionDeniedError,
)
from aenv_ray.retry import Backoff, retry

__all__ = ["ROLE", "Kube", "WatchEvent", "WatchExpired", "connect", "translate"]

log = logging.getLogger("aenv_ray.k8s")

_SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
ROLE = "aenv-ray-engine"
"""The Role that ``deploy/role.yaml`` defines: what an engine may do in its namespace."""
_FORBIDDEN = re.compile(
    r'User "(?P<user>[^"]*)" cannot (?P<verb>[a-z]+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "(?P<group>[^"]*)")?(?: in the namespace "(?P<namespace>[^"]+)")?'
)


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again, then watch from there."""


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: ``ADDED``, ``MODIFIED``, ``DELETED`` or ``BOOKMARK``, and the
    object (for a bookmark, only its resourceVersion)."""

    type: str
    object: dict[str, Any]


def _status_message(body: Any) -> str:
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    return ""


def _causes(body: Any) -> str:
    details = body.get("details") if isinstance(body, Mapping) else None
    causes = details.get("causes") if isinstance(details, Mapping) else None
    if not isinstance(causes, list):
        return ""
    parts = []
    for cause in causes[:8]:
        if isinstance(cause, Mapping):
            field = cause.get("field") or ""
            text = cause.get("message") or cause.get("reason") or ""
            parts.append(f"{field}: {text}" if field else str(text))
    return "; ".join(parts)


def translate(
    status: int,
    body: Any,
    *,
    what: str,
    not_found: Callable[[str], AEnvError] | None = None,
) -> AEnvError:
    """The error of an API answer with HTTP ``status`` and the (decoded) ``body``, a
    ``Status`` object when the server sends one. ``what`` says what was asked ("create pod
    X"); ``not_found`` makes a 404's error (default: a :class:`ClusterError`, or a
    :class:`ConfigurationError` when the namespace itself is missing)."""
    api = _status_message(body) or (body if isinstance(body, str) else "") or f"HTTP {status}"
    reason = body.get("reason", "") if isinstance(body, Mapping) else ""
    said = f"{what}: the Kubernetes API answered {status}: {api}"
    if status == 401:
        return AuthenticationError(
            f"{said}. The cluster does not accept our credentials: check the kubeconfig's user "
            "(KUBECONFIG, kubeconfig=) or the pod's service account token"
        )
    if status == 403:
        if "exceeded quota" in api:
            return CapacityError(
                f"{said}. The namespace's ResourceQuota is full: wait, or ask less"
            )
        return PermissionDeniedError(f"{said}. {_forbidden_hint(api)}")
    if status == 404:
        details = body.get("details") if isinstance(body, Mapping) else None
        if isinstance(details, Mapping) and details.get("kind") == "namespaces":
            return ConfigurationError(
                f"{said}. The namespace does not exist: create it (kubectl create namespace "
                f"{details.get('name')}) or choose another (namespace=, AENV_K8S_NAMESPACE)"
            )
        if not_found is not None:
            return not_found(said)
        return ClusterError(said)
    if status == 409:
        return ClusterConflictError(f"{said}. Read the object again and retry")
    if status in (400, 422) or reason == "Invalid":
        causes = _causes(body)
        return ConfigurationError(
            f"{said}" + (f" ({causes})" if causes else "") + ". The object we sent is invalid "
            "for this cluster: check the environment's deployConfig and pod template"
        )
    if status == 429 or status >= 500:
        return ClusterUnreachableError(f"{said}. The API server is overloaded or failing")
    return ClusterError(said)


def _forbidden_hint(message: str) -> str:
    """What to do about a 403: who may not do what where, and the Role that grants it."""
    found = _FORBIDDEN.search(message)
    if found is None:
        return (
            f"Our account may not do this: bind it the Role {ROLE} of deploy/role.yaml in this "
            "namespace (deploy/README.md), or use a kubeconfig whose user has it"
        )
    user, verb, resource = found["user"], found["verb"], found["resource"]
    group = f"{found['group']}/" if found["group"] else ""
    namespace = found["namespace"]
    where = f"in namespace {namespace}" if namespace else "at cluster scope"
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        subject = f"--serviceaccount={parts[2]}:{parts[3]}"
    else:
        subject = f"--user={user}"
    ns = namespace or "NAMESPACE"
    return (
        f"{user} may not {verb} {group}{resource} {where}: bind it the Role {ROLE} of "
        f"deploy/role.yaml there (`kubectl apply -k deploy/` binds it to the hub's service "
        f"account aenv-ray:aenv-hub; for this account: `kubectl -n {ns} create rolebinding "
        f"{ROLE} --role={ROLE} {subject}`, after creating the Role in {ns}), or use a "
        "kubeconfig whose user has it"
    )


def _retry_after(exc: Exception) -> float | None:
    """The pause a 429 asks for (``Retry-After``, at most 30 s)."""
    if not isinstance(exc, ApiException) or exc.status != 429 or exc.headers is None:
        return None
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        value = exc.headers.get("Retry-After")
        if value is not None:
            return min(max(float(value), 0.0), 30.0)
    return None


class Kube:
    """A connection to one cluster's API server (thread-safe: the engine calls it from its
    worker threads). Build it with :func:`connect`."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        *,
        namespace: str | None = None,
        retries: int = 5,
        request_timeout: float = 30.0,
    ) -> None:
        self.api_client = api_client
        self.namespace = namespace or "default"
        self.server = str(api_client.configuration.host)
        self.retries = retries
        self.request_timeout = request_timeout
        self._closed = threading.Event()

    # -- requests ----------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: Mapping[str, str | int] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        not_found: Callable[[str], AEnvError] | None = None,
        retry_conflicts: bool = False,
        text: bool = False,
    ) -> Any:
        """``method path`` with ``body`` (a dict or list, sent as JSON), its answer decoded
        (``text``: as text, for a pod's log). 429, 5xx and dropped connections are retried with
        backoff (and 409 when ``retry_conflicts``); any other failure raises
        :func:`translate`'s error."""

        def transient(exc: Exception) -> bool:
            if self._closed.is_set():
                return False
            if isinstance(exc, ApiException):
                status = int(exc.status or 0)
                return status == 429 or status >= 500 or (status == 409 and retry_conflicts)
            return isinstance(exc, urllib3.exceptions.HTTPError | OSError)

        def on_retry(exc: Exception, attempt: int, pause: float) -> None:
            log.info(
                "retrying a Kubernetes API call",
                extra={"what": what, "attempt": attempt, "pause": round(pause, 3)},
            )

        try:
            return retry(
                lambda: self._once(method, path, query, body, content_type, text),
                Backoff(first=0.1, most=2.0, jitter=0.2, tries=1 + self.retries),
                retryable=transient,
                wait_hint=_retry_after,
                on_retry=on_retry,
            )
        except ApiException as exc:
            status = int(exc.status or 0)
            raise translate(status, _decode(exc.body), what=what, not_found=not_found) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnreachableError(
                f"{what}: the Kubernetes API server at {self.server} does not answer "
                f"({type(exc).__name__}: {exc}); check the kubeconfig's server and that "
                "the cluster runs"
            ) from None

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        return headers

    def _once(
        self,
        method: str,
        path: str,
        query: Mapping[str, str | int] | None,
        body: Any,
        content_type: str,
        text: bool = False,
    ) -> Any:
        headers = self._headers(content_type if body is not None else None)
        if text:
            headers["Accept"] = "text/plain, application/json"
        params = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = self.api_client.call_api(*params, _request_timeout=self.request_timeout)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        if text:
            return bytes(data).decode("utf-8", "replace")
        return orjson.loads(data) if data else None

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        query: Mapping[str, str | int] | None = None,
        timeout_seconds: int = 300,
        stop: threading.Event | None = None,
        on_response: Callable[[Any], None] | None = None,
    ) -> Iterator[WatchEvent]:
        """The events of a collection from ``resource_version`` on, until the server ends the
        watch (after about ``timeout_seconds``) or ``stop`` is set. Raises
        :class:`WatchExpired` on 410 Gone (list again), and the translated error otherwise."""
        params = self.api_client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[
                *(query or {}).items(),
                ("watch", "true"),
                ("resourceVersion", resource_version),
                ("allowWatchBookmarks", "true"),
                ("timeoutSeconds", timeout_seconds),
            ],
            header_params=self._headers(None),
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(
                *params, _request_timeout=(10.0, timeout_seconds + 30.0)
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterUnreachableError(
                f"watch {path}: the Kubernetes API server at {self.server} does not answer "
                f"({type(exc).__name__}: {exc})"
            ) from None
        raw = response.response
        if on_response is not None:
            on_response(raw)
        try:
            if not 200 <= response.status <= 299:
                if response.status == 410:
                    raise WatchExpired(path)
                raise translate(response.status, _decode(raw.data), what=f"watch {path}")
            for line in raw:
                if stop is not None and stop.is_set():
                    return
                if not line.strip():
                    continue
                event = orjson.loads(line)
                kind = str(event.get("type", ""))
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        raise WatchExpired(path)
                    raise translate(code, obj, what=f"watch {path}")
                yield WatchEvent(kind, obj)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if stop is not None and stop.is_set():
                return
            raise ClusterUnreachableError(
                f"watch {path}: the connection to {self.server} dropped ({exc})"
            ) from None
        finally:
            with contextlib.suppress(Exception):
                raw.release_conn()

    def close(self) -> None:
        """Stop retrying and close the connection pool."""
        self._closed.set()
        with contextlib.suppress(Exception):
            self.api_client.close()

    # -- paths ---------------------------------------------------------------------------------
    def path(self, group: str, kind: str, name: str | None = None) -> str:
        """The URL path of ``kind`` (plural) in this namespace: ``group`` ``""`` for core/v1,
        else e.g. ``"apps/v1"``; with ``name``, of one object.

            >>> Kube.path_in("ns", "", "pods", "p-1")
            '/api/v1/namespaces/ns/pods/p-1'
        """
        return self.path_in(self.namespace, group, kind, name)

    @staticmethod
    def path_in(namespace: str, group: str, kind: str, name: str | None = None) -> str:
        """:meth:`path` in another namespace."""
        root = "/api/v1" if not group else f"/apis/{group}"
        path = f"{root}/namespaces/{quote(namespace, safe='')}/{kind}"
        return f"{path}/{quote(name, safe='')}" if name else path


def _decode(body: Any) -> Any:
    if isinstance(body, bytes | bytearray):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
    return body


def connect(
    *,
    kubeconfig: str | os.PathLike[str] | None = None,
    context: str | None = None,
    api_client: Any = None,
    namespace: str | None = None,
    pool_size: int = 64,
) -> Kube:
    """A :class:`Kube` for the cluster of ``api_client`` (an official client's
    ``ApiClient``), or of ``kubeconfig`` (and ``context``), or, with neither, of the pod's
    service account when running inside a cluster, else of the default kubeconfig
    (``KUBECONFIG``, ``~/.kube/config``). ``namespace`` defaults to the kubeconfig context's,
    the service account's, then ``default``."""
    if api_client is not None:
        if not isinstance(api_client, k8s_client.ApiClient):
            raise ConfigurationError(
                f"api_client must be a kubernetes.client.ApiClient, not {type(api_client).__name__}"
            )
        return Kube(api_client, namespace=namespace)
    configuration = k8s_client.Configuration()
    found_namespace: str | None = None
    try:
        if kubeconfig is None and os.path.exists(f"{_SERVICE_ACCOUNT}/token"):
            k8s_config.load_incluster_config(client_configuration=configuration)
            with contextlib.suppress(OSError), open(f"{_SERVICE_ACCOUNT}/namespace") as f:
                found_namespace = f.read().strip() or None
        else:
            # the client reads KUBECONFIG once, at import: read it now (a single file)
            given = os.environ.get("KUBECONFIG", "")
            default = given if given and os.pathsep not in given else None
            path = os.fspath(kubeconfig) if kubeconfig is not None else default
            k8s_config.load_kube_config(
                config_file=path, context=context, client_configuration=configuration
            )
            with contextlib.suppress(ConfigException, KeyError, TypeError):
                _, active = k8s_config.list_kube_config_contexts(config_file=path)
                chosen = active
                if context is not None:
                    contexts, _ = k8s_config.list_kube_config_contexts(config_file=path)
                    chosen = next(c for c in contexts if c["name"] == context)
                found_namespace = chosen["context"].get("namespace")
    except (ConfigException, OSError, StopIteration) as exc:
        where = (
            os.fspath(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG", "~/.kube/config")
        )
        raise ConfigurationError(
            f"cannot load the Kubernetes configuration from {where}: {exc}. Point KUBECONFIG "
            "(or kubeconfig=) at a valid kubeconfig, or run inside a cluster"
        ) from None
    configuration.connection_pool_maxsize = pool_size
    return Kube(k8s_client.ApiClient(configuration), namespace=namespace or found_namespace)
