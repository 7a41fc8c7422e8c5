"""Usage metrics on a real kubelet and containerd: claim and pod labels, a shared claim split, idle claims.

The plugin runs as `draplugin run --backend fake` with its Prometheus
endpoint on a free port, sampling every second. Fake GPUs run no processes,
so NVML's per-process data comes from the fake process file in the plugin's
state dir: the tests write the host PIDs of the real container processes
there (found by their container IDs in their cgroups, independently of the
plugin's own parser),
and the plugin has to tie each PID to its pod and container through
/proc/<pid>/cgroup, the claim's `status.reservedFor` and the pod's status,
exactly as it does for NVML's processes on real GPUs.
"""

from __future__ import annotations

import re
import socket
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from devcluster.wait import wait_for
from dracommon import usagenames as names
from dracommon.kubeapi import KubeApi
from draplugin.usage.fakesource import FAKE_PROCESS_FILE_NAME
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 120.0
METRICS_TIMEOUT = 60.0
MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("plugin"),
        delete_slices_on_shutdown=True,
        metrics_port=free_port(),
        extra_env={"USAGE_SAMPLE_INTERVAL": "1s", "IDLE_THRESHOLD_PERCENT": "5", "IDLE_AFTER": "3s"},
    ) as process:
        yield process


@pytest.fixture(scope="module")
def whole_gpus(api: KubeApi, plugin: PluginProcess) -> Iterator[str]:
    name = f"usage-gpu-{uuid.uuid4().hex[:6]}"
    api.create(f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {
            "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"',
        }}]},
    })  # fmt: skip
    yield name
    api.delete(f"{RESOURCE}/deviceclasses/{name}")


@pytest.fixture
def namespace(test_namespace: str, api: KubeApi, plugin: PluginProcess, whole_gpus: str) -> Iterator[str]:
    yield test_namespace
    process_file(plugin).unlink(missing_ok=True)
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- helpers ------------------------------------------------------------------------------------------


def process_file(plugin: PluginProcess) -> Path:
    return plugin.state_dir / FAKE_PROCESS_FILE_NAME


def scrape(plugin: PluginProcess) -> list[Sample]:
    with urllib.request.urlopen(f"http://127.0.0.1:{plugin.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def series(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def make_claim(api: KubeApi, namespace: str, name: str, device_class: str) -> None:
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}},
    })  # fmt: skip


def run_pod(api: KubeApi, node: KubeletNode, namespace: str, name: str, claim: str) -> dict[str, Any]:
    body = claim_pod(
        name,
        node.workload_image,
        {"resourceClaimName": claim},
        command=["sleep", "3600"],
        nodeSelector={"kubernetes.io/hostname": node.name},
        terminationGracePeriodSeconds=0,
        automountServiceAccountToken=False,
    )
    api.create(f"/api/v1/namespaces/{namespace}/pods", body)
    return pods.wait_running(api, namespace, name, POD_TIMEOUT, node.cdi_root)


def allocated_device(api: KubeApi, namespace: str, claim: str) -> str:
    doc = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")
    (result,) = doc["status"]["allocation"]["devices"]["results"]
    device: str = result["device"]
    return device


def container_pid(pod: dict[str, Any]) -> int:
    """The host PID of the pod's `sleep`: the process whose cgroup path names its container's ID.

    By container ID rather than pod UID: the local test kubelet makes no pod cgroups
    (`cgroupsPerQOS: false`), so the cgroup path names the container only.
    """
    (status,) = pod["status"]["containerStatuses"]
    container_id = status["containerID"].partition("://")[2]
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if container_id in cgroup and cmdline[:2] == [b"sleep", b"3600"]:
            found.append(int(entry.name))
    assert len(found) == 1, f"pod {pod['metadata']['name']}: sleep processes {found}"
    return found[0]


def write_processes(plugin: PluginProcess, device: str, processes: list[dict[str, Any]]) -> None:
    path = process_file(plugin)
    temp = path.with_suffix(".tmp")
    temp.write_text(yaml.safe_dump({device: processes}))
    temp.replace(path)  # the plugin never reads half a file


# --- tests --------------------------------------------------------------------------------------------


