"""Every ```python block of README.md and docs/*.md runs, for real, in a subprocess.

One test per block, named by page and the line of its fence (``docs/sdk.md:121``). A block runs
with ``sys.executable`` in a fresh temporary directory, its output captured, and passes when it
ends without an exception. Blocks that start no Ray share one driver process with the other
blocks of the same set-ups, where those set-ups serve several alike (``SHARED_SETUPS``), each
block in a namespace of its own and, without set-ups, a directory of its own (``_batch_of``):
Python's start-up, the imports, the local engine's templates and what the set-ups start (a
served project, a hub) are paid once, not per block. A block that starts Ray
(``rollout.init_local``) joins the test session's one Ray instead, by ``RAY_ADDRESS``
(tests/_session_ray.py). An HTML comment on the lines just above a fence changes that:

``<!-- fragment: REASON -->``
    Not run, on purpose: a signature listing, a snippet with placeholders for a user's own
    service, or code that needs what a test cannot have (an OpenAI key, a real trainer). The
    reason is mandatory, and fragments are few (:data:`MAX_FRAGMENTS`).
``<!-- file: PATH -->``
    The block (of any language) is the file PATH of a project the page builds (README's
    ``notes/src/notes.py``, environments.md's ``guess/...``). The set-ups below write those
    projects; a Python file block's own test loads its project with ``check_environment``.
``<!-- setup: NAME[, NAME] -->``
    Run under the named set-ups, in order:

    - ``repo-root``: the working directory is the repository root, as in a clone (for blocks
      naming ``builtin_envs/mini_terminal``).
    - ``notes-project``: ``aenv init notes`` in the temporary directory, its ``src/notes.py``
      replaced by README's file block; ``AENV_ENV_PATH=.`` (the working directory), so
      ``notes@1.0.0`` resolves by name.
    - ``guess-project``: environments.md's ``guess`` project written from its file blocks, on
      ``AENV_ENV_PATH`` likewise.
    - ``mini-terminal-served`` / ``guess-served``: the project served as ``aenv run`` serves it
      (``RuntimeProcess``) and ``DUMMY_INSTANCE_IP=http://localhost``, on free ports, not
      8080/8081: ``AENV_FUNCTIONS_PORT``/``AENV_MCP_PORT`` name them, and ``127.0.0.1:8080`` and
      ``127.0.0.1:8081`` in the block's text are replaced by them.
    - ``hub-notes``: a real hub (``aenv serve`` via ``tests/_hub.py``, no auth, engine in
      process) with README's ``notes`` pushed to it by ``aenv push``; ``AENV_SYSTEM_URL`` names it.
    - ``agent-stand-in``: for builtins.md's agent: a deterministic stand-in model
      (``tests/_chat_server.AgentModel``) whose URL replaces ``http://127.0.0.1:30000/v1`` in the
      block, a real hub with auth and ``--allow-network`` (``AENV_SYSTEM_URL``, a key in
      ``AENV_API_KEY``) with ``examples/agent_b`` pushed to it, a made-up ``OPENAI_API_KEY``.
    - ``chat-stand-in``: for rollout.md's RL example: the deterministic OpenAI-compatible
      server of the rollout tests (``tests/_chat_server.ChatServer``: byte-level token ids and
      logprobs, as vLLM returns them), whose URL replaces ``http://127.0.0.1:8000/v1``.
    - ``trl-venv``: for training.md's TRL example: the block runs with the interpreter of TRL's
      own virtual environment (tests/_oracles.py's ``TRL``: trl, transformers, torch's CPU
      build and this checkout's aenv-ray), made once; where it cannot be made the test skips
      saying why (under ``AENV_REQUIRE_ORACLES=1``, fails).
    - ``areal-venv``: for training.md's AReaL example: the block runs with the interpreter of
      AReaL's own virtual environment (tests/_oracles.py's ``AREAL``: areal 1.0.4, torch's CPU
      build and this checkout's aenv-ray), skipped like ``trl-venv`` where it cannot be made.
    - ``openenv-python``: the block runs with OpenEnv's interpreter (its own virtual
      environment, tests/_oracles.py's ``OPENENV``), not this one: OpenEnv's client code.
    - ``openenv-served``: ``aenv openenv serve mini-terminal@1.0.0`` (at most 2 sessions, the
      local engine) on a free port, whose URL replaces ``http://127.0.0.1:8000`` in the block.
    - ``openenv-counter``: an OpenEnv project, ``counter/`` (tests/_openenv.py), on
      ``AENV_ENV_PATH``, OpenEnv's virtual environment in ``OPENENV_VENV``, and this
      checkout's CLI in ``AENV_OPENENV_COMMAND`` (what ``AenvRayProcessProvider`` runs).
    - ``pytest``: the block is a test module: run by pytest (``asyncio_mode=auto``, as this
      repository's tests), which must pass at least one test and fail none; the modules of the
      blocks with the same set-ups run in one pytest.
    - ``harbor-venv``: the block runs with the Python of Harbor's own virtual environment
      (tests/_oracles.py ``HARBOR``: Python 3.12, ``harbor==0.25.0``, aenv-ray from this
      checkout), first on ``PATH``; skipped where it cannot be installed (ecosystem.md).
    - ``continues``: the block goes on from the previous Python block of its page, in the same
      process and under its set-ups: a page that builds a pool once and uses it in later
      sections (rollout.md), or one Ray shared by sections that each need one (rollout.md's
      gymnasium section, which needs none itself, goes on in the pool sections' process so that
      its `PoolSource` example finds Ray started).

A ``print(...)`` whose line ends in a comment claims its output: ``print(x)  # lazy True`` passes
only if the block printed a line ``lazy True`` (whitespace ignored; ``...`` matches anything,
``PORT`` any number). Comment lines right after it that start with ``#  `` (two spaces) continue
the claim; a ``print`` with no comment of its own takes the next comment line. Comment lines right
after ``asyncio.run(...)`` claim one output line each. A claim is borne out by any line of the
block's output (not in order: a function's prints come when it is called).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import tokenize
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aenv_ray.engine import named_engine
from aenv_ray.testing import ConformanceError, RuntimeProcess, check_environment
from tests._chat_server import AgentModel, ChatServer
from tests._cli import aenv as run_cli
from tests._hub import HubProcess, new_key
from tests._openenv import OpenEnvServe
from tests._oracles import AREAL, HARBOR, TRL, oracle_python

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
MAX_FRAGMENTS = 6
SESSION_TIMEOUT = 300.0  # a guard against a hang, not a measurement
MARK = "@@docs-example@@"

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*([a-z-]+)\s*:\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    fragment: str | None = None
    file: str | None = None
    setups: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def _parse(page: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a page, with their markers, and the problems with its markers."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used: set[int] = set()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        block = Block(page, i + 1, opening.group(1), "\n".join(lines[i + 1 : end]) + "\n")
        j = i - 1
        while j >= 0 and _MARKER.match(lines[j]):
            used.add(j)
            kind, value = _MARKER.match(lines[j]).groups()  # type: ignore[union-attr]
            where = f"{page}:{j + 1}"
            if kind == "fragment":
                block.fragment = value
                if len(value.split()) < 3:
                    problems.append(f"{where}: a fragment marker must say why, in a few words")
            elif kind == "file":
                block.file = value
            elif kind == "setup":
                names = [name.strip() for name in value.split(",")]
                unknown = [name for name in names if name not in SETUPS]
                if unknown:
                    problems.append(f"{where}: unknown set-up {unknown}; known: {sorted(SETUPS)}")
                block.setups = names + block.setups
            else:
                problems.append(f"{where}: unknown marker `{kind}`")
            j -= 1
        blocks.append(block)
        i = end + 1
    for n, text in enumerate(lines):
        if text.startswith("<!--") and _MARKER.match(text) and n not in used:
            problems.append(f"{page}:{n + 1}: a marker must be on the line(s) just above a fence")
    return blocks, problems


def _all_blocks() -> tuple[list[Block], list[str]]:
    blocks: list[Block] = []
    problems: list[str] = []
    for page in PAGES:
        found, wrong = _parse(page)
        blocks += found
        problems += wrong
    return blocks, problems


# -- output claims ---------------------------------------------------------------------------------


def _comments(code: str) -> dict[int, tuple[int, str]]:
    """Line -> (column, text after '#') of every comment."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = (token.start[1], token.string[1:])
    return found


