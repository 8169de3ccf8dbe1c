"""An environment written as AEnvironment's guides write them (its config.json is AEnvironment's
`aenv init` template): every kind of tool, function, reward and health check its docs show.
tests/test_aenv_oracle.py serves it with AEnvironment itself and with aenv-ray."""

import os
import time
from typing import Any, Dict

from pydantic import BaseModel

from aenv import register_function, register_health, register_reward, register_tool

STATE = {"calls": 0}


@register_tool
def echo(content: str) -> Dict[str, Any]:
    """Echo the content back.

    Args:
        content: Any content to echo
    """
    STATE["calls"] += 1
    return {"result": content}


@register_tool
def run(command: str, timeout=60, verbose=False, ratio=0.5, label="x"):
    return {
        "command": command,
        "timeout": timeout,
        "types": [type(v).__name__ for v in (timeout, verbose, ratio, label)],
    }


@register_tool
def text(n: int) -> str:
    return "n=" + str(n)


@register_tool
def nothing() -> None:
    return None


@register_tool
def boom(x: int = 1) -> str:
    raise ValueError("boom " + str(x))


@register_tool
def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


@register_tool
def variables() -> Dict[str, Any]:
    return {k: os.environ.get(k) for k in ("envNAME", "envversion", "GREETING", "EXTRA")}


class UserQuery(BaseModel):
    query: str
    max_results: int = 10
    include_details: bool = False


@register_tool
def search_users(params: UserQuery) -> str:
    return f"Searching: {params.query} ({params.max_results})"


@register_tool
def simple_types(name: str, count: int, price: float, enabled: bool, tags: list[str]) -> str:
    return f"{name} {count} {price} {enabled} {tags}"


@register_function
def custom_endpoint(data: dict) -> dict:
    """Custom HTTP endpoint function"""
    return {"status": "success", "data": data}


@register_function
def calls() -> int:
    return STATE["calls"]


@register_function
def fails() -> int:
    raise RuntimeError("function failed")


@register_reward
def reward(expected: str = "") -> dict:
    """The reward: 1.0 once echo was called."""
    return {"score": 1.0 if STATE["calls"] else 0.0, "expected": expected}


@register_health
def health(detail: bool = False) -> dict:
    report = {"status": "healthy", "calls": STATE["calls"]}
    if detail:
        report["pid"] = os.getpid()
    return report
