"""The built-in mini-program environment, served by a real runtime: its file tools (and what they
refuse), ``execute_python_code``, ``validate``, the reward, the demo tasks and ``aenv rollout``.

The preview it serves is tested in ``tests/test_preview.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import Environment, JudgeReport, ToolErrorKind
from aenv_ray.testing import RuntimeProcess
from builtin_envs.demos import mini_program as demo
from tests._cli import aenv as run_cli
from tests._demo_solutions import assert_given_no_grader_fields

ROOT = Path(__file__).resolve().parent.parent
MINI_PROGRAM = ROOT / "builtin_envs" / "mini_program"

GOOD_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Good</title><link rel="stylesheet" href="css/site.css">
<script src="js/app.js"></script></head>
<body><main><h1>Weather</h1><p>Today is <b>sunny</b></p><ul><li>one<li>two</ul><br>
<img src="img/logo.png" alt=""></main>
<script>const note = `rendered ${1 + 1} times`; document.title = note.replace(/ti/g, 'TI');</script>
</body></html>
"""
GOOD_FILES = {
    "index.html": GOOD_PAGE,
    "css/site.css": "@media (max-width: 600px) { main { padding: 0 } }\nh1 { color: red; }\n",
    "js/app.js": "const says = { text: 'Forecast: rain' };\nfunction f(a) { return a / 2; }\n",
    "img/logo.png": "not really a png",
    "data.json": '{"days": [1, 2]}',
}


@pytest.fixture(scope="module")
def runtime() -> Iterator[RuntimeProcess]:
    # a page that hangs is given up on after 4 s here (20 s by default)
    with RuntimeProcess(MINI_PROGRAM, env={"MINI_PROGRAM_RENDER_TIMEOUT": "4"}) as process:
        yield process