def _is_call(node: ast.AST, name: str) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func) == name
    )


def claims(code: str) -> list[str]:
    """What the block's comments say it prints, in source order (see the module docstring)."""
    lines = code.splitlines()
    comments = _comments(code)

    def comment_only(n: int) -> str | None:
        if n <= len(lines) and lines[n - 1].lstrip().startswith("#") and n in comments:
            return comments[n][1]
        return None

    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(code)):
        is_print, is_run = _is_call(node, "print"), _is_call(node, "asyncio.run")
        if not (is_print or is_run):
            continue
        last = node.end_lineno or node.lineno
        parts: list[str] = []
        if last in comments and comment_only(last) is None:
            parts.append(comments[last][1])
        n = last + 1
        while (text := comment_only(n)) is not None:
            if text.startswith("  ") and parts:
                parts[-1] += " " + text.strip()
            elif is_run or not parts:
                parts.append(text)
            else:
                break
            n += 1
        if is_print and parts:
            parts = [" ".join(parts)]
        found += [(node.lineno, part.strip()) for part in parts]
    return [text for _, text in sorted(found, key=lambda item: item[0])]


def _pattern(claim: str) -> re.Pattern[str]:
    pieces = []
    for piece in re.split(r"(\.\.\.|PORT\d*)", claim):
        if piece == "...":
            pieces.append(".*")
        elif re.fullmatch(r"PORT\d*", piece):
            pieces.append(r"\d+")
        else:
            pieces.append(re.escape(re.sub(r"\s+", "", piece)))
    return re.compile("".join(pieces))


