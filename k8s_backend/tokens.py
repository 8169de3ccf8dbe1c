"""Instance tokens no pod spec reveals: the engine derives each pod's token from a namespace key,
and the pod is given only the token's SHA-256.

Whoever may read pods in a namespace reads their specs (``kubectl get pod -o yaml``, the
``view`` ClusterRole, a dashboard, a log shipper): a token in an environment variable or an
argument would be theirs too, and with it every call into the instance. So a pod carries only

- ``AENV_RUNTIME_TOKEN_SHA256`` (:data:`~aenv_ray.protocol.TOKEN_SHA256_ENV`) in its runtime
  container: the token's SHA-256, which the runtime compares with the digest of what a request
  presents (constant time). The digest is no token: presented as one it is refused, and a
  token is 256 bits of HMAC output, so no preimage can be searched for;
- the annotation ``aenv-ray.io/token-nonce``: 128 random bits, public.

The token is ``HMAC-SHA256(key, namespace, instance id, nonce)`` (:meth:`TokenKey.token`), where
``key`` is the namespace's 256-bit key, kept in the Secret ``aenv-runtime-token-key``
(:data:`SECRET`): the first engine of the namespace creates it, every engine reads it once at
start (:func:`load_key`) and derives any pod's token from the pod it already has in its watch
cache, so a claim or a ``get`` costs no API call for the token, and a hub restarted on the same
namespace, or another client of it, reaches the same instances. Reading Secrets is not part of
the ``view`` role: who may read pods but not that Secret learns nothing that opens an instance.
Nothing holds a token at rest; the engine checks a token it derives against the pod's digest,
so a pod made under another key (the Secret was replaced) has no token (``InstanceInfo.token``
None) rather than a wrong one.

A service's replicas share one token, derived the same way with ``service/<id>`` in place of the
instance id: its digest is in the Deployment's pod template, its nonce on the Deployment
(:meth:`TokenKey.of_service`), and an update keeps both (the replicas keep the token).

    >>> key = TokenKey(bytes(32), "rl")
    >>> pod = {"metadata": {"labels": {LABEL_INSTANCE: "ab12"},
    ...        "annotations": {ANNOTATION_NONCE: "n0"}},
    ...        "spec": {"containers": [{"name": "runtime", "env": [
    ...            {"name": TOKEN_SHA256_ENV, "value": digest(key.token("ab12", "n0"))}]}]}}
    >>> key.of_pod(pod) == key.token("ab12", "n0"), TokenKey(b"x" * 32, "rl").of_pod(pod)
    (True, None)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
from collections.abc import Mapping
from typing import Any

from aenv_ray.errors import AEnvError, ClusterConflictError, ConfigurationError
from aenv_ray.protocol import TOKEN_SHA256_ENV
from k8s_backend._api import Kube
from k8s_backend.manifests import ANNOTATION_NONCE, LABEL_INSTANCE
from k8s_backend.services import ANNOTATION_SERVICE

__all__ = [
    "SECRET",
    "KeyHolder",
    "TokenKey",
    "digest",
    "load_key",
    "new_nonce",
    "pod_digest",
]

SECRET = "aenv-runtime-token-key"
"""The namespace's Secret holding the key instance tokens are derived from (data ``key``)."""
_KEY_BYTES = 32
_CONTEXT = b"aenv-ray instance token v1"


def digest(token: str) -> str:
    """The SHA-256 of ``token`` in hex: what a pod is given instead of the token.

    >>> digest("s3cret")[:16]
    '1ec1c26b50d5d3c5'
    """
    return hashlib.sha256(token.encode()).hexdigest()


def new_nonce() -> str:
    """A fresh public nonce for a pod's token (128 random bits)."""
    return secrets.token_urlsafe(16)


