"""How code reaches a pod (k8s_backend.delivery): the generic runtime image that fetches a pushed
version's bundle from EnvHub (HubBundle), next to the environment's own image (OwnImage).

Without a cluster: the command and variables each delivery gives, where a version's digest comes
from, what is refused, the settings that choose a delivery, and a built-in served by name from
the runtime image's own copy. On the real API server (mark k8s): a pod of a version pushed to a
real hub fetches, checks and serves it; a digest mismatch fails the create with the runtime's own
words; a built-in runs with a new user's settings (no image of its own, no hub), from the engine
and from a hub on Kubernetes.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aenv_cli._scaffold import write_project
from aenv_ray import ConfigurationError, Environment, InstanceSpec, StartupTimeoutError
from aenv_ray.bundle import build_bundle, definition_digest, extract_bundle
from aenv_ray.config import EnvConfig
from aenv_ray.engine import new_engine
from aenv_ray.hub import HubClient
from aenv_ray.protocol import BUNDLE_KEY_ENV
from aenv_ray.resolve import builtin_environments
from envhub.keys import create_key
from envhub.store import open_store
from k8s_backend import HostProcess, HubBundle, KubernetesEngine, OwnImage
from k8s_backend.delivery import RUNTIME_IMAGE, builtin_of, bundle_digest
from k8s_backend.manifests import PodRecipe, instance_pod
from k8s_backend.state import pod_info, runtime_message
from sandbox_runtime.__main__ import builtin_project
from sandbox_runtime.__main__ import main as runtime_main
from tests._hub import HubProcess, new_key
from tests._k8s import KubeCluster

HOST_PODS = pytest.mark.fake_kubelet(
    "HubBundle(python=sys.executable): the pod runs this host's Python and fetches its bundle "
    "from a hub on this host's loopback, which a real pod cannot reach"
)


DIGEST = "sha256:" + "ab" * 32
PUSHED = EnvConfig(name="notes", version="2.0.0", artifacts=[{"type": "bundle", "digest": DIGEST}])


def _runtime_env(pod: dict[str, object]) -> dict[str, object]:
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    return {v["name"]: v for v in container["env"]}


# -- without a cluster ---------------------------------------------------------------------------


def test_hub_bundle_runs_the_generic_image_fetching_the_versions_bundle_by_digest() -> None:
    delivery = HubBundle("http://envhub.aenv.svc:8080/", api_key="aenv_x_secret")
    image, command = delivery.runtime(PUSHED, None)
    assert image == RUNTIME_IMAGE
    assert RUNTIME_IMAGE.startswith("ghcr.io/aenv-ray/aenv-ray:")
    assert command == [
        "python",
        "-m",
        "sandbox_runtime",
        "--bundle",
        "http://envhub.aenv.svc:8080/v1/envs/notes/2.0.0/bundle",
        "--digest",
        DIGEST,
    ]
    assert delivery.env(PUSHED) == [{"name": BUNDLE_KEY_ENV, "value": "aenv_x_secret"}]
    assert "secret" not in repr(delivery)


def test_hub_bundle_options_reach_the_command() -> None:
    delivery = HubBundle(
        "https://hub.example",
        image="registry.local/aenv-ray:dev",
        python="/venv/bin/python",
        bundle_dir="/workspace/.bundle",
        max_bundle=1 << 20,
    )
    image, command = delivery.runtime(PUSHED, None)
    assert image == "registry.local/aenv-ray:dev"
    assert command[0] == "/venv/bin/python"
    assert command[-4:] == ["--bundle-dir", "/workspace/.bundle", "--max-bundle", "1048576"]
    assert delivery.env(PUSHED) == []  # a hub without auth needs no key


def test_the_key_can_come_from_a_secret_the_engine_never_reads() -> None:
    delivery = HubBundle("http://hub:8080", api_key_secret=("envhub-pods", "key"))
    assert delivery.env(PUSHED) == [
        {
            "name": BUNDLE_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": "envhub-pods", "key": "key"}},
        }
    ]
    with pytest.raises(ConfigurationError, match="not both"):
        HubBundle("http://hub:8080", api_key="k", api_key_secret=("s", "k"))


def test_a_version_never_pushed_is_refused_saying_to_push_it(tmp_path: Path) -> None:
    write_project(tmp_path / "p", "local-only")
    config = EnvConfig.load(tmp_path / "p")
    with pytest.raises(ConfigurationError, match="aenv push") as caught:
        HubBundle("http://hub:8080").runtime(config, tmp_path / "p")
    assert "local-only@1.0.0" in str(caught.value)
    assert "http://hub:8080" in str(caught.value)


def test_the_digest_comes_from_the_record_or_the_unpacked_bundle(tmp_path: Path) -> None:
    write_project(tmp_path / "p", "notes")
    bundle = build_bundle(tmp_path / "p")
    unpacked = extract_bundle(bundle.data, tmp_path / "unpacked")  # as a hub unpacks it
    config = EnvConfig.load(unpacked)
    assert config.artifacts == []  # the bundle cannot hold its own digest
    assert bundle_digest(config, unpacked) == bundle.digest
    assert bundle_digest(PUSHED, unpacked) == DIGEST  # the record wins
    assert bundle_digest(config, tmp_path / "p") is None
    (tmp_path / "p" / ".aenv-digest").write_text("sha256:not-hex\n")
    assert bundle_digest(config, tmp_path / "p") is None


def test_a_bad_hub_url_or_limit_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        HubBundle("envhub:8080")
    with pytest.raises(ConfigurationError, match="max_bundle"):
        HubBundle("http://hub", max_bundle=0)


def test_the_key_goes_in_the_pod_as_aenv_rays_own_variable() -> None:
    delivery = HubBundle("http://hub:8080", api_key="aenv_k")
    image, command = delivery.runtime(PUSHED, None)

    def pod(**variables: str) -> dict[str, object]:
        recipe = PodRecipe(
            instance_id="4f2a9c1e07b3",
            env_ref=PUSHED.ref,
            image=image,
            command=command,
            expires_at=2e9,
            environment_variables=variables,
            runtime_env=delivery.env(PUSHED),
        )
        return instance_pod(recipe)

    env = _runtime_env(pod(MODE="x"))
    assert env[BUNDLE_KEY_ENV] == {"name": BUNDLE_KEY_ENV, "value": "aenv_k"}
    assert env["MODE"] == {"name": "MODE", "value": "x"}
    with pytest.raises(ConfigurationError, match=BUNDLE_KEY_ENV):
        pod(**{BUNDLE_KEY_ENV: "mine"})  # a user's variable cannot replace it


def test_own_image_and_host_process_add_no_variables() -> None:
    assert OwnImage("r.io/x").env(PUSHED) == []
    assert HostProcess().env(PUSHED) == []


def test_a_failed_runtimes_termination_message_is_part_of_why_it_ended() -> None:
    said = (
        "sandbox_runtime: error: the bundle from U has digest sha256:aa, but sha256:bb was expected"
    )
    terminated = {"reason": "Error", "exitCode": 2, "message": f"starting\n{said}\n"}
    pod = {
        "metadata": {"name": "aenv-notes-ab12", "labels": {"aenv-ray.io/instance": "ab12"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "runtime", "state": {"terminated": terminated}}],
        },
    }
    assert runtime_message(pod) == said
    assert pod_info(pod).detail == f"the runtime exited (code 2, Error): {said}"


def _kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u, namespace: ns}}]\n"
    )
    return path


async def test_the_settings_choose_bundle_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path)))
    monkeypatch.setenv("AENV_K8S_DELIVERY", "bundle")
    monkeypatch.delenv("AENV_K8S_HUB_URL", raising=False)
    with pytest.raises(ConfigurationError, match="AENV_K8S_HUB_URL"):
        new_engine("kubernetes")
    monkeypatch.setenv("AENV_K8S_HUB_URL", "http://envhub.aenv.svc:8080")
    monkeypatch.setenv("AENV_K8S_HUB_KEY", "aenv_pods_key")
    monkeypatch.setenv("AENV_K8S_RUNTIME_IMAGE", "registry.local/aenv-ray:7")
    engine = new_engine("kubernetes", session=False, reaper=False)
    try:
        assert isinstance(engine, KubernetesEngine)
        delivery = engine.delivery
        assert isinstance(delivery, HubBundle)
        assert delivery.hub_url == "http://envhub.aenv.svc:8080"
        assert delivery.image == "registry.local/aenv-ray:7"
        assert delivery.env(PUSHED) == [{"name": BUNDLE_KEY_ENV, "value": "aenv_pods_key"}]
    finally:
        await engine.aclose()


# -- built-ins: the runtime image serves its own copy, no image per environment, no hub ----------

TERMINAL = builtin_environments()["mini-terminal@1.0.0"]
DEFINITION = definition_digest(TERMINAL)
SERVED = [
    *("python", "-m", "sandbox_runtime"),
    *("--builtin", "mini-terminal@1.0.0", "--definition", DEFINITION),
]


def test_a_builtin_runs_the_runtime_image_serving_its_own_copy() -> None:
    config = EnvConfig.load(TERMINAL)
    assert builtin_of(config, TERMINAL) == "mini-terminal@1.0.0"
    # a new user's default: no prefix; the generic image of this version serves it
    assert OwnImage().runtime(config, TERMINAL) == (RUNTIME_IMAGE, SERVED)
    # an engine's prefix is for projects that name no image: nothing builds PREFIX/mini-terminal
    own = OwnImage("reg.example/aenv", runtime_image="reg.example/aenv/aenv-ray:7")
    assert own.runtime(config, TERMINAL) == ("reg.example/aenv/aenv-ray:7", SERVED)
    # bundle delivery: a built-in cannot be pushed, so its pods serve the image's copy too
    bundle = HubBundle(
        "http://hub:8080", "aenv_pods_key", image="reg.example/aenv/aenv-ray:7", python="/v/python"
    )
    assert bundle.env(config) == []  # it fetches nothing: no hub key in its pod
    assert bundle.env(PUSHED) == [{"name": BUNDLE_KEY_ENV, "value": "aenv_pods_key"}]
    assert bundle.runtime(config, TERMINAL) == (
        "reg.example/aenv/aenv-ray:7",
        ["/v/python", *SERVED[1:]],
    )
    # a built-in whose config.json names an image of its own runs that image
    named = config.model_copy(update={"artifacts": [{"type": "image", "content": "r.io/t:1"}]})
    assert OwnImage().runtime(named, TERMINAL) == (
        "r.io/t:1",
        ["python", "-m", "sandbox_runtime", "/env"],
    )


def test_a_copy_of_a_builtin_elsewhere_is_not_one(tmp_path: Path) -> None:
    copy = tmp_path / "mini_terminal"
    shutil.copytree(TERMINAL, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = EnvConfig.load(copy)
    assert config.ref == "mini-terminal@1.0.0"
    assert builtin_of(config, copy) is None  # its name alone does not make it the image's
    with pytest.raises(ConfigurationError, match="names no image"):
        OwnImage().runtime(config, copy)
    with pytest.raises(ConfigurationError, match="aenv push"):
        HubBundle("http://hub:8080").runtime(config, copy)


def test_the_runtime_serves_a_builtin_by_name_or_says_which_it_has(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert builtin_project("mini-terminal@1.0.0") == TERMINAL
    assert runtime_main(["--builtin", "mini-terminal@9.9.9"]) == 2
    said = capsys.readouterr().err
    assert "no built-in environment mini-terminal@9.9.9 here" in said
    assert "mini-terminal@1.0.0" in said  # what it has
    assert "deploy/Dockerfile" in said  # what to do
    with pytest.raises(SystemExit) as exited:
        runtime_main([str(TERMINAL), "--builtin", "mini-terminal@1.0.0"])
    assert exited.value.code == 2
    assert "give one of a PROJECT directory" in capsys.readouterr().err


def test_a_builtin_whose_definition_is_not_the_engines_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An image of another aenv-ray than the engine's: its copy of the built-in is another."""
    assert builtin_project("mini-terminal@1.0.0", DEFINITION) == TERMINAL
    changed = tmp_path / "mini_terminal"
    shutil.copytree(TERMINAL, changed, ignore=shutil.ignore_patterns("__pycache__"))
    assert definition_digest(changed) == DEFINITION  # a copy is the same definition
    (changed / "src" / "mini_terminal.py").write_text("# another tool set\n")
    other = definition_digest(changed)
    assert other != DEFINITION
    assert runtime_main(["--builtin", "mini-terminal@1.0.0", "--definition", other]) == 2
    said = capsys.readouterr().err
    assert f"its config.json and src/ have digest {DEFINITION}, {other} was asked" in said
    assert "build the runtime image from the checkout or wheel the engine runs" in said
    with pytest.raises(SystemExit) as exited:
        runtime_main([str(TERMINAL), "--definition", DEFINITION])
    assert exited.value.code == 2
    assert "--definition goes with --builtin" in capsys.readouterr().err


