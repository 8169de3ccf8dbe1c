"""The error tree: one root, every class picklable with its attributes (Ray ships errors)."""

from __future__ import annotations

import copy
import inspect
import pickle

import pytest

import aenv_ray
from aenv_ray import errors

CLASSES = sorted(
    (cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, Exception)),
    key=lambda cls: cls.__name__,
)

# every keyword attribute a class accepts, with a value to round-trip
ATTRIBUTES = {
    "env_name": "mini-terminal@1.0.0",
    "instance_id": "abc123",
    "location": "/p/src/tools.py:12",
    "tool": "execute_command",
    "error_type": "ValueError",
    "timeout": 2.5,
    "function": "grade",
}


def _kwargs(cls: type[Exception]) -> dict[str, object]:
    accepted: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            accepted |= set(inspect.signature(vars(klass)["__init__"]).parameters)
    if "kw" in accepted or "kwargs" in accepted:
        accepted |= {"env_name", "instance_id"}
    return {k: v for k, v in ATTRIBUTES.items() if k in accepted}


def test_every_class_is_an_aenv_error_and_exported() -> None:
    assert len(CLASSES) >= 20
    for cls in CLASSES:
        assert issubclass(cls, errors.AEnvError), cls
        assert cls.__name__ in errors.__all__
        assert getattr(aenv_ray, cls.__name__) is cls
        assert cls.__doc__, f"{cls.__name__} needs a docstring saying when it is raised"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("copier", [lambda e: pickle.loads(pickle.dumps(e)), copy.deepcopy])
def test_round_trips_with_message_and_attributes(
    cls: type[errors.AEnvError], copier: object
) -> None:
    kwargs = _kwargs(cls)
    original = cls("instance abc123 ended: crashed", **kwargs)
    clone = copier(original)  # type: ignore[operator]
    assert type(clone) is cls
    assert str(clone) == str(original) == "instance abc123 ended: crashed"
    assert clone.message == original.message
    for key, value in kwargs.items():
        assert getattr(clone, key) == value, key
    assert vars(clone) == vars(original)


def test_retryable_is_a_class_attribute_by_what_to_do() -> None:
    retryable = {cls.__name__ for cls in CLASSES if cls.retryable}
    assert retryable == {
        "AEnvTimeoutError",
        "CallTimeoutError",
        "CapacityError",
        "InstanceBrokenError",
        "InstanceExpiredError",
        "InstanceUnreachableError",
        "StartupTimeoutError",
    }
    # the tool ran past its own limit: running it again will do the same
    assert not errors.ToolTimeoutError.retryable
    assert issubclass(errors.ToolTimeoutError, TimeoutError)


def test_builtin_bases_let_plain_handlers_catch_them() -> None:
    assert issubclass(errors.ConfigurationError, ValueError)
    assert issubclass(errors.ToolArgumentError, ValueError)
    assert issubclass(errors.EnvironmentNotFoundError, LookupError)
    assert issubclass(errors.InstanceNotFoundError, LookupError)
    assert issubclass(errors.CallTimeoutError, TimeoutError)


def test_the_tree_in_the_docstring_names_every_class() -> None:
    doc = errors.__doc__ or ""
    for cls in CLASSES:
        assert cls.__name__ in doc, f"{cls.__name__} is missing from the tree in errors.py"
