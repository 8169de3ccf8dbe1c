"""OpenAI function names for tools: always valid, unique, reversible; list_openai_tools' shape.

Env names and versions are drawn from what ``config.json`` accepts and tool names from what the
registry accepts, so every case here is one a real environment can produce.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from aenv_ray.openai_tools import OPENAI_NAME, OpenAINames, split_openai_name, to_openai_tools
from aenv_ray.testing import RuntimeProcess

# what config.json accepts (aenv_ray.config) and what the registry accepts (aenv_ray.registry)
env_names = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,62}", fullmatch=True)
versions = st.from_regex(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}", fullmatch=True)
env_refs = st.builds(lambda n, v: f"{n}@{v}", env_names, versions)
tool_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,63}", fullmatch=True)
# 60 to 64 characters: past 64 with any env prefix (at least `0_0__`), so always hashed
long_tool_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{59,63}", fullmatch=True)
# what most environments are: no `_` in the name, a version of digits and dots
ordinary_env_refs = st.builds(
    lambda n, v: f"{n}@{v}",
    st.from_regex(r"[a-z0-9][a-z0-9-]{0,40}", fullmatch=True),
    st.from_regex(r"[0-9]{1,3}(\.[0-9]{1,3}){0,3}", fullmatch=True),
)
# short names over a few characters, with plenty of `_`, `.`, `+` and `__` (old_twins below)
near_env_refs = st.one_of(
    st.from_regex(r"[a1][a1_-]{0,3}", fullmatch=True),
    st.builds(
        lambda n, v: f"{n}@{v}",
        st.from_regex(r"[a1][a1_-]{0,3}", fullmatch=True),
        st.from_regex(r"[1a][1a._+-]{0,4}", fullmatch=True),
    ),
)
near_tools = st.from_regex(r"a[a1_-]{0,4}", fullmatch=True)


def _check_table(env: str, tools: set[str]) -> dict[str, str]:
    names = OpenAINames(env)
    mapped = {tool: names.to_openai(tool) for tool in tools}
    for tool, name in mapped.items():
        assert OPENAI_NAME.fullmatch(name), name
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name), name  # the pattern itself, spelled out
        assert names.from_openai(name, tools) == tool
    assert len(set(mapped.values())) == len(tools), mapped
    return mapped


def _old_readable(env: str, tool: str) -> str:
    # the form every name had before session 36, which recorded trajectories carry
    return re.sub(r"[^a-zA-Z0-9_-]", "_", env) + "__" + tool


def _is_hashed(name: str) -> bool:
    return "__" not in name and split_openai_name(name) is None


@given(env=env_refs, tools=st.sets(tool_names, min_size=1, max_size=30))
def test_names_are_valid_unique_and_reversible(env: str, tools: set[str]) -> None:
    _check_table(env, tools)


@given(env=env_refs, tools=st.sets(long_tool_names, min_size=2, max_size=30))
def test_long_names_are_valid_unique_and_reversible(env: str, tools: set[str]) -> None:
    mapped = _check_table(env, tools)
    assert all(_is_hashed(name) for name in mapped.values()), mapped


@given(
    env=env_refs,
    stem=st.from_regex(r"[A-Za-z][A-Za-z0-9_]{54,58}", fullmatch=True),
    endings=st.sets(st.from_regex(r"[A-Za-z0-9_-]{1,4}", fullmatch=True), min_size=2),
)
def test_names_differing_only_past_the_cut_stay_distinct(
    env: str, stem: str, endings: set[str]
) -> None:
    # everything the hint keeps is equal; only the hash tells them apart
    tools = {f"{stem}{ending}"[:64] for ending in endings}
    assume(len(tools) >= 2)
    _check_table(env, tools)


@given(env=ordinary_env_refs, tool=tool_names)
def test_ordinary_names_keep_their_readable_form(env: str, tool: str) -> None:
    # an environment named without `_`, versioned in digits and dots, keeps the names users and
    # recorded trajectories know wherever they fit
    name = OpenAINames(env).to_openai(tool)
    if len(_old_readable(env, tool)) <= 64:
        assert name == _old_readable(env, tool)
        assert split_openai_name(name) == (env, tool)
    else:
        assert _is_hashed(name), name


@given(env=env_refs, tool=tool_names)
def test_names_are_stable_and_read_back_or_hashed(env: str, tool: str) -> None:
    # the same pair gives the same name in any process (an agent may have learnt it)
    name = OpenAINames(env).to_openai(tool)
    assert OpenAINames(env).to_openai(tool) == name
    if "__" in name:
        assert split_openai_name(name) == (env, tool)
        assert name == _old_readable(env, tool)
    else:
        assert split_openai_name(name) is None
        assert re.fullmatch(r"([a-zA-Z0-9-]+(_[a-zA-Z0-9-]+)*_)?[0-9a-f]{16}", name), name


@given(env=st.text(max_size=80), tool=st.text(max_size=80), others=st.sets(st.text(max_size=8)))
def test_any_text_gets_a_valid_reversible_name(env: str, tool: str, others: set[str]) -> None:
    # refs from elsewhere than config.json (an attached runtime's, a lease's) are not checked
    assume(tool not in others)
    _check_table(env, {tool, *others})


@given(env=env_refs, tools=st.sets(tool_names, min_size=1, max_size=10), other=tool_names)
def test_a_name_of_no_listed_tool_maps_to_nothing(env: str, tools: set[str], other: str) -> None:
    assume(other not in tools)
    names = OpenAINames(env)
    assert names.from_openai(names.to_openai(other), tools) is None
    assert names.from_openai("", tools) is None


def test_known_examples() -> None:
    names = OpenAINames("mini-terminal@1.0.0")
    assert names.to_openai("execute_command") == "mini-terminal_1_0_0__execute_command"
    assert names.from_openai("mini-terminal_1_0_0__nope", {"execute_command"}) is None
    assert OpenAINames("mini-terminal").to_openai("execute_command") == (
        "mini-terminal__execute_command"
    )
    assert OpenAINames("tau2@1.0.0").to_openai("get_order_details") == (
        "tau2_1_0_0__get_order_details"
    )
    first = names.to_openai("execute_a_really_long_command_name_number_one_" + "x" * 20)
    second = names.to_openai("execute_a_really_long_command_name_number_two_" + "x" * 20)
    assert first != second
    assert first.startswith("execute_a_really_long_command_name_number_one_")  # the tool first
    assert second.startswith("execute_a_really_long_command_name_number_two_")
    assert _is_hashed(first)
    assert _is_hashed(second)
    # the digest is SHA-256's, not Python's per-process hash(): these are the names in any process
    assert OpenAINames("my_env@1.0.0").to_openai("run") == "my_env_run_f051546b8e606e0b"
    assert names.to_openai("x" * 70) == "x" * 47 + "_a3b658cda92c86a3"
    # not decodable, so hashed: `_` in the env's name, a version that is not digits and dots
    for env in ("my_env@1.0.0", "my-env@1.0.0-rc1", "my-env@latest", "my-env@1.0+b"):
        name = OpenAINames(env).to_openai("run")
        assert _is_hashed(name), (env, name)
        assert OpenAINames(env).from_openai(name, {"run", "walk"}) == "run"
    assert split_openai_name("my_env_1_0_0__run") is None  # what `my_env@1.0.0` would have been
    assert split_openai_name("a_1__") is None
    assert split_openai_name("a_1_0__9x") is None  # tools start with a letter
    assert split_openai_name("a_1_0__x") == ("a@1.0", "x")


def test_a_plain_name_never_equals_another_tools_hashed_name() -> None:
    # a 70-character tool's name is hashed; a tool named like that hash, or like what follows
    # the env's prefix, is a different pair and gets a different name
    names = OpenAINames("e@1")
    long_tool = "x" * 70
    hashed = names.to_openai(long_tool)
    assert _is_hashed(hashed)
    twins = {hashed, hashed.removeprefix("e_"), hashed[: len(hashed) - 5]}
    for twin in twins:
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,63}", twin)
    _check_table("e@1", {long_tool, *twins})


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (("a@1.0", "t"), ("a_1@0", "t")),  # `.` and `@` both became `_`
        (("a@1+b", "t"), ("a@1.b", "t")),  # so did `+` and `.`
        (("x@1", "y__z"), ("x@1__y", "z")),  # `__` separates, and may occur in a version
        (("a@1", "t"), ("a", "1__t")),  # a version and a tool's start
        (("a@1.0", "t"), ("a@1_0", "t")),
        (("a-b@1", "t"), ("a@b-1", "t")),
    ],
)
def test_names_are_unique_across_environments(
    first: tuple[str, str], second: tuple[str, str]
) -> None:
    a, b = (OpenAINames(env).to_openai(tool) for env, tool in (first, second))
    assert a != b
    assert OpenAINames(second[0]).from_openai(a, {second[1]}) is None
    assert OpenAINames(first[0]).from_openai(b, {first[1]}) is None


@given(first=st.tuples(env_refs, tool_names), second=st.tuples(env_refs, tool_names))
def test_distinct_pairs_get_distinct_names(first: tuple[str, str], second: tuple[str, str]) -> None:
    assume(first != second)
    a, b = (OpenAINames(env).to_openai(tool) for env, tool in (first, second))
    assert a != b


@st.composite
def old_twins(draw: st.DrawFn) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two (env, tool) pairs whose pre-session-36 names were equal: the second re-splits the
    first's old name at some `__` and writes each `_` of the env part as `_`, `.`, `+` or `@`."""
    first = draw(st.tuples(near_env_refs, near_tools))
    old = _old_readable(*first)
    cuts = [i for i in range(len(old) - 1) if old[i : i + 2] == "__"]
    cut = draw(st.sampled_from(cuts))
    env = "".join(draw(st.sampled_from("_.+@")) if char == "_" else char for char in old[:cut])
    return first, (env, old[cut + 2 :])