# -- on the real API server ----------------------------------------------------------------------


@dataclass
class Pushed:
    hub: HubProcess
    key: str
    project: Path  # the pushed bundle, unpacked as a hub unpacks it (its digest marked)
    digest: str


async def _key(store_url: str) -> str:
    store = await open_store(store_url)
    try:
        return (await create_key(store, tenant="alice"))[1]
    finally:
        await store.aclose()


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    tmp = tmp_path_factory.mktemp("k8s-bundle-hub")
    store = f"sqlite:///{tmp}/hub.db"
    key = asyncio.run(_key(store))
    write_project(tmp / "notes", "notes-in-a-pod")
    bundle = build_bundle(tmp / "notes")

    async def push(url: str) -> None:
        async with HubClient(url, api_key=key) as client:
            await client.push(bundle.data)

    with HubProcess(tmp / "hub", store=store) as hub:
        asyncio.run(push(hub.url))
        project = extract_bundle(bundle.data, tmp / "unpacked")
        yield Pushed(hub, key, project, bundle.digest)


@pytest.fixture(scope="module")
def cluster(kube_cluster: KubeCluster) -> KubeCluster:
    return kube_cluster


def _unpacked(where: Path) -> list[str]:
    """The bundles unpacked under ``where`` (each in a directory of its own)."""
    return [p.name for p in where.glob("aenv-bundle-*/*") if p.is_dir()]