def unmatched_claims(code: str, output: str) -> list[str]:
    """The claims that no line of the output bears out."""
    printed = [re.sub(r"\s+", "", line) for line in output.splitlines()]
    return [c for c in claims(code) if not any(_pattern(c).fullmatch(p) for p in printed)]


def test_claims_are_read_as_documented() -> None:
    code = (
        "import asyncio\n"
        "print(1)  # 1\n"
        "print({'a': 1,\n"
        "       'b': 2})  # {'a': 1,\n"
        "#  'b': 2}\n"
        "# a remark, not output\n"
        "x = 1  # not a print\n"
        "print(x)\n"
        "# 1\n"
        "asyncio.run(main())\n"
        "# first\n"
        "# second ...\n"
    )
    assert claims(code) == ["1", "{'a': 1, 'b': 2}", "1", "first", "second ..."]
    assert unmatched_claims(code, "1\n{'a': 1, 'b': 2}\n1\nfirst\nsecond and more\n") == []
    assert unmatched_claims(code, "1\n{'a': 1, 'b': 3}\nfirst\nsecond\n") == ["{'a': 1, 'b': 2}"]
    assert unmatched_claims("print(2)  # http://h:PORT/x\n", "http://h:80/x\n") == []
    assert unmatched_claims("print(2)  # 1.0\n", "10\n") == ["1.0"]


# -- set-ups ---------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a session of blocks runs with; set-ups change it."""

    tmp: Path
    blocks: list[Block]
    stack: contextlib.ExitStack
    cwd: Path
    env: dict[str, str]
    rewrites: list[tuple[str, str]] = field(default_factory=list)
    pytest: bool = False
    python: str = sys.executable  # the interpreter the blocks run with

    def run(self, *args: str, cwd: Path | None = None) -> str:
        """``aenv ARGS`` in this process (tests/_cli.py), with the session's environment."""
        done = run_cli(*args, cwd=cwd or self.tmp, environ=self.env)
        assert done.returncode == 0, f"aenv {' '.join(args)}: {done.stdout}{done.stderr}"
        return done.stdout


def write_files(ctx: Context, project: str) -> Path:
    """Write the page's file blocks of ``project`` under ``ctx.tmp``; the project's path."""
    files = [b for b in ctx.blocks if b.file and b.file.split("/")[0] == project]
    assert files, f"no file blocks of `{project}`"
    for block in files:
        assert block.file is not None
        path = ctx.tmp / block.file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.code, encoding="utf-8")
    return ctx.tmp / project


def repo_root(ctx: Context) -> None:
    ctx.cwd = ROOT


def notes_project(ctx: Context) -> None:
    if not (ctx.tmp / "notes").exists():
        ctx.run("init", "notes")
        write_files(ctx, "notes")
    ctx.env["AENV_ENV_PATH"] = "."  # as README says: run from the directory holding notes/


def guess_project(ctx: Context) -> None:
    write_files(ctx, "guess")
    ctx.env["AENV_ENV_PATH"] = str(ctx.tmp)