def test_a_prepared_claim_has_device_claim_and_pod_series_until_unprepared(
    api: KubeApi, kubelet_node: KubeletNode, plugin: PluginProcess, namespace: str, whole_gpus: str
) -> None:
    make_claim(api, namespace, "train", whole_gpus)
    run_pod(api, kubelet_node, namespace, "trainer", "train")
    device = allocated_device(api, namespace, "train")
    holder = {"namespace": namespace, "claim": "train", "pod": "trainer", "device": device}

    claim_series = wait_for(
        "the claim's utilization series with its pod",
        # `or None`: wait_for returns any value but None/False, an empty list included.
        lambda: series(scrape(plugin), names.CLAIM_GPU_UTILIZATION.name, **holder) or None,
        METRICS_TIMEOUT,
        0.5,
    )
    (sample,) = claim_series
    assert set(sample.labels) == set(names.CLAIM_GPU_UTILIZATION.labels)
    assert sample.labels["node"] == kubelet_node.name and sample.labels["uuid"].startswith("GPU-")
    assert sample.labels["model"].startswith("NVIDIA ")
    samples = scrape(plugin)
    (device_util,) = series(samples, names.DEVICE_GPU_UTILIZATION.name, device=device)
    assert 0.0 <= device_util.value <= 1.0
    assert series(samples, names.CLAIM_MEMORY_USED.name, **holder)
    assert series(samples, names.CLAIM_IDLE.name, namespace=namespace, claim="train")

    api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/trainer", query={"gracePeriodSeconds": "0"})
    api.delete(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/train")
    wait_for(
        "the claim's series to disappear once it is unprepared",
        lambda: not [s for s in scrape(plugin) if s.labels.get("claim") == "train"],
        METRICS_TIMEOUT,
        0.5,
    )
    assert series(scrape(plugin), names.DEVICE_GPU_UTILIZATION.name, device=device)  # the device stays


def test_two_pods_sharing_a_claim_are_split_by_their_processes(
    api: KubeApi, kubelet_node: KubeletNode, plugin: PluginProcess, namespace: str, whole_gpus: str
) -> None:
    make_claim(api, namespace, "shared", whole_gpus)
    pod_a = run_pod(api, kubelet_node, namespace, "pod-a", "shared")
    pod_b = run_pod(api, kubelet_node, namespace, "pod-b", "shared")
    device = allocated_device(api, namespace, "shared")
    write_processes(plugin, device, [
        {"pid": container_pid(pod_a), "smPercent": 30, "memory": "1Gi"},
        {"pid": container_pid(pod_b), "smPercent": 10, "memory": "512Mi"},
    ])  # fmt: skip

    def split() -> dict[str, tuple[str, float, float]] | None:
        samples = scrape(plugin)
        util = series(
            samples, names.CLAIM_GPU_UTILIZATION.name, namespace=namespace, claim="shared", device=device
        )
        memory = {
            s.labels["pod"]: s.value
            for s in series(samples, names.CLAIM_MEMORY_USED.name, namespace=namespace, claim="shared")
        }
        found = {
            s.labels["pod"]: (s.labels["container"], s.value, memory.get(s.labels["pod"], -1)) for s in util
        }
        # Until the plugin has tied a pod's process to its container (it re-reads the pod when it
        # meets an unknown PID), that pod's series has no container and no memory yet: wait for both.
        settled = set(found) == {"pod-a", "pod-b"} and all(c == "app" for c, _, _ in found.values())
        return found if settled else None

    shares = wait_for("the shared device split between the two pods", split, METRICS_TIMEOUT, 0.5)
    for pod, (ratio, memory) in {"pod-a": (0.3, 1024 * MiB), "pod-b": (0.1, 512 * MiB)}.items():
        container, got_ratio, got_memory = shares[pod]
        assert (container, got_memory) == ("app", memory), pod
        assert got_ratio == pytest.approx(ratio), pod
    samples = scrape(plugin)
    (unattributed,) = series(samples, names.DEVICE_UNATTRIBUTED_GPU_UTILIZATION.name, device=device)
    assert unattributed.value == 0.0
    (device_util,) = series(samples, names.DEVICE_GPU_UTILIZATION.name, device=device)
    assert device_util.value == pytest.approx(0.4)


def test_an_idle_claim_gets_one_event_on_the_claim_and_its_pod(
    api: KubeApi, kubelet_node: KubeletNode, plugin: PluginProcess, namespace: str, whole_gpus: str
) -> None:
    make_claim(api, namespace, "sleepy", whole_gpus)
    pod = run_pod(api, kubelet_node, namespace, "dozer", "sleepy")
    device = allocated_device(api, namespace, "sleepy")
    write_processes(plugin, device, [{"pid": container_pid(pod), "smPercent": 1, "memory": "256Mi"}])

    def idle() -> bool:
        return any(s.value == 1.0 for s in series(scrape(plugin), names.CLAIM_IDLE.name, claim="sleepy"))

    wait_for("the claim to be reported idle", idle, METRICS_TIMEOUT, 0.5)

    def idle_events() -> list[dict[str, Any]] | None:
        items = api.get(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events")["items"]
        found = [e for e in items if e.get("reason") == "ClaimIdle"]
        return found if len(found) >= 2 else None

    events = wait_for("ClaimIdle Events on the claim and the pod", idle_events, 30, 0.5)
    kinds = sorted((e["regarding"]["kind"], e["regarding"]["name"]) for e in events)
    assert kinds == [("Pod", "dozer"), ("ResourceClaim", "sleepy")]
    note = events[0]["note"]
    # The stretch may have begun on the device's own wave before the file took over: under 5% either way.
    assert re.fullmatch(
        rf"{device} \(NVIDIA [^)]+\) held by {namespace}/sleepy at [0-4]% busy for \d+s", note
    ), note
    assert all(e["type"] == "Normal" for e in events)
    (seconds,) = series(scrape(plugin), names.CLAIM_IDLE_SECONDS.name, claim="sleepy")
    assert seconds.value >= 3.0