def _engine(cluster: KubeCluster, namespace: str, pushed: Pushed, tmp: Path) -> KubernetesEngine:
    delivery = HubBundle(pushed.hub.url, pushed.key, python=sys.executable, bundle_dir=str(tmp))
    return cluster.engine(namespace, delivery=delivery)


@pytest.mark.k8s
@pytest.mark.timeout(2400)
@HOST_PODS
async def test_a_pod_fetches_a_pushed_version_from_the_hub_and_serves_it(
    cluster: KubeCluster, pushed: Pushed, tmp_path: Path
) -> None:
    with cluster.scratch_namespace("bundle") as (_, namespace):
        engine = _engine(cluster, namespace, pushed, tmp_path)
        try:
            spec = InstanceSpec("notes-in-a-pod@1.0.0", project=str(pushed.project), ttl=600)
            info = await engine.create(spec, timeout=120)
            assert info.url is not None
            async with Environment.attach(info.url, token=info.token) as env:
                result = await env.call_tool("add_note", {"text": "from the hub"})
            assert not result.is_error, result.text
            assert result.structured == {"saved": "from the hub", "count": 1}
            assert _unpacked(tmp_path) == [pushed.digest.replace(":", "-")]
        finally:
            await engine.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
@HOST_PODS
async def test_a_digest_mismatch_fails_the_create_with_the_runtimes_words(
    cluster: KubeCluster, pushed: Pushed, tmp_path: Path
) -> None:
    forged = tmp_path / "forged"
    forged.mkdir()
    for item in ("config.json", "aenv.lock"):
        (forged / item).write_bytes((pushed.project / item).read_bytes())
    wrong = "sha256:" + "0" * 64
    (forged / ".aenv-digest").write_text(wrong + "\n")
    with cluster.scratch_namespace("bundle") as (_, namespace):
        engine = _engine(cluster, namespace, pushed, tmp_path / "unpack")
        try:
            spec = InstanceSpec("notes-in-a-pod@1.0.0", project=str(forged), ttl=600)
            with pytest.raises(StartupTimeoutError) as caught:
                await engine.create(spec, timeout=120)
            said = str(caught.value)
            assert "ended before it served" in said
            assert "code 2" in said
            assert pushed.digest in said  # what the hub served
            assert wrong in said  # what the engine asked for
            assert _unpacked(tmp_path / "unpack") == []
        finally:
            await engine.aclose()