def _served(ctx: Context, project: Path) -> None:
    runtime = ctx.stack.enter_context(RuntimeProcess(project))
    ctx.env.update(
        DUMMY_INSTANCE_IP="http://localhost",
        AENV_FUNCTIONS_PORT=str(runtime.port),
        AENV_MCP_PORT=str(runtime.mcp_port),
    )
    ctx.rewrites += [
        ("127.0.0.1:8080", f"127.0.0.1:{runtime.port}"),
        ("127.0.0.1:8081", f"127.0.0.1:{runtime.mcp_port}"),
    ]


def mini_terminal_served(ctx: Context) -> None:
    _served(ctx, ROOT / "builtin_envs" / "mini_terminal")


def guess_served(ctx: Context) -> None:
    _served(ctx, write_files(ctx, "guess"))


def hub_notes(ctx: Context) -> None:
    notes_project(ctx)
    del ctx.env["AENV_ENV_PATH"]  # the instance comes from the hub, not from a local project
    hub = ctx.stack.enter_context(HubProcess(ctx.tmp / "hub", auth=False, env=ctx.env))
    ctx.env["AENV_SYSTEM_URL"] = hub.url
    assert "published notes@1.0.0" in ctx.run("push", "notes")


def agent_stand_in(ctx: Context) -> None:
    model = ctx.stack.enter_context(ChatServer(AgentModel()))
    hub = HubProcess(ctx.tmp / "hub", extra=["--allow-network"], env=ctx.env)
    ctx.stack.enter_context(hub)
    ctx.env.update(
        AENV_SYSTEM_URL=hub.url,
        AENV_API_KEY=new_key("docs", hub.store),
        OPENAI_API_KEY="sk-docs-stand-in",
    )
    ctx.rewrites.append(("http://127.0.0.1:30000/v1", model.url))
    assert "published agent-b@1.0.0" in ctx.run("push", str(ROOT / "examples" / "agent_b"))


def chat_stand_in(ctx: Context) -> None:
    model = ctx.stack.enter_context(ChatServer())
    ctx.rewrites.append(("http://127.0.0.1:8000/v1", model.url))


def trl_venv(ctx: Context) -> None:
    ctx.python = str(oracle_python(TRL))


def areal_venv(ctx: Context) -> None:
    ctx.python = str(oracle_python(AREAL))
    ctx.env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # AReaL's litellm: no fetch at import


def openenv_python(ctx: Context) -> None:
    from tests._oracles import OPENENV, oracle_python

    ctx.python = str(oracle_python(OPENENV))


def openenv_served(ctx: Context) -> None:
    server = ctx.stack.enter_context(OpenEnvServe("mini-terminal@1.0.0", env=ctx.env))
    ctx.rewrites.append(("http://127.0.0.1:8000", server.url))


def openenv_counter(ctx: Context) -> None:
    from tests._openenv import counter_project
    from tests._oracles import OPENENV, oracle_python

    counter_project(ctx.tmp / "counter")
    ctx.env["AENV_ENV_PATH"] = str(ctx.tmp)
    ctx.env["OPENENV_VENV"] = str(oracle_python(OPENENV).parent.parent)
    ctx.env["AENV_OPENENV_COMMAND"] = f"{sys.executable} -m aenv_cli"  # AenvRayProcessProvider


def pytest_module(ctx: Context) -> None:
    ctx.pytest = True


def harbor_venv(ctx: Context) -> None:
    # Harbor (Python 3.12+) in its own virtual environment, with aenv-ray from this checkout
    ctx.python = str(oracle_python(HARBOR))
    ctx.env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # Harbor's litellm: no fetch at import
    ctx.env["PATH"] = f"{Path(ctx.python).parent}{os.pathsep}{ctx.env.get('PATH', '')}"


def continues(ctx: Context) -> None:
    raise AssertionError("`continues` joins the previous block's session; it sets nothing up")


SETUPS: dict[str, Callable[[Context], None]] = {
    "agent-stand-in": agent_stand_in,
    "areal-venv": areal_venv,
    "chat-stand-in": chat_stand_in,
    "continues": continues,
    "guess-project": guess_project,
    "guess-served": guess_served,
    "harbor-venv": harbor_venv,
    "hub-notes": hub_notes,
    "mini-terminal-served": mini_terminal_served,
    "notes-project": notes_project,
    "openenv-counter": openenv_counter,
    "openenv-python": openenv_python,
    "openenv-served": openenv_served,
    "pytest": pytest_module,
    "repo-root": repo_root,
    "trl-venv": trl_venv,
}

