"""The optional parts of aenv-ray, and the one line that says which extra to install.

``pip install aenv-ray`` brings the SDK (:class:`~aenv_ray.Environment`, the decorators, the
hub client), the runtime that serves an environment (``sandbox_runtime``), the local engine
(``local_backend``) and the ``aenv`` CLI. The rest comes with an extra:

==============  =================================================  ==============================
extra           brings                                             for
==============  =================================================  ==============================
``ray``         ray, gymnasium, numpy                              ``rollout`` (pools, gym, jobs)
``rllib``       ray[rllib] (not torch: see docs/training.md)       ``rollout.rllib``
``kubernetes``  kubernetes, urllib3                                ``k8s_backend``
``hub``         fastapi, cryptography                              ``envhub`` (``aenv serve``)
``redis``       redis (and ``hub``)                                EnvHub's ``redis://`` store
``parquet``     pyarrow                                            Parquet trajectories
``builtins``    pytest                                             terminal-bench's graded tests
``harbor``      harbor (Python 3.12+)                              ``aenv_harbor`` (Harbor tasks)
``metrics``     prometheus_client                                  ``/metrics`` of the hub and the
                                                                   engine daemon
``ui``          plotly (its plotly.min.js, served offline)         ``aenv ui``'s charts
``all``         every extra above                                  ``scripts/setup``
==============  =================================================  ==============================

Each part checks its extra where it is entered (its package's ``__init__``, or the function
that needs it) with :func:`require_extra`, so a missing one fails at once with one line,
a :class:`~aenv_ray.errors.MissingExtraError` (an ``ImportError``), instead of a
``ModuleNotFoundError`` from deep inside; the CLI prints that line and exits non-zero. The
line says how for both kinds of users (:func:`install_hint`, the one wording of every message
naming an extra): ``pip install 'aenv-ray[ray]'`` where aenv-ray is installed (pip keeps it
and adds the extra's packages), ``pip install -e '.[ray]'`` in a checkout.

    >>> require_extra("ray", "rollout")  # nothing happens when it is installed
    >>> EXTRAS["hub"]
    ('fastapi', 'cryptography')

May import: the standard library, :mod:`aenv_ray.errors`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from aenv_ray.errors import MissingExtraError

__all__ = ["EXTRAS", "extra_imports", "install_hint", "missing_modules", "require_extra"]

EXTRAS: Mapping[str, tuple[str, ...]] = {
    "ray": ("ray", "gymnasium", "numpy"),
    "rllib": ("ray", "gymnasium", "numpy", "tree", "scipy"),  # tree: dm-tree
    "kubernetes": ("kubernetes", "urllib3"),
    "hub": ("fastapi", "cryptography"),
    "redis": ("fastapi", "cryptography", "redis"),
    "parquet": ("pyarrow",),
    "builtins": ("pytest",),
    "harbor": ("harbor",),
    "metrics": ("prometheus_client",),
    "ui": ("plotly",),
}
"""The top-level modules each extra installs (the ones its users import), by extra."""


def install_hint(extra: str) -> str:
    """How to install ``extra``, right for an installed aenv-ray (pip keeps it and adds the
    extra's packages) and for a checkout (the README's editable install): the one wording of
    every message that names an extra.

    >>> install_hint("ray")
    "pip install 'aenv-ray[ray]' (from a checkout: pip install -e '.[ray]')"
    """
    if extra not in EXTRAS and extra not in ("all", "dev"):
        raise ValueError(f"no extra `{extra}`; there are: {', '.join(EXTRAS)}")
    return f"pip install 'aenv-ray[{extra}]' (from a checkout: pip install -e '.[{extra}]')"


def _line(extra: str, what: str, missing: list[str]) -> str:
    return (
        f"aenv-ray: {what} needs the '{extra}' extra: {install_hint(extra)}; "
        f"{', '.join(missing)} not installed"
    )


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that this interpreter cannot import (found, not imported)."""
    try:
        modules = EXTRAS[extra]
    except KeyError:
        raise ValueError(f"no extra `{extra}`; there are: {', '.join(EXTRAS)}") from None
    missing = []
    for module in modules:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a broken install, or a module without a spec
            found = None
        if found is None:
            missing.append(module)
    return missing


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`~aenv_ray.errors.MissingExtraError` when a module of ``extra`` is not
    installed; ``what`` names the part that needs it (``"rollout"``, ``"aenv serve"``). The
    check looks the modules up without importing them."""
    missing = missing_modules(extra)
    if missing:
        raise MissingExtraError(_line(extra, what, missing), extra=extra)


@contextmanager
def extra_imports(extra: str, what: str) -> Iterator[None]:
    """Around the imports of an extra's modules: a module they lack (at any depth, e.g. a
    dependency of ``ray.rllib``) becomes the one line naming ``extra``.

        >>> with extra_imports("ray", "rollout.gym"):
        ...     import gymnasium
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = [exc.name or str(exc)]
        raise MissingExtraError(_line(extra, what, missing), extra=extra) from exc
