"""An environment project's ``config.json``, read and checked once at the edge.

The fields are the seeds' (name, version, description, tags, status, codeUrl, artifacts,
buildConfig, testConfig, deployConfig). Unknown top-level keys are rejected so that a typo such as
``deplyConfig`` is an error, not a silent default. Human units (``"2C"``, ``"512M"``, ``"30m"``)
are parsed here into numbers by :func:`parse_cpu`, :func:`parse_memory` and :func:`parse_duration`.

AEnvironment's keys are read too, so its projects load as they are: ``environmentVariables``
(merged into ``env``), the ``cpu``/``memory``/``ephemeralStorage`` requests and limits (one
amount each: the limit, else the request), ``deployConfig.service`` and its flat legacy keys
(:class:`ServiceConfig`), ``podTemplate: "Default"`` and a top-level ``requirements``. A key
that means nothing here is logged once per process (``aenv_ray.config``), saying why.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from aenv_ray.errors import ConfigurationError

__all__ = [
    "BuildConfig",
    "DeployConfig",
    "EnvConfig",
    "RewardConfig",
    "ServiceConfig",
    "TestConfig",
    "parse_cpu",
    "parse_duration",
    "parse_memory",
    "quiet_notes",
]

log = logging.getLogger("aenv_ray.config")

_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
_ENV_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$", re.IGNORECASE)
_WORKSPACE = re.compile(r"/[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# top-level directories an instance's workspace may not take: the system's and the engines' own
_RESERVED_DIRS = frozenset(
    {
        "bin", "boot", "data", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "run",
        "sbin", "storage", "sys", "tmp", "usr", "var",
    }
)  # fmt: skip


def _check_workspace(value: str) -> str:
    """The path of an instance's workspace (``deployConfig.workspace``): one directory right
    under ``/``, not one of the system's or the engines' own.

    >>> _check_workspace("/app")
    '/app'
    """
    if not isinstance(value, str) or not _WORKSPACE.fullmatch(value):
        raise ConfigurationError(
            f'workspace `{value}` is not a directory right under /; write e.g. "/app" '
            "(letters, digits, `.`, `_`, `-`)"
        )
    if value[1:] in _RESERVED_DIRS:
        raise ConfigurationError(
            f"workspace `{value}` is a directory of the system or the engine; choose another, "
            'e.g. "/app"'
        )
    return value


def parse_cpu(value: str | float | int) -> float:
    """``"2"``, ``"2C"``, ``"500m"`` (millicores) or a number -> cores.

    >>> parse_cpu("2C"), parse_cpu("500m"), parse_cpu(1.5)
    (2.0, 0.5, 1.5)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigurationError(f'cpu `{value!r}` is not a CPU amount; write e.g. "2" or "2C"')
    if isinstance(value, int | float):
        cores = float(value)
    else:
        text = value.strip()
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([cCmM]?)", text)
        if not match:
            raise ConfigurationError(f'cpu `{value}` is not a CPU amount; write e.g. "2" or "2C"')
        cores = float(match.group(1)) / (1000 if match.group(2) in ("m", "M") else 1)
    if not (0 < cores < math.inf):  # NaN and infinity (json.loads accepts them) fail here too
        raise ConfigurationError(f"cpu `{value}` must be a positive, finite number of cores")
    return cores


