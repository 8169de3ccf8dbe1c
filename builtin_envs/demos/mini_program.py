"""mini-program demo: small web apps to build, and a policy that replays each task's reference
solution through the tools (``write_file``, ``execute_python_code``, ``validate``, ...).

Every task starts from ``reset_project`` (its ``setup``: an empty project, or the files to fix),
so one warm instance serves any task; its ``reward_arguments`` are ``page_reward``'s: texts the
page must show and files that must exist. The replay reaches reward 1.0 on every task. A task
holds no solution (nothing a policy is given, nor the rollout record's ``task``, does): the
scripted policy reads the reference tool calls of a demo task by its id, on the driver's side
(:func:`reference_solution`).

    aenv rollout mini-program@1.0.0                         # these tasks, this policy
    aenv rollout mini-program@1.0.0 --tasks my_tasks.jsonl --base-url URL --model M  # yours
"""

from __future__ import annotations

from typing import Any

from aenv_ray.errors import ConfigurationError

__all__ = ["TASKS", "policy", "reference_solution"]


def _page(title: str, body: str, head: str = "") -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n  <meta charset="utf-8">\n'
        '  <meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"  <title>{title}</title>\n{head}</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _write(path: str, content: str) -> dict[str, Any]:
    return {"tool": "write_file", "arguments": {"file_path": path, "content": content}}


_VALIDATE: dict[str, Any] = {"tool": "validate", "arguments": {}}


def _start(files: dict[str, str] | None = None) -> list[dict[str, Any]]:
    return [{"function": "reset_project", "arguments": {"files": files or {}}}]


_HELLO = _page(
    "Hello",
    '  <h1 id="greeting">Loading...</h1>\n  <script>\n'
    "    document.getElementById('greeting').textContent = 'Hello from the mini program!';\n"
    "  </script>",
)

_COUNTER_JS = """\
let count = 0;
function render() {
  document.getElementById('count').textContent = `Count: ${count}`;
}
document.addEventListener('DOMContentLoaded', () => {
  document.getElementById('plus').addEventListener('click', () => { count += 1; render(); });
  render();
});
"""
_COUNTER = _page(
    "Counter",
    '  <main class="card">\n    <p id="count"></p>\n    <button id="plus">+1</button>\n  </main>',
    '  <link rel="stylesheet" href="style.css">\n  <script src="app.js"></script>\n',
)
_COUNTER_CSS = """\
body { font-family: sans-serif; display: flex; justify-content: center; }
.card { padding: 2rem; border: 1px solid #ccc; border-radius: 8px; text-align: center; }
button { font-size: 1.5rem; }
"""

_TODO_JS = """\
const ITEMS = ['Buy milk', 'Write tests', 'Ship it'];
document.addEventListener('DOMContentLoaded', () => {
  const list = document.getElementById('todo');
  for (const item of ITEMS) {
    const li = document.createElement('li');
    li.textContent = item;
    list.appendChild(li);
  }
  document.getElementById('total').textContent = `${ITEMS.length} things to do`;
});
"""
_TODO = _page(
    "To do",
    '  <h1>To do</h1>\n  <ul id="todo"></ul>\n  <p id="total"></p>',
    '  <script src="js/todo.js"></script>\n',
)

_SQUARES_PY = """\
squares = [n * n for n in range(1, 11)]
with open("squares.js", "w") as out:
    out.write("const SQUARES = " + repr(squares) + ";\\n")
print("wrote", len(squares), "squares")
"""
_SQUARES = _page(
    "Squares",
    '  <table id="table"><tr><th>n</th><th>n squared</th></tr></table>\n  <script>\n'
    "    SQUARES.forEach((square, i) => {\n"
    "      const row = document.getElementById('table').insertRow();\n"
    "      row.insertCell().textContent = i + 1;\n"
    "      row.insertCell().textContent = square;\n"
    "    });\n  </script>",
    '  <script src="squares.js"></script>\n',
)

_BROKEN = _page(
    "Broken",
    '  <div id="status">\n  <script>\n'
    "    function show() { document.getElementById('status').textContent = 'Fixed!';\n"
    "    show();\n  </script>",
)
_FIXED = _page(
    "Fixed",
    '  <div id="status"></div>\n  <script>\n'
    "    function show() { document.getElementById('status').textContent = 'Fixed!'; }\n"
    "    show();\n  </script>",
)

