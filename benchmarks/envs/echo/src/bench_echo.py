"""The tools the call-path benchmark measures: the smallest possible work, sync and async."""

from __future__ import annotations

from aenv_ray import register_tool


@register_tool
def echo(text: str) -> str:
    """Say it back (sync: runs on the runtime's main thread).

    Args:
        text: what to say.
    """
    return text


@register_tool
async def async_echo(text: str) -> str:
    """Say it back (async: runs on the runtime's event loop).

    Args:
        text: what to say.
    """
    return text