def _gone(pid: int) -> bool:
    """No process ``pid`` (or only its zombie, not yet reaped by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except FileNotFoundError:
        return True


async def _call(env: Environment, tool: str, **arguments: Any) -> Any:
    result = await env.call_tool(tool, arguments)
    assert not result.is_error, result.text
    return result.structured


async def _refused(env: Environment, tool: str, **arguments: Any) -> str:
    result = await env.call_tool(tool, arguments)
    assert result.is_error
    assert result.error_kind is ToolErrorKind.EXECUTION
    return result.text


# -- files --------------------------------------------------------------------------------------


async def test_files_are_written_read_listed_and_deleted(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {})
        made = await _call(env, "write_file", file_path="/pages/./about.html", content="héllo")
        assert made == {"file_path": "pages/about.html", "size": 6, "created": True}
        again = await _call(env, "write_file", file_path="pages/about.html", content="bye")
        assert again == {"file_path": "pages/about.html", "size": 3, "created": False}
        await _call(env, "write_file", file_path="index.html", content="<p>x</p>")
        read = await _call(env, "read_file", file_path="pages/about.html")
        assert read == {
            "file_path": "pages/about.html",
            "content": "bye",
            "size": 3,
            "truncated": False,
        }
        listing = await _call(env, "list_files")
        assert listing == {
            "directory": "/",
            "files": ["index.html", "pages/about.html"],
            "sizes": {"index.html": 8, "pages/about.html": 3},
            "count": 2,
        }
        assert (await _call(env, "list_files", directory="pages"))["files"] == ["pages/about.html"]
        deleted = await _call(env, "delete_file", file_path="pages/about.html")
        assert deleted == {"file_path": "pages/about.html", "deleted": True}
        assert (await _call(env, "list_files"))["files"] == ["index.html"]  # pages/ went too
        files = await env.call_function("project_files")
        assert files == {"index.html": "<p>x</p>"}
        health = await env.check_health()
        assert health["status"] == "healthy"
        assert health["project"].endswith("/project")


@pytest.mark.parametrize(
    ("tool", "arguments", "message"),
    [
        ("read_file", {"file_path": "missing.html"}, "no file `missing.html` in the project"),
        ("read_file", {"file_path": "../../etc/passwd"}, "leaves the project"),
        ("write_file", {"file_path": "a/../../x", "content": ""}, "leaves the project"),
        ("write_file", {"file_path": ".git/config", "content": ""}, "hidden names"),
        ("write_file", {"file_path": "a\\b.js", "content": ""}, "backslash"),
        ("write_file", {"file_path": "", "content": ""}, "give a file path"),
        ("write_file", {"file_path": "x.txt", "content": "x" * 1_000_001}, "over the limit"),
        ("write_file", {"file_path": "dir", "content": ""}, "is a directory"),
        ("write_file", {"file_path": "dir/file.txt/x", "content": ""}, "is not a directory"),
        ("delete_file", {"file_path": "dir"}, "is a directory"),
        ("delete_file", {"file_path": "nope.txt"}, "no file `nope.txt`"),
        ("list_files", {"directory": "nowhere"}, "no directory `nowhere`"),
        ("read_file", {"file_path": "dir"}, "is a directory"),
    ],
)
async def test_what_the_file_tools_refuse(
    runtime: RuntimeProcess, tool: str, arguments: dict[str, Any], message: str
) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {"files": {"dir/file.txt": "x"}})
        assert message in await _refused(env, tool, **arguments)


async def test_the_file_tools_never_follow_links(runtime: RuntimeProcess, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's")
    async with runtime.environment() as env:
        await env.call_function("reset_project", {})
        planted = await _call(
            env,
            "execute_python_code",
            code=f"import os\nos.symlink({str(outside)!r}, 'out.txt')\n"
            f"os.symlink({str(tmp_path)!r}, 'outdir')\nprint('ok')",
        )
        assert planted["output"] == "ok\n"
        for tool, arguments in [
            ("write_file", {"file_path": "out.txt", "content": "overwritten"}),
            ("write_file", {"file_path": "outdir/new.txt", "content": "escaped"}),
            ("read_file", {"file_path": "out.txt"}),
            ("read_file", {"file_path": "outdir/outside.txt"}),
        ]:
            assert "is a symbolic link" in await _refused(env, tool, **arguments)
        assert (await _call(env, "list_files"))["files"] == []  # links are not listed
        await _call(env, "delete_file", file_path="out.txt")  # the link goes, not its target
    assert outside.read_text() == "the host's"
    assert sorted(os.listdir(tmp_path)) == ["outside.txt"]


async def test_the_project_has_a_size_and_a_file_count_limit(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {})
        await _call(
            env,
            "execute_python_code",
            code="for i in range(500): open(f'f{i}.txt', 'w').write('x')\n"
            "open('f0.txt', 'w').write('x' * 19_999_000)",
        )
        text = await _refused(env, "write_file", file_path="one-more.txt", content="x")
        assert "the project has 500 files, the most it may hold" in text
        text = await _refused(env, "write_file", file_path="f1.txt", content="x" * 2000)
        assert "over its limit of 20000000" in text
        await _call(env, "write_file", file_path="f1.txt", content="y")  # a rewrite fits
        await env.call_function("reset_project", {})
        assert (await _call(env, "list_files"))["count"] == 0


# -- execute_python_code ------------------------------------------------------------------------


async def test_python_runs_in_the_project(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {"files": {"helper.py": "ANSWER = 42\n"}})
        ran = await _call(
            env,
            "execute_python_code",
            code="import sys, helper\nopen('out.txt', 'w').write(str(helper.ANSWER))\n"
            "print('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)",
        )
        assert ran == {
            "success": False,
            "output": "to stdout\n",
            "error": "to stderr\n",
            "returncode": 3,
            "timed_out": False,
        }
        assert (await _call(env, "read_file", file_path="out.txt"))["content"] == "42"
        assert (await _call(env, "list_files"))["files"] == ["helper.py", "out.txt"]  # no cache
        raised = await _call(env, "execute_python_code", code="input()")
        assert raised["returncode"] == 1
        assert "EOFError" in raised["error"]  # stdin is empty
        assert not raised["success"]


async def test_python_is_bounded_in_time_and_output(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {})
        slow = await _call(
            env,
            "execute_python_code",
            code="import time\nprint('began')\ntime.sleep(60)",
            timeout=1,
        )
        assert slow["timed_out"]
        assert (slow["returncode"], slow["output"]) == (124, "began\n")
        assert "did not finish within 1 s" in slow["error"]
        loud = await _call(
            env,
            "execute_python_code",
            code="import sys\nprint('x' * 300_000)\nsys.stderr.write('e' * 150_000)",
        )
        assert loud["output"].startswith("x" * 100_000 + "\n[... 200001 more bytes not shown")
        assert loud["error"].startswith("e" * 100_000 + "\n[... 50000 more bytes not shown")
        left = await _call(
            env,
            "execute_python_code",
            code="import subprocess\nchild = subprocess.Popen(['sleep', '300'])\nprint(child.pid)",
        )
        # aenv run: the instance's processes are the host's; this one was killed
        assert await asyncio.to_thread(_gone, int(left["output"]))
        bad = await env.call_tool("execute_python_code", {"code": "1", "timeout": 500})
        assert bad.is_error
        assert "timeout must be between 1 and 120 seconds" in bad.text


# -- validate -----------------------------------------------------------------------------------


async def test_a_sound_project_validates(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {"files": GOOD_FILES})
        report = await _call(env, "validate")
        assert report == {
            "valid": True,
            "checked": ["css/site.css", "data.json", "index.html", "js/app.js"],
            "errors": [],
            "warnings": [],
        }
        one = await _call(env, "validate", file_path="js/app.js")
        assert one == {"valid": True, "checked": ["js/app.js"], "errors": [], "warnings": []}
        assert "no file `nope.js`" in await _refused(env, "validate", file_path="nope.js")


PAGE_HEAD = "<!DOCTYPE html><html><head><title>t</title></head><body>\n"


@pytest.mark.parametrize(
    ("files", "errors", "warnings"),
    [
        ({}, ["index.html: missing: the preview opens it; write it with write_file"], []),
        (
            {"index.html": PAGE_HEAD + "<div><span>x</div>\n</body></html>"},
            ["index.html:2: `<span>` opened at line 2 is not closed before `</div>` at line 2"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD + "<section>\n<p>x</p>\n</body></html>"},
            ["index.html:2: `<section>` opened at line 2 is not closed before `</body>` at line 4"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD + "</div>\n</body></html>"},
            ["index.html:2: `</div>` closes nothing (no `<div>` is open here)"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD + '<script src="app.js"></script></body></html>'},
            ["index.html:2: `app.js` (script src) is not a file of the project"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD + '<img src="/logo.png"></body></html>', "logo.png": ""},
            [
                "index.html:2: `/logo.png` starts with `/`: in the preview that is outside the "
                "project; write it relative to this page (`logo.png`)"
            ],
            [],
        ),
        (
            {"index.html": "<p>no doctype <br/> <div/></p>"},
            [
                "index.html:1: `<div>` opened at line 1 is not closed before `</p>` at line 1",
            ],
            [
                "index.html:1: `<div/>` is not self-closing in HTML: it opens a `<div>`; write "
                "`<div></div>`",
                "index.html:1: no `<!DOCTYPE html>`: browsers render the page in quirks mode",
                "index.html:1: no `<title>`",
            ],
        ),
        (
            {
                "index.html": PAGE_HEAD
                + '<script src="https://cdn.example/lib.js"></script>\n<p id="a"></p><p id="a">'
                "</p>\n<!-- never closed"
            },
            ["index.html:4: a `<!--` comment is never closed"],
            [
                "index.html:2: `https://cdn.example/lib.js` is loaded from the network: the "
                "preview's policy allows only the project's own files (and an instance has no "
                "network); put the file in the project",
                "index.html:3: id `a` is used again (first at line 3)",
            ],
        ),
        (
            {"index.html": PAGE_HEAD + "<script>\nif (a) {\n  run(;\n}\n</script></body></html>"},
            ["index.html:5: inline <script>: `}` does not match `(` opened at line 4"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD, "app.js": "let s = 'never closed;\n"},
            ["app.js:1: a string opened with ' is not closed on its line"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD, "app.js": "const t = `a ${b} c;\n"},
            ["app.js:1: a template literal (`) is never closed"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD, "app.js": "function f() {\n  return 1;\n"},
            ["app.js:1: `{` opened at line 1 is never closed"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD, "app.js": "x = 1 /* to be continued"},
            ["app.js:1: a `/*` comment is never closed with `*/`"],
            [],
        ),
        (
            {"index.html": PAGE_HEAD, "site.css": "h1 { color: red;\np { colr blue }\n"},
            ["site.css:1: `{` opened at line 1 is never closed"],
            ["site.css:2: `colr blue` is not a `property: value` declaration"],
        ),
        (
            {"index.html": PAGE_HEAD, "data.json": '{"a": 1,}'},
            ["data.json:1: not JSON: Expecting property name enclosed in double quotes"],
            [],
        ),
    ],
    ids=[
        "no-index",
        "misnested",
        "unclosed",
        "stray-end-tag",
        "missing-script",
        "absolute-path",
        "quirks",
        "network-and-comment",
        "inline-js",
        "js-string",
        "js-template",
        "js-brace",
        "js-comment",
        "css",
        "json",
    ],
)
async def test_validate_names_each_mistake(
    runtime: RuntimeProcess, files: dict[str, str], errors: list[str], warnings: list[str]
) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {"files": files})
        report = await _call(env, "validate")
    assert report["valid"] is False
    assert report["errors"] == errors
    assert report["warnings"] == warnings


# -- the reward, the demo -----------------------------------------------------------------------


async def test_the_reward_counts_what_the_page_shows(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        await env.call_function("reset_project", {})
        nothing = await env.call_reward({"expected_text": ["Weather"]})
        # graded by the judge (tests/test_reward_exploits_mini_program.py), which says so
        assert JudgeReport.model_validate(nothing.pop("judge")).scope == "descendants"
        assert nothing == {
            "reward": 0.0,
            "checks": {"page index.html": False},
            "errors": [],
            "reason": "there is no page index.html",
        }
        await env.call_function("reset_project", {"files": GOOD_FILES})
        full = await env.call_reward(
            {
                # shown as text across elements, and what the page lays out after them
                "expected_text": ["Today is  sunny", "one", "two"],
                "expected_files": ["js/app.js", "data.json"],
            }
        )
        assert full["reward"] == 1.0, full
        assert "reason" not in full
        assert full["shown"] == "Weather Today is sunny one two"
        # a script's text, a variable, the title: in the source, not shown; an expected text
        # not shown is the task not done: 0.0, whatever else passes
        unseen = await env.call_reward({"expected_text": ["rendered", "Forecast: rain"]})
        assert unseen["reward"] == 0.0, unseen
        assert unseen["reason"].startswith("the page does not show 'rendered', 'Forecast: rain'")
        partial = await env.call_reward(
            {"expected_text": ["Weather", "Snow"], "expected_files": ["missing.js"]}
        )
        assert partial["checks"] == {
            "page index.html": True,
            "shows 'Weather'": True,
            "shows 'Snow'": False,
            "file missing.js": False,
            "validate": True,
        }
        assert partial["reward"] == 0.0
        assert "does not show 'Snow'" in partial["reason"]
        assert "no file 'missing.js'" in partial["reason"]
        # past the gate (every text shown), the share of the checks that pass
        shown = await env.call_reward(
            {"expected_text": ["Weather"], "expected_files": ["missing.js", "data.json"]}
        )
        assert shown["reward"] == 4 / 5, shown
        assert shown["reason"] == "no file 'missing.js'"
        await _call(env, "write_file", file_path="js/app.js", content="if (x) {")
        broken = await env.call_reward({"expected_text": ["Weather"]})
        assert broken["reward"] == 2 / 3
        assert broken["errors"] == ["js/app.js:1: `{` opened at line 1 is never closed"]
        assert broken["reason"] == "validate found 1 error(s)"


HIDES = {
    "a hidden <div>": '<div style="display:none">{}</div>',
    "a <noscript>": "<noscript>{}</noscript>",
    "a comment": "<!-- {} -->",
    "an element the page's script removes": (
        '<p id="gone">{}</p><script>document.getElementById("gone").remove()</script>'
    ),
    "a script's text": "<script>const answer = '{}';</script>",
    "visibility hidden": '<p style="visibility:hidden">{}</p>',
    "transparent": '<p style="opacity:0">{}</p>',
    "off the page": '<p style="position:absolute;left:-10000px">{}</p>',
    "white on white": '<p style="color:#fff;background:#fff">{}</p>',
    "no size": '<p style="font-size:0">{}</p>',
    "clipped away": (
        '<p style="position:absolute;width:1px;height:1px;overflow:hidden;'
        'clip:rect(0,0,0,0)">{}</p>'
    ),
    "covered by another element": (
        '<div style="position:relative"><p>{}</p>'
        '<div style="position:absolute;inset:0;background:#fff"></div></div>'
    ),
    "a template": "<template><p>{}</p></template>",
    "an attribute": '<p title="{}">hello</p>',
    "shown to a headless browser only": (
        '<p id="w"></p><script>if (navigator.webdriver || /Headless/.test(navigator.userAgent))'
        ' document.getElementById("w").textContent = "{}";</script>'
    ),
}


async def test_text_the_page_does_not_show_is_not_shown(runtime: RuntimeProcess) -> None:
    # every way to hide a text on one page, each with a text of its own
    texts = {name: f"answer number {i} is here" for i, name in enumerate(HIDES)}
    body = "<h1>Answers</h1>" + "".join(
        hide.replace("{}", texts[name]) for name, hide in HIDES.items()
    )
    page = f"<!DOCTYPE html>\n<html><head><title>x</title></head><body>{body}</body></html>"
    async with runtime.environment() as env:
        await env.call_function("reset_project", {"files": {"index.html": page}})
        forged = await env.call_reward({"expected_text": ["Answers", *texts.values()]})
        for name, text in texts.items():
            assert forged["checks"][f"shows {text!r}"] is False, (name, forged["shown"])
        assert forged["checks"]["shows 'Answers'"] is True, forged
        assert forged["checks"]["validate"] is True  # the rest passes, and scores nothing
        assert forged["reward"] == 0.0, forged
        assert forged["reason"].startswith(
            f"the page does not show {texts[next(iter(HIDES))]!r}, "
        ), forged["reason"]
        assert f"and {len(texts) - 5} more" in forged["reason"]
        # each way of hiding alone, next to a text that is shown: 0.0, naming the hidden one
        for name, hide in HIDES.items():
            alone = f"<h1>Answers</h1>{hide.replace('{}', texts[name])}"
            await env.call_function(
                "reset_project", {"files": {"index.html": page.replace(body, alone)}}
            )
            one = await env.call_reward({"expected_text": ["Answers", texts[name]]})
            assert one["reward"] == 0.0, (name, one)
            assert one["reason"].startswith(f"the page does not show {texts[name]!r} "), name
        # the control: the same page with each text also shown
        shown_body = body + "".join(f"<p>{text}</p>" for text in texts.values())
        shown_page = page.replace(body, shown_body)
        await env.call_function("reset_project", {"files": {"index.html": shown_page}})
        shown = await env.call_reward({"expected_text": ["Answers", *texts.values()]})
        assert shown["reward"] == 1.0, shown
        # a page whose script never yields shows nothing, and the next page renders again
        hang = "<!DOCTYPE html>\n<html><body><p>Answers</p><script>for(;;){}</script></body></html>"
        await env.call_function("reset_project", {"files": {"index.html": hang}})
        hung = await env.call_reward({"expected_text": ["Answers"]})
        assert hung["checks"]["shows 'Answers'"] is False
        assert "did not finish loading" in hung["render_error"]
        assert hung["reward"] == 0.0
        assert "it did not render: " in hung["reason"]
        await env.call_function("reset_project", {"files": {"index.html": shown_page}})
        assert (await env.call_reward({"expected_text": ["Answers"]}))["reward"] == 1.0


async def test_every_demo_task_reaches_reward_one(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        for task in demo.TASKS:
            for step in task["setup"]:
                await env.call_function(step["function"], step["arguments"])
            assert await demo.policy(task, env) == "valid", task["id"]
            reward = await env.call_reward(task["reward_arguments"])
            assert reward["reward"] == 1.0, (task["id"], reward)
        broken = demo.TASKS[-1]  # the "fix" task: its starting point does not validate
        for step in broken["setup"]:
            await env.call_function(step["function"], step["arguments"])
        before = await env.call_reward(broken["reward_arguments"])
        assert before["reward"] < 1.0
        assert before["checks"]["validate"] is False


def test_aenv_rollout_runs_the_demo_out_of_the_box(tmp_path: Path) -> None:
    done = run_cli(
        "rollout", "mini-program@1.0.0", "--episodes", "2", "-c", "2", "--no-ray",
        "--policy", "tests._demo_solutions:watched_mini_program",
        "--out", str(tmp_path / "out"), cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    assert sorted(r["task_id"] for r in rows) == sorted(t["id"] for t in demo.TASKS[:2])
    assert {(r["outcome"], r["reward"]) for r in rows} == {("ok", 1.0)}
    assert all(r["reward_components"]["checks"]["validate"] for r in rows)
    # the task the policy got: no reward arguments, no solution; the record's: no solution
    assert_given_no_grader_fields("mini_program", demo.TASKS, rows)