@given(twins=old_twins())
def test_pairs_whose_old_names_met_get_distinct_names(
    twins: tuple[tuple[str, str], tuple[str, str]],
) -> None:
    first, second = twins
    assert _old_readable(*first) == _old_readable(*second)  # the strategy does what it says
    assume(first != second)
    a, b = (OpenAINames(env).to_openai(tool) for env, tool in (first, second))
    assert a != b
    assert OpenAINames(second[0]).from_openai(a, {second[1]}) is None


def test_openai_tools_name_a_qualified_tool_by_its_own_environment() -> None:
    # a pool made with `mini-terminal` leases instances that serve `mini-terminal@1.0.0`
    specs = to_openai_tools(
        "mini-terminal",
        [
            {"name": "mini-terminal@1.0.0/execute_command", "description": "Run it."},
            {"name": "read_file"},
        ],
    )
    assert [spec["function"]["name"] for spec in specs] == [
        "mini-terminal_1_0_0__execute_command",
        "mini-terminal__read_file",
    ]
    assert specs[0]["function"]["description"] == "Run it."
    assert specs[1]["function"]["parameters"] == {"type": "object", "properties": {}}


# -- list_openai_tools against a real runtime -------------------------------------------------

LONG_ENV = "openai-names-" + "x" * 47  # 60 characters: every OpenAI name of it is hashed
LONG_TOOLS = [f"long_tool_name_{'y' * 40}_{n}" for n in ("one", "two")]


