"""OpenEnv's provider interface for a Python that cannot install aenv-ray's dependencies:
:class:`AenvRayProcessProvider`, which needs nothing but the standard library.

OpenEnv and aenv-ray pin different versions of the same packages (OpenEnv 0.10 needs
fastmcp >= 3), so an OpenEnv user's virtual environment cannot hold aenv-ray with its
dependencies. This provider runs aenv-ray where it is installed (``aenv`` on ``PATH``, e.g.
``uv tool install aenv-ray``; or a command given), as a child process:
``aenv openenv provide ENV --stop-on-stdin-eof`` creates the instance on the engine chosen,
starts the OpenEnv server inside it and its bridge (:class:`aenv_openenv.AenvRayProvider`),
prints the bridge's URL, and serves until this provider closes its standard input (or this
process dies: the pipe closes with it). So OpenEnv's own client starts and stops it::

    # pip install --no-deps aenv-ray   (beside openenv; this module imports only the stdlib)
    from openenv.core import GenericEnvClient
    from aenv_openenv.process_provider import AenvRayProcessProvider

    provider = AenvRayProcessProvider("counter-openenv@1.0.0", engine="kubernetes")
    with GenericEnvClient(provider=provider).sync() as env:  # starts the instance
        env.reset()
    # closed: the instance is released

    env = GenericEnvClient.from_docker_image("counter-openenv@1.0.0", provider=provider).sync()

Secrets never go on the child's command line: the bridge's token and the variables travel in
its environment (``AENV_OPENENV_TOKEN``, ``AENV_OPENENV_INSTANCE_ENV``,
``AENV_OPENENV_SERVER_ENV``). A failure to start is OpenEnv's ``RuntimeError`` (its providers'
contract), with the child's last words.

May import: the standard library only (this module runs in OpenEnv's virtual environment; the
package's ``__init__`` imports nothing eagerly, so importing it imports no aenv-ray code).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import IO, Any, Self

__all__ = ["COMMAND_VARIABLE", "AenvRayProcessProvider", "ProviderFaces"]

COMMAND_VARIABLE = "AENV_OPENENV_COMMAND"
"""Names the command that runs aenv-ray's CLI (``/opt/aenv/bin/python -m aenv_cli``), where
``aenv`` is not on ``PATH``."""


class ProviderFaces:
    """OpenEnv's ``ContainerProvider.close`` and ``RuntimeProvider`` (``start``/``stop``), and a
    context manager, over a provider's ``start_container``/``stop_container``: what both of
    aenv-ray's providers offer the same way."""

    def start_container(
        self, image: str | None, port: int | None = None, env_vars: dict[str, str] | None = None
    ) -> str:
        """Start the environment; its base URL (each provider's own)."""
        raise NotImplementedError

    def stop_container(self) -> None:
        """Stop it and release its instance (each provider's own; idempotent)."""
        raise NotImplementedError

    def close(self) -> None:
        """``ContainerProvider.close``: the same as :meth:`stop_container`."""
        self.stop_container()

    def start(
        self, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any
    ) -> str:
        """``RuntimeProvider.start``: :meth:`start_container` of ``env``."""
        return self.start_container(None, port=port, env_vars=env_vars)

    def stop(self) -> None:
        """``RuntimeProvider.stop``: :meth:`stop_container`."""
        self.stop_container()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_container()


