"""The hostile test project (``tests/envs/hostile``) and a checked tool call: what the engine
tests (in-process, through the daemon, with storage) share."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aenv_ray import Environment, InstanceInfo, InstanceSpec

__all__ = ["HOSTILE", "call", "hostile_spec"]

HOSTILE = Path(__file__).parent / "envs" / "hostile"


def hostile_spec(**kw: Any) -> InstanceSpec:
    """An instance of the hostile project, with ``kw`` as further spec fields."""
    return InstanceSpec("hostile@1.0.0", project=str(HOSTILE), **kw)


async def call(info: InstanceInfo, tool: str, args: dict[str, Any] | None = None) -> Any:
    """Call ``tool`` on the instance ``info``; its structured result (failing on an error)."""
    assert info.url is not None
    async with Environment.attach(info.url, token=info.token) as env:
        result = await env.call_tool(tool, args or {})
    assert not result.is_error, result.text
    return result.structured
