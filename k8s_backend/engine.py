"""``KubernetesEngine``: instances as Pods, state from a watch, TTL from the cluster.

Creating an instance sends one Pod (:func:`~k8s_backend.manifests.instance_pod`) and waits for
the watch to report it Ready; nothing is polled. ``get`` and ``list`` answer from the watch's
cache (:mod:`k8s_backend._cache`), ``renew`` moves the pod's ``expires-at`` annotation, and the
reaper (:mod:`k8s_backend.reaper`) deletes what has expired. Calls reach the pod at its IP:
run the client where pod IPs are routable (inside the cluster), or through a hub.

    >>> engine = KubernetesEngine("rl", kubeconfig="kubeconfig.yaml")  # doctest: +SKIP
    >>> info = await engine.create(InstanceSpec("mini-terminal@1.0.0", ttl=600))  # doctest: +SKIP

Warm pools (:class:`~aenv_ray.engine.WarmPoolEngine`): :meth:`prewarm` starts free pods of a
pool, :meth:`claim` takes one, atomically against every other client of the namespace
(:mod:`k8s_backend.warm`); a claim costs one PATCH, no pod start. :meth:`fill` brings a pool to
a number of free pods counting every client's, one client at a time (a Lease per pool), so
clients that each want ``N`` free keep ``N``, not ``N`` each.

Reservations. Once an engine with a session has claimed from a pool, it keeps up to ``reserve``
of its own Ready free pods of that pool reserved for itself, in the background (the same
atomic PATCH, ``claim=reserved``), with a connection to each opened ahead
(:func:`aenv_ray._wire.preconnect`, taken by the first SDK client of that pod on the same event
loop). A claim then takes a reserved pod from memory and answers at once; the claim (TTL,
owner, labels) is recorded by a PATCH after it answered, retried, and if it cannot be recorded
the pod is deleted and the instance reported ended (``crashed``), never left with two owners.

Tokens. A pod holds no instance token, only its digest and a nonce; the engine reads the
namespace's key once at start and derives each pod's token from the pod in its cache
(:mod:`k8s_backend.tokens`), so neither a create nor a claim pays an API call for it.

Sessions. With ``session=True`` (the default: an SDK's or a pool actor's engine) the engine's
pods belong to it: :meth:`aclose` deletes them, and if the process dies the reaper reclaims them
once its session Lease lapses (:attr:`closes_instances` is True). With ``session=False`` (a hub,
``aenv instance``) pods outlive the engine, bounded by their TTL, and any engine finds them by id.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from aenv_ray.config import DeployConfig, EnvConfig
from aenv_ray.engine import (
    InstanceInfo,
    InstanceSpec,
    InstanceState,
    Route,
    TerminationReason,
    WarmCount,
    discard_preconnected,
    instance_ttl,
    preconnect,
)
from aenv_ray.envref import EnvRef
from aenv_ray.errors import (
    AEnvError,
    ClosedError,
    ClusterConflictError,
    ConfigurationError,
    InstanceNotFoundError,
    NotSupportedError,
    StartupTimeoutError,
)
from aenv_ray.protocol import DEFAULT_FUNCTIONS_PORT, READY_PATH
from aenv_ray.resolve import resolve_environment
from k8s_backend._api import Kube, connect
from k8s_backend._cache import PodCache, pool_waiter
from k8s_backend.delivery import Delivery, OwnImage, bundle_digest, exec_helper_of
from k8s_backend.exec_helper import ExecHelper
from k8s_backend.manifests import (
    ANNOTATION_EXPIRES,
    CLAIM_FREE,
    LABEL_CLAIM,
    LABEL_INSTANCE,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_SESSION,
    MANAGER,
    OUR_LABELS,
    PodRecipe,
    deny_egress_policy,
    instance_pod,
)
from k8s_backend.reaper import LEASE_SECONDS, Housekeeper, release_lease, take_lease
from k8s_backend.service_controller import KubernetesServices
from k8s_backend.state import (
    instance_id,
    last_words,
    pod_info,
    pull_error,
    runtime_message,
    startup_failure,
    startup_wait,
)
from k8s_backend.templates import PodTemplatePolicy
from k8s_backend.tokens import TokenKey, new_nonce
from k8s_backend.tokens import digest as token_digest
from k8s_backend.warm import (
    RESERVED,
    claim_patch,
    claimed_by,
    is_claimable,
    is_warm,
    pool_key,
    reserve_patch,
    reserved_by,
)

__all__ = ["KubernetesEngine", "RateLimiter"]

T = TypeVar("T")
log = logging.getLogger("aenv_ray.k8s")
RESERVE = 2
"""How many free pods of a pool an engine keeps reserved once it claims from it (default)."""
RECORD_TRIES = 5
_DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 1}
MAX_LIFETIME = 24 * 3600.0


class RateLimiter:
    """A token bucket: at most ``rate`` acquisitions a second on average, ``burst`` at once.
    Thread-safe and loop-agnostic, so pools and engines of one process can share one.

        >>> limiter = RateLimiter(rate=100.0, burst=2)
        >>> limiter.reserve(), limiter.reserve(), limiter.reserve() > 0
        (0.0, 0.0, True)
    """

    def __init__(self, rate: float = 20.0, burst: int = 20) -> None:
        if not (rate > 0 and math.isfinite(rate)) or burst < 1:
            raise ConfigurationError("a rate limiter needs a positive rate and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = time.monotonic()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token; the seconds to wait before using it (0.0: now)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def acquire(self) -> None:
        """Wait for a token."""
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)


class KubernetesEngine:
    """Instances as Pods in ``namespace`` (see the module docstring).

    Args:
        namespace: where pods go (default: the kubeconfig context's, the service account's,
            else ``default``; ``AENV_K8S_NAMESPACE`` through :func:`aenv_ray.engine.make_engine`).
        kubeconfig, context, api_client: which cluster (:func:`k8s_backend._api.connect`):
            an official ``kubernetes.client.ApiClient``, a kubeconfig file, else in-cluster
            config inside a pod, else ``KUBECONFIG``/``~/.kube/config``.
        delivery: how code reaches the pod (default :class:`~k8s_backend.delivery.OwnImage`).
        image_prefix: registry path for environments that name no image (with ``OwnImage``).
        env_path: where names are looked up besides the built-ins (None: ``AENV_ENV_PATH``).
        session: the engine's pods end with it (see the module docstring).
        reaper: take part in the namespace's reaper election.
        max_lifetime: seconds after which the kubelet ends a pod whatever its TTL (the
            backstop when no reaper runs); renewals cannot go past it.
        limiter: the creation rate limiter (share one between engines and pools).
        network_policy: ensure the namespace's egress-denying NetworkPolicy exists.
        lease_seconds: how long the session's and the reaper's Leases hold unrenewed: a dead
            engine's pods are reclaimed about twice this after it died.
        pod_template_allow: what ``deployConfig.customPodTemplate`` may set beyond the
            allow-list (:mod:`aenv_ray.pod_template`): field paths such as
            ``spec.tolerations`` or ``spec.containers[].securityContext.seLinuxOptions``. The
            engine's owner is the operator: the default is the tenants' allow-list, because a
            definition may come from a hub's catalog (someone else's); widen it only for
            definitions you trust.
        pod_template_policy: the whole policy instead (its caps on a template's own
            containers' cpu and memory too); ``pod_template_allow`` widens it.
        reserve: how many of its own Ready free pods of a warm pool the engine keeps reserved
            once it has claimed from that pool (see the module docstring); 0: none, every
            claim is a PATCH. Only engines with a session reserve (a reserved pod must end
            with its engine). Engines sharing a pool hold at most this many each.
    """

    name = "kubernetes"

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        api_client: Any = None,
        delivery: Delivery | None = None,
        image_prefix: str = "",
        env_path: str | None = None,
        session: bool = True,
        reaper: bool = True,
        max_lifetime: float = MAX_LIFETIME,
        limiter: RateLimiter | None = None,
        network_policy: bool = True,
        port: int = DEFAULT_FUNCTIONS_PORT,
        workers: int = 32,
        lease_seconds: int = LEASE_SECONDS,
        pod_template_allow: Iterable[str] = (),
        pod_template_policy: PodTemplatePolicy | None = None,
        reserve: int = RESERVE,
    ) -> None:
        if not (max_lifetime > 0 and math.isfinite(max_lifetime)):
            raise ConfigurationError("max_lifetime must be positive seconds")
        if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
            raise ConfigurationError(
                f"reserve must be a whole number of pods >= 0 (0: reserve none), got {reserve!r}"
            )
        self._kube: Kube = connect(
            kubeconfig=kubeconfig, context=context, api_client=api_client, namespace=namespace
        )
        self.namespace = self._kube.namespace
        self.delivery: Delivery = delivery or OwnImage(image_prefix)
        self.env_path = env_path
        self.max_lifetime = max_lifetime
        self.limiter = limiter or RateLimiter()
        self.network_policy = network_policy
        self.port = port
        self.pod_policy = (pod_template_policy or PodTemplatePolicy()).widened(pod_template_allow)
        self.closes_instances = session
        self.identity = uuid.uuid4().hex[:12]
        self.session = self.identity if session else None
        self._cache = PodCache(self._kube)
        self._keeper = Housekeeper(
            self._kube,
            self._cache,
            identity=self.identity,
            session=self.session,
            reap=reaper,
            delete=self._delete_pod,
            lease_seconds=lease_seconds,
        )
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="aenv-k8s")
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._policy_ready = False
        self._pools: dict[str, tuple[str, DeployConfig]] = {}  # spec -> (pool label, deploy)
        self._claiming: set[str] = set()  # instance ids this engine is claiming right now
        self.reserve = reserve if session else 0
        self._reserved: dict[str, dict[str, str]] = {}  # pool key -> iid -> reservation id
        self._reserving: dict[str, set[asyncio.Task[None]]] = {}  # pool key -> in flight
        self._keepers: dict[str, asyncio.Task[None]] = {}  # pool key -> its reserver
        self._records: dict[str, asyncio.Task[None]] = {}  # iid -> its claim being recorded

    @functools.cached_property
    def services(self) -> KubernetesServices:
        """Long-running services in this namespace, as Deployments
        (:class:`~aenv_ray.engine.ServiceEngine`; :mod:`k8s_backend.service_controller`)."""
        return KubernetesServices(
            self._kube,
            delivery=self.delivery,
            port=self.port,
            env_path=self.env_path,
            prepare=self._ensure_policy,
            check_open=self._check_open,
            pod_policy=self.pod_policy,
            tokens=self._cache.tokens,
        )

    def __repr__(self) -> str:
        return (
            f"KubernetesEngine(namespace={self.namespace!r}, server={self._kube.server!r}, "
            f"delivery={self.delivery!r})"
        )

    # -- plumbing ------------------------------------------------------------------------------
    async def _run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("this KubernetesEngine is closed; create a new one")

    def _start(self) -> None:
        """The session Lease, the watch and the housekeeper (once, on first use)."""
        with self._start_lock:
            if self._started:
                return
            self._keeper.open_session()
            with contextlib.suppress(AEnvError):  # an account that may only read pods: no tokens
                self._cache.tokens.load()
            for name, target in (("watch", self._cache.run), ("housekeeper", self._keeper.run)):
                thread = threading.Thread(target=target, name=f"aenv-k8s-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)
            self._started = True

    async def _ready(self, timeout: float = 30.0) -> None:
        """Open, started, and the cache listed once."""
        self._check_open()
        if not self._started:
            await self._run(self._start)
        if self._cache.synced.is_set():
            return
        synced = await self._run(self._cache.wait_synced, timeout)
        if not synced:
            error = self._cache.error
            if error is not None:
                raise type(error)(f"cannot list pods in namespace {self.namespace}: {error}")
            raise StartupTimeoutError(f"listing pods in namespace {self.namespace} took too long")

    async def _token_key(self) -> TokenKey:
        """The namespace's token key (:mod:`k8s_backend.tokens`): read once, then kept."""
        key = self._cache.tokens.key
        return key if key is not None else await self._run(self._cache.tokens.load)

    @staticmethod
    def _tokened(recipe: PodRecipe, key: TokenKey) -> PodRecipe:
        """``recipe`` with a fresh nonce and the digest of the token derived from it: the pod
        gets no token, only what the engine derives it from and the runtime checks it by."""
        nonce = new_nonce()
        token = key.token(recipe.instance_id, nonce)
        return replace(recipe, token_nonce=nonce, token_sha256=token_digest(token))

    def _ensure_policy(self) -> None:
        if self._policy_ready or not self.network_policy:
            return
        path = self._kube.path("networking.k8s.io/v1", "networkpolicies")
        with contextlib.suppress(ClusterConflictError):  # it exists: another engine made it
            self._kube.request(
                "POST", path, body=deny_egress_policy(), what="create the egress NetworkPolicy"
            )
        self._policy_ready = True

    # -- the contract --------------------------------------------------------------------------
    async def create(self, spec: InstanceSpec, *, timeout: float = 60.0) -> InstanceInfo:
        """Send the instance's Pod and return once the watch reports it Ready."""
        deadline = time.monotonic() + timeout
        recipe, config = self._recipe(spec)
        await self._ready()
        recipe = self._tokened(recipe, await self._token_key())
        if not config.deploy_config.network:
            await self._run(self._ensure_policy)
        pod = instance_pod(recipe)
        name = pod["metadata"]["name"]
        await self.limiter.acquire()
        created = await self._run(
            self._kube.request,
            "POST",
            self._kube.path("", "pods"),
            body=pod,
            what=f"create pod {name}",
            retry_conflicts=False,
        )
        self._cache.put(created)
        try:
            return await self._until_ready(recipe.instance_id, name, deadline, timeout)
        except BaseException:
            await asyncio.shield(self._discard(recipe.instance_id, name))
            raise

    def _recipe(self, spec: InstanceSpec) -> tuple[PodRecipe, EnvConfig]:
        self._check_open()
        if spec.project is not None:
            project = Path(spec.project)
            config = EnvConfig.load(project)
            ref = config.ref if not spec.env_ref else spec.env_ref
        else:
            where = spec.env_path if spec.env_path is not None else self.env_path
            ref, project = resolve_environment(spec.env_ref, where)
            config = EnvConfig.load(project)
        ref = str(EnvRef.parse(ref))
        ttl = instance_ttl(spec.ttl, config.deploy_config)
        if ttl > self.max_lifetime:
            raise ConfigurationError(
                f"ttl {ttl:g} s is past this engine's max_lifetime ({self.max_lifetime:g} s); "
                "ask less, or raise KubernetesEngine(max_lifetime=)"
            )
        image, command = self.delivery.runtime(config, project)
        runtime_env = self.delivery.env(config)
        now = time.time()
        recipe = PodRecipe(
            instance_id=uuid.uuid4().hex[:12],
            env_ref=ref,
            image=image,
            command=command,
            expires_at=now + ttl,
            deploy=config.deploy_config,
            arguments=list(spec.arguments),
            environment_variables=dict(spec.environment_variables),
            owner=spec.owner,
            labels=dict(spec.labels),
            datasource=spec.datasource,
            port=self.port,
            session=self.session,
            created_at=now,
            max_lifetime=math.ceil(self.max_lifetime),
            exec_helper=exec_helper_of(self.delivery)
            if config.deploy_config.pod_template == "DualContainer"
            else ExecHelper(),
            runtime_env=runtime_env,
            pod_policy=self.pod_policy,
        )
        return recipe, config

    async def _until_ready(
        self, iid: str, name: str, deadline: float, timeout: float
    ) -> InstanceInfo:
        pulled = ""  # the last failed pull's message: the back-off after it says less
        while True:
            changed = self._cache.changed(iid)
            try:
                pod = self._cache.pod(iid)
                if pod is None:
                    tomb = self._cache.tombstone(iid)
                    raise StartupTimeoutError(
                        f"pod {name} ended before it served: "
                        + (tomb.describe_end() if tomb else "it vanished"),
                        timeout=timeout,
                    )
                info = self._cache.info(pod)
                if info.state is InstanceState.RUNNING:
                    return info
                if info.state is InstanceState.TERMINATED:
                    said = "" if runtime_message(pod) else await self._run(self._last_words, name)
                    raise StartupTimeoutError(
                        f"pod {name} ended before it served: {info.describe_end()}"
                        + (f": {said}" if said else ""),
                        timeout=timeout,
                    )
                pulled = pull_error(pod) or pulled
                problem = startup_failure(pod, pull_error=pulled)
                if problem is not None:
                    raise problem
                left = deadline - time.monotonic()
                if left <= 0:
                    waiting = startup_wait(pod)
                    raise StartupTimeoutError(
                        f"pod {name} was not Ready within {timeout:g} s "
                        f"(phase {(pod.get('status') or {}).get('phase', '?')}"
                        + (f"; {waiting}" if waiting else "")
                        + f"); see `kubectl -n {self.namespace} describe pod {name}`",
                        timeout=timeout,
                    )
                with contextlib.suppress(TimeoutError):  # the loop's check above reports it
                    await asyncio.wait_for(asyncio.shield(changed), timeout=left)
            finally:
                self._cache.forget_waiter(iid, changed)

    def _last_words(self, name: str) -> str:
        """What the pod's runtime said last (its log), for a cluster that gave no termination
        message; "" when the log cannot be read (it is a hint, not the error)."""
        try:
            log = self._kube.request(
                "GET",
                self._kube.path("", "pods", name) + "/log",
                query={"container": "runtime", "tailLines": 20},
                what=f"read pod {name}'s log",
                text=True,
            )
        except AEnvError:
            return ""
        return last_words(str(log or ""))

    async def _discard(self, iid: str, name: str) -> None:
        """Delete the pod of a create that failed (best effort: the reaper backs it up)."""
        with contextlib.suppress(AEnvError):
            await self._run(self._delete_by_name, name, iid, TerminationReason.DELETED)

    def on_end(
        self, instance_id: str, callback: Callable[[InstanceInfo], None]
    ) -> Callable[[], None]:
        """Call ``callback(info)`` once, from the watch's thread, when the instance's pod is
        deleted, starts being deleted or terminates (at once if it has): an
        :class:`~aenv_ray.Environment` on this engine fails its calls with the pod's end within
        the watch's latency, instead of waiting on a pod IP that went silent
        (:class:`~aenv_ray.engine.EndWatchingEngine`). Returns the function that cancels it."""
        return self._cache.on_end(instance_id, callback)

    async def get(self, instance_id: str) -> InstanceInfo:
        """The instance's state, from the watch's cache (a miss asks the API once)."""
        await self._ready()
        return await self._lookup(instance_id)

    async def _lookup(self, instance_id: str) -> InstanceInfo:
        pod = self._cache.pod(instance_id)
        if pod is not None:
            return self._cache.info(pod)
        tomb = self._cache.tombstone(instance_id)
        if tomb is not None:
            return tomb
        if not _safe_label(instance_id):
            raise InstanceNotFoundError(
                f"no instance {instance_id!r}: instance ids are letters and digits",
                instance_id=instance_id,
            )
        # created a moment ago by another engine, and not yet seen by our watch?
        selector = f"{LABEL_MANAGED}={MANAGER},{LABEL_INSTANCE}={instance_id}"
        found = await self._run(
            self._kube.request,
            "GET",
            self._kube.path("", "pods"),
            query={"labelSelector": selector},
            what=f"find instance {instance_id}",
        )
        items = found.get("items") or []
        if items:
            self._cache.put(items[0])
            return self._cache.info(items[0])
        raise InstanceNotFoundError(
            f"no instance {instance_id} in namespace {self.namespace} (never created here, or "
            "deleted long ago); `aenv instance list` shows the live ones",
            instance_id=instance_id,
        )

    async def route(self, info: InstanceInfo) -> Route:
        """The pod's IP and the instance token (reachable where pod IPs are routed)."""
        return Route.direct(info)

    async def list(self, *, env_ref: str | None = None) -> builtins.list[InstanceInfo]:
        """The live instances' pods in the namespace (any engine's), newest first; a warm
        pool's free pods are nobody's instances yet and are not listed."""
        await self._ready()
        wanted = str(EnvRef.parse(env_ref)) if env_ref else None
        infos = [self._cache.info(pod) for pod in self._cache.pods() if not _unclaimed(pod)]
        if wanted is not None:
            infos = [info for info in infos if info.env_ref == wanted]
        return sorted(infos, key=lambda i: i.created_at, reverse=True)

    async def delete(self, instance_id: str) -> InstanceInfo:
        """Delete the instance's pod (idempotent); its final state."""
        await self._ready()
        info = await self._lookup(instance_id)
        if info.state is InstanceState.TERMINATED:
            return info
        pod = self._cache.pod(instance_id)
        name = (pod or {}).get("metadata", {}).get("name") if pod else None
        if name is None:
            return info
        if info.url:  # a connection opened ahead that no client took goes with the pod
            discard_preconnected(info.url)
        await self._run(self._delete_by_name, name, instance_id, TerminationReason.DELETED)
        tomb = self._cache.tombstone(instance_id)
        if tomb is not None:
            return tomb
        return pod_info(pod or {}, deleted=True, reason=TerminationReason.DELETED)

    def _delete_pod(self, pod: dict[str, Any], reason: TerminationReason) -> None:
        meta = pod.get("metadata") or {}
        iid = (meta.get("labels") or {}).get(LABEL_INSTANCE, "")
        self._delete_by_name(str(meta.get("name")), str(iid), reason)

    def _delete_by_name(self, name: str, iid: str, reason: TerminationReason) -> None:
        self._cache.hint(iid, reason)
        try:
            answer = self._kube.request(
                "DELETE",
                self._kube.path("", "pods", name),
                body=_DELETE_OPTIONS,
                what=f"delete pod {name}",
                not_found=_Gone,
            )
        except _Gone:
            return
        if isinstance(answer, dict) and answer.get("kind") == "Pod":
            self._cache.put(answer)  # its deletionTimestamp, before the watch's event of it

    async def renew(self, instance_id: str, ttl: float) -> InstanceInfo:
        """Move the pod's ``expires-at`` annotation to ``ttl`` seconds from now."""
        if not (ttl > 0 and math.isfinite(ttl)):
            raise ConfigurationError(f"ttl must be positive seconds, got {ttl!r}")
        await self._ready()
        recording = self._records.get(instance_id)
        if recording is not None and recording.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({recording})  # its claim's expiry is written first, then ours
        info = await self._lookup(instance_id)
        pod = self._cache.pod(instance_id)
        if info.state is InstanceState.TERMINATED or pod is None:
            raise InstanceNotFoundError(
                f"instance {instance_id} cannot be renewed: {info.describe_end()}",
                instance_id=instance_id,
            )
        created = info.created_at or time.time()
        expires = time.time() + ttl
        if expires > created + self.max_lifetime:
            raise ConfigurationError(
                f"renewing {instance_id} by {ttl:g} s would pass its max_lifetime "
                f"({self.max_lifetime:g} s from its start, the pod's activeDeadlineSeconds); "
                "ask less, or start a new instance"
            )
        name = pod["metadata"]["name"]
        patched = await self._run(
            self._kube.request,
            "PATCH",
            self._kube.path("", "pods", name),
            body={"metadata": {"annotations": {ANNOTATION_EXPIRES: f"{expires:.3f}"}}},
            content_type="application/merge-patch+json",
            what=f"renew pod {name}",
            not_found=lambda said: InstanceNotFoundError(said, instance_id=instance_id),
        )
        self._cache.put(patched)
        return self._cache.info(patched)

    async def fork(
        self, instance_id: str, n: int, *, timeout: float = 60.0
    ) -> builtins.list[InstanceInfo]:
        """Not supported: a pod's memory cannot be copied into new pods (an unknown id is
        still :class:`InstanceNotFoundError`)."""
        await self._ready()
        await self._lookup(instance_id)
        raise NotSupportedError(
            "the Kubernetes engine cannot fork an instance (a running pod's memory cannot be "
            "copied): create new instances of the same environment and replay the steps, or "
            "fork on the local engine (engine='local')"
        )

    # -- warm pools ---------------------------------------------------------------------------
    def _warm_key(self, spec: InstanceSpec, pool: str) -> tuple[str, DeployConfig]:
        """The pool's label value for pods made from ``spec``, and the definition's
        deployConfig. What a claim sets (TTL, owner, labels) is not part of the key; a
        published version's project is keyed by its bundle's digest, not its directory."""
        described = {
            "env_ref": spec.env_ref,
            "project": spec.project,
            "environment_variables": dict(spec.environment_variables),
            "arguments": list(spec.arguments),
            "datasource": spec.datasource or None,
            "storage": spec.storage or None,
        }
        memo = repr((pool, sorted(described.items(), key=lambda kv: kv[0])))
        known = self._pools.get(memo)
        if known is None:
            _, config = self._recipe(replace(spec, ttl=None, labels={}))
            # a published version is its bundle, wherever a client unpacked it: two hubs with
            # data dirs of their own key one pool (the path alone made a pool per hub)
            project = Path(spec.project) if spec.project is not None else None
            digest = bundle_digest(config, project)
            keyed = {**described, "project": digest} if digest else described
            known = (pool_key(pool, keyed), config.deploy_config)
            self._pools[memo] = known
        return known

    def _claim_ttl(self, spec: InstanceSpec, deploy: DeployConfig) -> float:
        ttl = instance_ttl(spec.ttl, deploy)
        if ttl > self.max_lifetime:
            raise ConfigurationError(
                f"ttl {ttl:g} s is past this engine's max_lifetime ({self.max_lifetime:g} s); "
                "ask less, or raise KubernetesEngine(max_lifetime=)"
            )
        taken = sorted(set(spec.labels) & OUR_LABELS)
        if taken:
            raise ConfigurationError(f"labels {taken} are aenv-ray's own; choose other names")
        return ttl

    async def prewarm(self, spec: InstanceSpec, *, pool: str, count: int) -> int:
        """Send ``count`` free pods of warm pool ``pool`` (through the rate limiter) without
        waiting for them to be Ready; returns how many were created. They belong to this
        engine's session until claimed, and are free to claim until ``max_lifetime - ttl``
        after their start (so a claim still gets its whole TTL)."""
        if count <= 0:
            return 0
        await self._ready()
        key, deploy = self._warm_key(spec, pool)
        ttl = self._claim_ttl(spec, deploy)
        recipe, config = self._recipe(replace(spec, labels={}))
        if not config.deploy_config.network:
            await self._run(self._ensure_policy)

        token_key = await self._token_key()

        async def one() -> None:
            now = time.time()
            pod = instance_pod(
                replace(
                    self._tokened(replace(recipe, instance_id=uuid.uuid4().hex[:12]), token_key),
                    pool=key,
                    warm=True,
                    owner=None,
                    created_at=now,
                    expires_at=now + max(self.max_lifetime - ttl, 1.0),
                )
            )
            await self.limiter.acquire()
            created = await self._run(
                self._kube.request,
                "POST",
                self._kube.path("", "pods"),
                body=pod,
                what=f"create warm pod {pod['metadata']['name']}",
            )
            self._cache.put(created)

        done = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
        failures = [d for d in done if isinstance(d, BaseException)]
        if failures and len(failures) == count:
            raise failures[0]
        return count - len(failures)

    async def warm_count(self, spec: InstanceSpec, *, pool: str) -> WarmCount:
        """This engine's free pods of the pool, those it reserved included (any engine's free
        pods without a session); free pods that failed are deleted here, so a refill replaces
        them."""
        await self._ready()
        key, _ = self._warm_key(spec, pool)
        now = time.time()
        ready = starting = 0
        for pod in self._cache.free(key):
            labels = pod["metadata"].get("labels") or {}
            if self.session is not None and labels.get(LABEL_SESSION) != self.session:
                continue
            if self.session is None and reserved_by(pod):
                continue  # another engine's: not ours to count
            if is_warm(pod, now):  # free, or reserved by this engine: its next claims
                ready += 1
            elif self._cache.info(pod).state is InstanceState.TERMINATED:
                await self._run(self._delete_pod, pod, TerminationReason.CRASHED)
            else:
                starting += 1
        return WarmCount(ready=ready, starting=starting)

    async def fill(self, spec: InstanceSpec, *, pool: str, count: int) -> int:
        """Start the free pods the pool lacks to have ``count``, counting every client's free
        pods as the API server has them now (not this engine's cache); returns how many were
        started. One client fills a pool at a time: it holds the pool's Lease
        ``aenv-warm-<key>`` while it counts and sends, so two hubs each keeping ``count`` free
        never both add the same gap. 0 when another client is filling it now (the next call
        sees what it added). Free pods that failed are deleted, so a refill replaces them."""
        if count <= 0:
            return 0
        await self._ready()
        key, _ = self._warm_key(spec, pool)
        name = f"aenv-warm-{key}"
        # held while it sends: the sends wait on the rate limiter, count / rate seconds at most
        seconds = self._keeper.lease_seconds + 2 * math.ceil(count / self.limiter.rate)
        if not await self._run(take_lease, self._kube, name, self.identity, "warm", seconds):
            return 0
        try:
            have = await self._run(self._count_free, key)
            return await self.prewarm(spec, pool=pool, count=count - have) if have < count else 0
        finally:
            await self._run(release_lease, self._kube, name, self.identity)

    def _count_free(self, key: str) -> int:
        """The pool's free pods that stand (any client's), read from the API server."""
        # reserved pods stand too: each is its engine's next claim, and at most `reserve` each
        selector = (
            f"{LABEL_MANAGED}={MANAGER},{LABEL_POOL}={key},"
            f"{LABEL_CLAIM} in ({CLAIM_FREE},{RESERVED})"
        )
        found = self._kube.request(
            "GET",
            self._kube.path("", "pods"),
            query={"labelSelector": selector},
            what=f"list the free pods of pool {key}",
        )
        standing = 0
        for pod in found.get("items") or []:
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            if pod_info(pod).state is InstanceState.TERMINATED:
                self._delete_pod(pod, TerminationReason.CRASHED)
                continue
            standing += 1
        return standing

    async def claim(
        self, spec: InstanceSpec, *, pool: str, timeout: float = 0.0
    ) -> InstanceInfo | None:
        """Claim a Ready free pod of the pool (this engine's own first), waiting up to
        ``timeout`` seconds for one; None if none came. The claim is a PATCH whose
        ``resourceVersion`` precondition makes it atomic: a pod another client claimed first
        answers 409 and the next one is tried. A pod this engine reserved is taken first, with
        no API call before the answer (its claim is recorded just after; see the module
        docstring); the first claim of a pool starts its reservations."""
        await self._ready()
        await self._token_key()  # the claimed pod's token is derived from it (no API call)
        key, deploy = self._warm_key(spec, pool)
        ttl = self._claim_ttl(spec, deploy)
        self._keep_reserved(key)
        deadline = time.monotonic() + timeout
        while True:
            reserved = self._take_reserved(key, ttl, spec)
            if reserved is not None:
                return reserved
            changed = self._cache.pool_changed(key)
            try:
                for pod in self._candidates(key, ttl):
                    info = await self._claim_pod(pod, ttl, spec)
                    if info is not None:
                        return info
                reserved = self._take_reserved(key, ttl, spec)  # made while we tried
                if reserved is not None:
                    return reserved
                loop = asyncio.get_running_loop()
                inflight = {t for t in self._reserving.get(key, ()) if t.get_loop() is loop}
                if inflight:  # our own reservations under way may hold the pod we lacked
                    await asyncio.wait(inflight)
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                await asyncio.wait_for(asyncio.shield(changed), timeout=left)
            except TimeoutError:
                continue  # the loop's check above answers
            finally:
                self._cache.forget_waiter(pool_waiter(key), changed)

    def _candidates(self, key: str, ttl: float) -> Iterator[dict[str, Any]]:
        """The pool's claimable pods with ``ttl`` seconds of life left, this engine's own
        first, lazily: a claim looks at the first few, not at every pod of a big pool."""
        now = time.time()
        latest_start = now + ttl - self.max_lifetime
        pods = self._cache.free(key)
        for mine in (True, False):
            for pod in pods:
                labels = pod["metadata"].get("labels") or {}
                own = self.session is not None and labels.get(LABEL_SESSION) == self.session
                if (
                    own is mine
                    and is_claimable(pod, now)
                    and instance_id(pod) not in self._claiming
                    and (_started(pod) or now) >= latest_start
                ):
                    yield pod

    async def _patch_pod(self, name: str, body: dict[str, Any], *, what: str) -> dict[str, Any]:
        """A merge PATCH of pod ``name`` (a ``resourceVersion`` in ``body`` is its
        precondition: :class:`ClusterConflictError` when the pod changed); :class:`_Gone` when
        there is no such pod."""
        patched: dict[str, Any] = await self._run(
            self._kube.request,
            "PATCH",
            self._kube.path("", "pods", name),
            body=body,
            content_type="application/merge-patch+json",
            what=what,
            not_found=_Gone,
        )
        return patched

    async def _read_pod(self, name: str) -> dict[str, Any]:
        """Pod ``name`` as the API server has it now; :class:`_Gone` when there is none."""
        read: dict[str, Any] = await self._run(
            self._kube.request,
            "GET",
            self._kube.path("", "pods", name),
            what=f"read pod {name}",
            not_found=_Gone,
        )
        return read

    async def _claim_pod(
        self, pod: dict[str, Any], ttl: float, spec: InstanceSpec
    ) -> InstanceInfo | None:
        iid = instance_id(pod) or ""
        if iid in self._claiming:
            return None
        name = str(pod["metadata"]["name"])
        claim = uuid.uuid4().hex
        body = claim_patch(
            pod,
            claim=claim,
            expires_at=time.time() + ttl,
            session=self.session,
            owner=spec.owner,
            labels=spec.labels,
        )
        self._claiming.add(iid)
        try:
            try:
                taken = await self._patch_pod(name, body, what=f"claim pod {name}")
            except ClusterConflictError:
                # another client took it, or it changed since we read it; or our own claim
                # went through and a dropped connection's retry met its new version
                taken = await self._read_pod(name)
                if claimed_by(taken) != claim:
                    self._cache.put(taken)
                    return None
        except _Gone:
            return None
        finally:
            self._claiming.discard(iid)
        self._cache.put(taken)
        return self._cache.info(taken)

    # -- reservations -------------------------------------------------------------------------
    def _keep_reserved(self, key: str) -> None:
        """Start pool ``key``'s reserver on the running loop (the loop of the claims it
        serves, whose SDK clients take its connections), unless one runs there."""
        if self.reserve <= 0 or self._closed:
            return
        loop = asyncio.get_running_loop()
        task = self._keepers.get(key)
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        if task is not None and not task.done():  # a loop of an earlier claim
            with contextlib.suppress(RuntimeError):
                task.get_loop().call_soon_threadsafe(task.cancel)
        self._reserved.pop(key, None)  # their connections wait on the other loop
        self._keepers[key] = loop.create_task(self._reserver(key), name=f"aenv-reserve-{key}")

    async def _reserver(self, key: str) -> None:
        """Keep up to :attr:`reserve` of this engine's Ready free pods of pool ``key``
        reserved, looking again at each change of the pool's free pods."""
        pause = 0.1
        while not self._closed:
            changed = self._cache.pool_changed(key)
            try:
                self._top_up(key)
                pause = 0.1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(changed), timeout=30.0)
            except Exception:  # a bug must not end the reservations silently
                log.exception("reserving warm pods failed; trying again", extra={"pool": key})
                await asyncio.sleep(pause)
                pause = min(pause * 2, 5.0)
            finally:
                self._cache.forget_waiter(pool_waiter(key), changed)

    def _top_up(self, key: str) -> None:
        """Drop reservations that no longer stand; start the ones that are missing."""
        now = time.time()
        held = self._reserved.setdefault(key, {})
        for iid, reservation in list(held.items()):
            pod = self._cache.pod(iid)
            if pod is None or reserved_by(pod) != reservation or not is_warm(pod, now):
                del held[iid]  # deleted, ended, expired: the reaper or warm_count ends it
                url = self._cache.info(pod).url if pod is not None else None
                if url:
                    discard_preconnected(url)
        inflight = self._reserving.setdefault(key, set())
        need = self.reserve - len(held) - len(inflight)
        if need <= 0:
            return
        loop = asyncio.get_running_loop()
        for pod in self._cache.free(key):
            iid = instance_id(pod) or ""
            labels = pod["metadata"].get("labels") or {}
            if (
                labels.get(LABEL_SESSION) != self.session  # only pods this engine started
                or iid in self._claiming
                or not is_claimable(pod, now)
            ):
                continue
            self._claiming.add(iid)
            task = loop.create_task(self._reserve_one(key, pod))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            need -= 1
            if need <= 0:
                return

    async def _reserve_one(self, key: str, pod: dict[str, Any]) -> None:
        """Reserve ``pod`` (atomically: another client may claim it first), then open a
        connection to it for the claim that takes it."""
        assert self.session is not None
        iid = instance_id(pod) or ""
        name = str(pod["metadata"]["name"])
        reservation = uuid.uuid4().hex
        body = reserve_patch(pod, reservation=reservation, session=self.session)
        try:
            try:
                taken = await self._patch_pod(name, body, what=f"reserve pod {name}")
            except ClusterConflictError:  # claimed by another, or changed: or ours, retried
                taken = await self._read_pod(name)
            self._cache.put(taken)
        except _Gone:
            return
        except AEnvError as exc:  # the API server failed us: the next change tries again
            log.warning("reserving a warm pod failed", extra={"pod": name, "error": str(exc)})
            return
        finally:
            self._claiming.discard(iid)
        if reserved_by(taken) != reservation or self._closed:
            return
        self._reserved.setdefault(key, {})[iid] = reservation
        info = self._cache.info(taken)
        if info.url:  # readiness seen on a connection the first call will use
            await preconnect(info.url, READY_PATH, headers=info.headers, timeout=2.0)

    def _take_reserved(self, key: str, ttl: float, spec: InstanceSpec) -> InstanceInfo | None:
        """Hand out a pod this engine reserved (no API call): the claim is recorded after."""
        held = self._reserved.get(key)
        if not held:
            return None
        now = time.time()
        latest_start = now + ttl - self.max_lifetime
        for iid, reservation in list(held.items()):
            pod = self._cache.pod(iid)
            if pod is None or reserved_by(pod) != reservation or not is_warm(pod, now):
                del held[iid]
                continue
            if (_started(pod) or now) < latest_start:
                continue  # too old to give this claim its whole TTL
            del held[iid]
            claim = uuid.uuid4().hex
            body = claim_patch(
                pod,
                claim=claim,
                expires_at=now + ttl,
                session=self.session,
                owner=spec.owner,
                labels=spec.labels,
            )
            claimed = _merged(pod, body)
            self._cache.put(claimed)  # what the record will make of it: get() and list() see it
            self._records[iid] = asyncio.get_running_loop().create_task(
                self._record(claimed, body, reservation, claim)
            )
            return self._cache.info(claimed)
        return None

    async def _record(
        self, pod: dict[str, Any], body: dict[str, Any], reservation: str, claim: str
    ) -> None:
        """Write a claim handed out from a reservation: the PATCH, with the reserved version
        as its precondition; on a conflict, read the pod and write again while it is still
        reserved by ``reservation``. A pod that is no longer ours, or a claim that cannot be
        written after :data:`RECORD_TRIES`, ends the instance here (``crashed``) and the pod
        is deleted if it is still ours: never two owners."""
        iid = instance_id(pod) or ""
        name = str(pod["metadata"]["name"])
        body = copy.deepcopy(body)
        why = ""
        try:
            for attempt in range(RECORD_TRIES):
                try:
                    taken = await self._patch_pod(
                        name, body, what=f"record the claim of pod {name}"
                    )
                    self._cache.put(taken)
                    return
                except ClusterConflictError:
                    try:
                        fresh = await self._read_pod(name)
                    except _Gone:
                        raise
                    except AEnvError as exc:
                        why = str(exc)
                        await asyncio.sleep(0.1 * 2**attempt)
                        continue
                    if claimed_by(fresh) == claim:  # ours went through; a retry met it
                        self._cache.put(fresh)
                        return
                    if reserved_by(fresh) != reservation:
                        why = "another client changed its claim before it was recorded"
                        self._disown(pod, why)
                        return
                    version = str(fresh["metadata"].get("resourceVersion", ""))
                    body["metadata"]["resourceVersion"] = version
                except _Gone:
                    raise
                except AEnvError as exc:
                    why = str(exc)
                    await asyncio.sleep(0.1 * 2**attempt)
        except _Gone:
            return  # deleted meanwhile (released, reaped): the watch reports its end
        finally:
            self._records.pop(iid, None)
        log.error("a claim could not be recorded; ending it", extra={"pod": name, "error": why})
        with contextlib.suppress(AEnvError):
            await self._run(self._delete_by_name, name, iid, TerminationReason.CRASHED)
        self._disown(pod, f"its claim could not be recorded: {why}")

    def _disown(self, pod: dict[str, Any], why: str) -> None:
        info = replace(
            self._cache.info(pod),
            state=InstanceState.TERMINATED,
            url=None,
            reason=TerminationReason.CRASHED,
            detail=why,
        )
        self._cache.disown(pod, info)

    def _stop_reserving(self) -> None:
        """Stop the reservers and unrecorded claims' tasks (their pods end with the session)."""
        for task in (*self._keepers.values(), *self._records.values()):
            if not task.done():
                with contextlib.suppress(RuntimeError):  # its loop closed: nothing runs
                    task.get_loop().call_soon_threadsafe(task.cancel)
        for reserving in self._reserving.values():
            for task in reserving:
                with contextlib.suppress(RuntimeError):
                    task.get_loop().call_soon_threadsafe(task.cancel)
        self._keepers.clear()
        self._reserved.clear()

    async def aclose(self) -> None:
        """Stop watching; with a session, delete its pods and its Lease first."""
        if self._closed:
            return
        self._closed = True
        self._stop_reserving()
        if self._started:
            await self._run(self._shutdown)
        self._release()

    def _release(self) -> None:
        self._pool.shutdown(wait=False)
        self._kube.close()

    def _shutdown(self) -> None:
        self._keeper.stop()
        self._cache.stop()
        try:
            if self.session is not None:
                selector = f"{LABEL_MANAGED}={MANAGER},{LABEL_SESSION}={self.session}"
                for pod in self._cache.pods():
                    labels = (pod.get("metadata") or {}).get("labels") or {}
                    if labels.get(LABEL_SESSION) == self.session:
                        iid = str(labels.get(LABEL_INSTANCE, ""))
                        self._cache.hint(iid, TerminationReason.DELETED)
                self._kube.request(
                    "DELETE",
                    self._kube.path("", "pods"),
                    query={"labelSelector": selector},
                    body=_DELETE_OPTIONS,
                    what="delete this session's pods",
                )
                self._keeper.close_session()
            self._keeper.resign()
        except AEnvError:
            pass  # the reaper reclaims what is left once the session lease lapses
        for thread in self._threads:
            thread.join(timeout=2.0)

    def close(self) -> None:
        """:meth:`aclose` from synchronous code (no event loop running in this thread). It
        works in this thread, not through the engine's thread pool: at interpreter exit, when
        ``named_engine``'s atexit hook calls it, pools take no new work."""
        if self._closed:
            return
        self._closed = True
        self._stop_reserving()
        if self._started:
            self._shutdown()
        self._release()


class _Gone(AEnvError):
    """A 404 on delete: the pod is already gone."""


def _started(pod: dict[str, Any]) -> float | None:
    """When the pod was made (its created-at annotation, else its creationTimestamp)."""
    return pod_info(pod).created_at or None


def _unclaimed(pod: dict[str, Any]) -> bool:
    claim = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CLAIM)
    return claim in (CLAIM_FREE, RESERVED)


def _merged(pod: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as a JSON merge ``patch`` of its labels and annotations leaves it (the
    precondition aside): what a claim being recorded will make of it."""
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    for part in ("labels", "annotations"):
        values = dict(meta.get(part) or {})
        for name, value in (patch["metadata"].get(part) or {}).items():
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
        meta[part] = values
    return out


def _safe_label(text: str) -> bool:
    return text.replace("-", "").replace("_", "").replace(".", "").isalnum() and len(text) <= 63
