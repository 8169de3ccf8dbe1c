"""A restricted account on a real API server with RBAC on (``rbac_cluster``): the Kubernetes
engine's calls that the cluster refuses (403) raise :class:`PermissionDeniedError` naming the
verb, the resource, the namespace and the Role to bind, at once, and the engine's background
threads (the pod watch, the housekeeper's Leases) back off on a refusal instead of retrying it
hot, and end with the engine.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s_client

from aenv_ray import InstanceSpec, PermissionDeniedError
from k8s_backend import HostProcess, KubernetesEngine
from k8s_backend._api import ROLE
from tests._k8s import KubeCluster

SPEC = InstanceSpec("mini-terminal@1.0.0", ttl=600.0)
NOBODY = "aenv-test-nobody"
READER = "aenv-test-pod-reader"


class _Records(logging.Handler):
    """The records of logger ``aenv_ray.k8s`` whose message is one of ``messages``."""

    def __init__(self, *messages: str) -> None:
        super().__init__(logging.DEBUG)
        self.messages = messages
        self.records: list[logging.LogRecord] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() in self.messages:
            with self._lock:
                self.records.append(record)

    def pauses(self) -> list[float]:
        with self._lock:
            return [float(r.__dict__["pause"]) for r in self.records]


@pytest.fixture
def records() -> Iterator[type[_Records]]:
    logger = logging.getLogger("aenv_ray.k8s")
    handlers: list[_Records] = []
    level = logger.level

    class Attached(_Records):
        def __init__(self, *messages: str) -> None:
            super().__init__(*messages)
            handlers.append(self)
            logger.addHandler(self)

    logger.setLevel(logging.INFO)
    yield Attached
    for handler in handlers:
        logger.removeHandler(handler)
    logger.setLevel(level)


async def _until_records(handler: _Records, count: int, seconds: float = 120.0) -> list[float]:
    deadline = time.monotonic() + seconds
    while len(handler.pauses()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} records: {handler.pauses()}"
        await asyncio.sleep(0.1)
    return handler.pauses()[:count]


def _engine(cluster: KubeCluster, user: str, namespace: str, **options: object) -> KubernetesEngine:
    kubeconfig = cluster.kubeconfig_for(user, namespace=namespace)
    return KubernetesEngine(namespace, kubeconfig=kubeconfig, delivery=HostProcess(), **options)  # type: ignore[arg-type]


def _threads_ended(engine: KubernetesEngine) -> bool:
    return not any(thread.is_alive() for thread in engine._threads)


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_an_account_without_rights_is_told_what_it_may_not_do_and_which_role_to_bind(
    rbac_cluster: KubeCluster,
) -> None:
    with rbac_cluster.scratch_namespace("rbac") as (_, namespace):
        engine = _engine(rbac_cluster, NOBODY, namespace)
        try:
            # an SDK's engine: its session Lease is the first thing it creates
            with pytest.raises(PermissionDeniedError) as denied:
                await engine.create(SPEC, timeout=60)
            said = str(denied.value)
            assert f"{NOBODY} may not create coordination.k8s.io/leases" in said
            assert f"in namespace {namespace}" in said
            assert f"Role {ROLE} of deploy/role.yaml" in said
            assert (
                f"kubectl -n {namespace} create rolebinding {ROLE} --role={ROLE} --user={NOBODY}"
                in said
            )
            with pytest.raises(PermissionDeniedError, match="may not create"):
                await engine.list()  # refused again, not hung: nothing was started
            assert engine._threads == []
        finally:
            await engine.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_a_refused_pod_watch_fails_waiters_at_once_and_retries_ever_more_slowly(
    rbac_cluster: KubeCluster, records: type[_Records]
) -> None:
    refused = records("pod list or watch refused; retrying slowly")
    with rbac_cluster.scratch_namespace("rbac") as (_, namespace):
        engine = _engine(rbac_cluster, NOBODY, namespace, session=False, reaper=False)
        try:  # a hub's engine (no session Lease): its first call waits for the pod list
            with pytest.raises(PermissionDeniedError) as denied:
                # a wait of an hour: only a refusal that ends the wait lets this return
                await engine._ready(timeout=3600.0)
            said = str(denied.value)
            assert f"{NOBODY} may not list pods in namespace {namespace}" in said
            assert "deploy/role.yaml" in said
            with pytest.raises(PermissionDeniedError, match="may not list pods"):
                await engine.get("abc123")
            pauses = await _until_records(refused, 4)
            assert pauses == [0.1, 0.2, 0.4, 0.8]  # doubling: never a hot loop
        finally:
            await engine.aclose()
        assert _threads_ended(engine)


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_refused_housekeeping_is_logged_as_an_error_and_backs_off(
    rbac_cluster: KubeCluster, records: type[_Records]
) -> None:
    refused = records("housekeeping refused by the cluster; trying again later")
    with rbac_cluster.scratch_namespace("rbac") as (api, namespace):
        rbac = k8s_client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "pod-reader"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "pod-reader",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": READER}
                ],
            },
        )
        with rbac_cluster.api_client(READER) as reader:  # RBAC takes a moment to see it

            async def bound() -> bool:
                try:
                    k8s_client.CoreV1Api(reader).list_namespaced_pod(namespace)
                except k8s_client.ApiException as exc:
                    if exc.status != 403:
                        raise
                    return False
                return True

            deadline = time.monotonic() + 60
            while not await bound():
                assert time.monotonic() < deadline, "the RoleBinding never took effect"
                await asyncio.sleep(0.1)
        # it may read pods but not touch the reaper's Lease
        engine = _engine(rbac_cluster, READER, namespace, session=False, reaper=True)
        try:
            assert await engine.list() == []  # what it may do works
            logged = await _until_records(refused, 3)
            assert logged == [1.0, 2.0, 4.0]
            first = refused.records[0]
            assert first.levelno == logging.ERROR
            assert f"{READER} may not get coordination.k8s.io/leases" in first.__dict__["error"]
            assert not engine._keeper.leading
        finally:
            await engine.aclose()
        assert _threads_ended(engine)
