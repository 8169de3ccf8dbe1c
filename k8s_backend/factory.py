"""The Kubernetes engine made by name: ``new_engine("kubernetes")`` calls :func:`kubernetes_engine`
(registered under ``kubernetes`` in the ``aenv_ray.engines`` entry points).

What the caller's options leave out comes from the settings: ``AENV_K8S_NAMESPACE``,
``AENV_K8S_IMAGE_PREFIX``, ``AENV_K8S_DELIVERY`` with ``AENV_K8S_HUB_URL``, ``AENV_K8S_HUB_KEY``
and ``AENV_K8S_RUNTIME_IMAGE``, and ``KUBECONFIG`` (the client's).

May import: ``aenv_ray`` (settings, errors), ``k8s_backend``.
"""

from __future__ import annotations

from typing import Any

from aenv_ray.errors import ConfigurationError
from aenv_ray.settings import get_settings
from k8s_backend.delivery import HostProcess, HubBundle, OwnImage
from k8s_backend.engine import KubernetesEngine

__all__ = ["kubernetes_engine"]


def kubernetes_engine(**options: Any) -> KubernetesEngine:
    """A :class:`KubernetesEngine` with ``options`` (its keyword arguments, which win) and,
    for what they leave out, the namespace and the delivery the settings name."""
    settings = get_settings()
    options.setdefault("namespace", settings.k8s_namespace or None)
    if "delivery" not in options:
        if settings.k8s_delivery == "host":
            options["delivery"] = HostProcess()
        elif settings.k8s_delivery == "bundle":
            if not settings.k8s_hub_url:
                raise ConfigurationError(
                    "AENV_K8S_DELIVERY=bundle needs EnvHub's URL as the pods reach it "
                    "(e.g. http://envhub.aenv.svc:8080): set AENV_K8S_HUB_URL"
                )
            options["delivery"] = HubBundle(
                settings.k8s_hub_url,
                settings.k8s_hub_key,
                image=settings.k8s_runtime_image or None,
            )
        elif settings.k8s_runtime_image:
            options["delivery"] = OwnImage(
                settings.k8s_image_prefix, runtime_image=settings.k8s_runtime_image
            )
        else:
            options["delivery"] = OwnImage(settings.k8s_image_prefix)
    return KubernetesEngine(**options)
