"""Structured logging: one ``logfmt`` line per event, fields from ``extra=`` included.

>>> import logging
>>> record = logging.LogRecord("x", logging.INFO, __file__, 1, "tool call", None, None)
>>> record.tool = "echo"
>>> LogfmtFormatter().format(record).split(" ", 1)[1]
'level=info logger=x msg="tool call" tool=echo'
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["LogfmtFormatter", "configure_logging"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _quote(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="\n'):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return text


class LogfmtFormatter(logging.Formatter):
    """``ts=... level=info logger=name msg="..." key=value ...``"""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        parts = [
            f"ts={ts}.{int(record.msecs):03d}Z",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def configure_logging(level: int | str = "INFO", *, stream: Any = None) -> None:
    """Send aenv-ray's loggers to ``stream`` (stderr) as logfmt; idempotent."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    for name in ("aenv_ray", "sandbox_runtime", "envhub", "rollout", "k8s_backend", "builtin_envs"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level)
        logger.propagate = False