_MEM_UNITS = {
    "": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_memory(value: str | int) -> int:
    """``"512M"``, ``"4G"``, ``"1Gi"`` or bytes -> bytes. Single letters are binary, as in Docker.

    >>> parse_memory("512M"), parse_memory("1Gi"), parse_memory("2G")
    (536870912, 1073741824, 2147483648)
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ConfigurationError(f'memory `{value!r}` is not a size; write e.g. "512M" or "4G"')
    if isinstance(value, int):
        size = value
    else:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*((?:[kKmMgGtT]i?)?)[bB]?", value.strip())
        if not match:
            raise ConfigurationError(f'memory `{value}` is not a size; write e.g. "512M" or "4G"')
        unit = match.group(2).lower()
        # "512M" means MiB for container tools users know (docker -m 512m); keep that reading.
        factor = _MEM_UNITS[unit + "i"] if len(unit) == 1 else _MEM_UNITS[unit]
        size = int(float(match.group(1)) * factor)
    if size <= 0:
        raise ConfigurationError(f"memory `{value}` must be positive")
    return size


# one component: a number and its unit; spaces may separate the two, never two components
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(?:\s*(ms|s|m|h|d))?")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(value: str | float | int) -> float:
    """``"30m"``, ``"1h30m"``, ``"90s"``, ``"45"`` or a number of seconds -> seconds.

    >>> parse_duration("1h30m"), parse_duration("90"), parse_duration(2.5)
    (5400.0, 90.0, 2.5)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigurationError(
            f'duration `{value!r}` is not a time; write e.g. "30m", "1h" or "90s"'
        )
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip().lower()
        pos, seconds = 0, 0.0
        while pos < len(text):
            match = _DURATION.match(text, pos)
            if not match or match.end() == pos:
                raise ConfigurationError(
                    f'duration `{value}` is not readable; write e.g. "30m", "1h" or "90s"'
                )
            seconds += float(match.group(1)) * _SECONDS[match.group(2)]
            pos = match.end()
        if not text:
            raise ConfigurationError('duration is empty; write e.g. "30m"')
    if not (0 < seconds < math.inf):
        raise ConfigurationError(f"duration `{value}` must be a positive, finite time")
    return seconds


class _Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class BuildConfig(_Camel):
    """How to build the environment's image."""

    dockerfile: str = "./Dockerfile"
    model_config = ConfigDict(extra="allow")


class RewardConfig(_Camel):
    """How the reward runs: ``{"judge": true}`` runs it in the judge, as
    ``@register_reward(judge=True)`` does (either one is enough; docs/environments.md).
    ``maxWorkspaceFiles``, ``maxWorkspaceBytes`` (apparent size, and bytes on disk) and
    ``maxWorkspaceDepth``: how much of the workspace the judge copies; a workspace past one of
    them is graded 0, with a ``reason`` naming it (docs/security.md)."""

    judge: bool = False
    max_workspace_files: int = Field(default=200_000, ge=1)
    max_workspace_bytes: int = Field(default=4 << 30, ge=0)
    max_workspace_depth: int = Field(default=128, ge=1)


class TestConfig(_Camel):
    """How ``aenv test`` checks the project: ``script`` runs in the project directory."""

    script: str = ""


_NOTED: set[tuple[str, str]] = set()
_quiet = False  # quiet_notes() was called in this process


def quiet_notes() -> None:
    """Log none of the notes on ``config.json`` keys read but not used in this process: for a
    process whose parent read the same ``config.json`` and told them already, where its user
    sees them (a local engine's zygote shares the stderr of the command that started it, which
    would print each note twice)."""
    global _quiet
    _quiet = True


def _note_once(key: str, value: Any, why: str) -> None:
    """Log once per process that ``key`` (set to ``value``) is read but not used, and why."""
    shown = json.dumps(value, sort_keys=True, default=str)
    if (key, shown) in _NOTED or _quiet:
        return
    _NOTED.add((key, shown))
    log.warning(
        "config.json: %s is not used by aenv-ray: %s",
        key,
        why,
        extra={"key": key, "value": shown},
    )


class ServiceConfig(_Camel):
    """``deployConfig.service`` (AEnvironment's): defaults of ``aenv service create``.

    ``replicas`` and ``enableStorage`` are the defaults of ``--replicas`` and ``--storage``;
    ``storageSize`` is the size of a service's volume on the Kubernetes engine. ``port``,
    ``storageName``/``pvcName`` and ``mountPath`` are read and logged as unused: a service's
    runtime serves every route on 8080 and 8081, and its storage is mounted at ``/storage``.
    """

    replicas: int = Field(default=1, ge=0, le=64)
    port: int | None = Field(default=None, ge=1, le=65535)
    enable_storage: bool = False
    storage_name: str = ""
    pvc_name: str = ""
    storage_size: str | None = None
    mount_path: str | None = None

    @field_validator("storage_size", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        if value is not None:
            parse_memory(value)
            return str(value)
        return value


# AEnvironment's flat, legacy spelling of deployConfig.service's keys
_FLAT_SERVICE_KEYS = (
    "replicas",
    "port",
    "enableStorage",
    "storageName",
    "pvcName",
    "storageSize",
    "mountPath",
)
_RUNTIME_PORTS = (8080, 8081)
_STORAGE_PATH = "/storage"


def _one_amount(data: dict[str, Any], key: str) -> None:
    """Fold AEnvironment's ``KEYRequest``/``KEYLimit`` into ``KEY``: one amount, the request and
    the limit of an instance (the limit when both are given, as AEnvironment's docs recommend
    one value for both)."""
    request, limit = data.pop(f"{key}Request", None), data.pop(f"{key}Limit", None)
    if key in data or (request is None and limit is None):
        if request is not None or limit is not None:
            _note_once(
                f"deployConfig.{key}Request/{key}Limit",
                {"request": request, "limit": limit},
                f"`{key}` is given and is both the request and the limit of an instance",
            )
        return
    data[key] = limit if limit is not None else request
    if request is not None and limit is not None and request != limit:
        _note_once(
            f"deployConfig.{key}Request",
            request,
            f"an instance gets one {key} amount, the request and the limit: {key}Limit {limit}",
        )


def _pod_template(value: Any) -> Any:
    """``"Default"`` (AEnvironment's name) and case variants -> the names used here."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("default", "singlecontainer", "single"):
            return "singleContainer"
        if lowered == "dualcontainer":
            return "DualContainer"
    return value


def _aenvironment_deploy(data: dict[str, Any]) -> dict[str, Any]:
    """AEnvironment's ``deployConfig`` keys, read into ours (see the module docstring)."""
    data = dict(data)
    variables = data.pop("environmentVariables", data.pop("environment_variables", None))
    if variables is not None:
        if not isinstance(variables, dict):
            raise ValueError("environmentVariables must be an object of strings")
        env = data.get("env") or {}
        if not isinstance(env, dict):
            raise ValueError("env must be an object of strings")
        clash = sorted(k for k in set(env) & set(variables) if env[k] != variables[k])
        if clash:
            raise ValueError(
                f"env and environmentVariables give {', '.join(clash)} different values; "
                "keep one of the two keys"
            )
        data["env"] = {**variables, **env}
    for key in ("cpu", "memory", "ephemeralStorage"):
        _one_amount(data, key)
    flat = {k: data.pop(k) for k in _FLAT_SERVICE_KEYS if k in data}
    if flat:
        service = data.get("service")
        data["service"] = {**flat, **(service if isinstance(service, dict) else {})}
    service = data.get("service")
    if isinstance(service, dict):
        port = service.get("port")
        if port is not None and port not in _RUNTIME_PORTS:
            _note_once(
                "deployConfig.service.port",
                port,
                "a service's runtime serves every route on ports 8080 and 8081",
            )
        mount = service.get("mountPath")
        if mount not in (None, _STORAGE_PATH):
            _note_once(
                "deployConfig.service.mountPath",
                mount,
                f"a service's storage is mounted at {_STORAGE_PATH}",
            )
        for key in ("storageName", "pvcName"):
            if service.get(key):
                _note_once(
                    f"deployConfig.service.{key}",
                    service[key],
                    "a service's storage is named after the service",
                )
    if "podTemplate" in data:
        data["podTemplate"] = _pod_template(data["podTemplate"])
    return data


class DeployConfig(_Camel):
    """Resources and placement of an instance."""

    cpu: str | float = "1"
    memory: str | int = "2G"
    # AEnvironment's: the instance's disk (Kubernetes: the ephemeral-storage request and limit;
    # the local engine has no disk quota)
    ephemeral_storage: str | int | None = None
    os: str = "linux"
    image_prefix: str = ""
    pod_template: Literal["singleContainer", "DualContainer", ""] = ""
    env: dict[str, str] = Field(default_factory=dict)
    ttl: str | float | None = None
    network: bool = False
    # aenv-ray: where the instance's writable workspace is and its working directory
    workspace: str = "/workspace"
    pids: int = Field(default=512, ge=8, le=1 << 22)  # aenv-ray: most processes at once
    # aenv-ray: the environment's code makes namespaces of its own inside its instance (the boxes
    # of terminal-bench and swe); an engine that cannot give that refuses the definition (a
    # Kubernetes pod may not: docs/kubernetes.md)
    nested_namespaces: bool = False
    # aenv-ray, Kubernetes: a judge container beside the runtime, running this Python module of
    # the same image (``python -I -B -m MODULE --socket ... --workspace ...``): it grades where
    # the agent cannot reach, in place of the boxes nestedNamespaces asks for (docs/kubernetes.md)
    judge_container: str | None = None
    # aenv-ray, Kubernetes: the user's own pod template, YAML text or the same as a JSON object
    # (k8s_backend.templates checks and merges it; other engines ignore it)
    custom_pod_template: str | dict[str, Any] | None = None
    service: ServiceConfig = Field(default_factory=ServiceConfig)

    @model_validator(mode="before")
    @classmethod
    def _aenvironment(cls, data: Any) -> Any:
        return _aenvironment_deploy(data) if isinstance(data, dict) else data

    # "before" validators: they see the JSON value, so `true` is not read as 1 core or 1 byte
    @field_validator("cpu", mode="before")
    @classmethod
    def _cpu(cls, value: Any) -> Any:
        parse_cpu(value)
        return value

    @field_validator("memory", mode="before")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        parse_memory(value)
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace(cls, value: str) -> str:
        return _check_workspace(value)

    @field_validator("judge_container")
    @classmethod
    def _judge_container(cls, value: str | None) -> str | None:
        parts = (value or "x").split(".")
        if not all(p.isidentifier() for p in parts):
            raise ValueError(
                f"must name a Python module of the image (dotted names), not {value!r}"
            )
        return value

    @field_validator("ephemeral_storage", mode="before")
    @classmethod
    def _ephemeral_storage(cls, value: Any) -> Any:
        if value is not None:
            parse_memory(value)
        return value

    @field_validator("custom_pod_template", mode="before")
    @classmethod
    def _custom_pod_template(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, str | dict):
            raise ValueError("must be a pod template: its YAML as a string, or a JSON object")
        return value

    @field_validator("ttl", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> Any:
        if value is not None:
            parse_duration(value)
        return value


class EnvConfig(_Camel):
    """The parsed ``config.json`` of an environment project."""

    name: str
    version: str = "1.0.0"
    description: str = ""
    tags: list[str] = Field(default_factory=list)
    status: str = "Ready"
    code_url: str = ""
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    build_config: BuildConfig = Field(default_factory=BuildConfig)
    test_config: TestConfig = Field(default_factory=TestConfig)
    deploy_config: DeployConfig = Field(default_factory=DeployConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)

    @model_validator(mode="before")
    @classmethod
    def _requirements(cls, data: Any) -> Any:
        """AEnvironment's top-level ``requirements`` (``cpu``, ``memory``): the instance's, unless
        ``deployConfig`` gives them."""
        if not isinstance(data, dict) or "requirements" not in data:
            return data
        data = dict(data)
        wanted = data.pop("requirements")
        if not isinstance(wanted, dict):
            raise ValueError('requirements must be an object such as {"cpu": "1"}')
        unknown = sorted(set(wanted) - {"cpu", "memory"})
        if unknown:
            raise ValueError(f"requirements holds {', '.join(unknown)}; it takes cpu and memory")
        key = "deploy_config" if "deploy_config" in data else "deployConfig"
        deploy = dict(data.get(key) or {})
        for field in ("cpu", "memory"):
            given = {field, f"{field}Request", f"{field}Limit"} & set(deploy)
            if field in wanted and not given:
                deploy[field] = wanted[field]
        data[key] = deploy
        return data

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must start with a letter or digit and use only letters, digits, `-` and `_` "
                "(at most 63)"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        if not _VERSION.fullmatch(value):
            raise ValueError("must be a version such as 1.0.0 (letters, digits, `.`, `-`, `_`)")
        return value

    @property
    def ref(self) -> str:
        """``name@version``, the string the SDK and the registry use."""
        return f"{self.name}@{self.version}"

    @property
    def image_tag(self) -> str:
        """The image ``aenv build`` tags: ``NAME:VERSION`` below ``deployConfig.imagePrefix``.

        Image names are lowercase and tags cannot hold ``+``: the name is lowercased and a ``+``
        in the version becomes ``_``.

        >>> EnvConfig(name="Demo", version="1.0.0+local").image_tag
        'demo:1.0.0_local'
        >>> EnvConfig.model_validate({"name": "demo",
        ...     "deployConfig": {"imagePrefix": "reg.example/team"}}).image_tag
        'reg.example/team/demo:1.0.0'
        """
        prefix = self.deploy_config.image_prefix.strip()
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        return f"{prefix}{self.name.lower()}:{self.version.replace('+', '_')}"

    @property
    def image(self) -> str | None:
        """The environment's own image, where an engine that runs images finds its code: an
        ``artifacts`` entry of type ``image`` (its ``content``), else :attr:`image_tag` when
        ``deployConfig.imagePrefix`` names a registry, else None.

        >>> EnvConfig(name="demo", artifacts=[{"type": "image", "content": "r.io/d:7"}]).image
        'r.io/d:7'
        >>> EnvConfig(name="demo").image is None
        True
        """
        for artifact in self.artifacts:
            content = artifact.get("content")
            if artifact.get("type") == "image" and isinstance(content, str) and content:
                return content
        return self.image_tag if self.deploy_config.image_prefix.strip() else None

    def image_below(self, image_prefix: str = "") -> str | None:
        """The image an engine that runs images starts: :attr:`image`, else :attr:`image_tag`
        below ``image_prefix`` (the engine's registry path for projects that name none), else
        None.

        >>> EnvConfig(name="demo").image_below("reg.example/aenv/")
        'reg.example/aenv/demo:1.0.0'
        """
        if self.image is not None:
            return self.image
        prefix = image_prefix.strip().rstrip("/")
        return f"{prefix}/{self.image_tag}" if prefix else None

    @classmethod
    def load(cls, project: str | Path) -> EnvConfig:
        """Read ``project/config.json`` (or the file itself); every problem is one clear error."""
        path = Path(project)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise ConfigurationError(
                f"no config.json at {path}; run `aenv init NAME` to create a project"
            ) from exc
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigurationError(f"{path} must hold a JSON object")
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(
                f"`{'.'.join(str(p) for p in e['loc'])}`: {e['msg']}" for e in exc.errors()
            )
            raise ConfigurationError(f"{path} is invalid: {problems}") from exc
