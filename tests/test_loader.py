"""``load_project`` on project directories written into ``tmp_path``.

``load_project`` imports a project's modules into ``sys.modules`` under their plain names and puts
``src`` on ``sys.path``, so every project here gets module names with a fresh suffix, and a
fixture puts ``sys.path`` and ``sys.modules`` back after each test.
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aenv_ray import ConfigurationError, DefinitionError
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
        (
            {"name": "x", "deployConfig": {"podTemplate": "Triple"}},
            ["`deployConfig.podTemplate`"],
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


@pytest.mark.parametrize("config", [{"name": "probe\n"}, {"name": "probe", "version": "1.0\n"}])
def test_trailing_newline_in_name_or_version_is_rejected(
    tmp_path: Path, config: dict[str, Any]
) -> None:
    s = uid()
    root = make_project(tmp_path / "p", {f"m_{s}.py": TOOL.format(name="t")}, config=config)
    with pytest.raises(ConfigurationError):
        load_project(root)


@pytest.mark.parametrize(
    "deploy",
    ['{"cpu": NaN}', '{"cpu": Infinity}', '{"ttl": NaN}'],
    ids=["cpu-nan", "cpu-inf", "ttl-nan"],
)
def test_non_finite_numbers_in_config_are_rejected(tmp_path: Path, deploy: str) -> None:
    s = uid()
    root = make_project(
        tmp_path / "p",
        {f"m_{s}.py": TOOL.format(name="t")},
        config=f'{{"name": "x", "deployConfig": {deploy}}}',
    )
    with pytest.raises(ConfigurationError):
        load_project(root)
