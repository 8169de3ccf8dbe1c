"""The files ``aenv init NAME`` writes: a small working project, made offline.

Templates are ``string.Template`` texts (``$name``, ``$module``, ``$ref``, ``$version``), so the
braces of Python and JSON inside them need no escaping.
"""

from __future__ import annotations

import importlib.util
import json
import keyword
import re
import sys
from pathlib import Path
from string import Template

from aenv_cli._image import DEFAULT_BASE_IMAGE, dockerfile_lines
from aenv_ray.config import EnvConfig

__all__ = ["config_text", "module_name", "project_files", "write_project"]

_MODULE = '''\
"""$name: an example environment. Replace these functions with your own.

Each instance of the environment is its own process, so module-level state (``NOTES``) belongs
to one instance: what one agent writes, another never sees.
"""

from __future__ import annotations

from aenv_ray import register_health, register_reward, register_tool

NOTES: list[str] = []


@register_tool
def add_note(text: str) -> dict[str, object]:
    """Save a note in this instance and say how many notes it now holds.

    Args:
        text: the note to save, e.g. "buy milk".
    """
    if not text.strip():
        raise ValueError("a note needs some text")
    NOTES.append(text)
    return {"saved": text, "count": len(NOTES)}


@register_reward
def has_note(expected: str) -> float:
    """1.0 when a saved note contains `expected`, else 0.0.

    Args:
        expected: the text the agent was asked to save.
    """
    return 1.0 if any(expected in note for note in NOTES) else 0.0


@register_health
def health() -> dict[str, object]:
    """Healthy while the instance answers; reports how many notes it holds."""
    return {"status": "healthy", "notes": len(NOTES)}
'''

_TEST = '''\
"""Tests for $ref: its functions called directly, then the environment served for real."""

from __future__ import annotations

import asyncio
from pathlib import Path

from $module import add_note, has_note  # pytest.ini puts src/ on sys.path

from aenv_ray.testing import RuntimeProcess

PROJECT = Path(__file__).resolve().parent.parent


def test_functions_are_plain_functions() -> None:
    assert add_note("buy milk")["count"] >= 1
    assert has_note("milk") == 1.0


async def _episode(runtime: RuntimeProcess) -> None:
    async with runtime.environment() as env:
        tools = await env.list_tools()
        assert [tool["name"] for tool in tools] == ["$ref/add_note"]
        assert await env.call_reward({"expected": "milk"}) == 0.0
        result = await env.call_tool("add_note", {"text": "buy milk"})
        assert not result.is_error, result.text
        assert await env.call_reward({"expected": "milk"}) == 1.0
        empty = await env.call_tool("add_note", {"text": " "})
        assert empty.is_error and "needs some text" in empty.text


def test_served_environment() -> None:
    # RuntimeProcess serves the project the way `aenv run` does, on free loopback ports.
    with RuntimeProcess(PROJECT) as runtime:
        asyncio.run(_episode(runtime))
'''

_PYTEST_INI = """\
[pytest]
testpaths = tests
pythonpath = src
# The tests drive asyncio themselves (asyncio.run); drop this to write `async def` tests with
# pytest-asyncio.
addopts = -p no:asyncio
"""

_DOCKERFILE_HEAD = """\
# The image of $ref, built by `aenv build` in the context it prepares, dist/image/:
#   env/     the bundle's files (config.json, src/, aenv.lock ...)
#   wheels/  a wheel of the aenv-ray that built it (never installed from an index by name)
# Without docker, podman or buildah here: `aenv build --no-image`, then, where a builder
# exists, `docker build -t $tag dist/image`. Edit freely (system packages: RUN
# apt-get ...), but copy only from env/ and wheels/: the project itself is not the context.
"""

_REQUIREMENTS = """\
# What the environment's own code needs, one requirement per line; `aenv build` pins them into
# aenv.lock (the image installs aenv-ray itself from a wheel). Tests need pytest.
"""

