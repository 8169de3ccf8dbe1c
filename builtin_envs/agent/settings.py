"""An agent instance's settings: read from its environment variables when a call needs them.

An instance gets its variables at creation (``Environment(..., environment_variables={...})``
over the project's ``deployConfig.env``), never at import time (the template that imports the
project has only ``deployConfig.env``), so :meth:`AgentSettings.read` is called per chat.

    >>> s = AgentSettings.read({"AGENT_BASE_URL": "http://127.0.0.1:8000/v1",
    ...                         "AGENT_MODEL": "m", "OPENAI_API_KEY": "sk-secret"})
    >>> s.model, s.api_key == "sk-secret", s.max_turns, s.environment
    ('m', True, 10, None)
    >>> s.scrub("the key is sk-secret")
    'the key is [redacted]'
    >>> redact_url("http://user:pw@host:8000/v1")
    'http://***@host:8000/v1'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from aenv_ray.envref import EnvRef
from aenv_ray.errors import ConfigurationError

__all__ = ["PREFIX_INNER", "REDACTED", "AgentSettings", "redact_url"]

REDACTED = "[redacted]"
PREFIX_INNER = "AGENT_INNER_"
"""``AGENT_INNER_NAME=value`` in an agent instance sets ``NAME=value`` in its inner instance."""

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_NOT_SECRET = frozenset({"AGENT_API_KEY_VAR"})  # named like a secret, holds a variable's name
_MIN_SECRET = 6  # shorter values are not scrubbed from text (they would mangle ordinary words)
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def redact_url(url: str) -> str:
    """``url`` without the user and password it may carry (``http://***@host/v1``)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def _number(variables: Mapping[str, str], name: str, default: float, *, least: float) -> float:
    text = variables.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{name}={text!r} is not a number") from None
    if not (least <= value < math.inf):
        raise ConfigurationError(f"{name}={text!r} must be at least {least:g}")
    return value


@dataclass(frozen=True)
class AgentSettings:
    """What one agent instance is: its model, its inner environment, its limits.

    ``problem`` is why it cannot chat (no model configured, a bad value); the rest holds the
    defaults then. ``inner_variables`` is what the inner instance gets (``AGENT_FORWARD`` and
    ``AGENT_INNER_*``); ``secrets`` are the values never shown (:meth:`scrub`).
    """

    base_url: str = ""
    model: str = ""
    api_key_variable: str = "OPENAI_API_KEY"
    api_key: str = field(default="", repr=False)
    environment: str | None = None
    system_prompt: str = ""
    max_turns: int = 10
    temperature: float | None = None
    model_timeout: float = 120.0
    tool_timeout: float = 300.0
    inner_ttl: float = 60.0
    hub_url: str | None = None
    hub_key: str = field(default="", repr=False)
    hub_route: str = "auto"
    instance_id: str = ""
    inner_variables: Mapping[str, str] = field(default_factory=dict, repr=False)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    problem: str | None = None

    @classmethod
    def read(cls, variables: Mapping[str, str]) -> AgentSettings:
        """The settings in ``variables`` (an instance's ``os.environ``); a bad or missing value
        becomes :attr:`problem`, never an exception."""
        secrets = _secrets(variables)
        try:
            return cls._parse(variables, secrets)
        except ConfigurationError as exc:
            message = str(exc)
            for secret in secrets:
                message = message.replace(secret, REDACTED)
            return cls(secrets=secrets, problem=message)

    @classmethod
    def _parse(cls, variables: Mapping[str, str], secrets: tuple[str, ...]) -> AgentSettings:
        get = variables.get
        key_variable = get("AGENT_API_KEY_VAR", "").strip() or "OPENAI_API_KEY"
        if not _VARIABLE.match(key_variable):
            raise ConfigurationError(f"AGENT_API_KEY_VAR={key_variable!r} is not a variable name")
        environment = get("AGENT_ENV", "").strip() or None
        if environment is not None:
            EnvRef.parse(environment)  # ConfigurationError naming what is wrong with it
        hub_url = get("AENV_SYSTEM_URL", "").strip() or None
        route = get("AENV_HUB_ROUTE", "").strip() or "auto"
        if route not in ("auto", "direct", "proxy"):
            raise ConfigurationError(f"AENV_HUB_ROUTE={route!r}: use auto, direct or proxy")
        temperature = get("AGENT_TEMPERATURE", "").strip()
        settings = cls(
            base_url=get("AGENT_BASE_URL", "").strip().rstrip("/"),
            model=get("AGENT_MODEL", "").strip(),
            api_key_variable=key_variable,
            api_key=get(key_variable, "").strip(),
            environment=environment,
            system_prompt=get("AGENT_SYSTEM_PROMPT", ""),
            max_turns=int(_number(variables, "AGENT_MAX_TURNS", 10, least=1)),
            temperature=_number(variables, "AGENT_TEMPERATURE", 0, least=0)
            if temperature
            else None,
            model_timeout=_number(variables, "AGENT_MODEL_TIMEOUT", 120.0, least=0.001),
            tool_timeout=_number(variables, "AGENT_TOOL_TIMEOUT", 300.0, least=0.001),
            inner_ttl=_number(variables, "AGENT_INNER_TTL", 60.0, least=3),
            hub_url=hub_url,
            hub_key=get("AENV_API_KEY", "").strip(),
            hub_route=route,
            instance_id=get("AENV_INSTANCE_ID", ""),
            inner_variables=_inner_variables(variables),
            secrets=secrets,
        )
        return settings._checked()

    def _checked(self) -> AgentSettings:
        missing = [
            name
            for name, value in (("AGENT_BASE_URL", self.base_url), ("AGENT_MODEL", self.model))
            if not value
        ]
        if missing:
            raise ConfigurationError(
                f"no model configured: set {' and '.join(missing)} when you create the instance "
                "(environment_variables={'AGENT_BASE_URL': 'http://host:8000/v1', "
                "'AGENT_MODEL': 'name', ...}) or in the project's deployConfig.env"
            )
        scheme = urlsplit(self.base_url).scheme
        if scheme not in ("http", "https") or not urlsplit(self.base_url).hostname:
            raise ConfigurationError(
                f"AGENT_BASE_URL={redact_url(self.base_url)!r} is not an http(s) URL; write e.g. "
                "http://127.0.0.1:8000/v1"
            )
        return self

    def scrub(self, text: str) -> str:
        """``text`` with every secret value (the model's key, the hub's key, any variable named
        like a key, token, secret or password) replaced by ``[redacted]``."""
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    def describe(self) -> dict[str, object]:
        """The settings as health and errors show them: no key, no password in a URL."""
        return {
            "model": self.model or None,
            "base_url": redact_url(self.base_url) if self.base_url else None,
            "api_key_variable": self.api_key_variable,
            "api_key_set": bool(self.api_key),
            "environment": self.environment,
            "hub": redact_url(self.hub_url) if self.hub_url else None,
            "max_turns": self.max_turns,
            "configured": self.problem is None,
            "problem": self.problem,
        }


def _secrets(variables: Mapping[str, str]) -> tuple[str, ...]:
    """Values never to show: those of variables named like secrets, the key ``AGENT_API_KEY_VAR``
    names included; the longest first (so a key that contains another is replaced whole)."""
    key_variable = variables.get("AGENT_API_KEY_VAR", "").strip() or "OPENAI_API_KEY"
    found = {
        value.strip()
        for name, value in variables.items()
        if (name == key_variable or (_SECRET_NAME.search(name) and name not in _NOT_SECRET))
        and len(value.strip()) >= _MIN_SECRET
    }
    return tuple(sorted(found, key=len, reverse=True))


def _inner_variables(variables: Mapping[str, str]) -> dict[str, str]:
    """What the inner instance gets: ``AGENT_FORWARD``'s variables as they are here, then
    ``AGENT_INNER_NAME=value`` as ``NAME=value``."""
    out: dict[str, str] = {}
    for name in filter(None, (n.strip() for n in variables.get("AGENT_FORWARD", "").split(","))):
        if not _VARIABLE.match(name):
            raise ConfigurationError(f"AGENT_FORWARD names {name!r}, which is not a variable name")
        if name not in variables:
            raise ConfigurationError(
                f"AGENT_FORWARD names {name}, which this instance does not have: pass it in "
                "environment_variables, or drop it from AGENT_FORWARD"
            )
        out[name] = variables[name]
    for name, value in variables.items():
        if name.startswith(PREFIX_INNER) and len(name) > len(PREFIX_INNER):
            out[name[len(PREFIX_INNER) :]] = value
    return out
