"""AEnvironment's logging helpers (``aenv.core.logging``) over the ``logging`` module.

The compatibility layer logs under ``aenv``, aenv-ray's SDK under ``aenv_ray``:
:func:`setup_logging` points both at one handler (or silences both).
"""

from __future__ import annotations

import logging

__all__ = ["getLogger", "setup_logging"]

_ROOTS = ("aenv", "aenv_ray")


def getLogger(name: str | None = None, type_: str | None = None) -> logging.Logger:
    """A logger under ``aenv`` (``name`` is prefixed with ``aenv.`` unless it starts so);
    ``type_`` (AEnvironment's output style) is accepted and not used."""
    if name is None:
        name = "aenv"
    elif not name.startswith("aenv"):
        name = f"aenv.{name}"
    return logging.getLogger(name)


def setup_logging(handler: logging.Handler | None = None, level: int = logging.DEBUG) -> None:
    """Send the SDK's logs (``aenv`` and ``aenv_ray``) to ``handler`` only, at ``level``;
    without a handler, silence them."""
    for root in _ROOTS:
        logger = logging.getLogger(root)
        logger.handlers.clear()
        logger.setLevel(level)
        logger.propagate = False
        logger.addHandler(handler if handler is not None else logging.NullHandler())
