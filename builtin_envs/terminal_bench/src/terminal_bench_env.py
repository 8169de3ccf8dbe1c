"""terminal-bench@1.0.0: any Terminal-Bench (TB-1) task, its tests hidden until graded.

The task comes from ``TB_TASK_DIR`` (or a datasource that is a task) at creation, or from
``tb_reset(task=NAME)``, which picks a task of the dataset mounted as the datasource (``/data``,
or ``TB_DATASET_DIR``) or of the bundled demo tasks. The agent works in ``/app`` through the
tools (a command, the tmux terminal, files), all of which run in the agent's box, where neither
the dataset nor the task directory exists. The reward is the judge's: it ends the agent's box
(every process in it), keeps ``/app`` as files only, runs the task's ``run-tests.sh`` in a
grader's box of its own (fresh ``/tmp`` and home, the task's environment), parses pytest's
summary as Terminal-Bench does and checks it against pytest's own report. See
docs/builtins.md. In a Kubernetes pod with a judge container (``_tb_pod.py``) the tasks, their
tests and the test runs are the judge container's, and the agent's box is the pod itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Literal

import _tb_pod
from _tb_runtime import (
    IN_POD,
    WORKDIR,
    AgentBox,
    BoxDiedError,
    BoxError,
    Episode,
    WarmPytest,
    all_task_names,
    clean_slate,
    files_only,
    find_task,
    run_tests,
)

from aenv_ray import register_function, register_health, register_reward, register_tool
from aenv_ray.errors import ConfigurationError
from builtin_envs.terminal_bench import NoTaskError, Task, TestRun, grade

log = logging.getLogger("terminal_bench")

_LOCK = threading.RLock()
_EPISODE: Episode | None = None
_PYTEST: WarmPytest | None = None
MAX_WAIT = 60.0
MAX_LISTED = 200  # the agent's processes the judge names (all are killed; the total is given)


class AgentTimeUp(RuntimeError):
    """The agent's time for the task (``max_agent_timeout_sec``) is up."""


def _after_fork_in_child() -> None:
    # a fork keeps the Python state, not the parent's processes (its box, its warm pytest)
    global _PYTEST
    if _EPISODE is not None:
        _EPISODE.box = None
    _PYTEST = None


def _warm_pytest() -> WarmPytest:
    """The instance's warm pytest, started (it imports pytest in the background) when there is
    none."""
    global _PYTEST
    if _PYTEST is None or not _PYTEST.alive:
        if _PYTEST is not None:
            _PYTEST.close()
        _PYTEST = WarmPytest()
    return _PYTEST


os.register_at_fork(after_in_child=_after_fork_in_child)


def _episode() -> Episode:
    """The current episode; the first one comes from ``TB_TASK_DIR`` (or no task at all)."""
    global _EPISODE
    if IN_POD:
        _tb_pod.judge()  # before the agent's first command: the judge serves one connection
    if _EPISODE is None:
        task = None
        if IN_POD:
            task = _tb_pod.find_task(None) if os.environ.get("TB_TASK_DIR") else None
        elif os.environ.get("TB_TASK_DIR") or os.path.isfile(
            os.path.join(os.environ.get("TB_DATASET_DIR") or "/data", "task.yaml")
        ):
            task = find_task(None)
        _EPISODE = _new_episode(task, None, None)
    return _EPISODE


def _new_episode(
    task: Task | None, agent_timeout: float | None, test_timeout: float | None
) -> Episode:
    if task is None:
        return Episode()
    return Episode(
        task=task,
        agent_timeout=agent_timeout
        or _env_seconds("TB_AGENT_TIMEOUT_SEC")
        or (task.max_agent_timeout_sec),
        test_timeout=test_timeout
        or _env_seconds("TB_TEST_TIMEOUT_SEC")
        or (task.max_test_timeout_sec),
    )


def _env_seconds(name: str) -> float | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ConfigurationError(f"{name}={value!r} is not a positive number of seconds")
    return seconds


def _box(episode: Episode) -> AgentBox:
    """The agent's box, refusing once the agent's time is up."""
    left = episode.time_left()
    if left is not None and left <= 0:
        episode.timed_out = True
        raise AgentTimeUp(
            f"the agent's time for this task ({episode.agent_timeout:g} s, "
            "max_agent_timeout_sec) is up: the work is graded as it stands"
        )
    return episode.agent_box()


