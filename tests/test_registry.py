"""The decorators, the schema derived from a signature, validation, and load-time errors.

Every registration here goes into a fresh ``DefinitionRegistry().collecting()`` block, so nothing
leaks into ``default_registry``. Return values are checked end to end through an in-process
:class:`~sandbox_runtime.Dispatcher` whose :class:`SyncRunner` serves on a background thread.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import math
import threading
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from aenv_ray import (
    DefinitionError,
    DefinitionRegistry,
    ToolErrorKind,
    register_function,
    register_health,
    register_reward,
    register_tool,
)
from aenv_ray.protocol import MAX_TIMEOUT
from aenv_ray.registry import RESERVED_NAMES, Kind, default_registry
from aenv_ray.signature import format_validation_error, parse_docstring
from sandbox_runtime import Dispatcher
from sandbox_runtime._dispatch import CallFailed
from sandbox_runtime._runner import SyncRunner

HERE = __file__


# Argument types must live at module level: with ``from __future__ import annotations`` the
# registry resolves annotations against the function's module globals.
class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: int
    y: int = 0


class Shape(BaseModel):
    name: str
    corners: list[Point]


def _line(fn: Any) -> int:
    return int(fn.__code__.co_firstlineno)


def _where(fn: Any) -> str:
    return f"{HERE}:{_line(fn)}"


def _assert_names(exc: DefinitionError, *parts: str) -> str:
    message = str(exc)
    for part in parts:
        assert part in message, f"{part!r} not in {message!r}"
    return message


@pytest.fixture
def reg() -> Iterator[DefinitionRegistry]:
    registry = DefinitionRegistry()
    before = len(default_registry)
    with registry.collecting():
        yield registry
    assert len(default_registry) == before


# -- decorators ------------------------------------------------------------------------------


def test_bare_decorator_registers_and_returns_function_unchanged(reg: DefinitionRegistry) -> None:
    def echo(text: str) -> str:
        """Say it back."""
        return text

    decorated = register_tool(echo)
    assert decorated is echo
    assert decorated("hi") == "hi"
    entry = reg.tools["echo"]
    assert entry.kind is Kind.TOOL
    assert entry.fn is echo
    assert entry.description == "Say it back."
    assert entry.timeout is None
    assert entry.location == _where(echo)
    assert not entry.is_async


def test_decorator_syntax_with_options(reg: DefinitionRegistry) -> None:
    @register_tool(name="run-it", description="Runs it.", timeout=2.5)
    def run(command: str) -> str:
        """Ignored: description= wins."""
        return command.upper()

    assert run("ls") == "LS"
    assert "run" not in reg.tools
    entry = reg.tools["run-it"]
    assert entry.description == "Runs it."
    assert entry.timeout == 2.5
    described = entry.describe()
    assert described["name"] == "run-it"
    assert described["description"] == "Runs it."
    assert described["timeout"] == 2.5
    assert described["inputSchema"]["required"] == ["command"]


def test_describe_omits_timeout_when_none(reg: DefinitionRegistry) -> None:
    @register_tool
    def plain() -> str:
        return "x"

    described = reg.tools["plain"].describe()
    assert "timeout" not in described
    assert described["inputSchema"]["properties"] == {}
    assert described["inputSchema"]["additionalProperties"] is False
    assert described["description"] == ""


def test_empty_description_option_overrides_docstring(reg: DefinitionRegistry) -> None:
    @register_tool(description="")
    def documented() -> str:
        """A docstring."""
        return "x"

    assert reg.tools["documented"].description == ""


def test_async_functions_register_and_stay_awaitable(reg: DefinitionRegistry) -> None:
    @register_tool
    async def aecho(text: str, times: int = 1) -> str:
        """Async echo."""
        await asyncio.sleep(0)
        return text * times

    assert inspect.iscoroutinefunction(aecho)
    assert asyncio.run(aecho("ab", times=2)) == "abab"
    entry = reg.tools["aecho"]
    assert entry.is_async
    assert entry.description == "Async echo."
    assert entry.signature.input_schema["properties"]["times"] == {
        "default": 1,
        "type": "integer",
    }


def test_wrapped_async_function_counts_as_async(reg: DefinitionRegistry) -> None:
    async def inner(text: str) -> str:
        return text

    @functools.wraps(inner)
    async def wrapper(*args: Any, **kwargs: Any) -> str:
        return await inner(*args, **kwargs)

    # functools.wraps sets __wrapped__, so the signature (and hints) are inner's.
    register_tool(name="wrapped")(wrapper)
    entry = reg.tools["wrapped"]
    assert entry.is_async
    assert entry.signature.parameters == ("text",)


def test_every_decorator_kind_fills_its_slot(reg: DefinitionRegistry) -> None:
    @register_tool
    def tool_a() -> str:
        return "a"

    @register_function
    def helper(a: int, b: int = 1) -> int:
        """a + b."""
        return a + b

    @register_reward
    def score(answer: str) -> float:
        return float(answer == "42")

    @register_health
    def alive() -> bool:
        return True

    assert list(reg.tools) == ["tool_a"]
    assert list(reg.functions) == ["helper"]
    assert reg.reward is not None
    assert reg.reward.name == "score"
    assert reg.reward.kind is Kind.REWARD
    assert reg.health is not None
    assert reg.health.name == "alive"
    assert len(reg) == 4
    assert helper(2) == 3
    assert score("42") == 1.0
    assert alive() is True


def test_reward_and_health_may_use_reserved_words(reg: DefinitionRegistry) -> None:
    @register_reward
    def reward() -> float:
        return 1.0

    @register_health
    def health() -> bool:
        return True

    assert reg.reward is not None
    assert reg.reward.name == "reward"
    assert reg.health is not None
    assert reg.health.name == "health"


def test_tool_and_function_namespaces_are_separate(reg: DefinitionRegistry) -> None:
    def same(x: int) -> int:
        return x

    register_tool(same)
    register_function(same)
    assert set(reg.tools) == set(reg.functions) == {"same"}


def test_no_health_means_none_in_the_registry(reg: DefinitionRegistry) -> None:
    @register_tool
    def only() -> str:
        return ""

    assert reg.health is None
    assert reg.reward is None
    assert len(reg) == 1


def test_collecting_nests_and_restores() -> None:
    outer, inner = DefinitionRegistry(), DefinitionRegistry()
    with outer.collecting():

        @register_tool
        def first() -> str:
            return "1"

        with inner.collecting():

            @register_tool
            def second() -> str:
                return "2"

        @register_tool
        def third() -> str:
            return "3"

    assert list(outer.tools) == ["first", "third"]
    assert list(inner.tools) == ["second"]


def test_collecting_restores_after_an_error() -> None:
    registry = DefinitionRegistry()
    with pytest.raises(DefinitionError), registry.collecting():

        @register_tool
        def bad(x) -> str:  # type: ignore[no-untyped-def]
            return ""

    other = DefinitionRegistry()
    with other.collecting():

        @register_tool
        def good() -> str:
            return ""

    assert list(other.tools) == ["good"]
    assert len(registry) == 0


# -- input schema ------------------------------------------------------------------------------


def _schema(reg: DefinitionRegistry, name: str) -> dict[str, Any]:
    return reg.tools[name].signature.input_schema


def test_schema_scalars_and_required(reg: DefinitionRegistry) -> None:
    @register_tool
    def scalars(s: str, i: int, f: float, b: bool, opt_i: int = 3, opt_s: str = "x") -> str:
        return ""

    schema = _schema(reg, "scalars")
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["s"] == {"type": "string"}
    assert props["i"] == {"type": "integer"}
    assert props["f"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["opt_i"] == {"type": "integer", "default": 3}
    assert props["opt_s"] == {"type": "string", "default": "x"}
    assert schema["required"] == ["s", "i", "f", "b"]
    assert list(props) == ["s", "i", "f", "b", "opt_i", "opt_s"]
    assert "title" not in schema
    assert all("title" not in p for p in props.values())


def test_schema_containers(reg: DefinitionRegistry) -> None:
    @register_tool
    def containers(
        tags: list[str],
        nums: list[int],
        meta: dict,  # type: ignore[type-arg]
        counts: dict[str, int],
        nested: list[list[float]],
        defaults: list[str] = ["a"],  # noqa: B006 - the schema must carry the default
    ) -> str:
        return ""

    props = _schema(reg, "containers")["properties"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["nums"] == {"type": "array", "items": {"type": "integer"}}
    assert props["meta"]["type"] == "object"
    assert props["counts"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["nested"] == {
        "type": "array",
        "items": {"type": "array", "items": {"type": "number"}},
    }
    assert props["defaults"]["default"] == ["a"]
    assert _schema(reg, "containers")["required"] == ["tags", "nums", "meta", "counts", "nested"]


def test_schema_optional_is_anyof_null(reg: DefinitionRegistry) -> None:
    @register_tool
    def optionals(
        a: Optional[str] = None,  # noqa: UP045 - Optional[X] is one of the listed spellings
        b: int | None = None,
        c: float | None = 1.5,
        required_but_nullable: str | None = ...,  # type: ignore[assignment]
    ) -> str:
        return ""

    schema = _schema(reg, "optionals")
    props = schema["properties"]
    assert props["a"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["b"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["c"] == {"anyOf": [{"type": "number"}, {"type": "null"}], "default": 1.5}
    assert schema["required"] == ["required_but_nullable"]


def test_schema_literal_and_enum(reg: DefinitionRegistry) -> None:
    @register_tool
    def choices(
        mode: Literal["fast", "slow"],
        level: Literal[1, 2, 3] = 2,
        color: Color = Color.RED,
    ) -> str:
        return ""

    schema = _schema(reg, "choices")
    props = schema["properties"]
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["mode"]["type"] == "string"
    assert props["level"]["enum"] == [1, 2, 3]
    assert props["level"]["default"] == 2
    color = props["color"]
    assert color["default"] == "red"
    # Enums are described once under $defs and referenced.
    assert color["$ref"] == "#/$defs/Color"
    assert schema["$defs"]["Color"]["enum"] == ["red", "blue"]
    assert schema["required"] == ["mode"]


def test_schema_pydantic_models(reg: DefinitionRegistry) -> None:
    @register_tool
    def shapes(shape: Shape, origin: Point | None = None) -> str:
        return ""

    schema = _schema(reg, "shapes")
    defs = schema["$defs"]
    assert schema["properties"]["shape"] == {"$ref": "#/$defs/Shape"}
    assert schema["properties"]["origin"] == {
        "anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}],
        "default": None,
    }
    assert defs["Point"]["properties"] == {
        "x": {"type": "integer"},
        "y": {"type": "integer", "default": 0},
    }
    assert defs["Point"]["required"] == ["x"]
    assert defs["Shape"]["properties"]["corners"] == {
        "type": "array",
        "items": {"$ref": "#/$defs/Point"},
    }
    assert defs["Shape"]["required"] == ["name", "corners"]
    assert all("title" not in d for d in defs.values())


def test_unsupported_argument_type_is_a_definition_error(reg: DefinitionRegistry) -> None:
    def takes_lock(lock: threading.Lock) -> str:  # type: ignore[valid-type]
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(takes_lock)
    _assert_names(info.value, "takes_lock", _where(takes_lock), "cannot be described as JSON")
    assert "use str, int" in str(info.value)
    assert info.value.location == _where(takes_lock)


def test_unresolvable_annotation_is_a_definition_error(reg: DefinitionRegistry) -> None:
    class Local(BaseModel):
        a: int

    def uses_local(x: Local) -> str:
        return ""

    # Under `from __future__ import annotations` "Local" is a string resolved in module globals.
    with pytest.raises(DefinitionError) as info:
        register_tool(uses_local)
    _assert_names(
        info.value, "uses_local", _where(uses_local), "importable at module level", "Local"
    )


# -- descriptions ----------------------------------------------------------------------------


def test_descriptions_from_docstring_and_args_section(reg: DefinitionRegistry) -> None:
    @register_tool
    def execute(command: str, timeout: int = 60, env: dict[str, str] | None = None) -> str:
        """Run a shell command.

        The command runs in bash.

        Args:
            command: the command line,
                run by bash.
            timeout (int): seconds before it is interrupted.

        Returns:
            the output.
        """
        return ""

    entry = reg.tools["execute"]
    assert entry.description == "Run a shell command.\n\nThe command runs in bash."
    props = entry.signature.input_schema["properties"]
    assert props["command"]["description"] == "the command line, run by bash."
    assert props["timeout"]["description"] == "seconds before it is interrupted."
    assert "description" not in props["env"]
    assert "the output" not in entry.description


def test_annotated_field_descriptions_and_constraints_are_kept(reg: DefinitionRegistry) -> None:
    @register_tool
    def pick(
        count: Annotated[int, Field(description="how many, at least 1", ge=1)],
        label: Annotated[str, Field(description="overridden by Args")] = "x",
    ) -> str:
        """Pick some.

        Args:
            label: the label to use.
        """
        return label * count

    props = reg.tools["pick"].signature.input_schema["properties"]
    assert props["count"] == {
        "type": "integer",
        "minimum": 1,
        "description": "how many, at least 1",
    }
    assert props["label"]["description"] == "the label to use."


@pytest.mark.parametrize("header", ["Args:", "Arguments:", "Parameters:", "Params:"])
def test_args_section_headers(header: str) -> None:
    description, args = parse_docstring(f"Do it.\n\n{header}\n    x: the x.\n    y: the y.\n")
    assert description == "Do it."
    assert args == {"x": "the x.", "y": "the y."}


def test_parse_docstring_edges() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("") == ("", {})
    assert parse_docstring("Only a summary.") == ("Only a summary.", {})
    # Sections after Args end it; starred names are stripped.
    text = "Sum.\n\nArgs:\n    *items: things.\n    **opts: options.\nRaises:\n    x: no arg.\n"
    assert parse_docstring(text) == ("Sum.", {"items": "things.", "opts": "options."})


# -- validation ------------------------------------------------------------------------------


@pytest.fixture
def typed(reg: DefinitionRegistry) -> Any:
    @register_tool
    def typed(
        count: int,
        ratio: float,
        flag: bool,
        tags: list[str],
        meta: dict,  # type: ignore[type-arg]
        mode: Literal["fast", "slow"] = "fast",
        color: Color = Color.RED,
        note: str | None = None,
        point: Point | None = None,
    ) -> dict:  # type: ignore[type-arg]
        return {}

    return reg.tools["typed"].signature


GOOD = {"count": 3, "ratio": 0.5, "flag": True, "tags": ["a"], "meta": {"k": [1]}}


def test_validation_accepts_good_input_and_fills_defaults(typed: Any) -> None:
    kwargs = typed.validate(GOOD)
    assert kwargs == {
        **GOOD,
        "mode": "fast",
        "color": Color.RED,
        "note": None,
        "point": None,
    }
    full = typed.validate({**GOOD, "mode": "slow", "color": "blue", "note": "n", "point": {"x": 1}})
    assert full["color"] is Color.BLUE
    assert full["point"] == Point(x=1, y=0)
    assert isinstance(full["point"], Point)
    assert full["mode"] == "slow"
    assert full["note"] == "n"


def _message(signature: Any, arguments: dict[str, Any]) -> str:
    with pytest.raises(pydantic.ValidationError) as info:
        signature.validate(arguments)
    return format_validation_error(info.value, what="tool `typed`", parameters=signature.parameters)


@pytest.mark.parametrize(
    ("argument", "value", "expected"),
    [
        ("count", "many", "argument `count` must be an integer, got str 'many'"),
        ("count", 1.5, "argument `count` must be an integer, got float 1.5"),
        ("ratio", "half", "argument `ratio` must be a number, got str 'half'"),
        ("flag", "maybe", "argument `flag` must be a boolean, got str 'maybe'"),
        ("tags", "a,b", "argument `tags` must be an array, got str 'a,b'"),
        ("meta", [1], "argument `meta` must be an object, got list [1]"),
    ],
)
def test_validation_names_argument_and_expected_type(
    typed: Any, argument: str, value: Any, expected: str
) -> None:
    message = _message(typed, {**GOOD, argument: value})
    assert message.startswith("invalid arguments for tool `typed`: ")
    assert expected in message


def test_validation_names_allowed_literal_and_enum_values(typed: Any) -> None:
    message = _message(typed, {**GOOD, "mode": "medium", "color": "green"})
    assert "argument `mode`" in message
    assert "'fast' or 'slow'" in message
    assert "argument `color`" in message
    assert "'red' or 'blue'" in message


def test_validation_names_nested_model_field(typed: Any) -> None:
    message = _message(typed, {**GOOD, "point": {"x": "left"}})
    assert "argument `point.x` must be an integer, got str 'left'" in message


def test_validation_names_missing_and_unexpected_arguments(typed: Any) -> None:
    arguments = {k: v for k, v in GOOD.items() if k != "count"}
    message = _message(typed, {**arguments, "bogus": 1})
    assert "missing required argument `count`" in message
    assert "unexpected argument `bogus`" in message
    assert "it takes: count, ratio, flag, tags, meta, mode, color, note, point" in message


def test_unexpected_argument_for_a_tool_without_arguments(reg: DefinitionRegistry) -> None:
    @register_tool
    def nothing() -> str:
        return ""

    signature = reg.tools["nothing"].signature
    assert signature.validate({}) == {}
    with pytest.raises(pydantic.ValidationError) as info:
        signature.validate({"x": 1})
    message = format_validation_error(info.value, what="tool `nothing`", parameters=())
    assert "unexpected argument `x` (it takes: no arguments)" in message


# -- load-time errors --------------------------------------------------------------------------


def test_duplicate_tool_names_both_locations(reg: DefinitionRegistry) -> None:
    def dup(x: int) -> int:
        return x

    def dup_again(x: int) -> int:
        return x

    register_tool(dup)
    with pytest.raises(DefinitionError) as info:
        register_tool(name="dup")(dup_again)
    _assert_names(info.value, "`dup`", _where(dup), _where(dup_again), "name=")
    assert info.value.location == _where(dup_again)
    assert reg.tools["dup"].fn is dup


def test_duplicate_function_names(reg: DefinitionRegistry) -> None:
    @register_function
    def helper() -> int:
        return 1

    first = _where(helper)

    def helper_two() -> int:
        return 2

    with pytest.raises(DefinitionError) as info:
        register_function(name="helper")(helper_two)
    _assert_names(info.value, "function `helper`", first, _where(helper_two), "rename one")


def test_second_reward_names_both(reg: DefinitionRegistry) -> None:
    @register_reward
    def first_reward() -> float:
        return 1.0

    def second_reward() -> float:
        return 0.0

    with pytest.raises(DefinitionError) as info:
        register_reward(second_reward)
    _assert_names(
        info.value,
        "first_reward",
        "second_reward",
        _where(first_reward),
        _where(second_reward),
        "remove one",
    )
    assert reg.reward is not None
    assert reg.reward.fn is first_reward


def test_second_health_names_both(reg: DefinitionRegistry) -> None:
    @register_health
    def first_health() -> bool:
        return True

    def second_health() -> bool:
        return True

    with pytest.raises(DefinitionError) as info:
        register_health(second_health)
    _assert_names(
        info.value,
        "first_health",
        "second_health",
        _where(first_health),
        _where(second_health),
        "remove one",
    )


def _star_args(*args: str) -> str:
    return ""


def _star_kwargs(a: int, **kwargs: str) -> str:
    return ""


def _unannotated(a: int, b) -> str:  # type: ignore[no-untyped-def]
    return ""


def _positional_only(a: int, /, b: int) -> str:
    return ""


def _underscore_arg(_hidden: int) -> str:
    return ""


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (_star_args, "`*args` is not supported; name each argument"),
        (_star_kwargs, "`**kwargs` is not supported; name each argument"),
        (_unannotated, "argument `b` has no type annotation; write e.g. `b: str`"),
        (_positional_only, "positional-only `a` is not supported; drop the `/`"),
        (_underscore_arg, "argument `_hidden` starts with `_`"),
    ],
)
@pytest.mark.parametrize("decorator", [register_tool, register_function, register_reward])
def test_unsupported_parameters(
    reg: DefinitionRegistry, fn: Any, hint: str, decorator: Any
) -> None:
    with pytest.raises(DefinitionError) as info:
        decorator(name="subject")(fn)
    _assert_names(info.value, fn.__name__, _where(fn), hint)
    assert info.value.location == _where(fn)
    assert len(reg) == 0


def test_decorator_syntax_error_points_at_the_decorator_line(reg: DefinitionRegistry) -> None:
    # co_firstlineno of a decorated function is its first decorator's line.
    line = inspect.currentframe().f_lineno + 3  # type: ignore[union-attr]
    with pytest.raises(DefinitionError) as info:

        @register_tool
        def sloppy(x, y: int) -> int:  # type: ignore[no-untyped-def]
            return y

    _assert_names(info.value, "sloppy", f"{HERE}:{line}", "`x: str`")


@pytest.mark.parametrize("reserved", sorted(RESERVED_NAMES))
@pytest.mark.parametrize("decorator", [register_tool, register_function])
def test_reserved_names(reg: DefinitionRegistry, reserved: str, decorator: Any) -> None:
    def renamed() -> str:
        return ""

    with pytest.raises(DefinitionError) as info:
        decorator(name=reserved)(renamed)
    _assert_names(info.value, f"`{reserved}`", _where(renamed), "reserved", "pass name=")
    assert len(reg) == 0


def test_reserved_name_from_the_function_name(reg: DefinitionRegistry) -> None:
    def list() -> str:  # the function's own name is reserved
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(list)
    _assert_names(info.value, "`list`", _where(list), "reserved", "pass name=... to rename it")


@pytest.mark.parametrize(
    "bad",
    ["a/b", "env@1.0", "has space", "1starts_with_digit", "-dash", "x" * 65, "dots.no"],
)
def test_invalid_names(reg: DefinitionRegistry, bad: str) -> None:
    def subject() -> str:
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(name=bad)(subject)
    _assert_names(info.value, f"`{bad}`", _where(subject), "is invalid", "use a letter")
    assert len(reg) == 0


def test_name_with_trailing_newline_is_invalid(reg: DefinitionRegistry) -> None:
    def subject() -> str:
        return ""

    with pytest.raises(DefinitionError):
        register_tool(name="echo\n")(subject)


@given(name=st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,63}", fullmatch=True))
def test_every_valid_name_registers(name: str) -> None:
    registry = DefinitionRegistry()

    def subject() -> str:
        return ""

    with registry.collecting():
        if name in RESERVED_NAMES:
            with pytest.raises(DefinitionError):
                register_tool(name=name)(subject)
        else:
            assert register_tool(name=name)(subject) is subject
            assert list(registry.tools) == [name]


@given(
    prefix=st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,10}", fullmatch=True),
    bad=st.sampled_from(["/", "@", " ", ".", ":", "é", "\t", "!"]),
)
def test_names_with_forbidden_characters_are_rejected(prefix: str, bad: str) -> None:
    registry = DefinitionRegistry()

    def subject() -> str:
        return ""

    with registry.collecting(), pytest.raises(DefinitionError) as info:
        register_tool(name=f"{prefix}{bad}x")(subject)
    assert "is invalid" in str(info.value)
    assert len(registry) == 0


@pytest.mark.parametrize("timeout", [0, -1, -0.5, float("nan")])
@pytest.mark.parametrize(
    "decorator", [register_tool, register_function, register_reward, register_health]
)
def test_non_positive_timeout(reg: DefinitionRegistry, timeout: float, decorator: Any) -> None:
    def slow() -> str:
        return ""

    with pytest.raises(DefinitionError) as info:
        decorator(timeout=timeout)(slow)
    _assert_names(info.value, "`slow`", _where(slow), "timeout must be a positive number")
    assert len(reg) == 0


def test_non_callable_is_rejected(reg: DefinitionRegistry) -> None:
    with pytest.raises(DefinitionError) as info:
        register_tool("not a function")  # type: ignore[call-overload]
    assert "@register_tool needs a function" in str(info.value)


def test_name_given_as_empty_string_is_invalid_not_ignored(reg: DefinitionRegistry) -> None:
    def subject() -> str:
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(name="")(subject)
    _assert_names(info.value, "``", "(function `", "subject`", _where(subject), "is invalid")
    assert len(reg) == 0


@pytest.mark.parametrize(
    "timeout", [math.inf, 1e300, MAX_TIMEOUT + 1, True, "30", [1], complex(1, 0)]
)
def test_timeout_of_the_wrong_kind_is_a_definition_error(
    reg: DefinitionRegistry, timeout: Any
) -> None:
    # not a TypeError from comparing a str with 0, not an endless limit (1e300 ended in an
    # OverflowError from setitimer, blamed on the tool), not True-as-one-second
    def slow() -> str:
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(timeout=timeout)(slow)
    _assert_names(
        info.value,
        "`slow`",
        _where(slow),
        "timeout must be a positive number",
        "up to 86400",
        "timeout=30",
    )
    assert len(reg) == 0


@pytest.mark.parametrize("timeout", [0.001, 1, 2.5, 86400, MAX_TIMEOUT])
def test_positive_finite_timeouts_are_kept(reg: DefinitionRegistry, timeout: float) -> None:
    def quick() -> str:
        return ""

    assert register_tool(timeout=timeout)(quick) is quick
    assert reg.tools["quick"].timeout == timeout
    assert reg.tools["quick"].describe()["timeout"] == timeout


# Each case registers `my_tool_impl` under name=... and fails; the error must name the requested
# name, the Python function by its qualified name, where it is, and what to do.
Case = tuple[Any, Any, str, str]  # (act, my_tool_impl, requested name, remedy)


def _renamed_invalid() -> Case:
    def my_tool_impl() -> str:
        return ""

    act = lambda: register_tool(name="bad/name")(my_tool_impl)  # noqa: E731
    return act, my_tool_impl, "`bad/name`", "use a letter"


def _renamed_reserved() -> Case:
    def my_tool_impl() -> str:
        return ""

    act = lambda: register_function(name="list")(my_tool_impl)  # noqa: E731
    return act, my_tool_impl, "`list`", "pass name="


def _renamed_timeout() -> Case:
    def my_tool_impl() -> str:
        return ""

    act = lambda: register_tool(name="fine", timeout=0)(my_tool_impl)  # noqa: E731
    return act, my_tool_impl, "`fine`", "timeout must be a positive number of seconds"


def _renamed_duplicate() -> Case:
    def other_impl() -> str:
        return ""

    def my_tool_impl() -> str:
        return ""

    def act() -> None:
        register_tool(name="same")(other_impl)
        register_tool(name="same")(my_tool_impl)

    return act, my_tool_impl, "`same`", "rename one with @register_tool(name=...)"


def _renamed_second_reward() -> Case:
    def other_impl() -> float:
        return 0.0

    def my_tool_impl() -> float:
        return 1.0

    def act() -> None:
        register_reward(name="grade")(other_impl)
        register_reward(name="score")(my_tool_impl)

    return act, my_tool_impl, "`score`", "remove one"


@pytest.mark.parametrize(
    "case",
    [
        _renamed_invalid,
        _renamed_reserved,
        _renamed_timeout,
        _renamed_duplicate,
        _renamed_second_reward,
    ],
)
def test_errors_for_renamed_functions_name_the_python_function(
    reg: DefinitionRegistry, case: Any
) -> None:
    act, fn, requested, remedy = case()
    with pytest.raises(DefinitionError) as info:
        act()
    qualified = f"{case.__name__}.<locals>.my_tool_impl"
    where = _where(fn)
    _assert_names(info.value, requested, f"(function `{qualified}`)", where, remedy)
    assert info.value.location == where


def test_second_reward_names_the_function_behind_the_first_one(reg: DefinitionRegistry) -> None:
    @register_reward(name="grade")
    def first_impl() -> float:
        return 1.0

    def second_impl() -> float:
        return 0.0

    with pytest.raises(DefinitionError) as info:
        register_reward(second_impl)
    _assert_names(info.value, "`grade`", "first_impl`", _where(first_impl), "`second_impl`")


def test_errors_without_a_rename_do_not_repeat_the_function(reg: DefinitionRegistry) -> None:
    def list() -> str:  # reserved, and not renamed
        return ""

    with pytest.raises(DefinitionError) as info:
        register_tool(list)
    assert "(function `" not in str(info.value)


# -- return values, end to end through an in-process dispatcher ---------------------------


@pytest.fixture
def runner() -> Iterator[SyncRunner]:
    runner = SyncRunner()
    thread = threading.Thread(target=runner.run_forever, name="test-sync-runner", daemon=True)
    thread.start()
    yield runner
    runner.stop()
    thread.join(timeout=5)
    assert not thread.is_alive()


@pytest.fixture
def returns(runner: SyncRunner) -> Dispatcher:
    registry = DefinitionRegistry()
    with registry.collecting():

        @register_tool
        def give_str(text: str) -> str:
            return text

        @register_tool
        def give_dict(n: int) -> dict:  # type: ignore[type-arg]
            return {"n": n, "items": [n, None, "x"]}

        @register_tool
        def give_list(n: int) -> list[int]:
            return list(range(n))

        @register_tool
        def give_model(x: int) -> Point:
            return Point(x=x, y=x * 2)

        @register_tool
        def give_none() -> None:
            return None

        @register_tool
        async def agive_str(text: str) -> str:
            await asyncio.sleep(0)
            return text.upper()

        @register_tool
        async def agive_model(x: int) -> Point:
            return Point(x=x)

        @register_tool
        async def agive_none() -> None:
            return None

        @register_tool
        def give_object() -> object:
            return object()

        @register_tool
        def takes_model(point: Point, color: Color = Color.BLUE) -> dict:  # type: ignore[type-arg]
            assert isinstance(point, Point)
            assert isinstance(color, Color)
            return {"sum": point.x + point.y, "color": color.value}

        @register_function
        def helper(a: int, b: int = 1) -> int:
            return a + b

        @register_function
        async def ahelper(points: list[Point]) -> list[Point]:
            return [Point(x=p.y, y=p.x) for p in points]

        @register_reward
        def score(answer: str) -> float:
            return 1.0 if answer == "42" else 0.0

    return Dispatcher(registry, env_ref="returns@1.0.0", runner=runner, default_timeout=30)


async def test_return_str(returns: Dispatcher) -> None:
    for name in ("give_str", "agive_str"):
        result = await returns.call_tool(name, {"text": "hi"})
        assert not result.is_error
        assert result.text.lower() == "hi"
        assert result.structured is None


async def test_return_dict_and_list_are_json(returns: Dispatcher) -> None:
    result = await returns.call_tool("give_dict", {"n": 2})
    assert not result.is_error
    assert result.structured == {"n": 2, "items": [2, None, "x"]}
    assert result.text == '{"n":2,"items":[2,null,"x"]}'
    listed = await returns.call_tool("give_list", {"n": 3})
    assert listed.structured == [0, 1, 2]
    assert listed.text == "[0,1,2]"


async def test_return_pydantic_model(returns: Dispatcher) -> None:
    for name, expected in (("give_model", {"x": 2, "y": 4}), ("agive_model", {"x": 2, "y": 0})):
        result = await returns.call_tool(name, {"x": 2})
        assert not result.is_error
        assert result.structured == expected


async def test_return_none_is_empty_content(returns: Dispatcher) -> None:
    for name in ("give_none", "agive_none"):
        result = await returns.call_tool(name, {})
        assert not result.is_error
        assert result.content == []
        assert result.text == ""


async def test_return_unserializable_is_an_execution_error(returns: Dispatcher) -> None:
    result = await returns.call_tool("give_object", None)
    assert result.is_error
    assert result.error_kind is ToolErrorKind.EXECUTION
    assert "give_object" in result.text
    assert "return str, dict, list, a pydantic model or None" in result.text


async def test_model_and_enum_arguments_arrive_as_objects(returns: Dispatcher) -> None:
    result = await returns.call_tool("takes_model", {"point": {"x": 1, "y": 2}})
    assert result.structured == {"sum": 3, "color": "blue"}
    result = await returns.call_tool("takes_model", {"point": {"x": 1}, "color": "red"})
    assert result.structured == {"sum": 1, "color": "red"}


async def test_dispatcher_rejects_bad_arguments_before_running(returns: Dispatcher) -> None:
    result = await returns.call_tool("give_list", {"n": "three", "extra": 1})
    assert result.is_error
    assert result.error_kind is ToolErrorKind.INVALID_ARGUMENTS
    assert "argument `n` must be an integer" in result.text
    assert "unexpected argument `extra`" in result.text
    not_a_dict = await returns.call_tool("give_list", [1])
    assert not_a_dict.error_kind is ToolErrorKind.INVALID_ARGUMENTS


async def test_functions_and_reward_return_json(returns: Dispatcher) -> None:
    assert await returns.call_function(Kind.FUNCTION, "helper", {"a": 2}) == 3
    swapped = await returns.call_function(Kind.FUNCTION, "ahelper", {"points": [{"x": 1}]})
    assert swapped == [{"x": 0, "y": 1}]
    assert await returns.call_function(Kind.REWARD, None, {"answer": "42"}) == 1.0
    with pytest.raises(CallFailed) as info:
        await returns.call_function(Kind.FUNCTION, "helper", {"a": "x"})
    assert info.value.status == 400
    assert "argument `a` must be an integer" in info.value.message


def test_the_old_name_registry_still_names_the_definition_registry_with_a_warning() -> None:
    import aenv_ray

    with pytest.warns(DeprecationWarning, match="aenv_ray.DefinitionRegistry"):
        old = aenv_ray.Registry  # type: ignore[attr-defined]
    assert old is DefinitionRegistry
    with pytest.raises(AttributeError, match="no_such_name"):
        aenv_ray.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_a_warm_up_is_a_plain_function_of_no_arguments() -> None:
    registry = DefinitionRegistry()
    with pytest.raises(DefinitionError, match="needs a function of no arguments"):
        registry.add_warm_up(42)  # type: ignore[type-var]

    async def start() -> None: ...

    with pytest.raises(DefinitionError, match="is async: a warm-up runs before"):
        registry.add_warm_up(start)

    def first() -> None: ...

    def second() -> None: ...

    assert registry.add_warm_up(first) is first
    registry.add_warm_up(second)
    assert registry.warm_ups == [first, second]
    assert len(registry) == 0  # nothing a caller can call: not a tool, function or reward
