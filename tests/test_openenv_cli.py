"""``aenv openenv serve``'s refusals, before it serves (in this process: tests/_cli.py)."""

from __future__ import annotations

from tests._cli import aenv


def test_an_unknown_environment_exits_2_naming_it() -> None:
    done = aenv("openenv", "serve", "no-such-env@9.9.9", "--port", "1")
    assert done.returncode == 2
    assert "no-such-env" in done.stderr


def test_an_unknown_engine_exits_2_naming_the_engines() -> None:
    done = aenv("openenv", "serve", "mini-terminal@1.0.0", "--engine", "nope", "--port", "1")
    assert done.returncode == 2
    assert "local" in done.stderr


def test_the_limit_is_at_least_one() -> None:
    done = aenv("openenv", "serve", "mini-terminal@1.0.0", "--max-concurrent-envs", "0")
    assert done.returncode == 2
    assert "--max-concurrent-envs" in done.stderr


def test_help_names_the_endpoints_clients() -> None:
    done = aenv("openenv", "serve", "--help")
    assert done.returncode == 0
    assert "OpenEnv" in done.stdout
