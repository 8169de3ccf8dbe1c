"""The error tree: one root, every class picklable with its attributes (Ray ships errors).

The classes are found by walking :mod:`aenv_ray.errors`, so a class added there is covered by every
test here without touching this file.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import pickle
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import aenv_ray
from aenv_ray import errors
from aenv_ray.config import EnvConfig
from aenv_ray.registry import DefinitionRegistry, register_tool

CLASSES: list[type[errors.AEnvError]] = sorted(
    (
        cls
        for cls in vars(errors).values()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == errors.__name__
    ),
    key=lambda cls: cls.__name__,
)

# a value of the right kind for every keyword attribute some class accepts; a class that grows a
# keyword not listed here fails test_every_keyword_attribute_has_a_sample_value
SAMPLES: dict[str, object] = {
    "env_name": "mini-terminal@1.0.0",
    "instance_id": "abc123",
    "location": "/p/src/tools.py:12",
    "tool": "execute_command",
    "error_type": "ValueError",
    "timeout": 2.5,
    "function": "grade",
    "limit": "memory",
    "requested": 8.0,
    "allowed": 4.0,
    "existing_digest": "sha256:" + "ab" * 32,
    "kind": errors.FunctionErrorKind.TIMEOUT,
    "code": "ENOENT",
    "field": "customPodTemplate.spec.nodeName",
    "allow": "spec.nodeName",
    "retry_after": 30.0,
    "extra": "ray",
}

COPIERS: dict[str, Callable[[Any], Any]] = {
    **{
        f"pickle-{protocol}": (lambda e, p=protocol: pickle.loads(pickle.dumps(e, protocol=p)))
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    },
    "deepcopy": copy.deepcopy,
    "copy": copy.copy,
}


def _keywords(cls: type[BaseException]) -> set[str]:
    """Every keyword-only attribute the class's constructors (along its MRO) accept."""
    accepted: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None or klass is BaseException or klass is Exception:
            continue
        with_kw = False
        for param in inspect.signature(init).parameters.values():
            if param.kind is param.KEYWORD_ONLY:
                accepted.add(param.name)
            with_kw |= param.kind is param.VAR_KEYWORD
        if not with_kw:
            break  # this __init__ does not pass unknown keywords further up
    return accepted


def _kwargs(cls: type[BaseException]) -> dict[str, object]:
    return {k: SAMPLES[k] for k in _keywords(cls)}


def _same(clone: BaseException, original: BaseException) -> None:
    assert type(clone) is type(original)
    assert str(clone) == str(original)
    assert clone.args == original.args
    assert vars(clone) == vars(original)


# -- the tree ---------------------------------------------------------------------------------


def test_the_walk_finds_the_whole_tree() -> None:
    # the walk is what keeps this file complete; it must see the known classes
    names = {cls.__name__ for cls in CLASSES}
    assert {"AEnvError", "DefinitionError", "ToolTimeoutError", "CapacityError"} <= names
    assert len(CLASSES) >= 22


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_is_an_aenv_error_exported_and_documented(cls: type[Exception]) -> None:
    assert issubclass(cls, errors.AEnvError)
    assert issubclass(cls, Exception)  # never a bare BaseException: `except Exception` sees it
    assert cls.__name__ in errors.__all__
    assert getattr(aenv_ray, cls.__name__) is cls, "export it from aenv_ray too"
    assert cls.__doc__, f"{cls.__name__} needs a docstring saying when it is raised"
    doc = errors.__doc__ or ""
    assert re.search(rf"\b{cls.__name__}\b", doc), f"{cls.__name__} is missing from the tree"


def test_all_lists_exactly_the_classes_and_the_wire_functions() -> None:
    functions = ["FunctionErrorKind", "decode_error", "encode_error", "is_retryable"]
    assert sorted(errors.__all__) == sorted([cls.__name__ for cls in CLASSES] + functions)
    assert errors.__all__ == sorted(errors.__all__)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_keyword_attribute_has_a_sample_value(cls: type[Exception]) -> None:
    missing = _keywords(cls) - set(SAMPLES)
    assert not missing, f"add a sample value for {sorted(missing)} to SAMPLES"