def _request(op: str, *, timeout: float, **fields: Any) -> dict[str, Any]:
    with _LOCK:
        episode = _episode()
        box = _box(episode)
        try:
            return box.request(op, timeout=timeout, **fields)
        except BoxDiedError:
            episode.close()
            raise


def _limit(timeout: float) -> float:
    """``timeout`` cut to the agent's time left."""
    left = _episode().time_left()
    return timeout if left is None else max(0.001, min(timeout, left))


# -- the agent's tools ------------------------------------------------------------------------


@register_tool(timeout=3600)
def run_command(command: str, timeout: float = 120) -> dict[str, Any]:
    """Run a bash command in /app (the task's working directory) and return its output.

    Each command runs in a fresh bash (stderr merged into the output; at most 1 MB, the middle
    cut); programs it leaves in the background keep running. Use the terminal (send_keys) for
    an interactive shell. A command past its timeout is killed (returncode 124).

    Args:
        command: the command line, e.g. "ls -la".
        timeout: seconds before the command is killed (at most the agent's time left).
    """
    if timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    limit = _limit(timeout)
    answer = _request("run", timeout=limit + 10, command=command, seconds=limit, limit=1 << 20)
    return {"output": answer["output"], "returncode": answer["returncode"]}


@register_tool(timeout=120)
def send_keys(keys: list[str], wait_seconds: float = 1.0) -> str:
    """Type into the terminal (a tmux session in /app, 160x40) and return its screen afterwards.

    Each item is typed as text, unless it is a tmux key name: "Enter", "C-c", "C-d", "Escape",
    "Tab", "Up", "Down", "BSpace", ... e.g. ["python3 server.py", "Enter"]. Programs keep running
    between calls; read_screen shows what they print later.

    Args:
        keys: what to type, in order.
        wait_seconds: seconds to wait before reading the screen (at most 60).
    """
    if not 0 <= wait_seconds <= MAX_WAIT:
        raise ValueError(f"wait_seconds must be between 0 and {MAX_WAIT:g}")
    wait = min(wait_seconds, _limit(MAX_WAIT))
    return str(_request("keys", timeout=wait + 20, keys=keys, wait=wait)["screen"])


@register_tool(timeout=60)
def read_screen(history_lines: int = 0) -> str:
    """The terminal's screen as it is now (what a user of the tmux session sees).

    Args:
        history_lines: also this many lines scrolled off above the screen.
    """
    if history_lines < 0:
        raise ValueError("history_lines must be 0 or more")
    return str(_request("screen", timeout=20, history=history_lines)["screen"])


@register_tool(timeout=60)
def write_file(path: str, content: str, append: bool = False) -> dict[str, Any]:
    """Write a text file (its directories are made); a relative path is relative to /app.

    Args:
        path: the file, e.g. "solution.py" or "/app/src/main.c".
        content: the text to write.
        append: add to the end of the file instead of replacing it.
    """
    answer = _request("write", timeout=30, path=path, content=content, append=append)
    return {"path": answer["path"], "bytes": answer["bytes"]}


@register_tool(timeout=60)
def read_file(path: str, offset: int = 0, limit: int = 200_000) -> dict[str, Any]:
    """Read a text file; a relative path is relative to /app.

    Args:
        path: the file, e.g. "solution.py".
        offset: the first byte to read.
        limit: at most this many bytes (4 MB at most).
    """
    if offset < 0 or limit <= 0:
        raise ValueError("offset must be 0 or more and limit positive")
    answer = _request("read", timeout=30, path=path, offset=offset, limit=limit)
    return {"content": answer["content"], "size": answer["size"], "offset": answer["offset"]}


# -- the trainer's functions ------------------------------------------------------------------


