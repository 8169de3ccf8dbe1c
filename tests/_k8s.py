"""A real Kubernetes API server for the tests: ``../shared/tools/k8s-real`` (kube-apiserver, etcd,
kube-controller-manager and a fake kubelet that runs pod commands as local processes), or any
cluster named by ``AENV_TEST_KUBECONFIG``.

:class:`KubeCluster` sets the tools up when their binaries are missing (a one-time build of a few
minutes, cached outside the repository in ``~/.cache/k8s-real``), starts a fresh control plane on
free loopback ports with its state in a directory of its own (so it never meets another run's),
and stops it. Tests that need it are marked ``k8s``; the suite runs them in CI.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from aenv_ray.testing import free_port
from tests._later import wait_for_ends

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from k8s_backend import HostProcess, KubernetesEngine, OwnImage

__all__ = ["KubeCluster", "kit_lock", "session_cluster_runs_images", "set_up_k8s_real", "tools_dir"]

REPO = Path(__file__).resolve().parent.parent


def tools_dir() -> Path | None:
    """Where k8s-real's scripts are (``AENV_K8S_REAL_TOOLS``, else ``../shared/tools/k8s-real``
    beside the repository), or None."""
    given = os.environ.get("AENV_K8S_REAL_TOOLS")
    candidates = [Path(given)] if given else [REPO.parent / "shared" / "tools" / "k8s-real"]
    return next((path for path in candidates if (path / "start").is_file()), None)


_RUNS_IMAGES: dict[str, bool] = {}


def session_cluster_runs_images() -> bool:
    """Whether the session's ``kube_cluster`` runs images (``AENV_TEST_CLUSTER=realnode``, or
    ``AENV_TEST_KUBECONFIG`` naming a cluster that is not k8s-real's fake node), without
    starting it: a k8s-real cluster of the fixture's own runs this host's processes. Asked
    once per session."""
    if os.environ.get("AENV_TEST_CLUSTER") == "realnode":
        return True
    given = os.environ.get("AENV_TEST_KUBECONFIG")
    if not given:
        return False
    if given not in _RUNS_IMAGES:
        try:
            _RUNS_IMAGES[given] = not KubeCluster(Path(given)).runs_host_processes
        except Exception:  # it does not answer: the fixture that uses it will say why
            _RUNS_IMAGES[given] = False
    return _RUNS_IMAGES[given]


def _cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("K8S_REAL") or Path(base) / "k8s-real")


def _built(cache: Path) -> bool:
    return (
        (cache / "bin" / "kube-apiserver").is_file()
        and (cache / "venv" / "bin" / "python").is_file()
        and shutil.which("etcd") is not None
    )


@contextlib.contextmanager
def kit_lock() -> Iterator[None]:
    """Held while a kit is set up or an image is built into its cache. k8s-real and the real node
    share one build tree (``~/.cache/k8s-real``), and ``scripts/test`` prepares both in the
    background while the first tests run (``python -m tests._kits``): a test that needs what is
    being made waits for it here instead of making it again beside it. Never nested."""
    cache = _cache()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".aenv-kit.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


APT = Path("/etc/apt")
DEB_SRC = APT / "sources.list.d" / "k8s-real-debsrc.sources"


def _write_deb_src() -> None:
    """Write the deb-src entry k8s-real's ``setup`` would write, where it cannot. It finds the
    machine's Debian mirror with one pipeline, under ``set -o pipefail``, over the deb822
    ``*.sources`` files and ``/etc/apt/sources.list`` plus ``*.list``: on a machine with
    neither of the latter (deb822 sources only, as these machines now are) that ``grep`` fails,
    and ``setup`` exits 2 before printing anything. The entry is the kit's, from the same
    mirror; nothing is written when it exists or when the kit's pipeline would work."""
    listed = APT / "sources.list"
    if DEB_SRC.exists() or listed.exists() or any((APT / "sources.list.d").glob("*.list")):
        return
    mirrors = [
        line.split()[1]
        for source in sorted((APT / "sources.list.d").glob("*.sources"))
        for line in source.read_text().splitlines()
        if line.startswith("URIs:") and len(line.split()) > 1
    ]
    mirror = next((m for m in mirrors if m.rstrip("/").endswith("/debian")), None)
    if mirror is None or os.geteuid() != 0:
        return  # setup says what is missing
    DEB_SRC.write_text(
        f"Types: deb-src\nURIs: {mirror}\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )


def set_up_k8s_real(tools: Path, *, timeout: float = 1800.0) -> None:
    """k8s-real's ``setup`` when its binaries are missing (once per machine, some minutes),
    under :func:`kit_lock`. Raises :class:`RuntimeError` when it fails."""
    if _built(_cache()):
        return
    with kit_lock():
        if _built(_cache()):
            return
        _write_deb_src()
        setup = subprocess.run(
            [str(tools / "setup")], capture_output=True, text=True, timeout=timeout, check=False
        )
    if setup.returncode != 0:
        raise RuntimeError(f"k8s-real setup failed:\n{(setup.stdout + setup.stderr)[-3000:]}")


def _groups(user: str, groups: tuple[str, ...]) -> list[str]:
    """``groups``, plus a ServiceAccount's own groups when ``user`` names one."""
    parts = user.split(":")
    if len(parts) == 4 and parts[:2] == ["system", "serviceaccount"]:
        groups = (*groups, "system:serviceaccounts", f"system:serviceaccounts:{parts[2]}")
    return list(dict.fromkeys(groups))


class KubeCluster:
    """A running cluster: ``kubeconfig`` is its path. ``with KubeCluster.start() as cluster:``."""

    def __init__(
        self,
        kubeconfig: Path,
        *,
        state: Path | None = None,
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.state = state  # ours to stop and remove; None: a cluster someone else runs
        self.tokens = dict(tokens or {})  # user -> its static bearer token
        self.tools = tools_dir()
        self._host_processes: bool | None = None
        # the generic aenv-ray image pods of a cluster that runs images serve built-ins from
        # (tests/_realnode.py builds one from this checkout; else the published tag)
        self.runtime_image = os.environ.get("AENV_TEST_RUNTIME_IMAGE") or None
        self._made: list[str] = []  # namespaces :meth:`namespace` created, deleted at stop
        # the port our engines' pods listen on: each k8s-real kubelet hands out the same pod IPs
        # (127.1.0.1, ...), so two clusters on one host must not also share the port
        self.pod_port = free_port() if state is not None else None

    @classmethod
    def start(
        cls,
        *,
        setup_timeout: float = 1800.0,
        rbac: bool = False,
        users: Mapping[str, tuple[str, ...]] | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> KubeCluster:
        """``AENV_TEST_KUBECONFIG``'s cluster, else a fresh k8s-real control plane (set up first
        when needed). Raises :class:`RuntimeError` saying why it cannot.

        ``rbac=True`` starts k8s-real with ``AUTHORIZATION_MODE=RBAC`` (the kubeconfig's admin
        stays in ``system:masters``) and never uses ``AENV_TEST_KUBECONFIG``: the restricted users
        it needs are static tokens of its own. ``users`` maps each user name to its groups (a
        random token each, in :attr:`tokens`; :meth:`kubeconfig_for` and :meth:`api_client` use
        them); a ServiceAccount's name ``system:serviceaccount:NS:NAME`` also gets the groups
        the API server gives a ServiceAccount (``system:serviceaccounts`` and
        ``system:serviceaccounts:NS``), so its token acts exactly as that ServiceAccount.
        ``extra_env`` goes to k8s-real's ``start`` (its knobs, e.g. ``FAKE_KUBELET_*``).
        """
        wait_for_ends()  # a cluster still stopping (tests/_later.py) holds its addresses
        given = os.environ.get("AENV_TEST_KUBECONFIG")
        if given and not rbac and not users:
            return cls(Path(given))
        tools = tools_dir()
        if tools is None:
            raise RuntimeError(
                "no k8s-real tools (../shared/tools/k8s-real, or AENV_K8S_REAL_TOOLS), and no "
                "AENV_TEST_KUBECONFIG naming a cluster"
            )
        set_up_k8s_real(tools, timeout=setup_timeout)
        state = Path(tempfile.mkdtemp(prefix="aenv-k8s-"))
        tokens = {user: secrets.token_hex(16) for user in users or {}}
        env = {
            **os.environ,
            # `python` in a pod's command is this venv's (as an image's `python` is the image's):
            # the fake kubelet runs commands on this host with its PATH
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "APISERVER_PORT": str(free_port()),
            "ETCD_PORT": str(free_port()),
            "ETCD_PEER_PORT": str(free_port()),
            "KUBELET_PORT": str(free_port()),
            "DATA_DIR": str(state / "data"),
            "RUN_DIR": str(state / "run"),
            "KUBECONFIG_OUT": str(state / "kubeconfig"),
            "FAKE_KUBELET_POD_IP_MODE": "unique",  # a pod binds its own 127.1.x.y
            **(extra_env or {}),
        }
        if rbac:
            env["AUTHORIZATION_MODE"] = "RBAC"
        if tokens:
            lines = []
            for user, token in tokens.items():  # token,user,uid[,"group1,group2"]
                groups = ",".join(_groups(user, (users or {})[user]))
                lines.append(
                    f'{token},{user},{user},"{groups}"' if groups else f"{token},{user},{user}"
                )
            (state / "tokens.csv").write_text("\n".join(lines) + "\n")
            env["EXTRA_TOKENS"] = str(state / "tokens.csv")
        started = subprocess.run(
            [str(tools / "start")],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        cluster = cls(state / "kubeconfig", state=state, tokens=tokens)
        if started.returncode != 0:
            cluster.stop()
            raise RuntimeError(
                f"k8s-real start failed:\n{(started.stdout + started.stderr)[-3000:]}"
            )
        return cluster

    @property
    def runs_host_processes(self) -> bool:
        """True for our k8s-real cluster, whose kubelet runs pod commands on this host: pods
        run this venv's runtime (HostProcess). Another cluster (AENV_TEST_KUBECONFIG) runs
        images: AENV_TEST_IMAGE_PREFIX names the registry that holds the built-ins' images.
        A k8s-real cluster named by AENV_TEST_KUBECONFIG is known by its node, fake-node."""
        if self.state is not None:
            return True
        if self._host_processes is None:
            from kubernetes import client

            with self.api_client() as api:
                nodes = client.CoreV1Api(api).list_node().items
            self._host_processes = any(n.metadata.name == "fake-node" for n in nodes)
        return self._host_processes

    def api_client(self, user: str | None = None) -> ApiClient:
        """An official client's ApiClient for this cluster (a context manager: close it), as
        the kubeconfig's admin or, with ``user``, as one of :meth:`start`'s ``users``."""
        from kubernetes import config

        path = self.kubeconfig if user is None else self.kubeconfig_for(user)
        return config.new_client_from_config(config_file=str(path))

    def kubeconfig_for(self, user: str, *, namespace: str | None = None) -> Path:
        """A kubeconfig for this cluster whose credentials are ``user``'s static token (one
        of :meth:`start`'s ``users``), with ``namespace`` as its context's namespace; written
        next to the cluster's own (0600), removed with the cluster."""
        import yaml

        token = self.tokens.get(user)
        if token is None:
            raise KeyError(f"no token for user {user!r}: start the cluster with users={{...}}")
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["users"] = [{"name": "restricted", "user": {"token": token}}]
        context = config["contexts"][0]["context"]
        context["user"] = "restricted"
        if namespace is not None:
            context["namespace"] = namespace
        safe = "".join(c if c.isalnum() else "-" for c in user)
        path = self.kubeconfig.with_name(f"kubeconfig-{safe}-{namespace or 'default'}")
        path.touch(mode=0o600)
        path.write_text(yaml.safe_dump(config))
        return path

    def namespace(self, name: str) -> str:
        """Create namespace ``name`` if it is missing; its name."""
        from kubernetes import client

        with self.api_client() as api:
            try:
                client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
                self._made.append(name)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        return name

    def delete_namespaces(self) -> None:
        """Delete the namespaces :meth:`namespace` created (on a cluster others use, what the
        tests made goes with the session; a k8s-real cluster of our own goes whole)."""
        from kubernetes import client

        made, self._made = self._made, []
        if not made:
            return
        with self.api_client() as api:
            for name in made:
                try:
                    client.CoreV1Api(api).delete_namespace(name)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise

    @contextlib.contextmanager
    def scratch_namespace(self, prefix: str) -> Iterator[tuple[ApiClient, str]]:
        """A fresh namespace ``prefix-<random>`` and a client, both gone afterwards."""
        from kubernetes import client

        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        with self.api_client() as api:
            client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
            try:
                yield api, name
            finally:
                client.CoreV1Api(api).delete_namespace(name)

    def delivery(self) -> HostProcess | OwnImage:
        """How this cluster's pods get an environment's code: this venv's runtime as a host
        process (k8s-real), else images (``AENV_TEST_IMAGE_PREFIX`` for an environment's own,
        :attr:`runtime_image` for the built-ins)."""
        from k8s_backend import HostProcess, OwnImage
        from k8s_backend.exec_helper import RUNTIME_IMAGE

        if self.runs_host_processes:
            return HostProcess()
        return OwnImage(
            os.environ.get("AENV_TEST_IMAGE_PREFIX", ""),
            runtime_image=self.runtime_image or RUNTIME_IMAGE,
        )

    def delivery_source(self) -> str:
        """:meth:`delivery` as Python source, for a child process's script (names from
        ``k8s_backend``)."""
        from k8s_backend import OwnImage

        delivery = self.delivery()
        if isinstance(delivery, OwnImage):
            return f"OwnImage({delivery.image_prefix!r}, runtime_image={delivery.runtime_image!r})"
        return "HostProcess()"

    def settings_env(self) -> dict[str, str]:
        """:meth:`delivery` as the settings' variables (``AENV_K8S_DELIVERY`` ...), for a hub or
        an engine made by name."""
        from k8s_backend import OwnImage

        delivery = self.delivery()
        if isinstance(delivery, OwnImage):
            return {
                "AENV_K8S_DELIVERY": "image",
                "AENV_K8S_IMAGE_PREFIX": delivery.image_prefix,
                "AENV_K8S_RUNTIME_IMAGE": delivery.runtime_image,
            }
        return {"AENV_K8S_DELIVERY": "host"}

    def runtime(self, project: Path) -> tuple[str, list[str]]:
        """The image and command of a pod serving built-in ``project`` here, as the engine's
        delivery makes them: for a recipe a test writes by hand."""
        from aenv_ray.config import EnvConfig
        from k8s_backend import OwnImage

        delivery = self.delivery()
        if not isinstance(delivery, OwnImage):  # the fake kubelet runs it, ignoring the image
            return "ignored-by-the-fake-kubelet", [
                sys.executable,
                *("-m", "sandbox_runtime", str(project)),
            ]
        return delivery.runtime(EnvConfig.load(project), project)

    def engine(self, namespace: str = "default", **options: Any) -> KubernetesEngine:
        """A KubernetesEngine on this cluster, delivering code as the cluster can run it."""
        from k8s_backend import KubernetesEngine

        options.setdefault("delivery", self.delivery())
        if self.pod_port is not None:
            options.setdefault("port", self.pod_port)
        return KubernetesEngine(namespace, kubeconfig=self.kubeconfig, **options)

    def stop(self) -> None:
        """Stop the control plane this object started and remove its state; on a cluster
        someone else runs, delete the namespaces made here. Idempotent."""
        if self.state is None:
            self.delete_namespaces()
            return
        if self.tools is not None:
            subprocess.run(
                [str(self.tools / "stop")],
                env={**os.environ, "RUN_DIR": str(self.state / "run")},
                capture_output=True,
                timeout=120,
                check=False,
            )
        shutil.rmtree(self.state, ignore_errors=True)
        self.state = None

    def __enter__(self) -> KubeCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
