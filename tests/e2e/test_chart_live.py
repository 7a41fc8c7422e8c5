"""The chart, live: `helm install` on the containerd node, the plugin as the chart's DaemonSet pod.

Our image (deploy/Dockerfile, built with buildah by tests/cluster/build_image.sh)
runs the kubelet plugin as the DaemonSet's pod and the controller as the
Deployment's, in real containers. The plugin registers through the mounted
plugins_registry, publishes the node's ResourceSlices and prepares claims;
containerd injects the CDI spec into the workload container, whose own log
shows the device. The first test installs the chart as a release ships it:
the archive `make release` packages (tools/release.sh chart), not the source
folder. Uninstall leaves nothing behind; an upgrade rolls the DaemonSet with
`maxSurge: 1` and per-pod sockets, and no claim is lost.

How this differs from a production install (tests/kube/chart.py): both
daemons use the host network (the test API server is on loopback only), so the
old and the new plugin pod share the gRPC health port during the rollout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.binaries import REPO_ROOT
from devcluster.chart import local_release
from devcluster.controlplane import ControlPlane, free_port
from devcluster.images import LocalImage
from devcluster.kubelet import KubeletNode
from devcluster.pods import wait_running, workload_report
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import server_version
from draplugin.kubelet.sockets import socket_paths
from draplugin.prepare.plan import env_key
from tests.e2e.inside import log_env
from tests.e2e.workloads import claim_pod
from tests.kube.chart import (
    ChartError,
    ChartRelease,
    deep_merge,
    import_our_image,
    installed,
    is_ready,
    live_values,
)

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
# What the node publishes for deploy/helm/values-fake-gpus.yaml: three whole
# GPUs, and gpu-3 as its three MIG devices.
WHOLE_GPUS = {"gpu-0", "gpu-1", "gpu-2"}
PUBLISHED = WHOLE_GPUS | {"gpu-3-mig-1g10gb-0", "gpu-3-mig-1g10gb-1", "gpu-3-mig-2g20gb-2"}
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def our_image(kubelet_node: KubeletNode) -> LocalImage:
    return import_our_image(kubelet_node)


@pytest.fixture(scope="module")
def packaged_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as `make release` packages it: tools/release.sh's chart part, into a dist of its own."""
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [str(REPO_ROOT / "tools" / "release.sh"), "chart"], env={**os.environ, "DIST": str(dist)},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    archive = Path(done.stdout.split()[-1])
    assert archive.parent == dist and archive.name.endswith(".tgz"), done.stdout
    assert archive.name in (dist / "SHA256SUMS").read_text()
    return archive


@pytest.fixture
def release(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    our_image: LocalImage,
    test_namespace: str,
    api: KubeApi,
) -> Iterator[ChartRelease]:
    """A release of the chart for this test; its plugin runs on the containerd node only."""
    home = Path(tempfile.mkdtemp(prefix="dra-helm-"))
    state_dir = Path(tempfile.mkdtemp(prefix="dra-chart-state-"))
    values = deep_merge(
        live_values(kube_cluster, kubelet_node, our_image, state_dir),
        # Other tests' nodes (fake Node objects, the fake-CRI kubelet) never run a pod.
        {"kubeletPlugin": {"nodeSelector": {"kubernetes.io/hostname": kubelet_node.name}}},
    )
    try:
        yield ChartRelease(api, kube_cluster.kubeconfig, home, test_namespace, values)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)


def node_slices(api: KubeApi, node: str) -> list[dict[str, Any]]:
    query = {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
    items: list[dict[str, Any]] = api.get(f"{RESOURCE}/resourceslices", query)["items"]
    return items


def published_devices(api: KubeApi, node: str) -> set[str]:
    return {device["name"] for s in node_slices(api, node) for device in s["spec"].get("devices") or []}


def create_gpu_pod(api: KubeApi, node: KubeletNode, namespace: str, name: str) -> None:
    """A pod of the workload image with one GPU from the chart's DeviceClass (a claim per pod)."""
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
        ]}}},
    })  # fmt: skip
    pod = claim_pod(
        name,
        node.workload_image,
        {"resourceClaimTemplateName": name},
        nodeSelector={"kubernetes.io/hostname": node.name},
        automountServiceAccountToken=False,
        terminationGracePeriodSeconds=1,
    )
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def claim_of(api: KubeApi, namespace: str, pod_name: str) -> dict[str, Any]:
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    (status,) = pod["status"]["resourceClaimStatuses"]
    claim: dict[str, Any] = api.get(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{status['resourceClaimName']}"
    )
    return claim