@register_function(timeout=120)
def tb_reset(
    task: str | None = None,
    agent_timeout_sec: float | None = None,
    test_timeout_sec: float | None = None,
) -> dict[str, Any]:
    """Start an episode of ``task``: an empty /app, /tmp and home, a new terminal.

    Returns what the agent may know: the instruction, the limits, whether the task has tests.

    Args:
        task: a task of the dataset (the datasource, or TB_DATASET_DIR) or a bundled demo task;
            default: TB_TASK_DIR's (or the datasource's, when it is a task).
        agent_timeout_sec: the agent's time (default: the task's max_agent_timeout_sec).
        test_timeout_sec: the tests' time (default: the task's max_test_timeout_sec).
    """
    global _EPISODE
    for value in (agent_timeout_sec, test_timeout_sec):
        if value is not None and value <= 0:
            raise ValueError("a timeout must be a positive number of seconds")
    with _LOCK:
        found = _tb_pod.find_task(task) if IN_POD else find_task(task)
        if _EPISODE is not None:
            _EPISODE.close()
        clean_slate()
        _EPISODE = _new_episode(found, agent_timeout_sec, test_timeout_sec)
        _EPISODE.agent_box()  # now: a machine that cannot build one says so here
        if not IN_POD:  # in a pod the tests run in the judge container
            _warm_pytest()
        return _task_info(_EPISODE)


def _task_info(episode: Episode) -> dict[str, Any]:
    if episode.task is None:
        return {"task": None, "workdir": WORKDIR}
    info = episode.task.public()
    info.update(
        workdir=WORKDIR,
        max_agent_timeout_sec=episode.agent_timeout,
        max_test_timeout_sec=episode.test_timeout,
        agent_seconds_left=episode.time_left(),
    )
    return info


@register_function
def tb_task() -> dict[str, Any]:
    """The current task as the agent may know it (no tests, no solution), and its time left."""
    with _LOCK:
        return _task_info(_episode())


@register_function
def tb_tasks() -> dict[str, list[str]]:
    """The tasks tb_reset can start: the dataset's and the bundled demo tasks."""
    if IN_POD:
        with _LOCK:
            return _tb_pod.all_task_names()
    return all_task_names()


@register_function(timeout=3600)
def tb_run_solution() -> dict[str, Any]:
    """Run the task's reference solution (solution.sh) in the agent's box, as an agent would.

    The oracle: for checking a task, or as a scripted policy. Limited by the agent's time.
    """
    with _LOCK:
        episode = _episode()
        if episode.task is None:
            raise NoTaskError("no task: call tb_reset(task=...) first")
        if IN_POD:
            script = _tb_pod.solution(episode.task)
        else:
            solution = episode.task.solution
            if not solution.is_file():
                raise FileNotFoundError(f"task {episode.task.name} has no solution.sh")
            script = solution.read_text(errors="replace")
        path = "/tmp/.tb-solution.sh"
        _request("write", timeout=30, path=path, content=script, append=False)
        limit = _limit(3600)
        answer = _request(
            "run",
            timeout=limit + 10,
            command=f"bash {path}; s=$?; rm -f {path}; exit $s",
            seconds=limit,
            limit=1 << 20,
        )
        return {"output": answer["output"], "returncode": answer["returncode"]}


@register_reward(timeout=86400)
def tb_reward(scoring: Literal["all", "fraction"] | None = None, strict: bool = False) -> Any:
    """Grade the task: end every process of the agent's box, run its run-tests.sh in the
    judge's box and parse pytest's summary as Terminal-Bench does, checked against pytest's own
    report.

    Returns the reward (1 or 0; the fraction of tests passed with scoring "fraction"; None when
    the task has no tests: invalid), the result of each test, the parser's outcome, the invalid
    flag, the end of the test output, ``judge`` (the processes killed, the files removed or
    ignored, pytest's report and the verdict) and, when it failed on the judge's checks,
    ``reason``. The agent's terminal is a new one afterwards.

    Args:
        scoring: "all" (every test must pass; the default, or TB_SCORING) or "fraction".
        strict: count only PASSED tests (Terminal-Bench also counts SKIPPED and XFAIL).
    """
    chosen = scoring or os.environ.get("TB_SCORING") or "all"
    if chosen not in ("all", "fraction"):
        raise ValueError(f"scoring must be `all` or `fraction`, not `{chosen}`")
    with _LOCK:
        episode = _episode()
        task = episode.task
        if task is None:
            raise NoTaskError("no task to grade: call tb_reset(task=...) first")
        late = episode.timed_out or (episode.time_left() == 0.0)
        started = time.monotonic()
        if IN_POD:
            return _pod_reward(episode, task, chosen, strict, late, started)
        judge = _judge(episode)
        if task.invalid is not None:
            return grade(task.name, None, invalid=task.invalid, agent_timed_out=late, judge=judge)
        run = run_tests(task, episode.test_timeout or task.max_test_timeout_sec, _warm_pytest())
        result = grade(
            task.name,
            run,
            scoring="fraction" if chosen == "fraction" else "all",
            strict=strict,
            agent_timed_out=late,
            judge=judge,
        )
        if judge["links_into_judge"]:  # the agent's work reaches into the judge's files
            named = ", ".join(
                f"{link['path']} -> {link['target']} ({link['leads_to']})"
                for link in judge["links_into_judge"][:5]
            )
            result.update(reward=0.0, resolved=False, outcome="failed")
            result["reason"] = (
                f"a link the agent left in /app leads into the judge's files: {named} "
                "(removed before the tests ran)"
            )
        log.info(
            "graded",
            extra={
                "task": task.name,
                "outcome": result["outcome"],
                "reward": result["reward"],
                "seconds": round(time.monotonic() - started, 3),
            },
        )
        return result


