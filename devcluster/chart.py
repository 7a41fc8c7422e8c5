"""The Helm chart on the local cluster: installed with the built Helm on the containerd node.

The kubelet plugin runs as the chart's DaemonSet pod and the controller as
its Deployment, both in real containers of our image (deploy/Dockerfile,
built by tests/cluster/build_image.sh and imported into the node's
containerd; `imagePullPolicy: Never`). `make demo`, `make cluster` and the
end-to-end tests (tests/kube/chart.py) install it through this module. The
values are the user's fake-GPU values (deploy/helm/values-fake-gpus.yaml)
plus what this cluster needs:

- the kubelet's root dir and CDI root, and a state dir of the release's own;
- the host network for both daemons: the local API server listens on loopback
  only and there is no kube-proxy, so a pod on the pod network could reach
  neither it nor the `kubernetes` Service. `KUBERNETES_SERVICE_HOST/PORT`
  point the in-cluster config at the loopback API server instead;
- a free health-check port and no metrics endpoint (`metrics.port: 0`): on the
  host network both would be ports of this machine, shared with whatever else
  runs here (the old and new plugin pod of a rolling update share theirs:
  SO_REUSEPORT).

Every wait fails at once, with the command that fixes it, when the runtime
gives up on a pod (an image that is not imported, a crashing plugin) or the
DaemonSet schedules no pod; a timeout names what it waited for and shows the
release's pods, their logs and events.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from kubernetes import client as k8s

from devcluster import images
from devcluster.binaries import HELM_BUILD_COMMAND, REPO_ROOT, MissingBinariesError, helm_path
from devcluster.controlplane import ControlPlane, free_port
from devcluster.kubelet import KubeletNode
from devcluster.plugin import node_slices
from devcluster.pods import ContainerFailed, runtime_failure
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi

CHART = REPO_ROOT / "deploy" / "helm" / "draplugin"
FAKE_GPU_VALUES = REPO_ROOT / "deploy" / "helm" / "values-fake-gpus.yaml"
T = TypeVar("T")
PLUGIN_LABELS = "app.kubernetes.io/component=kubelet-plugin"
CONTROLLER_LABELS = "app.kubernetes.io/component=controller"
HELM_OUTPUT_LIMIT = 6000
FAKE_GPUS_KEY = "fake-gpus.yaml"  # the key of the chart's fake-GPU ConfigMap (kubeletplugin-fake-gpus.yaml)


class ChartError(RuntimeError):
    """The release cannot be installed or does not come up; the message says why and what fixes it."""


class HelmError(ChartError):
    """helm exited non-zero; the message carries its stderr."""


def helm_binary() -> Path:
    """The helm built by build_helm.sh; MissingBinariesError (with the build command) when absent."""
    path = helm_path()
    if not os.access(path, os.X_OK):
        raise MissingBinariesError(
            f"helm not found at {path}: build it with `{HELM_BUILD_COMMAND}` (part of `make kube`)"
        )
    return path


def helm_env(home: Path, kubeconfig: Path | None = None) -> dict[str, str]:
    """Helm's environment: its own cache/config/data dirs under `home`, nothing of the user's."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    return env