def allocated_device(claim: dict[str, Any]) -> str:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["driver"] == DRIVER
    device: str = result["device"]
    return device


def cdi_specs(node: KubeletNode, claim_uid: str) -> list[Path]:
    """The CDI spec files the plugin wrote for one claim (their names carry the claim's UID)."""
    return sorted(node.cdi_root.glob(f"*{claim_uid}*"))


def assert_container_got_its_gpu(api: KubeApi, node: KubeletNode, namespace: str, pod_name: str) -> str:
    """The workload container's own log shows the device allocated to its claim; returns the device."""
    wait_running(api, namespace, pod_name, TIMEOUT_S, node.cdi_root)
    device = allocated_device(claim_of(api, namespace, pod_name))
    log = wait_for(f"{pod_name}'s report", lambda: workload_report(api, namespace, pod_name, "app"), 60)
    env = log_env(log)
    assert env.get(f"DRAPLUGIN_DEVICE_{env_key(device)}_NAME") == device, log
    return device


def assert_device_status(api: KubeApi, node: KubeletNode, namespace: str, pod_name: str, device: str) -> None:
    """The plugin pod's own writes (chart `deviceStatus: auto`, its RBAC, its pod-bound token): the
    GPU's UUID in status.devices on 1.36+; nothing on 1.34/1.35, where the grant cannot be narrowed."""
    found = api.get(f"{RESOURCE}/resourceslices", query={"fieldSelector": f"spec.nodeName={node.name}"})
    uuids = {
        d["name"]: d["attributes"]["uuid"]["string"] for s in found["items"] for d in s["spec"]["devices"]
    }

    def ours() -> list[dict[str, Any]]:
        entries = claim_of(api, namespace, pod_name)["status"].get("devices", [])
        return [e for e in entries if e["driver"] == DRIVER]

    if server_version(api) >= (1, 36):
        (entry,) = wait_for("the plugin pod to write status.devices", ours, 60)
        assert entry["device"] == device and entry["data"]["uuid"] == uuids[device]
        assert [c["type"] for c in entry["conditions"] if c["status"] == "True"] == ["Ready"]
    else:
        assert ours() == []