BLOCKS, MARKER_PROBLEMS = _all_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]
RUNNING = [b for b in PYTHON if b.fragment is None]


def _session_of(block: Block) -> list[Block]:
    """The blocks that run in one process with ``block``: its chain of ``continues``."""
    page = [b for b in RUNNING if b.page == block.page]
    start = page.index(block)
    while "continues" in page[start].setups:
        assert start > 0, f"{page[start].id} continues nothing"
        start -= 1
    end = page.index(block)
    while end + 1 < len(page) and "continues" in page[end + 1].setups:
        end += 1
    return page[start : end + 1]


# Sessions share one driver process (a batch), each in a namespace of its own, in reading order:
# Python's start-up, the imports and the process's local engine (a template started by one block
# serves the next) are paid once, not per block. Sessions without set-ups each get a directory of
# their own. Sessions whose set-ups are the same SHARED_SETUPS share them too: one served
# mini-terminal, one hub with notes pushed, the repository root as working directory, as each
# would have alone. A session that starts Ray keeps a process of its own: Ray initialized by one
# block must not be what makes another block work.
_STARTS_RAY = re.compile(r"\binit_local\(|\bRolloutPool\(|\bray\.init\(")

SHARED_SETUPS = frozenset(
    {
        "guess-project",
        "guess-served",
        "hub-notes",
        "mini-terminal-served",
        "notes-project",
        "pytest",
        "repo-root",
    }
)
"""Set-ups that serve several sessions alike: a working directory, a project on
``AENV_ENV_PATH``, a served project or a hub that each session only calls, pytest (the modules
of one batch run in one pytest process, each its own module)."""


def _batch_key(session: list[Block]) -> tuple[str, ...] | None:
    """What sessions must have in common to share a driver (their set-ups), or None: this one
    runs alone (it starts Ray, is a project's file, or has a set-up of its own)."""
    setups = tuple(session[0].setups)
    if (
        session[0].file is not None
        or not SHARED_SETUPS.issuperset(setups)
        or any(_STARTS_RAY.search(block.code) for block in session)
    ):
        return None
    return setups


def _batch_of(block: Block) -> list[list[Block]]:
    """The sessions that run in one driver process (or one pytest) with ``block``'s."""
    session = _session_of(block)
    key = _batch_key(session)
    if key is None:
        return [session]
    batch: list[list[Block]] = []
    for other in RUNNING:
        if other.file is None and not any(other in s for s in batch):
            candidate = _session_of(other)
            if candidate[0] is other and _batch_key(candidate) == key:
                batch.append(candidate)
    return batch


# -- running ---------------------------------------------------------------------------------------

DRIVER = f"""
import json, os, signal, sys, traceback


def out_of_time(signum, frame):
    raise TimeoutError("the session ran past {SESSION_TIMEOUT:g} s: a hang?")


signal.signal(signal.SIGALRM, out_of_time)
for session in json.load(open(sys.argv[1], encoding="utf-8")):
    os.chdir(session["cwd"])
    namespace = {{"__name__": "__main__"}}
    signal.alarm(int({SESSION_TIMEOUT!r}))  # each session's own guard against a hang
    for block in session["blocks"]:
        for stream in (sys.stdout, sys.stderr):
            print({MARK!r}, "start", block["id"], file=stream, flush=True)
        try:
            code = compile("\\n" * block["line"] + block["code"], block["page"], "exec")
            exec(code, namespace)
        except BaseException:
            sys.stdout.flush()
            traceback.print_exc()
            sys.stderr.flush()
            print({MARK!r}, "failed", block["id"], flush=True)
            break  # the rest of this session never runs; the next session does
        sys.stdout.flush()
        print({MARK!r}, "ok", block["id"], flush=True)
    signal.alarm(0)
"""


@dataclass
class Outcome:
    ok: bool
    output: str
    log: str  # what to show when it failed
    code: str = ""  # what ran (after the set-ups' rewrites)


