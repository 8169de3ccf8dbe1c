"""What a hub does against abuse from the network: how long it waits for a request, how many
connections one client may hold, how many failed authentications it answers.

:class:`Defences` holds the operator's knobs (``aenv serve``'s options of the same names):

========================  ==========  ==============================================================
knob                      default     what
========================  ==========  ==============================================================
``header_timeout``        10 s        a request's line and headers must arrive within this, from
                                      the connection's start (or the previous answer's end); else
                                      408 and the connection is closed (slowloris)
``body_timeout``          30 s        a request's body may pause this long between two reads; else
                                      408 and the connection is closed
``client_connections``    256         connections one client (an IPv4 address, an IPv6 /64) may
                                      hold at once; more are answered 429 and closed
``max_connections``       auto        connections the hub holds at once: at most half of the file
                                      descriptors left (the other half proxies calls to
                                      instances), at most 8192. At the cap a new connection takes
                                      the place of the oldest one still waiting for its headers;
                                      with none waiting it is answered 503
``auth_failures``         30          keys that fail (401) one client may send per
                                      ``auth_window``; past them its requests that need a key
                                      get 429 with ``Retry-After`` until one more is allowed
                                      (0: no limit)
``auth_window``           60.0        the seconds over which ``auth_failures`` refill: a client
                                      is forgotten this long after its last failure
========================  ==========  ==============================================================

A failed authentication (a key sent that is malformed, unknown or revoked; a request without
a key is answered 401 at no cost and not counted) is counted for the client
(:class:`FailureThrottle`, a token bucket of ``auth_failures`` refilled over ``auth_window``): a
success does not refill it (a tenant's own valid key must not let it guess others' faster).
While a client is refused, its keys are not looked at, so guessing costs the hub neither a
store read nor a log line: one warning per episode.

A client is its address (:func:`client_key`); behind a reverse proxy every client is the
proxy's address, so raise ``client_connections`` and ``auth_failures`` (or set them to 0 for
no limit) and let the proxy limit per client.

    >>> throttle = FailureThrottle(2, clock=lambda: 0.0)
    >>> throttle.failed("10.0.0.1"); throttle.failed("10.0.0.1")
    >>> throttle.retry_after("10.0.0.1"), throttle.retry_after("10.0.0.2")
    (30.0, None)

May import: the standard library, ``aenv_ray.errors``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aenv_ray.errors import ConfigurationError, RateLimitedError

__all__ = ["PEER", "Defences", "FailureThrottle", "client_key", "peer_of"]

log = logging.getLogger("envhub.defences")

PEER = "aenv.peer"
"""The ASGI scope's key for the client as the connection's peer (:func:`client_key` of its
address), set by :mod:`envhub.connections`: ``scope["client"]`` may come from
``X-Forwarded-For``, which anyone on loopback may send."""

MAX_CONNECTIONS = 8192
"""The most connections ``max_connections`` picks by itself (``auto``)."""


@dataclass(frozen=True)
class Defences:
    """The operator's knobs against abuse (see the module's table); ``None`` for
    ``max_connections`` picks it from the file descriptor limit when the hub starts."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    client_connections: int = 256
    max_connections: int | None = None
    auth_failures: int = 30
    auth_window: float = 60.0

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "auth_window"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and 0 < value < math.inf):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, not {value!r} "
                    f"(--{name.replace('_', '-')})"
                )
        for name in ("client_connections", "max_connections", "auth_failures"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 0):
                raise ConfigurationError(
                    f"{name} must be 0 (no limit) or more, not {value!r} "
                    f"(--{name.replace('_', '-')})"
                )


def client_key(host: str | None) -> str:
    """Who a peer address counts as: an IPv4 address itself, an IPv6 address its /64 (one
    host usually holds a whole /64), anything else (a Unix socket) ``"local"``.

        >>> client_key("127.0.0.2"), client_key("2001:db8::1"), client_key(None)
        ('127.0.0.2', '2001:db8::/64', 'local')
    """
    if not host:
        return "local"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def peer_of(scope: Mapping[str, Any]) -> str:
    """The client of a request as :func:`client_key` names it: the connection's peer (never
    ``X-Forwarded-For``), or the scope's client where no guarded connection set it."""
    peer = scope.get(PEER)
    if isinstance(peer, str):
        return peer
    client = scope.get("client")
    return client_key(client[0] if client else None)


