"""RolloutPool on a real Ray (the session's one node, joined; then a cluster of two nodes on
loopback, of its own) with real local-engine instances.

The probe environment (``tests/envs/probe``) gives tools that echo, fail, sleep and crash their
instance; the built-in mini-terminal gives files to check fork with. Instance processes are
counted from ``/proc`` by the engine owner (the pool actor's pid) each of them names on its
command line, so a leak shows whatever the pool itself believes.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.exceptions as rex

import rollout
from aenv_ray import (
    AcquireTimeoutError,
    FunctionError,
    FunctionNotFoundError,
    InstanceBrokenError,
    InstanceClosedError,
    LeaseLostError,
    ToolArgumentError,
    ToolErrorKind,
    ToolResult,
)
from rollout import EpisodeOutcome, Lease, RolloutPool, classify, is_retryable, run_episode
from rollout._limiter import TokenBucket
from rollout.metrics import LatencyHistogram
from tests._processes import processes_of
from tests._session_ray import SessionRay

PROBE = Path(__file__).resolve().parent / "envs" / "probe"
T = 60.0  # generous bound on every wait: a loaded 2-core box is slow, never wrong

pytestmark = pytest.mark.timeout(300)


# -- Ray, one node or two, on loopback --------------------------------------------------------


class _Ray:
    """Which Ray this module's driver (this process) is on: ``session``, the session's Ray,
    joined; ``cluster``, two nodes of its own. Switching leaves the one it was on (and shuts
    the cluster down)."""

    mode: str | None = None
    cluster: Any = None

    @classmethod
    def use(cls, mode: str, session: SessionRay | None = None) -> None:
        if cls.mode == mode and ray.is_initialized():
            return
        cls.shutdown()
        if mode == "session":
            # the session's Ray, joined (one Ray start for the session, not one per module):
            # leaving it ends this driver's job, and the job's actors with it
            assert session is not None
            rollout.init_local(address=session.address)
        else:
            from ray.cluster_utils import Cluster

            rollout._ray.loopback_only()
            # a port of its own: Ray's default 6379 may belong to another cluster on this machine
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            node = {
                "num_cpus": 1,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
                "gcs_server_port": port,
            }
            cls.cluster = Cluster(initialize_head=True, head_node_args=node)
            cls.cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
            cls.cluster.wait_for_nodes()
            rollout.init_local(address=cls.cluster.address)
        cls.mode = mode

    @classmethod
    def shutdown(cls) -> None:
        if ray.is_initialized():
            ray.shutdown()
        if cls.cluster is not None:
            cls.cluster.shutdown()
            cls.cluster = None
        cls.mode = None


def _auth_mode(mode: str | None) -> None:
    """Set ``RAY_AUTH_MODE`` (None: unset) for this process and what it starts, and have Ray
    read it again: its config is read once, at import, and ``ray.init`` does the same when it
    turns token mode on for a Ray it starts (without this, joining the session's Ray is
    refused as unauthenticated)."""
    if mode is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = mode
    ray._raylet.Config.initialize("")


@pytest.fixture(scope="module", autouse=True)
def _ray_teardown() -> Iterator[None]:
    """Token mode for the module's drivers (the session's Ray asks for it; a Ray that
    ``ray.init`` starts turns it on by itself), and this process as it was afterwards."""
    saved = os.environ.get("RAY_AUTH_MODE")
    _auth_mode("token")
    yield
    _Ray.shutdown()
    _auth_mode(saved)


@pytest.fixture
def local_ray(session_ray: SessionRay) -> None:
    _Ray.use("session", session_ray)


def actor_pids(pool: RolloutPool) -> set[int]:
    """Process ids of the pool's actors (each runs the local engine of its instances)."""
    calls = [a.__ray_call__.remote(lambda self: os.getpid()) for a in pool.actors]
    return set(ray.get(calls, timeout=T))