_K8S_SETTINGS = (
    "AENV_K8S_DELIVERY",
    "AENV_K8S_IMAGE_PREFIX",
    "AENV_K8S_RUNTIME_IMAGE",
    "AENV_K8S_HUB_URL",
    "AENV_K8S_HUB_KEY",
)


async def _terminal_works(env: Environment) -> None:
    """A tool call and a reward of mini-terminal, in its instance."""
    done = await env.call_tool(
        "execute_command", {"command": "echo built-in > out.txt; cat out.txt"}
    )
    assert not done.is_error, done.text
    assert done.structured == {"output": "built-in\n", "returncode": 0}
    assert await env.call_reward({"path": "out.txt", "expected": "built-in"}) == 1.0
    assert await env.call_reward({"path": "out.txt", "expected": "other"}) == 0.0


def _runtime_container(api: object, namespace: str, instance_id: str) -> object:
    from kubernetes import client

    pods = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"aenv-ray.io/instance={instance_id}"
    )
    (pod,) = pods.items
    return next(c for c in pod.spec.containers if c.name == "runtime")


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_a_builtin_runs_on_the_cluster_with_a_new_users_settings(
    cluster: KubeCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _K8S_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    with cluster.scratch_namespace("builtin") as (api, namespace):
        # as a new user makes it: by name, nothing but the cluster and the namespace (the port:
        # two test clusters on one host hand out the same pod IPs)
        port = {} if cluster.pod_port is None else {"port": cluster.pod_port}
        engine = new_engine("kubernetes", namespace=namespace, **port)
        try:
            assert isinstance(engine, KubernetesEngine)
            assert isinstance(engine.delivery, OwnImage)
            async with Environment("mini-terminal@1.0.0", engine=engine, ttl=600) as env:
                await _terminal_works(env)
                assert env.instance_id is not None
                runtime = _runtime_container(api, namespace, env.instance_id)
            assert runtime.image == RUNTIME_IMAGE  # type: ignore[attr-defined]
            assert runtime.command == SERVED  # type: ignore[attr-defined]
        finally:
            await engine.aclose()


@pytest.mark.k8s
@pytest.mark.timeout(2400)
async def test_a_hub_on_kubernetes_serves_a_builtin_with_default_settings(
    cluster: KubeCluster, tmp_path: Path
) -> None:
    with cluster.scratch_namespace("builtin-hub") as (api, namespace):
        defaults = dict.fromkeys(_K8S_SETTINGS, "")  # empty: each setting's default
        defaults["AENV_K8S_DELIVERY"] = "image"
        env = {**defaults, "KUBECONFIG": str(cluster.kubeconfig), "AENV_K8S_NAMESPACE": namespace}
        hub = HubProcess(tmp_path, engine="kubernetes", env=env)
        key = new_key("alice", hub.store)
        with hub:
            async with Environment(
                "mini-terminal@1.0.0", aenv_url=hub.url, api_key=key, ttl=600
            ) as instance:
                await _terminal_works(instance)
                assert instance.instance_id is not None
                runtime = _runtime_container(api, namespace, instance.instance_id)
            assert runtime.image == RUNTIME_IMAGE  # type: ignore[attr-defined]
            assert runtime.command == SERVED  # type: ignore[attr-defined]
