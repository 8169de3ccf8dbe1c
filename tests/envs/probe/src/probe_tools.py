"""Tools for the runtime and SDK tests: every supported argument type, and every failure."""

from __future__ import annotations

import asyncio
import enum
import os
import time
from typing import Literal

from pydantic import BaseModel

from aenv_ray import register_function, register_health, register_reward, register_tool

CALLS: list[str] = []
HEALTHY = {"ok": True}


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int = 0


@register_tool
def echo(text: str) -> str:
    """Say it back.

    Args:
        text: what to say.
    """
    CALLS.append(text)
    return text


@register_tool(name="async_echo", description="Say it back, asynchronously.")
async def aecho(text: str, times: int = 1) -> str:
    await asyncio.sleep(0)
    return text * times


@register_tool
def typed(
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    meta: dict,
    mode: Literal["fast", "slow"] = "fast",
    color: Color = Color.RED,
    note: str | None = None,
    point: Point | None = None,
) -> dict:
    """Echo typed arguments back as JSON."""
    return {
        "count": count,
        "ratio": ratio,
        "flag": flag,
        "tags": tags,
        "meta": meta,
        "mode": mode,
        "color": color.value,
        "note": note,
        "point": point.model_dump() if point else None,
    }


@register_tool
def returns_model(x: int) -> Point:
    """A pydantic model result."""
    return Point(x=x, y=x * 2)


@register_tool
def returns_none() -> None:
    """Nothing at all."""


@register_tool
def returns_list(n: int) -> list[int]:
    """A JSON list."""
    return list(range(n))


@register_tool
def returns_unserializable() -> object:
    """Something that is not JSON."""
    return object()


@register_tool
def fail(message: str) -> str:
    """Raise ValueError(message)."""
    raise ValueError(message)


@register_tool
def sys_exit() -> str:
    """Call sys.exit: must not stop the server."""
    raise SystemExit(3)


@register_tool(timeout=0.5)
def busy_loop() -> str:
    """Spin forever in pure Python."""
    while True:
        pass


@register_tool
def stubborn_loop() -> str:
    """Spin forever and swallow every interruption."""
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass


@register_tool
def sleepy(seconds: float) -> str:
    """time.sleep (a blocking C call)."""
    time.sleep(seconds)
    return f"slept {seconds}"


@register_tool
async def async_sleepy(seconds: float) -> str:
    """asyncio.sleep."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@register_tool
def crash() -> str:
    """Kill the whole runtime process."""
    os._exit(17)


@register_tool
def pid() -> int:
    """The runtime's process id."""
    return os.getpid()


@register_function
def add(a: int, b: int = 1) -> int:
    """a + b."""
    return a + b


@register_tool(timeout=5)
def patient(seconds: float) -> str:
    """Sleeps; declares it may take up to 5 s."""
    time.sleep(seconds)
    return f"waited {seconds}"


@register_function
def nap(seconds: float) -> float:
    """time.sleep in a function."""
    time.sleep(seconds)
    return seconds


@register_function
def explode() -> None:
    """Raise RuntimeError."""
    raise RuntimeError("kaboom")


@register_function
def set_healthy(ok: bool) -> bool:
    """Switch the health check."""
    HEALTHY["ok"] = ok
    return ok


@register_reward
def reward(answer: str, expected: str = "42") -> float:
    """1.0 when the answer is right."""
    return 1.0 if answer.strip() == expected else 0.0


@register_health
def health() -> bool:
    """Healthy unless switched off."""
    return HEALTHY["ok"]
