"""``load_project`` on project directories written into ``tmp_path``.

``load_project`` imports a project's modules into ``sys.modules`` under their plain names and puts
``src`` on ``sys.path``, so every project here gets module names with a fresh suffix, and a
fixture puts ``sys.path`` and ``sys.modules`` back after each test.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aenv_ray import ConfigurationError, DefinitionError
from aenv_ray.config import parse_cpu, parse_duration, parse_memory
from sandbox_runtime import LoadedProject, load_project

TOOL = """
from aenv_ray import register_tool

@register_tool
def {name}(text: str) -> str:
    '''Echo.'''
    return text
"""


@pytest.fixture(autouse=True)
def _restore_import_state(tmp_path: Path) -> Iterator[None]:
    path = list(sys.path)
    modules = set(sys.modules)
    yield
    sys.path[:] = path
    for name in set(sys.modules) - modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file.startswith(str(tmp_path)):
            del sys.modules[name]


def uid() -> str:
    return uuid.uuid4().hex[:10]


def make_project(
    root: Path,
    modules: dict[str, str],
    *,
    config: dict[str, Any] | str | None = None,
    src: bool = True,
) -> Path:
    """Write config.json and the modules (dedented) under root/src; return root."""
    root.mkdir(parents=True, exist_ok=True)
    if config is None:
        config = {"name": "loader-test", "version": "1.0.0"}
    (root / "config.json").write_text(
        config if isinstance(config, str) else json.dumps(config), encoding="utf-8"
    )
    base = root / "src" if src else root
    for rel, text in modules.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return root


def line_of(path: Path, needle: str) -> int:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


# -- happy paths -------------------------------------------------------------------------------


def test_loads_tools_from_several_modules_and_sibling_imports(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "proj",
        {
            f"alpha_{s}.py": f"""
                from aenv_ray import register_tool, register_reward
                from helper_{s} import shout

                @register_tool
                def loud(text: str) -> str:
                    '''Shout it.'''
                    return shout(text)

                @register_reward
                def score(answer: str) -> float:
                    return 1.0
                """,
            f"helper_{s}.py": f"""
                from aenv_ray import register_function

                def shout(text: str) -> str:
                    return text.upper() + "!"

                @register_function
                def helper_{s}_fn(a: int) -> int:
                    return a * 2
                """,
            f"beta_{s}.py": TOOL.format(name=f"beta_{s}"),
        },
        config={"name": "multi", "version": "2.1.0", "deployConfig": {"cpu": "2C"}},
    )
    project = load_project(root)
    assert isinstance(project, LoadedProject)
    assert project.root == root.resolve()
    assert project.config.ref == "multi@2.1.0"
    assert project.config.deploy_config.cpu == "2C"
    registry = project.registry
    assert set(registry.tools) == {"loud", f"beta_{s}"}
    # The sibling was imported once, by alpha, and its registration landed in this registry.
    assert set(registry.functions) == {f"helper_{s}_fn"}
    assert registry.reward is not None
    assert registry.health is None
    assert registry.tools["loud"].fn("hi") == "HI!"
    alpha = root / "src" / f"alpha_{s}.py"
    assert registry.tools["loud"].location == f"{alpha}:{line_of(alpha, '@register_tool')}"
    assert sys.modules[f"helper_{s}"].__file__ == str(root / "src" / f"helper_{s}.py")


def test_registrations_do_not_leak_into_the_default_registry(tmp_path: Path) -> None:
    from aenv_ray.registry import default_registry

    before = len(default_registry)
    s = uid()
    load_project(make_project(tmp_path / "p", {f"m_{s}.py": TOOL.format(name=f"t_{s}")}))
    assert len(default_registry) == before


def test_project_without_src_directory(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "flat", {f"flat_{s}.py": TOOL.format(name="flat")}, src=False)
    assert list(load_project(root).registry.tools) == ["flat"]


def test_private_and_test_modules_are_not_imported(tmp_path: Path) -> None:
    s = uid()
    boom = "raise RuntimeError('must not be imported')\n"
    root = make_project(
        tmp_path / "p",
        {
            f"main_{s}.py": f"""
                from aenv_ray import register_tool
                from _private_{s} import VALUE

                @register_tool
                def value() -> str:
                    return VALUE
                """,
            f"_private_{s}.py": "VALUE = 'secret'\n",
            f"test_main_{s}.py": boom,
            f"tests/check_{s}.py": boom,
            f".hidden/mod_{s}.py": boom,
        },
    )
    project = load_project(root)
    assert list(project.registry.tools) == ["value"]
    assert project.registry.tools["value"].fn() == "secret"


def test_module_with_future_annotations_and_local_types(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"typed_{s}.py": """
                from __future__ import annotations

                import enum
                from typing import Literal

                from pydantic import BaseModel

                from aenv_ray import register_tool


                class Mode(enum.Enum):
                    A = "a"
                    B = "b"


                class Box(BaseModel):
                    w: int
                    h: int = 1


                @register_tool
                def area(box: Box, mode: Mode = Mode.A, unit: Literal["m", "cm"] = "m") -> int:
                    '''Area of a box.

                    Args:
                        box: the box.
                    '''
                    return box.w * box.h
                """,
        },
    )
    entry = load_project(root).registry.tools["area"]
    schema = entry.signature.input_schema
    assert schema["properties"]["box"]["$ref"] == "#/$defs/Box"
    assert schema["properties"]["box"]["description"] == "the box."
    assert schema["$defs"]["Mode"]["enum"] == ["a", "b"]
    assert schema["properties"]["unit"]["enum"] == ["m", "cm"]
    assert schema["required"] == ["box"]
    assert entry.description == "Area of a box."


def test_subpackage_modules_are_loaded(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"pkg_{s}/__init__.py": "",
            f"pkg_{s}/shared.py": "PREFIX = '> '\n",
            f"pkg_{s}/tools.py": """
                from aenv_ray import register_tool
                from .shared import PREFIX

                @register_tool
                def quote(text: str) -> str:
                    return PREFIX + text
                """,
        },
    )
    project = load_project(root)
    assert project.registry.tools["quote"].fn("x") == "> x"


# -- import failures -------------------------------------------------------------------------


def test_module_raising_at_import_names_file_and_line(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"broken_{s}.py": """
                from aenv_ray import register_tool

                CONFIG = {"a": 1}
                VALUE = CONFIG["missing"]
                """,
        },
    )
    path = root / "src" / f"broken_{s}.py"
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    where = f"{path}:{line_of(path, 'CONFIG[')}"
    assert info.value.location == where
    message = str(info.value)
    assert where in message
    assert "KeyError" in message
    assert "'missing'" in message
    assert isinstance(info.value.__cause__, KeyError)
    # The half-imported module does not stay behind: a fixed project loads.
    assert f"broken_{s}" not in sys.modules
    path.write_text(TOOL.format(name="fixed"))
    assert list(load_project(root).registry.tools) == ["fixed"]


def test_decorator_misuse_in_a_module_keeps_the_function_location(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"misuse_{s}.py": """
                from aenv_ray import register_tool

                @register_tool
                def loose(x):
                    return x
                """,
        },
    )
    path = root / "src" / f"misuse_{s}.py"
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    where = f"{path}:{line_of(path, '@register_tool')}"
    assert info.value.location == where
    assert "loose" in str(info.value)
    assert "write e.g. `x: str`" in str(info.value)
    assert f"misuse_{s}" not in sys.modules


def test_duplicate_tools_across_modules_name_both_files(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"one_{s}.py": TOOL.format(name="same"), f"two_{s}.py": TOOL.format(name="same")},
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    message = str(info.value)
    assert f"{root / 'src' / f'one_{s}.py'}:3" in message
    assert f"{root / 'src' / f'two_{s}.py'}:3" in message
    assert "registered twice" in message


def test_second_reward_across_modules(tmp_path: Path) -> None:
    s = uid()
    reward = """
        from aenv_ray import register_reward

        @register_reward
        def {name}() -> float:
            return 0.0
        """
    root = make_project(
        tmp_path / "p",
        {f"r1_{s}.py": reward.format(name="first"), f"r2_{s}.py": reward.format(name="second")},
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    message = str(info.value)
    for part in ("first", "second", f"r1_{s}.py:3", f"r2_{s}.py:3", "remove one"):
        assert part in message


def test_error_in_imported_sibling_names_the_sibling(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"aa_{s}.py": f"""
                from aenv_ray import register_tool
                import zz_{s}
                """,
            f"zz_{s}.py": """
                X = 1

                Y = 1 / 0
                """,
        },
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'zz_{s}.py'}:3"


def test_error_two_imports_deep_names_the_innermost_project_file(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"aa_{s}.py": f"import _mid_{s}\n",
            f"_mid_{s}.py": f"import _deep_{s}\n",
            f"_deep_{s}.py": "import json\n\nDATA = json.loads('{not json')\n",
        },
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    deep = root / "src" / f"_deep_{s}.py"
    # the innermost frame is inside the json module; the innermost one in the project is the call
    assert info.value.location == f"{deep}:3"
    message = str(info.value)
    assert f"importing {root / 'src' / f'aa_{s}.py'} failed at {deep}:3" in message
    assert "JSONDecodeError" in message
    assert not {f"aa_{s}", f"_mid_{s}", f"_deep_{s}"} & set(sys.modules)


def test_error_in_a_library_called_by_the_module_names_the_calling_line(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"lib_{s}.py": "import textwrap\n\n\nX = textwrap.dedent(None)\n"},
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'lib_{s}.py'}:4"


def test_syntax_error_in_an_imported_sibling_names_the_sibling(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"aa_{s}.py": f"from aenv_ray import register_tool\nimport _syn_{s}\n",
            f"_syn_{s}.py": "A = 1\nB = 2\nC = (\n",
        },
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'_syn_{s}.py'}:3"
    assert isinstance(info.value.__cause__, SyntaxError)


def test_indentation_error_location_has_the_line(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"ind_{s}.py": "def f() -> int:\nreturn 1\n"})
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'ind_{s}.py'}:2"
    assert "IndentationError" in str(info.value)


def test_syntax_error_of_compiled_text_names_the_compiling_line(tmp_path: Path) -> None:
    # the SyntaxError's own filename is "<text>", not a project file: the frame line stands
    s = uid()
    root = make_project(
        tmp_path / "p", {f"comp_{s}.py": "X = 1\nCODE = compile('1 +', '<text>', 'eval')\n"}
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'comp_{s}.py'}:2"


def test_sys_exit_at_import_is_a_definition_error(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"quit_{s}.py": "import sys\n\nsys.exit(3)\n"})
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'quit_{s}.py'}:3"
    assert "SystemExit: 3" in str(info.value)
    assert f"quit_{s}" not in sys.modules


def test_error_in_imported_sibling_is_still_a_definition_error(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"aa_{s}.py": f"import zz_{s}\n",
            f"zz_{s}.py": "Y = 1 / 0\n",
        },
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert "ZeroDivisionError" in str(info.value)
    assert f"aa_{s}.py" in str(info.value)
    assert f"zz_{s}" not in sys.modules


def test_syntax_error_names_file_and_line_in_message(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"syn_{s}.py": "x = 1\n\ndef f(:\n    pass\n"})
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    message = str(info.value)
    assert str(root / "src" / f"syn_{s}.py") in message
    assert "SyntaxError" in message
    assert "line 3" in message


def test_syntax_error_location_has_the_line(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"syn_{s}.py": "x = 1\n\ndef f(:\n    pass\n"})
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    assert info.value.location == f"{root / 'src' / f'syn_{s}.py'}:3"


@pytest.mark.parametrize("name", ["json", "os", "sys"])
def test_module_named_like_an_imported_module_is_a_clear_error(tmp_path: Path, name: str) -> None:
    root = make_project(tmp_path / "p", {f"{name}.py": TOOL.format(name="shadow")})
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    message = str(info.value)
    assert f"`{name}`" in message
    assert str(root / "src" / f"{name}.py") in message
    assert "already imported" in message
    assert "rename the file" in message
    # The real module is untouched.
    assert getattr(sys.modules[name], "__file__", None) != str(root / "src" / f"{name}.py")


def test_two_projects_with_the_same_module_name_clash_clearly(tmp_path: Path) -> None:
    s = uid()
    first = make_project(tmp_path / "a", {f"same_{s}.py": TOOL.format(name="one")})
    second = make_project(tmp_path / "b", {f"same_{s}.py": TOOL.format(name="two")})
    assert list(load_project(first).registry.tools) == ["one"]
    with pytest.raises(DefinitionError) as info:
        load_project(second)
    message = str(info.value)
    assert str(first / "src" / f"same_{s}.py") in message
    assert str(second / "src" / f"same_{s}.py") in message


def test_loading_the_same_project_twice(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"twice_{s}.py": TOOL.format(name="again")})
    assert list(load_project(root).registry.tools) == ["again"]
    assert list(load_project(root).registry.tools) == ["again"]


def test_loading_twice_gives_independent_registries_and_reimports_helpers(
    tmp_path: Path,
) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"main_{s}.py": f"""
                from aenv_ray import register_tool
                import _help_{s}

                @register_tool
                def count() -> int:
                    return _help_{s}.COUNTER
                """,
            f"_help_{s}.py": """
                from aenv_ray import register_function

                COUNTER = 0

                @register_function
                def bump() -> int:
                    return 1
                """,
        },
    )
    first = load_project(root)
    second = load_project(root)
    for project in (first, second):
        assert set(project.registry.tools) == {"count"}
        # the private helper ran again on the second load: its function is in both registries
        assert set(project.registry.functions) == {"bump"}
    assert first.registry.tools["count"].fn is not second.registry.tools["count"].fn
    assert sys.modules[f"main_{s}"].count is second.registry.tools["count"].fn


def test_loading_again_reads_the_files_as_they_are_now(tmp_path: Path) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"edit_{s}.py": TOOL.format(name="before")})
    assert list(load_project(root).registry.tools) == ["before"]
    path = root / "src" / f"edit_{s}.py"
    path.write_text(TOOL.format(name="after") + "\n# a different size: no stale bytecode\n")
    assert list(load_project(root).registry.tools) == ["after"]
    # a file added since the first load is found too
    (root / "src" / f"added_{s}.py").write_text(TOOL.format(name="added"))
    assert set(load_project(root).registry.tools) == {"after", "added"}


def test_reloading_after_another_project_puts_its_src_first(tmp_path: Path) -> None:
    s = uid()
    first = make_project(tmp_path / "a", {f"a_{s}.py": TOOL.format(name="a")})
    second = make_project(tmp_path / "b", {f"b_{s}.py": TOOL.format(name="b")})
    load_project(first)
    load_project(second)
    assert sys.path[0] == str(second / "src")
    assert list(load_project(first).registry.tools) == ["a"]
    assert sys.path[0] == str(first / "src")
    assert sys.path.count(str(first / "src")) == 1


def test_private_helpers_with_the_same_name_in_two_projects_clash_clearly(
    tmp_path: Path,
) -> None:
    # without the check the second project would silently import the first one's helper
    s = uid()
    user = """
        from aenv_ray import register_tool
        from _shared_{s} import WHO

        @register_tool
        def {name}() -> str:
            return WHO
        """
    first = make_project(
        tmp_path / "a",
        {f"a_{s}.py": user.format(s=s, name="a"), f"_shared_{s}.py": "WHO = 'a'\n"},
    )
    second = make_project(
        tmp_path / "b",
        {f"b_{s}.py": user.format(s=s, name="b"), f"_shared_{s}.py": "WHO = 'b'\n"},
    )
    assert load_project(first).registry.tools["a"].fn() == "a"
    with pytest.raises(DefinitionError) as info:
        load_project(second)
    message = str(info.value)
    assert f"`_shared_{s}`" in message
    assert str(first / "src" / f"_shared_{s}.py") in message
    assert str(second / "src" / f"_shared_{s}.py") in message
    assert "rename the file" in message
    assert info.value.location == str(second / "src" / f"_shared_{s}.py")


def test_project_with_no_registrations(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"plain_{s}.py": "def helper() -> int:\n    return 1\n"},
        config={"name": "empty-env", "version": "0.1"},
    )
    with pytest.raises(DefinitionError) as info:
        load_project(root)
    message = str(info.value)
    assert "empty-env@0.1" in message
    assert "registers no tool" in message
    assert "@register_tool" in message


def test_project_with_only_a_health_check_registers_nothing_useful(tmp_path: Path) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {
            f"h_{s}.py": """
                from aenv_ray import register_health

                @register_health
                def ok() -> bool:
                    return True
                """
        },
    )
    with pytest.raises(DefinitionError, match="registers no tool"):
        load_project(root)


def test_project_with_no_modules(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {"README.md": "nothing"})
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    assert "holds no Python module" in str(info.value)
    assert str(root / "src") in str(info.value)


# -- config.json problems ----------------------------------------------------------------------


def test_missing_config_json(tmp_path: Path) -> None:
    root = tmp_path / "noconfig"
    (root / "src").mkdir(parents=True)
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    assert f"no config.json at {root / 'config.json'}" in str(info.value)
    assert "aenv init" in str(info.value)
    assert not isinstance(info.value, DefinitionError)


def test_invalid_json(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {}, config='{"name": "x",}')
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    assert f"{root / 'config.json'} is not valid JSON" in str(info.value)
    assert "line 1" in str(info.value)


def test_config_not_an_object(tmp_path: Path) -> None:
    root = make_project(tmp_path / "p", {}, config='["name"]')
    with pytest.raises(ConfigurationError, match="must hold a JSON object"):
        load_project(root)


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        (
            {"name": "x", "deplyConfig": {"cpu": "1"}},
            ["`deplyConfig`", "Extra inputs are not permitted"],
        ),
        ({"name": "x", "deployConfig": {"cpus": "1"}}, ["`deployConfig.cpus`"]),
        ({"version": "1.0.0"}, ["`name`", "Field required"]),
        ({"name": "has space"}, ["`name`", "letters, digits"]),
        ({"name": "bad/name"}, ["`name`"]),
        ({"name": "-lead"}, ["`name`"]),
        ({"name": "x" * 64}, ["`name`", "at most 63"]),
        ({"name": "x", "version": ""}, ["`version`", "version such as 1.0.0"]),
        ({"name": "x", "version": "1.0 beta"}, ["`version`"]),
        ({"name": "x", "deployConfig": {"cpu": "lots"}}, ["`deployConfig.cpu`", "lots"]),
        ({"name": "x", "deployConfig": {"cpu": "0"}}, ["`deployConfig.cpu`", "positive"]),
        ({"name": "x", "deployConfig": {"memory": "2X"}}, ["`deployConfig.memory`", "2X"]),
        ({"name": "x", "deployConfig": {"memory": 0}}, ["`deployConfig.memory`", "positive"]),
        ({"name": "x", "deployConfig": {"ttl": "forever"}}, ["`deployConfig.ttl`", "forever"]),
        ({"name": "x", "deployConfig": {"ttl": "0s"}}, ["`deployConfig.ttl`", "positive"]),
        ({"name": "x", "deployConfig": {"workspace": "app"}}, ["`deployConfig.workspace`", "/"]),
        ({"name": "x", "deployConfig": {"workspace": "/a/b"}}, ["`deployConfig.workspace`"]),
        (
            {"name": "x", "deployConfig": {"workspace": "/usr"}},
            ["`deployConfig.workspace`", "system"],
        ),
        (
            {"name": "x", "deployConfig": {"podTemplate": "Triple"}},
            ["`deployConfig.podTemplate`"],
        ),
        (
            {"name": "x", "deployConfig": {"customPodTemplate": ["spec"]}},
            ["`deployConfig.customPodTemplate`", "YAML as a string, or a JSON object"],
        ),
        ({"name": "x", "tags": "a,b"}, ["`tags`"]),
    ],
)
def test_invalid_config_is_a_configuration_error(
    tmp_path: Path, config: dict[str, Any], fragments: list[str]
) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"m_{s}.py": TOOL.format(name="t")}, config=config)
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    message = str(info.value)
    assert message.startswith(f"{root / 'config.json'} is invalid: ")
    for fragment in fragments:
        assert fragment in message
    # Nothing was imported: the config is checked first.
    assert f"m_{s}" not in sys.modules


def test_config_fields_are_read(tmp_path: Path) -> None:
    s = uid()
    config = {
        "name": "full_env",
        "version": "3.0.0-rc1",
        "description": "d",
        "tags": ["a", "b"],
        "codeUrl": "https://example.invalid/x",
        "buildConfig": {"dockerfile": "./Dockerfile.gpu", "extraKey": 1},
        "testConfig": {"script": "pytest -q"},
        "deployConfig": {
            "cpu": 0.5,
            "memory": "512M",
            "ttl": "1h30m",
            "env": {"A": "1"},
            "podTemplate": "DualContainer",
            "imagePrefix": "reg.example/x",
        },
    }
    loaded = load_project(
        make_project(tmp_path / "p", {f"m_{s}.py": TOOL.format(name="t")}, config=config)
    ).config
    assert loaded.ref == "full_env@3.0.0-rc1"
    assert loaded.tags == ["a", "b"]
    assert loaded.code_url == "https://example.invalid/x"
    assert loaded.build_config.dockerfile == "./Dockerfile.gpu"
    assert loaded.test_config.script == "pytest -q"
    deploy = loaded.deploy_config
    assert (deploy.cpu, deploy.memory, deploy.ttl) == (0.5, "512M", "1h30m")
    assert deploy.env == {"A": "1"}
    assert deploy.pod_template == "DualContainer"
    assert deploy.image_prefix == "reg.example/x"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"name": "probe\n"}, "`name`"),
        ({"name": "probe", "version": "1.0\n"}, "`version`"),
        ({"name": "probe\r\n"}, "`name`"),
    ],
)
def test_trailing_newline_in_name_or_version_is_rejected(
    tmp_path: Path, config: dict[str, Any], field: str
) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"m_{s}.py": TOOL.format(name="t")}, config=config)
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    assert field in str(info.value)
    assert f"m_{s}" not in sys.modules


@pytest.mark.parametrize(
    ("deploy", "fragments"),
    [
        ('{"cpu": NaN}', ["`deployConfig.cpu`", "finite"]),
        ('{"cpu": Infinity}', ["`deployConfig.cpu`", "finite"]),
        ('{"cpu": -Infinity}', ["`deployConfig.cpu`"]),
        ('{"ttl": NaN}', ["`deployConfig.ttl`", "finite"]),
        ('{"ttl": Infinity}', ["`deployConfig.ttl`", "finite"]),
        ('{"memory": NaN}', ["`deployConfig.memory`", "not a size"]),
        ('{"memory": Infinity}', ["`deployConfig.memory`", "not a size"]),
    ],
    ids=["cpu-nan", "cpu-inf", "cpu-minus-inf", "ttl-nan", "ttl-inf", "memory-nan", "memory-inf"],
)
def test_non_finite_numbers_in_config_are_rejected(
    tmp_path: Path, deploy: str, fragments: list[str]
) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"m_{s}.py": TOOL.format(name="t")},
        config=f'{{"name": "x", "deployConfig": {deploy}}}',
    )
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    message = str(info.value)
    assert message.startswith(f"{root / 'config.json'} is invalid: ")
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize(
    ("deploy", "field"),
    [({"cpu": True}, "cpu"), ({"memory": True}, "memory"), ({"ttl": False}, "ttl")],
)
def test_booleans_are_not_amounts(tmp_path: Path, deploy: dict[str, Any], field: str) -> None:
    # pydantic would read `true` as 1 (one core, one byte): the check sees the JSON value first
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"m_{s}.py": TOOL.format(name="t")},
        config={"name": "x", "deployConfig": deploy},
    )
    with pytest.raises(ConfigurationError) as info:
        load_project(root)
    assert f"`deployConfig.{field}`" in str(info.value)


# -- units: parse_cpu, parse_memory, parse_duration --------------------------------------------

_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "": 1}
_BINARY = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


@given(cores=st.integers(1, 512), suffix=st.sampled_from(["", "c", "C"]), space=st.booleans())
def test_parse_cpu_reads_whole_cores(cores: int, suffix: str, space: bool) -> None:
    text = f"{cores}{' ' if space and suffix else ''}{suffix}"
    assert parse_cpu(text) == cores
    assert parse_cpu(cores) == cores
    assert parse_cpu(f"  {text} ") == cores


@given(milli=st.integers(1, 10**6), unit=st.sampled_from(["m", "M"]))
def test_parse_cpu_reads_millicores(milli: int, unit: str) -> None:
    assert parse_cpu(f"{milli}{unit}") == pytest.approx(milli / 1000)


@given(value=st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_parse_cpu_numbers_round_trip(value: float) -> None:
    assert parse_cpu(value) == value
    assert parse_cpu(f"{value:.6f}") == pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize(
    "bad",
    ["", "lots", "2 cores", "-1", "1e3", "0", "0m", "0.0", "2CC", "1/2", "\n", True, None, [2]],
)
def test_parse_cpu_rejects(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="cpu"):
        parse_cpu(bad)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf])
def test_parse_cpu_rejects_numbers_that_are_no_amount(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="positive, finite"):
        parse_cpu(bad)


@given(
    amount=st.integers(1, 4096),
    unit=st.sampled_from(["", "k", "m", "g", "t"]),
    binary_marker=st.booleans(),
    upper=st.booleans(),
    byte_suffix=st.sampled_from(["", "b", "B"]),
)
def test_parse_memory_round_trips(
    amount: int, unit: str, binary_marker: bool, upper: bool, byte_suffix: str
) -> None:
    # a single letter is binary, as in Docker ("512M" is 512 MiB); "i" says so explicitly;
    # two-letter units without "i" do not exist, so KB/MB/GB read as K/M/G
    letters = unit.upper() if upper else unit
    if binary_marker and unit:
        letters += "i"
    factor = _BINARY[unit]
    assert parse_memory(f"{amount}{letters}{byte_suffix}") == amount * factor
    assert parse_memory(amount * factor) == amount * factor


@given(amount=st.integers(1, 10**6))
def test_parse_memory_plain_number_is_bytes(amount: int) -> None:
    assert parse_memory(str(amount)) == amount == parse_memory(amount)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "2X",
        "lots",
        "-1G",
        "0",
        "0G",
        "0.1",
        "1 GB of RAM",
        "1e9",
        "512i",
        "1ib",
        True,
        2.0,
        None,
    ],
)
def test_parse_memory_rejects(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="memory"):
        parse_memory(bad)


_components = st.lists(
    st.tuples(st.integers(1, 10_000), st.sampled_from(sorted(_UNIT_SECONDS))),
    min_size=1,
    max_size=4,
)


@given(parts=_components, upper=st.booleans())
def test_parse_duration_adds_up_its_components(parts: list[tuple[int, str]], upper: bool) -> None:
    # only the last component may lack a unit: "1h30" is 1 h + 30 s; "30 1h" is unreadable
    parts = [(n, unit or "s") for n, unit in parts[:-1]] + [parts[-1]]
    text = "".join(f"{n}{unit}" for n, unit in parts)
    expected = sum(n * _UNIT_SECONDS[unit] for n, unit in parts)
    assert parse_duration(text.upper() if upper else text) == pytest.approx(expected)


@given(value=st.floats(min_value=1e-3, max_value=1e9, allow_nan=False, allow_infinity=False))
def test_parse_duration_numbers_round_trip(value: float) -> None:
    assert parse_duration(value) == value


@pytest.mark.parametrize(
    "bad",
    ["", " ", "forever", "0s", "0", "1 1", "1h 30m", "30 1h", "-5s", "1y", "h", "1.5.5s", True],
)
def test_parse_duration_rejects(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="duration"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf])
def test_parse_duration_rejects_numbers_that_are_no_time(bad: float) -> None:
    with pytest.raises(ConfigurationError, match="positive, finite"):
        parse_duration(bad)


@given(text=st.text(alphabet="0123456789.smhdMGKiIbBcC :-xe\n", max_size=8))
def test_units_either_parse_to_a_positive_number_or_raise_a_configuration_error(
    text: str,
) -> None:
    # never a KeyError, ValueError or IndexError from inside the parser
    for parse in (parse_cpu, parse_memory, parse_duration):
        message = None
        try:
            value = parse(text)
        except ConfigurationError as exc:
            message = str(exc)
        if message is None:
            assert 0 < value < math.inf
        else:  # the message quotes what was written (or says it was empty)
            assert text.strip().lower() in message.lower() or "empty" in message
