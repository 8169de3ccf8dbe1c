"""AEnvironment's instance models (``aenv.core.models``): what ``get_env_info()`` describes."""

from __future__ import annotations

import enum

from pydantic import BaseModel, Field

__all__ = ["EnvInstance", "EnvStatus"]


class EnvStatus(enum.StrEnum):
    """An instance's status, in AEnvironment's words."""

    PENDING = "Pending"
    CREATING = "Creating"
    RUNNING = "Running"
    FAILED = "Failed"
    TERMINATED = "Terminated"


class EnvInstance(BaseModel):
    """One instance: its id, status, address (``ip``: the runtime's URL) and times."""

    id: str = Field(description="the instance's id")
    status: str = Field(description="an EnvStatus value")
    created_at: str = Field(description="ISO 8601, UTC")
    updated_at: str = Field(description="ISO 8601, UTC")
    ip: str | None = Field(default=None, description="the runtime's URL")
    labels: dict[str, str] | None = Field(default=None, description="resource labels")
