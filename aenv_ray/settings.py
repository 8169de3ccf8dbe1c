"""The one settings tree. Only this module reads ``os.environ``.

Variables use the ``AENV_`` prefix (``AENV_SYSTEM_URL``, ``AENV_API_KEY``, ``AENV_TIMEOUT``, ...);
``DUMMY_INSTANCE_IP`` is read as well, for compatibility with the seeds (their "local mode"; here
the *aenv run mode*: the SDK talks to a server started with ``aenv run``; "local" means only the
local engine). Below the
variables comes the user's settings file that ``aenv config set`` writes (:func:`config_file`).

    >>> Settings(system_url="http://hub:8000").system_url
    'http://hub:8000'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

__all__ = ["Settings", "config_file", "get_settings"]


def config_file() -> Path:
    """The user's settings file (``aenv config``): ``AENV_CONFIG_FILE``, else
    ``<user config dir>/aenv-ray/config.json``. Environment variables win over it."""
    configured = os.environ.get("AENV_CONFIG_FILE")
    if configured:
        return Path(configured)
    import platformdirs

    return Path(platformdirs.user_config_dir("aenv-ray")) / "config.json"


class Settings(BaseSettings):
    """Process-wide defaults; objects take explicit arguments that override these."""

    model_config = SettingsConfigDict(env_prefix="AENV_", extra="ignore", frozen=True)

    system_url: str | None = Field(
        default=None, description="control plane (EnvHub) URL; remote mode when set"
    )
    dummy_instance_ip: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DUMMY_INSTANCE_IP", "AENV_DUMMY_INSTANCE_IP"),
        description="aenv run mode: talk to an `aenv run` server at this address",
    )
    api_key: str | None = Field(default=None, description="Bearer key for the control plane")
    timeout: float = Field(default=60.0, gt=0, description="default per-call timeout, seconds")
    connect_timeout: float = Field(default=5.0, gt=0, description="TCP connect timeout")
    startup_timeout: float = Field(default=120.0, gt=0, description="wait for healthy, seconds")
    reconnect_window: float = Field(
        default=1.5,
        gt=0,
        description="how long a refused connection is retried before the instance is declared "
        "unreachable (seconds); keeps a dead server's error under a couple of seconds",
    )
    call_grace: float = Field(
        default=5.0,
        gt=0,
        description="how long past a call's timeout the SDK waits for the runtime's own timeout "
        "answer (the runtime answers by timeout + 2 s even for code that ignores interruption)",
    )
    functions_port: int = Field(default=8080, description="aenv run mode: functions/health port")
    mcp_port: int = Field(default=8081, description="aenv run mode: MCP port")
    env_path: str = Field(default="", description="colon-separated project directories")
    hub_route: Literal["auto", "direct", "proxy"] = Field(
        default="auto",
        description="remote mode: call instances directly (auto: when reachable) or through "
        "the hub's proxy",
    )
    engine: str = Field(
        default="local",
        description="the engine that creates instances when no hub is configured, by name "
        "(aenv_ray.engine.engine_names): local (in this process), daemon (the local engine's "
        "daemon), kubernetes, or another installed engine",
    )
    k8s_namespace: str = Field(
        default="", description="kubernetes engine: the namespace (default: the kubeconfig's)"
    )
    k8s_image_prefix: str = Field(
        default="",
        description="kubernetes engine: the registry path of environments that name no image",
    )
    k8s_delivery: Literal["image", "bundle", "host"] = Field(
        default="image",
        description="kubernetes engine: image (the environment's own), bundle (a generic runtime "
        "image fetches the version's bundle from EnvHub) or host (a test cluster whose kubelet "
        "runs commands on this host)",
    )
    k8s_runtime_image: str = Field(
        default="",
        description="kubernetes engine: the generic aenv-ray image (bundle delivery's runtime, "
        "and where DualContainer pods take the exec helper from; default "
        "ghcr.io/aenv-ray/aenv-ray:VERSION)",
    )
    k8s_hub_url: str = Field(
        default="",
        description="kubernetes engine, bundle delivery: EnvHub's URL as the pods reach it",
    )
    k8s_hub_key: str | None = Field(
        default=None,
        description="kubernetes engine, bundle delivery: the hub key pods fetch bundles with "
        "(stored in each pod's spec)",
    )
    state_dir: str = Field(
        default="",
        description="where `aenv instance` keeps its engine daemon (default: the user state dir)",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then ``AENV_*`` variables, then the ``aenv config`` file."""
        path = config_file()
        if not path.is_file():
            return init_settings, env_settings
        return init_settings, env_settings, JsonConfigSettingsSource(settings_cls, json_file=path)


def get_settings() -> Settings:
    """Read the environment now (cheap; not cached, so tests can change variables)."""
    return Settings()
