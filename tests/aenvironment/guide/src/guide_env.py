"""The environment guide's and the SDK guide's examples of environment code (AEnvironment's
docs/guide/sdk.md, "Environment Development"), written from them: a tool, the parameter types
the guide recommends, a reward, a function and a health check."""

from typing import Any, Dict

from pydantic import BaseModel

from aenv import register_function, register_health, register_reward, register_tool


@register_tool
def my_custom_echo_env(content: str) -> Dict[str, Any]:
    """
    Echo whatever it is given, to check that the environment is wired up.

    Args:
        content: Any content to echo

    Returns:
        Dictionary with the original content under "result"
    """
    return {"result": f"{content}"}


@register_tool
def simple_types(name: str, count: int, price: float, enabled: bool, tags: list[str]) -> str:
    return "OK"


class UserQuery(BaseModel):
    query: str
    max_results: int = 10
    include_details: bool = False


@register_tool
def search_users(params: UserQuery) -> str:
    return f"Searching: {params.query}"


@register_reward
def evaluate_code_quality(code: str, test_results: dict) -> dict:
    """
    Score code from its test results, its length and its structure.

    Args:
        code: Code string to evaluate
        test_results: Test result dictionary containing pass/fail statistics
    """
    score = 0.0
    feedback = []
    if test_results.get("passed", 0) > 0:
        score += 0.5
        feedback.append("Tests passed")
    if len(code) < 1000:
        score += 0.3
        feedback.append("Code concise")
    if "def " in code and "import " in code:
        score += 0.2
        feedback.append("Good structure")
    return {"score": score, "feedback": "; ".join(feedback), "details": test_results}


@register_function
def custom_endpoint(data: dict) -> dict:
    """Custom HTTP endpoint function"""
    return {"status": "success", "data": data}


@register_health
def system_health_check() -> dict:
    """
    System health: CPU, memory and disk use.

    Returns:
        Dictionary containing various health indicators
    """
    import psutil

    return {
        "status": "healthy",
        "cpu_percent": psutil.cpu_percent(),
        "memory_percent": psutil.virtual_memory().percent,
        "disk_usage": psutil.disk_usage("/").percent,
        "uptime": "Running normally",
    }