class AenvRayProcessProvider(ProviderFaces):
    """OpenEnv's ``ContainerProvider`` (and ``RuntimeProvider``) over ``aenv openenv provide``
    in a child process (see the module).

    Args:
        env: the aenv-ray environment (``name@version``) :meth:`start` and a bare
            :meth:`start_container` run; with ``project``, its ``config.json``'s.
        project: an OpenEnv project made an aenv-ray environment (its ``config.json`` and
            ``src/``), run without registering it.
        engine: ``local``, ``daemon``, ``kubernetes`` (``None``: aenv-ray's default).
        datasource: the instance's datasource (local engine: a host directory at ``/data``,
            e.g. a virtual environment with the OpenEnv server's packages).
        server_env: environment variables of the OpenEnv server's process.
        token: the bridge then requires ``Authorization: Bearer TOKEN`` (:attr:`headers`).
        command: the command that runs aenv-ray's CLI (default: ``$AENV_OPENENV_COMMAND``,
            else ``aenv`` on ``PATH``).
        start_timeout: how long the instance and its server may take to start, in seconds.

        >>> AenvRayProcessProvider("counter-openenv@1.0.0", command=["aenv"]).base_url is None
        True
    """

    def __init__(
        self,
        env: str | None = None,
        *,
        project: str | os.PathLike[str] | None = None,
        engine: str | None = None,
        datasource: str = "",
        server_env: dict[str, str] | None = None,
        token: str | None = None,
        command: list[str] | None = None,
        start_timeout: float = 300.0,
    ) -> None:
        self.env = env
        self.project = os.fspath(project) if project is not None else None
        self.engine = engine
        self.datasource = datasource
        self.server_env = dict(server_env or {})
        self.token = token
        self._command = list(command) if command else None
        self.start_timeout = start_timeout
        self.base_url: str | None = None
        self.instance_id: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def headers(self) -> dict[str, str]:
        """What an OpenEnv client sends to the bridge (``{}`` without a token)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def command(self) -> list[str]:
        """The command that runs aenv-ray's CLI; ``RuntimeError`` saying how to name one."""
        if self._command:
            return list(self._command)
        given = os.environ.get(COMMAND_VARIABLE, "").strip()
        if given:
            return shlex.split(given)
        found = shutil.which("aenv")
        if found is None:
            raise RuntimeError(
                "AenvRayProcessProvider: no `aenv` command on PATH: install aenv-ray where its "
                f"pins hold (`uv tool install aenv-ray`), or set {COMMAND_VARIABLE} (e.g. "
                "'/opt/aenv/bin/python -m aenv_cli') or pass command=[...]"
            )
        return [found]

    # -- OpenEnv's ContainerProvider ------------------------------------------------------------

    def start_container(
        self,
        image: str | None = None,
        port: int | None = None,
        env_vars: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> str:
        """Start ``aenv openenv provide`` for ``image`` (an aenv-ray ``name@version``; default:
        ``env``) and return the bridge's base URL once the OpenEnv server inside answers."""
        if self._proc is not None:
            raise RuntimeError(
                f"AenvRayProcessProvider already runs {self.base_url}: stop_container() first"
            )
        ref = image or self.env
        if not ref and self.project is None:
            raise RuntimeError(
                "AenvRayProcessProvider: no environment: pass AenvRayProcessProvider("
                "'name@version') or project=DIR, or start_container('name@version')"
            )
        argv = [*self.command(), "openenv", "provide", "--stop-on-stdin-eof"]
        if ref:
            argv.append(ref)
        if self.project is not None:
            argv += ["--project", self.project]
        if self.engine:
            argv += ["--engine", self.engine]
        if self.datasource:
            argv += ["--datasource", self.datasource]
        if port:
            argv += ["--port", str(port)]
        child_env = {
            **os.environ,
            "AENV_OPENENV_INSTANCE_ENV": json.dumps(dict(env_vars or {})),
            "AENV_OPENENV_SERVER_ENV": json.dumps(self.server_env),
        }
        child_env.pop("AENV_OPENENV_TOKEN", None)
        if self.token:
            child_env["AENV_OPENENV_TOKEN"] = self.token
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (the child's stderr, kept until stop)
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=child_env
        )
        try:
            ready = self._first_line(self._proc)
        except BaseException:
            self.stop_container()
            raise
        self.base_url = str(ready["base_url"])
        self.instance_id = ready.get("instance_id")
        return self.base_url

    def _first_line(self, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
        """The child's line saying it serves (read on a thread: a deadline holds)."""
        stdout = proc.stdout
        assert stdout is not None
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.start_timeout)
        line = got[0] if got else b""
        if line.strip():
            try:
                return dict(json.loads(line))
            except ValueError:
                pass
        if reader.is_alive():
            why = f"did not serve within {self.start_timeout:g} s"
        else:
            why = f"exited with code {proc.wait(timeout=30)} before it served"
        raise RuntimeError(f"aenv openenv provide {why}: {self._tail()}")

    def _tail(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-3000:].strip()

    def wait_for_ready(self, base_url: str | None = None, timeout_s: float | None = 30.0) -> None:
        """Wait until ``/health`` answers 200 through the bridge (``start_container`` already
        waited for the server; this checks the path OpenEnv's client takes)."""
        url = base_url or self.base_url
        if url is None:
            raise RuntimeError("AenvRayProcessProvider is not started")
        deadline = time.monotonic() + (30.0 if timeout_s is None else timeout_s)
        request = urllib.request.Request(url + "/health", headers=self.headers)
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"aenv openenv provide exited: {self._tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s} s")
            time.sleep(0.1)  # the bridge is a process of its own: nothing here to wait on

    def stop_container(self) -> None:
        """Close the child's standard input (it releases the instance and exits); terminate
        it if it has not exited 60 s later. Idempotent."""
        proc, self._proc = self._proc, None
        self.base_url = self.instance_id = None
        if proc is not None:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._log is not None:
            self._log.close()
            self._log = None