def test_builtin_bases_let_plain_handlers_catch_them() -> None:
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.DefinitionError, ValueError)
    assert issubclass(errors.ToolArgumentError, ValueError)
    for cls in (
        errors.EnvironmentNotFoundError,
        errors.ToolNotFoundError,
        errors.FunctionNotFoundError,
        errors.InstanceNotFoundError,
    ):
        assert issubclass(cls, LookupError), cls
    for cls in (errors.CallTimeoutError, errors.StartupTimeoutError, errors.ToolTimeoutError):
        assert issubclass(cls, TimeoutError), cls
        assert issubclass(cls, errors.AEnvTimeoutError), cls
    assert issubclass(errors.ToolTimeoutError, errors.ToolError)


def test_the_tree_in_the_docstring_matches_the_classes() -> None:
    # each line "    ├── Name (...)" of the drawing names a class whose parent is the line above
    # it one level up
    doc = errors.__doc__ or ""
    stack: list[tuple[int, str]] = []
    drawn: dict[str, str | None] = {}
    for line in doc.splitlines():
        match = re.match(r"^(\s*(?:[│ ]   )*)(?:[├└]── )?([A-Z]\w*Error)\b", line)
        if not match or not line.strip().startswith(("AEnvError", "├", "└", "│")):
            continue
        depth = len(match.group(1)) // 4
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[match.group(2)] = stack[-1][1] if stack else None
        stack.append((depth, match.group(2)))
    assert set(drawn) == {cls.__name__ for cls in CLASSES}
    for name, parent in drawn.items():
        if parent is not None:
            assert issubclass(getattr(errors, name), getattr(errors, parent)), (name, parent)


# -- pickling and copying ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("copier", list(COPIERS.values()), ids=list(COPIERS))
def test_round_trips_with_message_and_attributes(
    cls: type[errors.AEnvError], copier: Callable[[Any], Any]
) -> None:
    kwargs = _kwargs(cls)
    original = cls("instance abc123 ended: crashed", **kwargs)
    clone = copier(original)
    _same(clone, original)
    assert str(clone) == clone.message == "instance abc123 ended: crashed"
    for key, value in kwargs.items():
        assert getattr(clone, key) == value, key
    assert clone.retryable is cls.retryable


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_round_trips_with_defaults(cls: type[errors.AEnvError]) -> None:
    original = cls()
    clone = pickle.loads(pickle.dumps(original))
    _same(clone, original)
    assert str(clone) == ""
    for key in _keywords(cls):
        assert getattr(clone, key) is None, key


@given(
    cls=st.sampled_from(CLASSES),
    message=st.text(),
    values=st.fixed_dictionaries(
        {},
        optional={
            "env_name": st.text(),
            "instance_id": st.text(),
            "location": st.text(),
            "tool": st.text(),
            "error_type": st.text(),
            "function": st.text(),
            "timeout": st.floats(allow_nan=False),
            "limit": st.text(),
            "requested": st.floats(allow_nan=False),
            "allowed": st.floats(allow_nan=False),
            "retry_after": st.floats(allow_nan=False),
            "existing_digest": st.text(),
            "kind": st.sampled_from(errors.FunctionErrorKind),
        },
    ),
    note=st.none() | st.text(),
)
def test_any_message_and_attributes_survive_pickle(
    cls: type[errors.AEnvError], message: str, values: dict[str, Any], note: str | None
) -> None:
    kwargs = {k: v for k, v in values.items() if k in _keywords(cls)}
    original = cls(message, **kwargs)
    if note is not None:
        original.add_note(note)  # notes live in __dict__ and travel too
    for copier in (pickle.loads, copy.deepcopy):
        clone = copier(pickle.dumps(original)) if copier is pickle.loads else copier(original)
        _same(clone, original)
        assert getattr(clone, "__notes__", None) == ([note] if note is not None else None)


def _broken_from_a_reset() -> None:
    try:
        raise ConnectionResetError("peer went away")
    except OSError as exc:
        raise errors.InstanceBrokenError(
            "instance abc123 of probe@0.1.0 died during `echo`", instance_id="abc123"
        ) from exc


def test_a_chained_error_pickles_without_losing_its_own_data() -> None:
    # pickle drops __cause__ (Python does that for every exception); the error's own data stays
    with pytest.raises(errors.InstanceBrokenError) as info:
        _broken_from_a_reset()
    broken = info.value
    assert isinstance(broken.__cause__, ConnectionResetError)
    clone = pickle.loads(pickle.dumps(broken))
    _same(clone, broken)
    assert clone.instance_id == "abc123"


# -- retryability -----------------------------------------------------------------------------