_README = """\
# $name

An aenv-ray environment, `$ref`. Its code is in `src/$module.py`: one tool (`add_note`), a
reward (`has_note`) and a health check. Replace them with your own.

## Test it

    aenv test $name        # runs testConfig.script from config.json: python -m pytest -q tests

## Serve it locally

    aenv run $name         # tools, functions and health on http://127.0.0.1:8080, MCP on :8081/mcp

Then, from another shell:

```python
import asyncio
from aenv_ray import Environment

async def main():
    async with Environment("$ref") as env:
        print(await env.list_tools())
        print(await env.call_tool("add_note", {"text": "buy milk"}))
        print(await env.call_reward({"expected": "milk"}))

asyncio.run(main())
```

run with `DUMMY_INSTANCE_IP=http://localhost python agent.py`. Any MCP client can use
`http://127.0.0.1:8081/mcp` as well.

## Build its image

    aenv build $name       # dist/: the bundle (what `aenv push` publishes) and the image's
                           # context dist/image/; builds $tag with docker, podman or buildah

The image installs aenv-ray from a wheel `aenv build` writes into its context (not from a
package index) and the requirements pinned in `aenv.lock`. Without a builder on this machine,
copy `dist/image/` to one that has one and run `docker build -t $tag .` there.

## Files

- `config.json`: name, version, resources (`deployConfig`), the test script (`testConfig`)
- `src/`: every public module here is imported; decorate functions with `@register_tool`,
  `@register_function`, `@register_reward`, `@register_health`
- `tests/`: the project's tests; `requirements.txt`: what `src/` needs
- `Dockerfile`: the instance image, built by `aenv build` in the context it prepares
"""


def module_name(name: str) -> str:
    """A Python module name for the environment ``name`` that shadows nothing importable."""
    module = re.sub(r"\W", "_", name.replace("-", "_")).lower()
    if module[:1].isdigit() or keyword.iskeyword(module):
        module = f"env_{module}"
    if module in sys.stdlib_module_names or importlib.util.find_spec(module) is not None:
        module = f"{module}_env"
    return module


def _config(name: str, version: str = "1.0.0") -> str:
    raw = {
        "name": name,
        "version": version,
        "description": f"{name}: an example environment made by `aenv init`.",
        "tags": [],
        "status": "Ready",
        "codeUrl": "",
        "artifacts": [],
        "buildConfig": {"dockerfile": "./Dockerfile"},
        "testConfig": {"script": "python -m pytest -q tests"},
        "deployConfig": {"cpu": "1", "memory": "2G", "os": "linux", "ttl": "30m"},
    }
    EnvConfig.model_validate(raw)  # the template must stay a valid config
    return json.dumps(raw, indent=2) + "\n"


def config_text(name: str, version: str = "1.0.0") -> str:
    """The ``config.json`` of a new project ``name@version`` (``aenv init --config-only``)."""
    return _config(name, version)


def project_files(name: str, version: str = "1.0.0") -> dict[str, str]:
    """Relative path -> text of every file of a new project called ``name`` (``version``)."""
    module = module_name(name)
    values = {
        "name": name,
        "module": module,
        "ref": f"{name}@{version}",
        "tag": EnvConfig(name=name, version=version).image_tag,
    }
    dockerfile = [
        Template(_DOCKERFILE_HEAD).substitute(values).rstrip("\n"),
        *dockerfile_lines(DEFAULT_BASE_IMAGE),
    ]
    return {
        "config.json": _config(name, version),
        f"src/{module}.py": Template(_MODULE).substitute(values),
        f"tests/test_{module}.py": Template(_TEST).substitute(values),
        "pytest.ini": _PYTEST_INI,
        "Dockerfile": "\n".join(dockerfile) + "\n",
        "requirements.txt": _REQUIREMENTS,
        "README.md": Template(_README).substitute(values),
    }


def write_project(root: Path, name: str, version: str = "1.0.0") -> list[Path]:
    """Write the files of project ``name`` under ``root`` (created); return the paths written."""
    written = []
    for relative, text in project_files(name, version).items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