def engine_processes(pids: set[int]) -> int:
    """Zygotes, instance inits and runtimes of engines living in ``pids`` (counted from /proc,
    by the ``--owner PID-...`` every one of them carries), whatever the pool believes."""
    found: set[int] = set()
    for pid in pids:
        found.update(processes_of(f"--owner\0{pid}-"))
    return len(found)


def wait_until(predicate: Any, *, timeout: float = T) -> None:
    """Until ``predicate()``, asked ten times a second (each a scan of /proc or a call to the
    pool's actors; what they wait for, a kill or a maintenance round, takes longer)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def probe_pool(size: int = 2, **kwargs: Any) -> RolloutPool:
    return RolloutPool(project=PROBE, size=size, **kwargs)


# -- plain logic, no Ray -----------------------------------------------------------------------


def test_token_bucket_grants_in_batches_at_the_rate() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, burst=4, clock=lambda: now[0])
    assert bucket.take(10) == (4, 0.1)  # the burst at once, then one every 0.1 s
    assert bucket.take(1)[0] == 0
    now[0] = 0.25
    assert bucket.take(10)[0] == 2
    now[0] = 100.0
    assert bucket.take(10)[0] == 4  # never more than the burst


def test_latency_histograms_merge_exactly() -> None:
    a, b = LatencyHistogram(), LatencyHistogram()
    for ms in range(1, 51):
        a.observe(ms / 1000)
    for ms in range(51, 101):
        b.observe(ms / 1000)
    merged = LatencyHistogram.from_dict(a.to_dict())
    merged.merge(b)
    assert merged.count == 100
    assert merged.quantile(0.5) == pytest.approx(0.050, rel=0.05)
    assert merged.quantile(0.99) == pytest.approx(0.099, rel=0.05)
    assert LatencyHistogram().quantile(0.5) == 0.0


def test_classify_sorts_failures_into_outcomes_and_the_retry_rule_reads_retryable() -> None:
    from aenv_ray.errors import (
        CallTimeoutError,
        CapacityError,
        HubUnreachableError,
        InstanceExpiredError,
        InstanceNotFoundError,
        ProtocolError,
        ResponseTooLargeError,
        StartupTimeoutError,
        ToolTimeoutError,
    )

    assert classify(None) is EpisodeOutcome.OK
    assert not is_retryable(None)
    retried = (
        InstanceBrokenError("x"),
        InstanceExpiredError("x"),
        InstanceNotFoundError("x"),  # gone under you: a fresh instance helps
        LeaseLostError("x"),
        CapacityError("x"),
        StartupTimeoutError("x"),
        AcquireTimeoutError("x"),
        CallTimeoutError("x"),  # the runtime answers overruns itself: silence is the instance's
        HubUnreachableError("x"),
        rex.ActorDiedError(),
    )
    for exc in retried:
        assert classify(exc) is EpisodeOutcome.INFRASTRUCTURE_ERROR, exc
        assert is_retryable(exc), exc
    for exc in (ProtocolError("x"), ResponseTooLargeError("x")):  # the next instance: the same
        assert classify(exc) is EpisodeOutcome.INFRASTRUCTURE_ERROR, exc
        assert not is_retryable(exc), exc
    for exc in (ToolTimeoutError("x"), TimeoutError(), rex.GetTimeoutError()):
        assert classify(exc) is EpisodeOutcome.TIMEOUT, exc
        assert not is_retryable(exc), exc
    for exc in (ToolArgumentError("x"), FunctionError("x"), InstanceClosedError("x"), KeyError()):
        assert classify(exc) is EpisodeOutcome.AGENT_ERROR, exc
        assert not is_retryable(exc), exc


def test_classify_looks_through_ray_and_every_wrapper_to_find_the_infrastructure() -> None:
    from aenv_ray.errors import ToolTimeoutError

    infrastructure, timeout, agent = (
        EpisodeOutcome.INFRASTRUCTURE_ERROR,
        EpisodeOutcome.TIMEOUT,
        EpisodeOutcome.AGENT_ERROR,
    )
    # Ray's own failures, whichever: a cancelled task, a dead raylet, a lost owner, ...
    for exc in (
        rex.TaskCancelledError(),
        rex.LocalRayletDiedError(),
        rex.OwnerDiedError(ray.ObjectRef.nil().hex(), "", ""),
        rex.WorkerCrashedError(),
        rex.ActorUnavailableError("restarting", None),
        rex.RaySystemError("x"),
    ):
        assert classify(exc) is infrastructure, exc
        assert is_retryable(exc), exc

    def through_ray(cause: BaseException) -> BaseException:
        # what ray.get raises for an error raised inside an actor: a RayTaskError that is also
        # an instance of the cause's class
        try:
            raise cause
        except BaseException as raised:
            return rex.RayTaskError("call_tool", "traceback", raised).as_instanceof_cause()

    assert classify(through_ray(InstanceBrokenError("gone"))) is infrastructure
    assert classify(through_ray(rex.ActorDiedError())) is infrastructure  # nested actors
    assert classify(through_ray(ToolArgumentError("bad"))) is agent
    assert classify(through_ray(ToolTimeoutError("slow"))) is timeout
    assert is_retryable(through_ray(InstanceBrokenError("gone")))
    assert not is_retryable(through_ray(ToolArgumentError("bad")))

    def wrapped(outer: BaseException, cause: BaseException) -> BaseException:
        outer.__cause__ = cause  # raise outer from cause
        return outer

    assert (
        classify(wrapped(RuntimeError("tool failed"), InstanceBrokenError("x"))) is infrastructure
    )
    assert classify(wrapped(RuntimeError("x"), rex.ActorDiedError())) is infrastructure
    assert classify(wrapped(RuntimeError("x"), ValueError("y"))) is agent
    assert is_retryable(wrapped(RuntimeError("tool failed"), InstanceBrokenError("x")))
    assert not is_retryable(wrapped(RuntimeError("x"), ValueError("y")))
    context = RuntimeError("while handling")  # only explicit causes count, not the context
    context.__context__ = InstanceBrokenError("x")
    assert classify(context) is agent
    assert not is_retryable(context)
    cycle = wrapped(RuntimeError("a"), RuntimeError("b"))
    assert cycle.__cause__ is not None
    cycle.__cause__.__cause__ = cycle
    assert classify(cycle) is agent
    assert not is_retryable(cycle)

    # a policy's TaskGroup: the infrastructure's if any is, else a timeout if any is
    group = BaseExceptionGroup
    assert classify(group("g", [KeyError(), InstanceBrokenError("x")])) is infrastructure
    assert classify(group("g", [KeyError(), ToolTimeoutError("x")])) is timeout
    assert classify(group("g", [KeyError(), ValueError()])) is agent
    nested = group("outer", [ValueError(), group("inner", [through_ray(LeaseLostError("x"))])])
    assert classify(nested) is infrastructure
    assert is_retryable(nested)
    assert not is_retryable(group("g", [KeyError(), ToolTimeoutError("x")]))


# -- one node ----------------------------------------------------------------------------------


@pytest.mark.usefixtures("local_ray")
def test_acquire_call_release_and_typed_errors_through_futures() -> None:
    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        lease = pool.acquire(timeout=T)
        assert lease.env_name == "probe@0.1.0"
        result = ray.get(lease.call_tool("echo", {"text": "hi"}), timeout=T)
        assert isinstance(result, ToolResult)
        assert result.text == "hi"
        tools = rollout.get(lease.list_tools(), timeout=T)
        assert "probe@0.1.0/echo" in {t["name"] for t in tools}
        assert rollout.get(lease.call_reward({"answer": "42"}), timeout=T) == 1.0
        assert rollout.get(lease.call_function("add", {"a": 2, "b": 3}), timeout=T) == 5

        # what the agent can react to is a result, as in the SDK
        unknown = rollout.get(lease.call_tool("ecko", {"text": "x"}), timeout=T)
        assert unknown.error_kind is ToolErrorKind.NOT_FOUND
        invalid = rollout.get(lease.call_tool("echo", {"text": 3}), timeout=T)
        assert invalid.error_kind is ToolErrorKind.INVALID_ARGUMENTS

        # exceptions keep their type through ray.get (Ray's dual class) and rollout.get (itself)
        with pytest.raises(ToolArgumentError) as info:
            ray.get(lease.call_tool("echo", ["not", "a", "dict"]), timeout=T)  # type: ignore[arg-type]
        assert isinstance(info.value, rex.RayTaskError)
        with pytest.raises(FunctionNotFoundError) as found:
            rollout.get(lease.call_function("ad", {}), timeout=T)
        assert type(found.value) is FunctionNotFoundError
        assert found.value.function == "function `ad`"
        with pytest.raises(FunctionError):
            rollout.get(lease.call_function("explode"), timeout=T)

        # a broken instance: typed, retryable, counted
        with pytest.raises(InstanceBrokenError) as broken:
            rollout.get(lease.call_tool("crash"), timeout=T)
        assert broken.value.retryable
        assert classify(broken.value) is EpisodeOutcome.INFRASTRUCTURE_ERROR
        assert rollout.get(lease.release(), timeout=T) is True
        assert rollout.get(lease.release(), timeout=T) is False  # idempotent
        with pytest.raises(InstanceClosedError):
            rollout.get(lease.call_tool("echo", {"text": "late"}), timeout=T)

        stats = pool.stats()
        assert stats.counters["broken"] == 1
        assert stats.counters["acquired"] == 1
        assert stats.phases["tool_call"].count >= 4
        assert stats.phases["tool_call"].p99 >= stats.phases["tool_call"].p50 > 0
        assert stats.phases["acquire"].count == 1
        assert stats.phases["create"].count >= 2
        assert stats.phases["reward"].count == 1
        assert stats.phases["first_call"].count == 1
        wait_until(lambda: pool.stats().idle == 2)  # the broken one was replaced
        assert engine_processes(pids) > 0
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_leases_pickle_and_work_inside_ray_tasks() -> None:
    @ray.remote(num_cpus=0)
    def episode(lease: Lease, text: str) -> str:
        result = rollout.get(lease.call_tool("echo", {"text": text}), timeout=T)
        return str(result.text)

    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        leases = [pool.acquire(timeout=T) for _ in range(2)]
        assert pickle.loads(pickle.dumps(leases[0])).lease_id == leases[0].lease_id
        refs = [episode.remote(lease, f"t{i}") for i, lease in enumerate(leases)]
        assert ray.get(refs, timeout=T) == ["t0", "t1"]
        with pytest.raises(AcquireTimeoutError):
            pool.acquire(timeout=0.2)  # both are leased
        for lease in leases:
            lease.release()
        assert pool.acquire(timeout=T).lease_id not in {lease.lease_id for lease in leases}
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_batched_stepping_hands_out_the_first_k_and_stragglers_later() -> None:
    with probe_pool(size=4) as pool:
        pids = actor_pids(pool)
        leases = [pool.acquire(timeout=T) for _ in range(4)]
        steps: list[tuple[Lease, str, Any]] = [
            (leases[0], "sleepy", {"seconds": 2.0}),  # the straggler
            (leases[1], "echo", {"text": "a"}),
            (leases[2], "echo", {"text": "b"}),
            (leases[3], "async_echo", {"text": "c", "times": 2}),
            (leases[1], "echo", "not a dict"),  # fails: failure is data in a batch
        ]
        batch = pool.step_many(steps)
        assert batch.total == 5
        first = batch.wait(num_returns=4, timeout=T)
        assert sorted(s.index for s in first) == [1, 2, 3, 4]
        by_index = {s.index: s for s in first}
        assert by_index[1].unwrap().text == "a"
        assert by_index[3].unwrap().text == "cc"
        assert not by_index[4].ok
        with pytest.raises(ToolArgumentError):
            by_index[4].unwrap()
        assert batch.pending == 1
        [last] = batch.results(timeout=T)
        assert last.index == 0
        assert last.unwrap().text == "slept 2.0"
        assert batch.wait(1, timeout=0.01) == []

        # the same with plain refs: the first K of many lease calls
        refs = [lease.call_tool("echo", {"text": str(i)}) for i, lease in enumerate(leases[1:])]
        refs.append(leases[0].call_tool("sleepy", {"seconds": 2.0}))
        ready, pending = pool.wait(refs, num_returns=3, timeout=T)
        assert len(ready) == 3
        assert pending == [refs[-1]]
        assert rollout.get(pending[0], timeout=T).text == "slept 2.0"
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_fork_copies_the_leased_instance_and_the_datasource_is_at_data(tmp_path: Path) -> None:
    data = tmp_path / "dataset"
    data.mkdir()
    (data / "rows.txt").write_text("row-1\n")
    for path in (data, data / "rows.txt"):  # an instance's root is `nobody` on the host
        path.chmod(0o755 if path.is_dir() else 0o644)
    pool = RolloutPool("mini-terminal@1.0.0", size=1, datasource=str(data))
    pids = actor_pids(pool)
    try:
        lease = pool.acquire(timeout=T)
        ref = lease.call_tool("execute_command", {"command": "cat /data/rows.txt"})
        assert rollout.get(ref, timeout=T).structured["output"] == "row-1\n"
        command = {"command": "echo 7 > state.txt"}
        rollout.get(lease.call_tool("execute_command", command), timeout=T)
        forks = pool.fork(lease, 2)
        assert len({f.instance_id for f in forks} | {lease.instance_id}) == 3
        lease.release()
        for fork in forks:
            out = rollout.get(
                fork.call_tool("execute_command", {"command": "cat state.txt"}), timeout=T
            )
            assert out.structured["output"] == "7\n"
            assert (
                rollout.get(fork.call_reward({"path": "state.txt", "expected": "7"}), timeout=T)
                == 1.0
            )
        for fork in forks:
            rollout.get(fork.release(), timeout=T)
        assert pool.stats().leased == 0
        pool.wait_ready(timeout=T)  # the released instance's replacement is warm
    finally:
        assert pool.close() >= 1
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_a_pool_of_an_unversioned_name_offers_the_names_its_instances_answer_to() -> None:
    # the pool knows `mini-terminal`; its instances serve `mini-terminal@1.0.0`
    import asyncio

    from rollout.sources import PoolSource

    async def offer_and_call(source: PoolSource) -> tuple[list[str], ToolResult]:
        handle = await source.acquire()
        try:
            offered = [tool["function"]["name"] for tool in await handle.list_openai_tools()]
            result = await handle.call_tool(
                "mini-terminal_1_0_0__execute_command", {"command": "echo 7"}
            )
        finally:
            await source.release(handle)
        return offered, result

    with RolloutPool("mini-terminal", size=1, ready_timeout=T) as pool:
        offered, result = asyncio.run(offer_and_call(PoolSource(pool)))
    assert "mini-terminal_1_0_0__execute_command" in offered
    assert not result.is_error, result.text
    assert result.structured["output"] == "7\n"


@pytest.mark.usefixtures("local_ray")
def test_a_killed_pool_actor_loses_its_leases_and_is_replaced() -> None:
    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        lease = pool.acquire(timeout=T)
        running = lease.call_tool("sleepy", {"seconds": 5.0})  # mid-episode
        [old] = pool.actors
        ray.kill(old)
        with pytest.raises(LeaseLostError) as lost:
            rollout.get(running, timeout=T)
        assert classify(lost.value) is EpisodeOutcome.INFRASTRUCTURE_ERROR
        with pytest.raises(rex.RayActorError):  # plain ray.get shows Ray's own error
            ray.get(lease.call_tool("echo", {"text": "x"}), timeout=T)
        # the dead actor's instances die with its engine
        wait_until(lambda: engine_processes(pids) == 0)

        fresh = pool.acquire(timeout=T)  # finds the actor dead, replaces it, leases from the new
        assert pool.actors[0] != old
        pids |= actor_pids(pool)
        assert rollout.get(fresh.call_tool("echo", {"text": "again"}), timeout=T).text == "again"
        assert pool.stats().actor_restarts == 1
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_episodes_survive_an_instance_killed_mid_episode() -> None:
    attempts: list[str] = []

    def episode(lease: Lease) -> float:
        attempts.append(lease.instance_id)
        rollout.get(lease.call_tool("echo", {"text": "step 1"}), timeout=T)
        if len(attempts) == 1:
            rollout.get(lease.call_tool("crash"), timeout=T)  # the instance dies under us
        return float(rollout.get(lease.call_reward({"answer": "42"}), timeout=T))

    def agent_bug(lease: Lease) -> float:
        raise KeyError("the policy's own bug")

    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        result = run_episode(pool, episode, max_retries=2)
        assert result.outcome is EpisodeOutcome.OK
        assert result.value == 1.0
        assert result.attempts == 2
        assert len(set(attempts)) == 2  # retried on a fresh instance

        failed = run_episode(pool, agent_bug)
        assert failed.outcome is EpisodeOutcome.AGENT_ERROR
        assert failed.attempts == 1
        assert "KeyError" in failed.reason

        def always_broken(lease: Lease) -> float:
            raise InstanceBrokenError("simulated")

        gave_up = run_episode(pool, always_broken, max_retries=1)
        assert gave_up.outcome is EpisodeOutcome.INFRASTRUCTURE_ERROR
        assert gave_up.attempts == 2

        stats = pool.stats()
        assert stats.counters["retried"] == 2
        assert stats.counters["broken"] == 1
        wait_until(lambda: pool.stats().leased == 0)
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


def _synthesis_cut_by(pool: Any, out: Path, kill: Any) -> tuple[Any, list[Any], list[Any]]:
    """Four episodes of ``run_synthesis`` over ``pool``; the first to get past its first step
    calls ``kill()`` under everyone. All must end ok: (summary, trajectory rows, the cut ones)."""
    from rollout.sources import PoolSource
    from rollout.synthesis import AgentEnv, run_synthesis

    killed: list[bool] = []

    async def policy(task: dict[str, Any], env: AgentEnv) -> str:
        await env.call_tool("echo", {"text": "step 1"})
        if not killed:
            killed.append(True)
            kill()
        await env.call_tool("sleepy", {"seconds": 0.3})
        return "done"

    summary = run_synthesis(
        str(PROBE),
        episodes=4,
        concurrency=2,
        out=out,
        tasks=[{"id": "t"}],
        policy=policy,
        source=PoolSource(pool),
        max_retries=2,
    )
    assert summary.outcomes == {"ok": 4}  # nothing recorded as the agent's
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    cut = [r for r in rows if r["attempts"] > 1]
    assert cut, "no episode was cut by the kill"
    return summary, rows, cut


@pytest.mark.usefixtures("local_ray")
def test_synthesis_retries_the_episodes_a_killed_pool_actor_cut(tmp_path: Path) -> None:
    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        first = pool.actors[0]
        summary, rows, cut = _synthesis_cut_by(pool, tmp_path, lambda: ray.kill(first))
        assert sorted(r["episode_id"] for r in rows) == [f"00000{i}-t" for i in range(4)]
        assert summary.retries == sum(r["attempts"] - 1 for r in rows)
        for row in cut:
            assert all(reason.startswith("LeaseLostError: ") for reason in row["retried"]), row
            assert "pool actor" in row["retried"][0]
        assert pool.actors[0] is not first
        assert pool.stats().actor_restarts == 1
        pids |= actor_pids(pool)
    wait_until(lambda: engine_processes(pids) == 0)


def _zygote_of(actor_pid: int) -> int:
    """The zygote of the local engine running in ``actor_pid``: its child (the engine's first,
    exec'd cold), or a child of its launcher (a later one, forked warm: ``_launcher.py``)."""
    found: dict[int, tuple[int, list[bytes]]] = {}
    for pid in processes_of(f"--owner\0{actor_pid}-"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            words = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        found[pid] = (int(stat.rsplit(")", 1)[1].split()[1]), words)
    launchers = {pid for pid, (_, words) in found.items() if b"--launcher" in words}
    for pid, (ppid, words) in found.items():
        zygote = b"local_backend.zygote" in words and pid not in launchers
        if zygote and (ppid == actor_pid or ppid in launchers):
            return pid
    raise AssertionError(f"no zygote under pool actor {actor_pid}")


@pytest.mark.usefixtures("local_ray")
def test_synthesis_retries_the_episodes_a_killed_zygote_cut(tmp_path: Path) -> None:
    with probe_pool(size=2) as pool:
        pids = actor_pids(pool)
        (actor,) = pids
        zygote = _zygote_of(actor)  # the template every instance of the engine was forked from
        _, rows, cut = _synthesis_cut_by(pool, tmp_path, lambda: os.kill(zygote, signal.SIGKILL))
        assert len({r["episode_id"] for r in rows}) == len(rows) == 4
        for row in cut:  # the engine reports the instance crashed; the SDK raises this
            assert all(reason.startswith("InstanceBrokenError: ") for reason in row["retried"])
        assert _zygote_of(actor) != zygote  # the engine started a new template
        assert pool.stats().actor_restarts == 0
    wait_until(lambda: engine_processes(pids) == 0)


@pytest.mark.usefixtures("local_ray")
def test_idle_leases_are_reclaimed() -> None:
    with probe_pool(size=1, lease_timeout=0.3) as pool:
        pids = actor_pids(pool)
        lease = pool.acquire(timeout=T)
        wait_until(lambda: pool.stats().counters["reclaimed"] == 1)
        with pytest.raises(LeaseLostError, match="idle"):
            rollout.get(lease.call_tool("echo", {"text": "too late"}), timeout=T)
        assert pool.acquire(timeout=T).instance_id != lease.instance_id
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous


@pytest.mark.usefixtures("local_ray")
def test_leases_of_an_owner_that_died_are_reclaimed_without_waiting_for_the_timeout() -> None:
    @ray.remote(num_cpus=0)
    class Holder:
        def take(self, pool: RolloutPool) -> str:
            self.lease = pool.acquire(timeout=T)
            return str(self.lease.lease_id)

    with probe_pool(size=1, lease_timeout=600) as pool:
        holder = Holder.remote()  # type: ignore[attr-defined]
        ray.get(holder.take.remote(pool), timeout=T)
        assert pool.stats().leased == 1
        ray.kill(holder)  # an owner (an actor) dies holding its lease
        wait_until(lambda: pool.stats().counters["reclaimed"] == 1)
        fresh = pool.acquire(timeout=T)  # the instance came back to the pool, renewed
        assert rollout.get(fresh.call_tool("echo", {"text": "mine"}), timeout=T).text == "mine"


@pytest.mark.usefixtures("local_ray")
def test_close_deletes_everything_even_with_leases_out() -> None:
    pool = probe_pool(size=3)
    pids = actor_pids(pool)
    lease = pool.acquire(timeout=T)
    assert engine_processes(pids) > 0
    assert pool.close() == 3
    assert pool.close() == 0  # idempotent
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous
    with pytest.raises(rex.RayActorError):
        ray.get(lease.call_tool("echo", {"text": "x"}), timeout=T)


@pytest.mark.usefixtures("local_ray")
def test_prefetched_leases_are_handed_out_without_asking_and_go_back_when_stale() -> None:
    with probe_pool(size=4, prefetch=3, lease_timeout=2.0) as pool:
        first = pool.acquire(timeout=T)
        assert pool.stats().leased == 2  # one extra: half of the three left idle
        # from the driver's stash: no new lease on the actor; a retry is counted all the same
        second = pool.acquire(timeout=T, attempt=1)
        stats = pool.stats()
        assert (stats.leased, stats.counters["acquired"], stats.counters["retried"]) == (2, 2, 1)
        assert second.lease_id != first.lease_id
        for lease in (first, second):
            assert rollout.get(lease.call_tool("echo", {"text": "p"}), timeout=T).text == "p"
            lease.release()
        pool.wait_ready(timeout=T)
        third = pool.acquire(timeout=T)  # again one extra, stashed
        assert pool.stats().leased == 2
        time.sleep(1.2)  # past half the lease timeout: the stashed one is stale
        fourth = pool.acquire(timeout=T)  # asks the actor; the stale lease goes back
        assert rollout.get(fourth.call_tool("echo", {"text": "q"}), timeout=T).text == "q"
        deadline = time.monotonic() + T
        while pool.stats().counters["released"] < 3:
            assert time.monotonic() < deadline, "the stale prefetched lease never went back"
            time.sleep(0.05)
        for lease in (third, fourth):
            lease.release()


@pytest.mark.usefixtures("local_ray")
def test_auto_prefetch_starts_after_the_first_acquire_and_never_travels_with_the_pool() -> None:
    with probe_pool(size=16) as pool:  # "auto": up to min(4, size / 4) extra per round trip
        first = pool.acquire(timeout=T)
        assert pool.stats().leased == 1  # a process that leases once keeps nothing back
        second = pool.acquire(timeout=T)
        assert pool.stats().leased == 6  # this one brought four more along
        copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(pool))  # as a task or actor gets it
        assert copy._stash == collections.deque()
        assert copy._acquired == 0
        third = pool.acquire(timeout=T)  # from the driver's stash
        assert pool.stats().leased == 6
        assert len({first.lease_id, second.lease_id, third.lease_id}) == 3
        for lease in (first, second, third):
            lease.release()


@pytest.mark.usefixtures("local_ray")
def test_a_vector_env_over_a_pool_matches_sync_vector_env() -> None:
    import gymnasium
    from gymnasium.utils.env_checker import data_equivalence

    from rollout.gym import make_env, make_vector_env
    from rollout.sources import PoolSource

    n = 2
    tasks = [
        {"prompt": "say 42", "reward_arguments": {"answer": "42"}},
        {"prompt": "say 7", "reward_arguments": {"answer": "7"}},
    ]
    options: dict[str, Any] = {"tasks": tasks, "max_steps": 2}
    with RolloutPool(project=PROBE, size=n, ready_timeout=T) as pool:
        ours = make_vector_env(str(PROBE), num_envs=n, source=PoolSource(pool), **options)
        sync = gymnasium.vector.SyncVectorEnv([lambda: make_env(str(PROBE), **options)] * n)
        echo = {"tool": "echo", "arguments": {"text": "x"}}
        try:
            assert data_equivalence(ours.reset(seed=4), sync.reset(seed=4), exact=True)
            for actions in ([echo, "not json"], [echo, echo], [{"tool": "nope"}, echo]):
                a, b = ours.step(tuple(actions)), sync.step(tuple(actions))
                assert data_equivalence(a, b, exact=True), (actions, a, b)
            assert pool.stats().counters["created"] >= n  # the pool's instances served it
        finally:
            ours.close()
            sync.close()


# -- two nodes ---------------------------------------------------------------------------------


def test_a_pool_spreads_over_both_nodes_of_a_cluster() -> None:
    _Ray.use("cluster")
    nodes = rollout._ray.alive_nodes()
    assert len(nodes) == 2
    with probe_pool(size=4) as pool:
        pids = actor_pids(pool)
        assert len(pool.actors) == 2
        where = ray.get([a.node_id.remote() for a in pool.actors], timeout=T)
        assert sorted(where) == sorted(nodes)
        leases = [pool.acquire(timeout=T) for _ in range(4)]
        assert {lease.actor for lease in leases} == set(pool.actors)
        batch = pool.step_many(
            [(lease, "echo", {"text": str(i)}) for i, lease in enumerate(leases)]
        )
        assert [s.unwrap().text for s in batch.results(timeout=T)] == ["0", "1", "2", "3"]
        stats = pool.stats()
        assert (stats.actors, stats.leased, stats.counters["created"]) == (2, 4, 4)
    wait_until(lambda: engine_processes(pids) == 0)  # the kill is asynchronous