def run_helm(args: Sequence[str], home: Path, kubeconfig: Path | None = None, timeout_s: float = 120) -> str:
    """Run helm hermetically (helm_env; no network but the cluster's)."""
    command = [str(helm_binary()), *args]
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, env=helm_env(home, kubeconfig), timeout=timeout_s,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as err:
        raise HelmError(f"helm {' '.join(args)} did not finish within {timeout_s:.0f}s") from err
    if proc.returncode != 0:
        output = proc.stderr + proc.stdout
        if len(output) > HELM_OUTPUT_LIMIT:  # an API server's validation error can run to megabytes
            output = f"{output[:HELM_OUTPUT_LIMIT]}... ({len(output) - HELM_OUTPUT_LIMIT} more characters)"
        raise HelmError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{output}")
    return proc.stdout


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`, maps merged key by key (as Helm merges values files)."""
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        both_maps = isinstance(current, Mapping) and isinstance(value, Mapping)
        out[key] = deep_merge(current, value) if both_maps else value  # type: ignore[arg-type]
    return out


def live_values(
    cluster: ControlPlane, node: KubeletNode, image: images.LocalImage, state_dir: Path
) -> dict[str, Any]:
    """The fake-GPU values with this node's paths, the local image and host networking (module docstring)."""
    repository, _, tag = image.name.rpartition(":")
    api = urllib.parse.urlsplit(cluster.server)
    api_env = [
        {"name": "KUBERNETES_SERVICE_HOST", "value": api.hostname},
        {"name": "KUBERNETES_SERVICE_PORT", "value": str(api.port)},
    ]
    local = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "kubeletPlugin": {
            "kubeletRootDir": str(node.root_dir),
            "cdiRoot": str(node.cdi_root),
            "stateDir": str(state_dir),
            "hostNetwork": True,
            "healthcheckPort": free_port(),
            "extraEnv": api_env,
        },
        "controller": {"hostNetwork": True, "extraEnv": api_env},
        "metrics": {"port": 0},
    }
    return deep_merge(yaml.safe_load(FAKE_GPU_VALUES.read_text()), local)


def import_our_image(node: KubeletNode) -> images.LocalImage:
    """Our image built (a no-op when current) and present in the node's containerd."""
    image = images.our_image()
    import_image_into(node, image)
    return image


def import_image_into(node: KubeletNode, image: images.LocalImage) -> None:
    """`image` present in the node's containerd (imported unless it is there already)."""
    if node.containerd is None:
        raise ChartError(
            f"the chart runs real containers: node {node.name} runs the fake CRI, not containerd"
        )
    if image.name not in images.image_names(node.containerd.ctr, node.containerd.socket):
        images.import_image(node.containerd.ctr, node.containerd.socket, image.archive)


def pods(api: KubeApi, namespace: str, selector: str) -> list[dict[str, Any]]:
    query = {"labelSelector": selector}
    items: list[dict[str, Any]] = api.get(f"/api/v1/namespaces/{namespace}/pods", query)["items"]
    return items


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def last_log(api: KubeApi, pod: Mapping[str, Any], status: Mapping[str, Any], lines: int = 30) -> str:
    """The end of a container's log: of its previous run once it restarted (why it exited)."""
    meta = pod["metadata"]
    try:
        text: str = k8s.CoreV1Api(api.api_client).read_namespaced_pod_log(
            meta["name"], meta["namespace"], container=status["name"],
            previous=bool(status.get("restartCount")), tail_lines=lines,
        )  # fmt: skip
    except k8s.ApiException as err:
        return f"(no log: {err.reason})"
    return text


def describe_pods(api: KubeApi, namespace: str) -> str:
    """Phase, readiness, container states, the end of each container's log, and recent events."""
    lines = []
    for pod in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        statuses = pod.get("status", {}).get("containerStatuses") or []
        states = {s["name"]: s.get("state") for s in statuses}
        lines.append(
            f"{pod['metadata']['name']}: {pod['status'].get('phase')} ready={is_ready(pod)} {states}"
        )
        for status in statuses:
            lines.append(f"--- log of {status['name']} (last run):\n{last_log(api, pod, status)}")
    for event in api.get(f"/api/v1/namespaces/{namespace}/events")["items"][-15:]:
        lines.append(f"event {event['involvedObject']['name']}: {event.get('reason')} {event.get('message')}")
    return "\n".join(lines)


def owner(pod: Mapping[str, Any]) -> str:
    """`Kind/name` of the pod's controlling owner (a DaemonSet, a ReplicaSet), or '' when it has none."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return f"{ref['kind']}/{ref['name']}"
    return ""


@dataclass
class ChartRelease:
    """One Helm release of the chart in its own namespace; `install()` waits until it runs."""

    api: KubeApi
    kubeconfig: Path
    home: Path
    namespace: str
    values: dict[str, Any]
    name: str = field(default_factory=lambda: f"dra-{uuid.uuid4().hex[:6]}")
    ready_timeout_s: float = 180.0
    create_namespace: bool = False
    # The source folder, or the chart packaged by tools/release.sh (a .tgz).
    chart: Path = CHART
    # The plugin pods install() waits for: one per node the DaemonSet selects.
    plugin_pod_count: int = 1

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name}"

    def _values_file(self, values: Mapping[str, Any]) -> Path:
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / f"values-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return path

    def helm(self, *args: str, timeout_s: float = 120) -> str:
        return run_helm(args, self.home, self.kubeconfig, timeout_s)

    def install(self) -> None:
        """`helm install`, then wait for the plugin pod (Ready: registered) and the controller."""
        extra = ["--create-namespace"] if self.create_namespace else []
        self.helm("install", self.name, str(self.chart), "--namespace", self.namespace, *extra,
                  "--values", str(self._values_file(self.values)))  # fmt: skip
        self.wait_plugin_pods(self.plugin_pod_count)
        self.wait_controller_ready()

    def upgrade(self, values: Mapping[str, Any]) -> None:
        """`helm upgrade` without waiting: the caller watches the rollout."""
        self.values = dict(values)
        self.helm("upgrade", self.name, str(self.chart), "--namespace", self.namespace,
                  "--values", str(self._values_file(self.values)))  # fmt: skip

    def uninstall(self) -> None:
        self.helm("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout", "120s",
                  timeout_s=180)  # fmt: skip

    def plugin_pods(self) -> list[dict[str, Any]]:
        return pods(self.api, self.namespace, f"{self.selector},{PLUGIN_LABELS}")

    def controller_pods(self) -> list[dict[str, Any]]:
        return pods(self.api, self.namespace, f"{self.selector},{CONTROLLER_LABELS}")

    def wait_plugin_pods(self, count: int) -> list[dict[str, Any]]:
        """Exactly `count` plugin pods, all Ready (the startup probe: registered with the kubelet)."""

        def ready() -> list[dict[str, Any]] | None:
            self._check_scheduled()
            found = [p for p in self.plugin_pods() if not p["metadata"].get("deletionTimestamp")]
            for pod in found:
                failure = runtime_failure(self.api, pod)
                if failure:  # the kubelet only retries the same failure: say so now
                    raise ContainerFailed(f"plugin pod {pod['metadata']['name']}: {failure}")
            return found if len(found) == count and all(map(is_ready, found)) else None

        return self.wait(f"{count} Ready kubelet plugin pod(s) of release {self.name}", ready)

    def wait_controller_ready(self) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            found = self.controller_pods()
            for pod in found:
                failure = runtime_failure(self.api, pod)
                if failure:
                    raise ContainerFailed(f"controller pod {pod['metadata']['name']}: {failure}")
            return next((p for p in found if is_ready(p)), None)

        return self.wait(f"the controller pod of release {self.name} Ready", ready)

    def wait_published(self, node_name: str) -> list[dict[str, Any]]:
        """The node's ResourceSlices once they list exactly the devices of the release's fake inventory.

        The expected names come from the release's own fake-GPU ConfigMap, read
        by the same backend code the plugin runs; nothing is published from here.
        """
        from draplugin.devices import load_backend

        driver = self.values.get("driverName") or DEFAULT_DRIVER_NAME
        query = {"labelSelector": f"{self.selector},{PLUGIN_LABELS}"}
        maps = self.api.get(f"/api/v1/namespaces/{self.namespace}/configmaps", query)["items"]
        inventory = next((m["data"][FAKE_GPUS_KEY] for m in maps if FAKE_GPUS_KEY in m.get("data", {})), None)
        if inventory is None:
            raise ChartError(f"release {self.name} has no fake-GPU inventory (kubeletPlugin.backend: fake)")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as config:
            config.write(inventory)
            config.flush()
            expected = sorted(
                d.name for d in load_backend("fake", node_name, config_file=config.name).discover()
            )

        def published() -> list[dict[str, Any]] | None:
            slices = node_slices(self.api.api_client, node_name, driver)
            names = sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])
            return slices if names == expected else None

        what = f"the plugin pod to publish {len(expected)} devices for node {node_name}"
        return self.wait(what, published)

    def _check_scheduled(self) -> None:
        """Fail at once when the plugin's DaemonSet, its status current, places no pod on any node."""
        path = f"/apis/apps/v1/namespaces/{self.namespace}/daemonsets"
        for daemonset in self.api.get(path, {"labelSelector": f"{self.selector},{PLUGIN_LABELS}"})["items"]:
            status, meta = daemonset.get("status") or {}, daemonset["metadata"]
            current = status.get("observedGeneration", 0) >= meta.get("generation", 1)
            if current and status.get("desiredNumberScheduled") == 0:
                pod = daemonset["spec"]["template"]["spec"]
                selector, affinity = pod.get("nodeSelector"), "nodeAffinity" in (pod.get("affinity") or {})
                raise ChartError(
                    f"DaemonSet {meta['name']} schedules no plugin pod: no node matches its nodeSelector "
                    f"{selector}{' and node affinity' if affinity else ''} (set kubeletPlugin.nodeSelector, "
                    "or kubeletPlugin.gpuNodeAffinity: false on nodes without NVIDIA's GPU node labels)"
                )

    def wait(self, what: str, probe: Callable[[], T | None]) -> T:
        """wait_for, reporting the release's pods and logs on timeout; a ChartError or ContainerFailed
        from the probe ends the wait at once."""
        failed: list[Exception] = []

        def checked() -> T | bool | None:
            try:
                return probe()
            except (ContainerFailed, ChartError) as err:
                failed.append(err)
                return True

        try:
            found = wait_for(what, checked, self.ready_timeout_s, 0.5)
        except AssertionError as err:
            raise ChartError(f"{err}\n{describe_pods(self.api, self.namespace)}") from None
        if failed:
            raise ChartError(f"{failed[0]}{self._fix(failed[0])}\n{describe_pods(self.api, self.namespace)}")
        return cast(T, found)

    def _fix(self, failure: Exception) -> str:
        """The command that fixes a failure the runtime reported, where there is one."""
        if "ErrImageNeverPull" in str(failure):
            image = self.values.get("image") or {}
            return (
                f"\nthe node's containerd has no image {image.get('repository')}:{image.get('tag')}: "
                f"build it with `{images.OUR_IMAGE_BUILD_COMMAND}` and import the archive it prints "
                f"(`ctr --namespace {images.IMPORT_NAMESPACE} images import ARCHIVE`; "
                "`make demo` and the tests import it themselves)"
            )
        return ""


@contextmanager
def installed(release: ChartRelease) -> Iterator[ChartRelease]:
    """The release installed and running; uninstalled afterwards, whatever the caller did."""
    try:
        release.install()
        yield release
    finally:
        try:
            release.uninstall()
        except HelmError as err:
            if "not found" not in str(err):  # the caller uninstalled it itself
                raise


def local_release(
    cluster: ControlPlane,
    node: KubeletNode,
    api: KubeApi,
    image: images.LocalImage,
    *,
    home: Path,
    state_dir: Path,
    name: str = "draplugin",
    namespace: str = "draplugin",
    plugin_metrics_port: int = 0,
    overrides: Mapping[str, Any] | None = None,
) -> ChartRelease:
    """The release `make demo` and `make cluster` install: live_values for `node`, its own namespace,
    and `overrides` over them.

    `plugin_metrics_port`: the plugin alone serves /metrics there (for `dra-controller top
    --endpoint`), as a flag, which wins over the chart's METRICS_PORT: `metrics.port` would open
    the same host port in the controller too (module docstring). A rollout's new plugin pod binds
    it beside the old one (SO_REUSEPORT; tests/e2e/test_chart_live.py rolls this release).
    """
    values = live_values(cluster, node, image, state_dir)
    if plugin_metrics_port:
        values = deep_merge(
            values, {"kubeletPlugin": {"extraArgs": [f"--metrics-port={plugin_metrics_port}"]}}
        )
    values = deep_merge(values, overrides or {})
    return ChartRelease(api, cluster.kubeconfig, home, namespace, values, name=name, create_namespace=True)