def _base_env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AENV_") and k not in {"DUMMY_INSTANCE_IP", "PYTEST_CURRENT_TEST"}
    }
    env["AENV_CONFIG_FILE"] = str(tmp / "no-aenv-config.json")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_sessions(
    sessions: list[list[Block]], tmp: Path, ray_env: dict[str, str] | None = None
) -> dict[str, Outcome]:
    """Run ``sessions`` (one, or several without set-ups: :func:`_batch_of`) in one driver
    process, each in a directory of its own under ``tmp`` and a namespace of its own;
    ``ray_env``: the Ray that a block starting one joins instead (``RAY_ADDRESS``)."""
    tmp.mkdir(parents=True)
    blocks = [block for session in sessions for block in session]
    with contextlib.ExitStack() as stack:
        ctx = Context(tmp, BLOCKS, stack, tmp, _base_env(tmp))
        ctx.env.update(ray_env or {})
        for name in blocks[0].setups:
            SETUPS[name](ctx)
        sources, plan = [], []
        for session in sessions:
            cwd = ctx.cwd  # with set-ups, theirs: as each session would have alone
            if len(sessions) > 1 and not blocks[0].setups:
                cwd = tmp / re.sub(r"\W", "_", session[0].id)
                cwd.mkdir()
            plan.append({"cwd": str(cwd), "blocks": []})
            for block in session:
                code = block.code
                for old, new in ctx.rewrites:
                    code = code.replace(old, new)
                source = {"id": block.id, "page": block.page, "line": block.line, "code": code}
                sources.append(source)
                plan[-1]["blocks"].append(source)
        if ctx.pytest:
            return _run_pytest(ctx, sources)
        script = tmp / "blocks.json"
        script.write_text(json.dumps(plan), encoding="utf-8")
        timeout = SESSION_TIMEOUT * len(sessions) + 60  # the driver times each session out
        try:
            done = subprocess.run(
                [ctx.python, "-c", DRIVER, str(script)],
                cwd=ctx.cwd,
                env=ctx.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            stdout, stderr = done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
            stderr += f"\n(no end within {timeout:g} s)"
    outcomes = {}
    for block, source in zip(blocks, sources, strict=True):
        started = f"{MARK} start {block.id}\n"
        if started not in stdout:
            outcomes[block.id] = Outcome(
                False, "", f"never ran (an earlier block of its session failed)\n{stderr[-6000:]}"
            )
            continue
        own = stdout.split(started, 1)[1].split(f"{MARK} ", 1)[0]
        own_err = stderr.split(started, 1)[-1].split(f"{MARK} ", 1)[0]  # its part, if marked
        ok = f"{MARK} ok {block.id}\n" in stdout
        log = f"stdout:\n{own}\nstderr:\n{own_err[-6000:]}"
        outcomes[block.id] = Outcome(ok, own, log, source["code"])
    return outcomes


NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""Hypothesis's pytest plugin, which this venv has for the suite's own tests and no block uses,
left out of the pytests the blocks run: it is most of a small pytest's start-up (about 1 s of
CPU of 1.6)."""


def _module_name(block_id: str) -> str:
    return "test_doc_" + re.sub(r"\W", "_", block_id)


def _run_pytest(ctx: Context, sources: list[dict[str, object]]) -> dict[str, Outcome]:
    """Each source a test module of its own, all run by one pytest; a module passes when at
    least one of its tests passed and none failed or erred."""
    modules = {}
    for source in sources:
        module = ctx.tmp / f"{_module_name(str(source['id']))}.py"
        module.write_text(str(source["code"]), encoding="utf-8")
        modules[str(source["id"])] = module.name
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-rA", "--continue-on-collection-errors"),
            *("-p", "no:cacheprovider", *NO_HYPOTHESIS),
            *("-o", "asyncio_mode=auto", "--rootdir", str(ctx.tmp)),
            *(str(ctx.tmp / name) for name in modules.values()),
        ],
        cwd=ctx.cwd,
        env=ctx.env,
        capture_output=True,
        text=True,
        timeout=SESSION_TIMEOUT * len(sources),
        check=False,
    )
    summary = done.stdout.split("short test summary info", 1)[-1].splitlines()
    outcomes = {}
    for block_id, module in modules.items():
        ran = [line.split()[0] for line in summary if f" {module}" in line]
        ok = "PASSED" in ran and not {"FAILED", "ERROR"} & set(ran)
        outcomes[block_id] = Outcome(ok, "", done.stdout[-6000:] + done.stderr[-3000:])
    return outcomes


_RESULTS: dict[str, Outcome] = {}


@pytest.fixture(scope="module")
def session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs")


def _python_file_check(ctx_tmp: Path, block: Block) -> Outcome:
    """A Python file block: its project passes ``check_environment`` (in a sandbox of this
    process's local engine, the session's warm one), or for a test module, the project's own
    tests pass (``aenv test``, in this process: the script it runs is a child of its own)."""
    assert block.file is not None
    project = block.file.split("/")[0]
    tmp = ctx_tmp / f"file-{project}-{block.line}"
    tmp.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        ctx = Context(tmp, BLOCKS, stack, tmp, _base_env(tmp))
        {"notes": notes_project, "guess": guess_project}[project](ctx)
        if "/tests/" in block.file:  # a test of the project: its own test command runs it
            addopts = {"PYTEST_ADDOPTS": " ".join(NO_HYPOTHESIS)}  # the script's pytest's
            done = run_cli("test", project, cwd=tmp, environ={**ctx.env, **addopts}, fds=True)
            return Outcome(done.returncode == 0, done.stdout, done.stdout + done.stderr[-6000:])
        try:
            report = asyncio.run(check_environment(tmp / project, engine=named_engine("local")))
        except ConformanceError as exc:
            return Outcome(False, "", str(exc))
        return Outcome(True, str(sorted(report.results)), str(sorted(report.results)))


# set-ups that run an original's own package (a trainer, OpenEnv) in its virtual environment:
# the `oracle` lane's
ORACLE_SETUPS = frozenset(
    {"trl-venv", "areal-venv", "openenv-python", "openenv-counter", "harbor-venv"}
)


def _param(block: Block) -> object:
    oracle = ORACLE_SETUPS.intersection(block.setups)
    return pytest.param(block, id=block.id, marks=[pytest.mark.oracle] if oracle else [])


# the batch's first test runs its sessions (each under the driver's own SESSION_TIMEOUT guard)
@pytest.mark.timeout(SESSION_TIMEOUT * 2)
@pytest.mark.parametrize("block", [_param(b) for b in RUNNING])
def test_docs_example(block: Block, session_dir: Path, request: pytest.FixtureRequest) -> None:
    if block.file is not None and not block.setups:
        outcome = _python_file_check(session_dir, block)
        assert outcome.ok, f"{block.id} (the file {block.file}) fails its check:\n{outcome.log}"
        return
    if block.id not in _RESULTS:
        sessions = _batch_of(block)
        name = re.sub(r"\W", "_", sessions[0][0].id) + ("-batch" if len(sessions) > 1 else "")
        starts_ray = any(_STARTS_RAY.search(b.code) for s in sessions for b in s)
        # a block that starts Ray (rollout.init_local) joins the session's, as RAY_ADDRESS
        # makes it: the page's point is the pool, not Ray's start (test_rollout_faults's is)
        ray_env = request.getfixturevalue("session_ray").env if starts_ray else None
        _RESULTS.update(run_sessions(sessions, session_dir / name, ray_env))
    outcome = _RESULTS[block.id]
    assert outcome.ok, f"{block.id} failed:\n{outcome.log}"
    missing = unmatched_claims(outcome.code, outcome.output)
    assert not missing, f"{block.id} printed something else than its comments say: {missing}\n" + (
        f"it printed:\n{outcome.output}"
    )


# -- the markers -----------------------------------------------------------------------------------


def test_the_blocks_are_found() -> None:
    ids = {b.id for b in PYTHON}
    assert len(PYTHON) >= 30, ids
    assert {b.page for b in PYTHON} >= {"README.md", "docs/sdk.md", "docs/rollout.md"}


def test_markers_are_well_formed() -> None:
    assert MARKER_PROBLEMS == []
    for block in BLOCKS:
        if block.lang != "python" and (block.fragment or block.setups):
            pytest.fail(f"{block.id}: only Python blocks run; a {block.lang} block takes `file`")
        if "continues" in block.setups:
            assert block.setups == ["continues"], f"{block.id}: `continues` takes no other set-up"
        if block.fragment is not None:
            assert not block.setups, f"{block.id}: a fragment runs nothing"
            assert block.file is None, f"{block.id}: a fragment is no project's file"


def test_fragments_are_few_and_say_why() -> None:
    fragments = {b.id: b.fragment for b in PYTHON if b.fragment is not None}
    assert len(fragments) <= MAX_FRAGMENTS, fragments
    assert all(reason and len(reason.split()) >= 3 for reason in fragments.values()), fragments


def test_every_file_block_is_used() -> None:
    """A file block belongs to a project a set-up writes (``notes`` or ``guess``)."""
    projects = {"notes", "guess"}
    for block in BLOCKS:
        if block.file is not None:
            assert block.file.split("/")[0] in projects, block.id