@pytest.fixture(scope="module")
def long_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeProcess]:
    root = tmp_path_factory.mktemp("openai-names")
    (root / "config.json").write_text(json.dumps({"name": LONG_ENV, "version": "1.0.0"}))
    (root / "src").mkdir()
    tools = "\n".join(
        f"""
@register_tool(name="{name}")
def tool_{n}(text: str) -> str:
    '''Tool {n}.

    Args:
        text: what to return.
    '''
    return "{n}:" + text
"""
        for n, name in enumerate(LONG_TOOLS)
    )
    (root / "src" / "openai_names_tools.py").write_text(
        "from aenv_ray import register_tool\n\n"
        "@register_tool\n"
        "def echo(text: str, times: int = 1) -> str:\n"
        "    '''Say it back.'''\n"
        "    return text * times\n" + tools
    )
    with RuntimeProcess(root) as runtime:
        yield runtime


async def test_list_openai_tools_shape(long_runtime: RuntimeProcess) -> None:
    async with long_runtime.environment() as env:
        listed = {t["name"].split("/", 1)[1]: t for t in await env.list_tools()}
        openai = await env.list_openai_tools()
    assert set(listed) == {"echo", *LONG_TOOLS}
    assert isinstance(openai, list)
    assert len(openai) == len(listed)
    names = OpenAINames(f"{LONG_ENV}@1.0.0")
    seen = set()
    for entry in openai:
        assert set(entry) == {"type", "function"}
        assert entry["type"] == "function"
        function = entry["function"]
        assert set(function) == {"name", "description", "parameters"}
        assert OPENAI_NAME.fullmatch(function["name"])
        tool = names.from_openai(function["name"], set(listed))
        assert tool is not None
        seen.add(tool)
        assert function["description"] == listed[tool]["description"]
        assert function["parameters"] == listed[tool]["inputSchema"]
        assert function["parameters"]["type"] == "object"
        json.dumps(entry)  # what goes to the API is plain JSON
    assert seen == set(listed)
    by_tool = {names.from_openai(e["function"]["name"], set(listed)): e for e in openai}
    assert by_tool["echo"]["function"]["description"] == "Say it back."
    assert by_tool["echo"]["function"]["parameters"]["required"] == ["text"]
    assert by_tool[LONG_TOOLS[0]]["function"]["parameters"]["properties"]["text"] == {
        "type": "string",
        "description": "what to return.",
    }


async def test_every_listed_openai_name_calls_its_tool(long_runtime: RuntimeProcess) -> None:
    async with long_runtime.environment() as env:
        openai = await env.list_openai_tools()
        results = {}
        for entry in openai:
            result = await env.call_tool(entry["function"]["name"], {"text": "hi"})
            assert not result.is_error, result.text
            results[entry["function"]["name"]] = result.text
    assert sorted(results.values()) == ["0:hi", "1:hi", "hi"]


async def test_a_fresh_environment_calls_a_long_openai_name(long_runtime: RuntimeProcess) -> None:
    name = OpenAINames(f"{LONG_ENV}@1.0.0").to_openai("echo")
    assert "__" not in name
    async with long_runtime.environment() as env:
        result = await env.call_tool(name, {"text": "hi"})
    assert not result.is_error, result.text
    assert result.text == "hi"


def test_the_fixture_project_really_has_long_names() -> None:
    # the runtime tests above mean something only if the names are hashed and lack `__`
    names = OpenAINames(f"{LONG_ENV}@1.0.0")
    for tool in ("echo", *LONG_TOOLS):
        assert _is_hashed(names.to_openai(tool))
