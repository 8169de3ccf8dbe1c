"""OpenAI function names for tools: always valid, unique within an environment, reversible."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aenv_ray.openai_tools import OPENAI_NAME, OpenAINames

env_names = st.from_regex(
    r"[a-z0-9][a-z0-9_-]{0,62}@[0-9A-Za-z][0-9A-Za-z.+_-]{0,20}", fullmatch=True
)
tool_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,63}", fullmatch=True)


@given(env=env_names, tools=st.sets(tool_names, min_size=1, max_size=30))
def test_names_are_valid_unique_and_reversible(env: str, tools: set[str]) -> None:
    names = OpenAINames(env)
    mapped = {tool: names.to_openai(tool) for tool in tools}
    for tool, name in mapped.items():
        assert OPENAI_NAME.fullmatch(name), name
        assert names.from_openai(name, tools) == tool
    assert len(set(mapped.values())) == len(tools)


def test_long_names_keep_a_hash_and_stay_distinct() -> None:
    names = OpenAINames("a-very-long-environment-name-for-testing@10.20.30")
    first = names.to_openai("execute_a_really_long_command_name_number_one")
    second = names.to_openai("execute_a_really_long_command_name_number_two")
    assert len(first) == len(second) == 64
    assert first != second
    assert first[:55] == second[:55]


def test_unknown_names_map_to_nothing() -> None:
    names = OpenAINames("mini-terminal@1.0.0")
    assert names.from_openai("mini-terminal_1_0_0__nope", {"execute_command"}) is None
    assert names.to_openai("execute_command") == "mini-terminal_1_0_0__execute_command"