class TokenKey:
    """The namespace's token key: derives a pod's token (see the module's docstring)."""

    def __init__(self, key: bytes, namespace: str) -> None:
        if len(key) < 16:
            raise ConfigurationError(
                f"the instance token key of namespace {namespace} is {len(key)} bytes; it needs "
                f"at least 16 (delete the Secret {SECRET}: the next engine makes a new one)"
            )
        self._key = key
        self.namespace = namespace

    def __repr__(self) -> str:  # never the key
        return f"TokenKey(namespace={self.namespace!r})"

    def token(self, instance_id: str, nonce: str) -> str:
        """The token of instance ``instance_id`` whose pod has nonce ``nonce``."""
        message = b"\0".join(
            (_CONTEXT, self.namespace.encode(), instance_id.encode(), nonce.encode())
        )
        mac = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def of_pod(self, pod: Mapping[str, Any]) -> str | None:
        """The token of a pod of ours (from its labels, nonce and digest alone), None when it
        has none or was made under another key."""
        meta = pod.get("metadata") or {}
        iid = (meta.get("labels") or {}).get(LABEL_INSTANCE)
        nonce = (meta.get("annotations") or {}).get(ANNOTATION_NONCE)
        expected = pod_digest(pod)
        if not iid or not nonce or not expected:
            return None
        token = self.token(str(iid), str(nonce))
        return token if hmac.compare_digest(digest(token), expected) else None

    def of_service(self, deployment: Mapping[str, Any]) -> str | None:
        """The token of a service's replicas (from its Deployment alone: the service id, the
        nonce and the template's digest), None when it has none or another key made it."""
        notes = (deployment.get("metadata") or {}).get("annotations") or {}
        service = notes.get(ANNOTATION_SERVICE)
        nonce = notes.get(ANNOTATION_NONCE)
        template = (deployment.get("spec") or {}).get("template") or {}
        expected = pod_digest(template)
        if not service or not nonce or not expected:
            return None
        token = self.token(f"service/{service}", str(nonce))
        return token if hmac.compare_digest(digest(token), expected) else None


def pod_digest(pod: Mapping[str, Any]) -> str | None:
    """The token digest a pod's runtime container is given (None: none)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == "runtime":
            for variable in container.get("env") or []:
                if variable.get("name") == TOKEN_SHA256_ENV and variable.get("value"):
                    return str(variable["value"])
    return None


def load_key(kube: Kube) -> TokenKey:
    """The namespace's key from its Secret :data:`SECRET`, made first if there is none (of two
    engines that make it at once, the second reads the first's). An account that may not read
    it gets :class:`~aenv_ray.errors.PermissionDeniedError` naming the Role to bind."""
    path = kube.path("", "secrets", SECRET)
    try:
        found = kube.request("GET", path, what=f"read the Secret {SECRET}", not_found=_Missing)
    except _Missing:
        found = None
    if found is None:
        fresh = base64.b64encode(secrets.token_bytes(_KEY_BYTES)).decode()
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": SECRET,
                "labels": {"app.kubernetes.io/part-of": "aenv-ray"},
            },
            "type": "Opaque",
            "data": {"key": fresh},
        }
        try:
            found = kube.request(
                "POST",
                kube.path("", "secrets"),
                body=body,
                what=f"create the Secret {SECRET}",
                retry_conflicts=False,
            )
        except ClusterConflictError:  # another engine made it first: its key is the key
            found = kube.request("GET", path, what=f"read the Secret {SECRET}")
    text = ((found or {}).get("data") or {}).get("key") or ""
    try:
        key = base64.b64decode(text, validate=True)
    except ValueError:
        key = b""
    return TokenKey(key, kube.namespace)


class _Missing(AEnvError):
    """A 404 reading the Secret: there is none yet."""


class KeyHolder:
    """The key once loaded, loaded at most once at a time (the engine's threads share it)."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._lock = threading.Lock()
        self.key: TokenKey | None = None

    def load(self) -> TokenKey:
        """The key, read (or made) on first use; an error is raised again on the next call."""
        with self._lock:
            if self.key is None:
                self.key = load_key(self._kube)
            return self.key

    def of_pod(self, pod: Mapping[str, Any]) -> str | None:
        """The pod's token when the key is loaded (no API call here), else None."""
        key = self.key
        return key.of_pod(pod) if key is not None else None

    def of_service(self, deployment: Mapping[str, Any]) -> str | None:
        """A service's token (:meth:`TokenKey.of_service`) when the key is loaded, else None."""
        key = self.key
        return key.of_service(deployment) if key is not None else None