RETRYABLE = {
    "AEnvTimeoutError",
    "AcquireTimeoutError",
    "CallTimeoutError",
    "CapacityError",
    "ClusterConflictError",
    "ClusterUnreachableError",
    "DatasourceUnreachableError",
    "HubUnreachableError",
    "InstanceBrokenError",
    "InstanceExpiredError",
    "InstanceNotFoundError",
    "InstanceUnreachableError",
    "LeaseLostError",
    "RateLimitedError",
    "StartupTimeoutError",
}


def test_retryable_is_a_bool_class_attribute_on_every_class() -> None:
    for cls in CLASSES:
        assert isinstance(cls.retryable, bool), cls
        instance = cls("x", **_kwargs(cls))
        assert instance.retryable is cls.retryable, cls
        assert "retryable" not in vars(instance), "retryability is the class's, not per instance"


def test_which_classes_are_retryable() -> None:
    assert {cls.__name__ for cls in CLASSES if cls.retryable} == RETRYABLE
    assert errors.AEnvError.retryable is False  # the root, and so anything not marked, is final


def test_a_tool_timeout_is_not_retryable_though_it_is_a_timeout() -> None:
    # the tool ran past its own limit: running it again will do the same
    assert issubclass(errors.ToolTimeoutError, errors.AEnvTimeoutError)
    assert errors.AEnvTimeoutError.retryable
    assert not errors.ToolTimeoutError.retryable


def test_retryability_is_inherited_unless_a_class_says_otherwise() -> None:
    for cls in CLASSES:
        own = vars(cls).get("retryable")
        if own is None:
            parent = next(k for k in cls.__mro__[1:] if "retryable" in vars(k))
            assert cls.retryable is parent.retryable, cls


def test_the_docstring_marks_retryable_classes_as_such() -> None:
    # every class whose line in the tree says "retryable" is retryable, and the doc says the
    # policy reads the attribute
    doc = errors.__doc__ or ""
    marked = {
        match.group(1)
        for line in doc.splitlines()
        if "retryable" in line
        for match in [re.search(r"([A-Z]\w*Error)\b", line)]
        if match
    }
    assert marked
    assert marked <= RETRYABLE
    assert "``retryable``" in doc


# -- messages from real raising sites ---------------------------------------------------------


def _raised(action: Callable[[], Any]) -> errors.AEnvError:
    with pytest.raises(errors.AEnvError) as info:
        action()
    return info.value


def _definition_error() -> errors.AEnvError:
    def list() -> str:  # a reserved name
        return ""

    with DefinitionRegistry().collecting():
        return _raised(lambda: register_tool(list))


def _configuration_error(tmp_path: Any) -> errors.AEnvError:
    (tmp_path / "config.json").write_text('{"name": "x", "deployConfig": {"cpu": "lots"}}')
    return _raised(lambda: EnvConfig.load(tmp_path))


def _not_found_error() -> errors.AEnvError:
    from aenv_ray.resolve import resolve_environment

    return _raised(lambda: resolve_environment("mini-terminl@1.0.0"))


def _closed_error() -> errors.AEnvError:
    async def use_after_release() -> None:
        env = aenv_ray.Environment.attach("http://127.0.0.1:9", "probe@0.1.0")
        await env.release()
        await env.call_tool("echo", {"text": "hi"})

    return _raised(lambda: asyncio.run(use_after_release()))


def test_errors_from_real_raising_sites_say_what_happened_and_survive_pickle(
    tmp_path: Any,
) -> None:
    cases = [
        (_definition_error(), errors.DefinitionError, ["`list`", "reserved", "name="]),
        (_configuration_error(tmp_path), errors.ConfigurationError, ["cpu", "lots", "invalid"]),
        (
            _not_found_error(),
            errors.EnvironmentNotFoundError,
            ["mini-terminl@1.0.0", "did you mean `mini-terminal@1.0.0`", "AENV_ENV_PATH"],
        ),
        (_closed_error(), errors.InstanceClosedError, ["probe@0.1.0", "released", "create a new"]),
    ]
    for error, cls, fragments in cases:
        assert type(error) is cls
        for copier in COPIERS.values():
            clone = copier(error)
            _same(clone, error)
            for fragment in fragments:
                assert fragment in str(clone), (cls.__name__, fragment, str(clone))
    definition, _, not_found, closed = (case[0] for case in cases)
    assert isinstance(definition, errors.DefinitionError)
    assert definition.location is not None
    assert definition.location.startswith(__file__ + ":")
    assert not_found.env_name == "mini-terminl@1.0.0"
    assert closed.env_name == "probe@0.1.0"