_DEMO: list[dict[str, Any]] = [  # each with its reference solution
    {
        "id": "hello",
        "prompt": "Build a page whose script greets the user with 'Hello from the mini program!'.",
        "setup": _start(),
        "solution": [_write("index.html", _HELLO), _VALIDATE],
        "reward_arguments": {"expected_text": ["Hello from the mini program!"]},
    },
    {
        "id": "counter",
        "prompt": "Build a counter: a page showing 'Count: 0' and a +1 button, with its script "
        "in app.js and its style in style.css.",
        "setup": _start(),
        "solution": [
            _write("style.css", _COUNTER_CSS),
            _write("app.js", _COUNTER_JS),
            _write("index.html", _COUNTER),
            _VALIDATE,
        ],
        "reward_arguments": {
            "expected_text": ["Count:", "+1"],
            "expected_files": ["app.js", "style.css"],
        },
    },
    {
        "id": "todo",
        "prompt": "Build a to-do list showing Buy milk, Write tests and Ship it, rendered by "
        "js/todo.js.",
        "setup": _start(),
        "solution": [
            _write("js/todo.js", _TODO_JS),
            _write("index.html", _TODO),
            {"tool": "list_files", "arguments": {}},
            _VALIDATE,
        ],
        "reward_arguments": {
            "expected_text": ["Buy milk", "Write tests", "Ship it"],
            "expected_files": ["js/todo.js"],
        },
    },
    {
        "id": "squares",
        "prompt": "Generate squares.js with the squares of 1..10 using Python, and show them in "
        "a table.",
        "setup": _start(),
        "solution": [
            {"tool": "execute_python_code", "arguments": {"code": _SQUARES_PY}},
            {"tool": "read_file", "arguments": {"file_path": "squares.js"}},
            _write("index.html", _SQUARES),
            _VALIDATE,
        ],
        "reward_arguments": {
            "expected_text": ["n squared", "81"],
            "expected_files": ["squares.js"],
        },
    },
    {
        "id": "fix",
        "prompt": "index.html is broken: its status never shows. Fix it so that it shows 'Fixed!'.",
        "setup": _start({"index.html": _BROKEN, "notes.txt": "scratch\n"}),
        "solution": [
            _VALIDATE,
            {"tool": "read_file", "arguments": {"file_path": "index.html"}},
            _write("index.html", _FIXED),
            {"tool": "delete_file", "arguments": {"file_path": "notes.txt"}},
            _VALIDATE,
        ],
        "reward_arguments": {"expected_text": ["Fixed!"]},
    },
]


TASKS: list[dict[str, Any]] = [
    {key: value for key, value in task.items() if key != "solution"} for task in _DEMO
]
_SOLUTIONS: dict[str, list[dict[str, Any]]] = {task["id"]: task["solution"] for task in _DEMO}


def reference_solution(task_id: str) -> list[dict[str, Any]]:
    """The reference tool calls (``{"tool", "arguments"}``) of demo task ``task_id``, never
    part of the task.

        >>> [step["tool"] for step in reference_solution("hello")]
        ['write_file', 'validate']

    Raises :class:`~aenv_ray.errors.ConfigurationError` for a task that is not a demo task:
    the scripted policy has nothing to replay there (a run with it stops, saying so).
    """
    try:
        return [dict(step) for step in _SOLUTIONS[task_id]]
    except KeyError:
        raise ConfigurationError(
            f"the mini-program demo policy replays the demo tasks' reference solutions "
            f"({', '.join(_SOLUTIONS)}); task {task_id!r} is not one of them: give a policy "
            "(--policy MODULE:CALLABLE, or --base-url and --model)"
        ) from None


async def policy(task: dict[str, Any], env: Any) -> str | None:
    """Call the task's reference tools in order; stop at the first error result. The answer is
    the last ``validate``'s verdict."""
    verdict: str | None = None
    for step in reference_solution(str(task["id"])):
        result = await env.call_tool(step["tool"], dict(step["arguments"]))
        if result.is_error:
            return None
        if step["tool"] == "validate":
            report = result.structured or {}
            verdict = "valid" if report.get("valid") else f"invalid: {report.get('errors')}"
    return verdict