class FailureThrottle:
    """Failed authentications per client: a token bucket of ``allowed`` failures, refilled at
    ``allowed`` per ``window`` seconds (a minute by default); ``allowed=0`` limits nothing.
    Holds at most ``clients`` clients (the least recently seen go first), so a flood from many
    addresses costs bounded memory."""

    def __init__(
        self,
        allowed: int,
        *,
        window: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        clients: int = 65536,
    ) -> None:
        self.capacity = float(allowed)
        self.rate = allowed / window
        self.clock = clock
        self.clients = clients
        # client -> (tokens left, when counted, whether this episode was logged); a client is
        # forgotten once its bucket is full again, which ends its episode
        self._buckets: OrderedDict[str, tuple[float, float, bool]] = OrderedDict()
        self._peak = 0  # the most clients counted since the table was last renewed

    @property
    def window(self) -> float:
        """Seconds after its last failure by which any client's bucket is full again (a
        failure is counted only while a token is left, so a bucket never drops below 0)."""
        return self.capacity / self.rate if self.rate > 0 else 0.0

    def prune(self, now: float | None = None) -> int:
        """Forget every client whose last failure is :attr:`window` old (its bucket is full:
        it is as if it never failed); how many are still counted. Clients are kept in the
        order of their last failure, so this costs one step per client forgotten; every
        :meth:`failed` and :meth:`refusal` prunes, so the bookkeeping of an attack that
        ended is gone once the hub answers anything a window later."""
        now = self.clock() if now is None else now
        buckets = self._buckets
        while buckets:
            client, (_, then, _) = next(iter(buckets.items()))
            if now - then < self.window:
                break
            del buckets[client]
        if not buckets and self._peak > self.clients // 64:
            self._buckets = OrderedDict()  # a dict never shrinks its table by itself
            self._peak = 0
        return len(self._buckets)

    def stats(self) -> dict[str, int]:
        """``{"clients": ...}``: how many clients' failures are counted (after :meth:`prune`)."""
        return {"clients": self.prune()}

    def _tokens(self, client: str, now: float) -> tuple[float, bool]:
        found = self._buckets.get(client)
        if found is None:
            return self.capacity, False
        tokens, then, warned = found
        return min(self.capacity, tokens + (now - then) * self.rate), warned

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try a key again; None when it may now."""
        if self.rate <= 0:
            return None
        now = self.clock()
        if self._buckets:
            self.prune(now)
        tokens, _ = self._tokens(client, now)
        if tokens >= self.capacity:  # all forgiven: forget it
            self._buckets.pop(client, None)
        return None if tokens >= 1 else (1 - tokens) / self.rate

    def failed(self, client: str) -> None:
        """Count one failed authentication of ``client``; the first that exhausts its
        allowance in an episode is logged, the others are not."""
        if self.rate <= 0:
            return
        now = self.clock()
        self.prune(now)
        tokens, warned = self._tokens(client, now)
        tokens -= 1
        if tokens < 1 and not warned:
            warned = True
            log.warning(
                "client %s failed to authenticate %d times within a minute; its requests that "
                "need a key are answered 429 until it may try again (--auth-failures)",
                client,
                int(self.capacity),
            )
        self._buckets[client] = (tokens, now, warned)
        self._buckets.move_to_end(client)
        while len(self._buckets) > self.clients:
            self._buckets.popitem(last=False)
        self._peak = max(self._peak, len(self._buckets))

    def refusal(self, client: str) -> RateLimitedError | None:
        """The error to answer ``client`` with instead of looking at its key, if any."""
        wait = self.retry_after(client)
        if wait is None:
            return None
        return RateLimitedError(
            f"too many failed authentications from {client}: this hub answers its requests "
            f"that need a key again in {math.ceil(wait)} s. Check AENV_API_KEY (a key "
            "`aenv keys create` printed, not revoked) before you retry",
            retry_after=float(math.ceil(wait)),
        )