def _pod_reward(
    episode: Episode, task: Task, scoring: str, strict: bool, late: bool, started: float
) -> dict[str, Any]:
    """tb_reward in a pod: the agent's box ended here, the work graded by the judge container
    on its own copy of /app (links out, FIFOs, sockets and devices left out)."""
    killed = episode.end()
    run, copy = _tb_pod.run_tests(task, episode.test_timeout or task.max_test_timeout_sec)
    judge = {
        "killed": killed[:MAX_LISTED],
        "killed_total": len(killed),
        "removed": copy["removed"],
        "links_out": copy["links_out"],
        "links_into_judge": [],
        "over_limit": copy["over_limit"],
        "judge_container_ended": copy["judge_ended"][:MAX_LISTED],
        "ignored": [
            "the agent's /tmp and home directory (the tests get fresh ones)",
            "the agent's environment and shell (the tests get the task's)",
        ],
    }
    if task.invalid is not None:
        return grade(task.name, None, invalid=task.invalid, agent_timed_out=late, judge=judge)
    if run is None:  # past the judge's copy limits: the agent's doing
        empty = TestRun(output="", exit_code=None, seconds=0.0, reports=())
        result = grade(task.name, empty, agent_timed_out=late, judge=judge)
        limit = copy["over_limit"] or {}
        result.update(reward=0.0, resolved=False, outcome="failed")
        result["reason"] = (
            f"the agent's /app holds more than {limit.get('cap')} {limit.get('limit')} "
            f"(at {limit.get('path')!r}): the judge copied no more of it and ran no test"
        )
        return result
    result = grade(
        task.name,
        run,
        scoring="fraction" if scoring == "fraction" else "all",
        strict=strict,
        agent_timed_out=late,
        judge=judge,
        tests_dir=copy["tests_dir"],
    )
    log.info(
        "graded",
        extra={
            "task": task.name,
            "outcome": result["outcome"],
            "reward": result["reward"],
            "seconds": round(time.monotonic() - started, 3),
        },
    )
    return result


def _judge(episode: Episode) -> dict[str, Any]:
    """Before a grading: the agent's box ended (every process in it frozen, listed, killed; the
    next tool call starts a new one), ``/app`` made files only. What was removed or ignored."""
    killed = episode.end()
    app = files_only()
    return {
        "killed": killed[:MAX_LISTED],
        "killed_total": len(killed),
        "removed": app["removed"],
        "links_out": app["links_out"],
        "links_into_judge": app["links_into_judge"],
        "ignored": [
            "the agent's /tmp and home directory (the tests get fresh ones)",
            "the agent's environment and shell (the tests get the task's)",
        ],
    }


@register_health
async def tb_health() -> dict[str, Any]:
    """Healthy while the instance serves; names the current task. (On the event loop: a test
    run on the main thread does not hold it up.)"""
    episode = _EPISODE
    task = episode.task.name if episode is not None and episode.task is not None else None
    return {"status": "healthy", "task": task}


__all__ = [
    "BoxError",
    "read_file",
    "read_screen",
    "run_command",
    "send_keys",
    "tb_health",
    "tb_reset",
    "tb_reward",
    "tb_run_solution",
    "tb_task",
    "tb_tasks",
    "write_file",
]