def delete_pod_and_wait_unprepared(api: KubeApi, node: KubeletNode, namespace: str, pod_name: str) -> None:
    """Delete the pod; its claim goes with it once the plugin unprepared it (CDI spec removed)."""
    claim_uid = claim_of(api, namespace, pod_name)["metadata"]["uid"]
    api.delete(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    wait_for(f"the CDI spec of claim {claim_uid} removed", lambda: not cdi_specs(node, claim_uid), TIMEOUT_S)


def test_the_packaged_chart_runs_the_plugin_and_prepares_a_claim(
    release: ChartRelease,
    api: KubeApi,
    kubelet_node: KubeletNode,
    our_image: LocalImage,
    packaged_chart: Path,
) -> None:
    release.chart = packaged_chart
    with installed(release):
        # Installed from the archive: its chart version and appVersion are the release's one version.
        (listed,) = json.loads(release.helm("list", "--namespace", release.namespace, "--output", "json"))
        version = packaged_chart.name.removeprefix("draplugin-").removesuffix(".tgz")
        assert (listed["chart"], listed["app_version"]) == (f"draplugin-{version}", version)
        (plugin,) = release.plugin_pods()
        # Our image, in a real container on the containerd node.
        assert plugin["spec"]["nodeName"] == kubelet_node.name
        (status,) = plugin["status"]["containerStatuses"]
        assert status["image"].endswith(our_image.name), status
        assert status["containerID"].startswith("containerd://")
        # Registered through the mounted plugins_registry, with per-pod socket names.
        sockets = socket_paths(kubelet_node.root_dir, DRIVER, plugin["metadata"]["uid"])
        assert sockets.registration.is_socket(), sorted(kubelet_node.plugins_registry.iterdir())
        assert sockets.dra.is_socket()
        # Its ResourceSlices: the fake inventory of values-fake-gpus.yaml.
        release.wait(
            "the plugin pod's ResourceSlices", lambda: published_devices(api, kubelet_node.name) == PUBLISHED
        )

        create_gpu_pod(api, kubelet_node, release.namespace, "gpu-app")
        device = assert_container_got_its_gpu(api, kubelet_node, release.namespace, "gpu-app")
        assert device in WHOLE_GPUS
        claim = claim_of(api, release.namespace, "gpu-app")
        assert cdi_specs(kubelet_node, claim["metadata"]["uid"]), "no CDI spec for the prepared claim"
        assert_device_status(api, kubelet_node, release.namespace, "gpu-app", device)
        # Device metadata (on by default): the plugin pod wrote it below its mounted plugin directory
        # and containerd bind-mounted it read-only into the workload (docs/device-metadata.md).
        report = workload_report(api, release.namespace, "gpu-app", "app") or ""
        metadata_dir = "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates"
        metadata_file = f"{metadata_dir}/gpu/gpu/{DRIVER}-metadata.json"
        mounts = [line.split() for line in report.split("== mounts", 1)[-1].splitlines()]
        assert any(m[1:2] == [metadata_file] and "ro" in m[3].split(",") for m in mounts if len(m) > 3), (
            report
        )
        delete_pod_and_wait_unprepared(api, kubelet_node, release.namespace, "gpu-app")


def test_uninstall_removes_the_plugin_cleanly(
    release: ChartRelease, api: KubeApi, kubelet_node: KubeletNode
) -> None:
    with installed(release):
        (plugin,) = release.plugin_pods()
        sockets = socket_paths(kubelet_node.root_dir, DRIVER, plugin["metadata"]["uid"])
        wait_for("the plugin's slices", lambda: published_devices(api, kubelet_node.name) or None, TIMEOUT_S)
        release.uninstall()

        # The pods go after their owners (garbage collection), each after its SIGTERM.
        release.wait(
            "the release's pods gone",
            lambda: not api.get(f"/api/v1/namespaces/{release.namespace}/pods")["items"],
        )
        for path in ("/apis/apps/v1/namespaces/{ns}/daemonsets", "/apis/apps/v1/namespaces/{ns}/deployments"):
            assert not api.get(path.format(ns=release.namespace))["items"], path
        selector = {"labelSelector": f"app.kubernetes.io/instance={release.name}"}
        for path in ("/apis/rbac.authorization.k8s.io/v1/clusterroles", f"{RESOURCE}/deviceclasses"):
            assert not api.get(path, selector)["items"], path
        # The plugin removed its sockets on the way out...
        assert not sockets.registration.exists()
        assert not sockets.dra.exists()
        # ...and the kubelet, seeing the driver gone, wipes its ResourceSlices.
        wait_for("the node's slices wiped", lambda: not node_slices(api, kubelet_node.name), TIMEOUT_S)


def test_rolling_update_loses_no_claim_and_keeps_preparing(
    release: ChartRelease, api: KubeApi, kubelet_node: KubeletNode
) -> None:
    namespace = release.namespace
    with installed(release):
        (old_plugin,) = release.plugin_pods()
        create_gpu_pod(api, kubelet_node, namespace, "before")
        before_device = assert_container_got_its_gpu(api, kubelet_node, namespace, "before")
        before_claim = claim_of(api, namespace, "before")
        # The claim's CDI specs (its devices', and its device metadata's): untouched by the rollout.
        before_specs = {
            path: path.read_text() for path in cdi_specs(kubelet_node, before_claim["metadata"]["uid"])
        }
        assert before_specs, "no CDI spec for the prepared claim"

        # Any change to the pod template rolls the DaemonSet.
        release.upgrade(
            deep_merge(release.values, {"kubeletPlugin": {"podAnnotations": {"rollout": uuid.uuid4().hex}}})
        )
        create_gpu_pod(api, kubelet_node, namespace, "during")

        # maxSurge 1: the new plugin pod runs beside the old one before the old one goes.
        most_at_once = 0
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            current = release.plugin_pods()
            most_at_once = max(most_at_once, len(current))
            new = [p for p in current if p["metadata"]["uid"] != old_plugin["metadata"]["uid"]]
            if len(current) == 1 and new and is_ready(new[0]):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the rollout did not finish in {TIMEOUT_S:.0f}s: {release.plugin_pods()}")
        assert most_at_once == 2, "the new plugin pod never ran beside the old one (maxSurge 1)"

        # The pod created during the rollout got its device.
        during_device = assert_container_got_its_gpu(api, kubelet_node, namespace, "during")
        assert during_device != before_device
        # The claim prepared before the rollout is still there, still prepared.
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/before")
        assert pod["status"]["phase"] == "Running"
        assert claim_of(api, namespace, "before")["metadata"]["uid"] == before_claim["metadata"]["uid"]
        assert {path: path.read_text() for path in before_specs} == before_specs
        # The new plugin pod owns it now: it unprepares it when its pod goes.
        delete_pod_and_wait_unprepared(api, kubelet_node, namespace, "before")
        delete_pod_and_wait_unprepared(api, kubelet_node, namespace, "during")


def test_bad_image_fails_the_install_with_the_runtimes_reason(
    release: ChartRelease, api: KubeApi, kubelet_node: KubeletNode
) -> None:
    """An image that is not imported fails at once with the kubelet's reason, not a timeout."""
    release.values = deep_merge(release.values, {"image": {"tag": "not-imported"}})
    release.ready_timeout_s = 60
    started = time.monotonic()
    with pytest.raises(ChartError, match="ErrImageNeverPull") as failed, installed(release):
        pass
    assert time.monotonic() - started < 60
    assert "tests/cluster/build_image.sh" in str(failed.value), "the error does not say what fixes it"
    with pytest.raises(ApiError):
        api.get(
            f"/apis/apps/v1/namespaces/{release.namespace}/daemonsets/{release.name}-draplugin-kubelet-plugin"
        )


def test_a_daemonset_that_schedules_no_pod_fails_at_once(release: ChartRelease) -> None:
    """A nodeSelector no node matches (GPU Feature Discovery missing, say) is an error, not a wait."""
    release.values = deep_merge(
        release.values, {"kubeletPlugin": {"nodeSelector": {"draplugin.dev/no-such-label": "true"}}}
    )
    started = time.monotonic()
    with pytest.raises(ChartError, match=r"schedules no plugin pod.*no-such-label"), installed(release):
        pass
    assert time.monotonic() - started < 60


def test_make_clusters_release_rolls_with_its_host_network_metrics_port(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    our_image: LocalImage,
    test_namespace: str,
    api: KubeApi,
) -> None:
    """`make cluster`'s release (devcluster.chart.local_release: host networking and a plugin metrics
    port): a rollout's new plugin pod binds the ports the old one still serves (SO_REUSEPORT), gets
    Ready without a restart, and then serves the metrics alone."""
    home = Path(tempfile.mkdtemp(prefix="dra-helm-"))
    state_dir = Path(tempfile.mkdtemp(prefix="dra-chart-state-"))
    port = free_port()
    release = local_release(
        kube_cluster, kubelet_node, api, our_image, home=home, state_dir=state_dir,
        name=f"roll-{uuid.uuid4().hex[:6]}", namespace=test_namespace, plugin_metrics_port=port,
        overrides={"kubeletPlugin": {"nodeSelector": {"kubernetes.io/hostname": kubelet_node.name}}},
    )  # fmt: skip
    try:
        with installed(release):
            (old,) = release.plugin_pods()
            release.upgrade(
                deep_merge(
                    release.values, {"kubeletPlugin": {"podAnnotations": {"rollout": uuid.uuid4().hex}}}
                )
            )

            def rolled() -> dict[str, Any] | None:
                current = release.plugin_pods()
                if len(current) == 1 and current[0]["metadata"]["uid"] != old["metadata"]["uid"]:
                    return current[0] if is_ready(current[0]) else None
                return None

            new = wait_for("the rollout's new plugin pod alone and Ready", rolled, release.ready_timeout_s)
            restarts = {s["name"]: s["restartCount"] for s in new["status"]["containerStatuses"]}
            assert restarts == {"plugin": 0}, f"the new plugin pod restarted: {restarts}"
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
                assert b"draplugin_claim_operations_total" in answer.read()
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)
