"""Every example applied on a local cluster with a real kubelet, and its README's outcome checked.

The node runs one `draplugin run --backend fake` for the module, with the
inventory of examples/fake-gpus.yaml (the one the READMEs describe); the
scheduler allocates from the ResourceSlices that process publishes. The
DeviceClasses are the chart's (examples/deviceclasses.yaml), and the manifests
are applied as they are, into a fresh namespace per example, which is emptied
after the test, passed or failed, until the plugin has unprepared every claim
of it: a failing example cannot leave GPUs taken for the next.

The pods run in real containers (containerd + runc) from the local workload
image, which replaces the examples' public `busybox` image (no registry is
reachable; `devcluster.images.use_local_image`). What each README says the
container gets is read from inside it, through the API server: the variables
from the container's own log (the examples print them with `env | grep`), the
device nodes `/dev/nvidia*` (character devices it can open) and mounts with
`exec`. containerd applied our CDI specs; nothing here resolves them for it.

Size: one test per example, sharing one plugin and the example helpers.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.images import use_local_image, workload_image
from devcluster.kubelet import KubeletNode
from devcluster.manifests import DEVICE_CLASSES, collection_path, load_manifests
from devcluster.objects import create_namespace, delete_namespace
from devcluster.plugin import PluginProcess, node_slices, wait_published
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from draplugin.devices.fake import make_device_nodes
from draplugin.prepare import mpsgpu
from tests.driverroot_layout import TOOL_STATE, command_log
from tests.e2e import inside
from tests.e2e.cleanup import release_namespace

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
POD_TIMEOUT = 120.0
WHOLE_GPUS = {"gpu-0", "gpu-1", "gpu-2"}  # gpu-3 is split into MIG devices
MPS_DIR = "/var/run/draplugin/mps"


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin(driver_root_plugin: PluginProcess) -> PluginProcess:
    """One plugin for the whole module, with a driver root (MPS and time-slices run through its tools)."""
    return driver_root_plugin


@pytest.fixture(scope="module")
def device_classes(api: KubeApi, plugin: PluginProcess) -> Iterator[list[str]]:
    """The chart's DeviceClasses; ones that already exist (another test's) are used as they are."""
    created: list[str] = []
    names: list[str] = []
    for doc in load_manifests(DEVICE_CLASSES):
        names.append(doc["metadata"]["name"])
        try:
            api.create(collection_path(doc, ""), doc)
            created.append(doc["metadata"]["name"])
        except ApiError as err:
            if err.status != 409:
                raise
    yield names
    for name in created:
        api.delete(f"{RESOURCE}/deviceclasses/{name}")


@pytest.fixture
def namespace(
    test_namespace: str, api: KubeApi, plugin: PluginProcess, device_classes: list[str]
) -> Iterator[str]:
    """The test's namespace; afterwards, passed or failed, every GPU it used is free again."""
    yield test_namespace
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- helpers ------------------------------------------------------------------------------------------


@functools.cache
def local_image() -> str:
    """The workload image the kubelet node imported (its name is its content hash)."""
    return workload_image().name


def example_docs(path: Path) -> list[dict[str, Any]]:
    """A manifest file's objects, its pods running the local workload image."""
    return [use_local_image(doc, local_image()) for doc in load_manifests(path)]


def apply_example(api: KubeApi, example: str, namespace: str) -> list[dict[str, Any]]:
    """Create the example's objects in `namespace`; a Namespace in it lends its labels to `namespace`."""
    docs = [doc for path in sorted((EXAMPLES / example).glob("*.yaml")) for doc in example_docs(path)]
    assert docs, f"examples/{example} has no manifests"
    namespaces = [doc for doc in docs if doc["kind"] == "Namespace"]
    for doc in namespaces:
        labels = {"metadata": {"labels": doc["metadata"]["labels"]}}
        api.merge_patch(f"/api/v1/namespaces/{namespace}", labels)
    for doc in docs:
        if doc["kind"] != "Namespace":
            create(api, collection_path(doc, namespace), doc, retry=bool(namespaces))
    return docs


def create(api: KubeApi, path: str, doc: dict[str, Any], *, retry: bool) -> None:
    if not retry:
        api.create(path, doc)
        return
    # The API server checks namespace labels (admin access) against its
    # namespace cache, which sees a new label a moment later.
    wait_for(f"{doc['kind']} {doc['metadata']['name']} to be accepted", lambda: api.create(path, doc), 30)


def wait_running(api: KubeApi, namespace: str, name: str, node: KubeletNode | None = None) -> dict[str, Any]:
    """The pod once Running; fails at once, naming the node's CDI specs, if the runtime cannot start it."""
    return pods.wait_running(api, namespace, name, POD_TIMEOUT, node.cdi_root if node else None)


def claims_of(api: KubeApi, namespace: str, pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's claims by their name in the pod spec."""
    statuses = pod["status"].get("resourceClaimStatuses") or []
    generated = {s["name"]: s.get("resourceClaimName") for s in statuses}
    out: dict[str, dict[str, Any]] = {}
    for ref in pod["spec"]["resourceClaims"]:
        name = ref.get("resourceClaimName") or generated[ref["name"]]
        out[ref["name"]] = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    return out


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = claim["status"].get("allocation")
    assert allocation, f"claim {claim['metadata']['name']} is not allocated"
    found: list[dict[str, Any]] = allocation["devices"]["results"]
    return found


def devices(claim: dict[str, Any]) -> list[str]:
    return sorted(r["device"] for r in results(claim))


def container_got(
    api: KubeApi, namespace: str, pod: str, container: str, claim: dict[str, Any]
) -> dict[str, str]:
    """Check, from inside the container, that it got every device of the claim; return its variables."""
    return inside.container_got(api, namespace, pod, container, devices(claim))


def env_key(device: str) -> str:
    return device.upper().replace("-", "_")


def pod_events(api: KubeApi, namespace: str, pod: str) -> list[dict[str, Any]]:
    query = {"fieldSelector": f"involvedObject.kind=Pod,involvedObject.name={pod}"}
    items: list[dict[str, Any]] = api.get(f"/api/v1/namespaces/{namespace}/events", query)["items"]
    return items


# --- the examples -------------------------------------------------------------------------------------


def test_01_single_gpu(kubelet_node: KubeletNode, api: KubeApi, namespace: str) -> None:
    apply_example(api, "01-single-gpu", namespace)
    pod = wait_running(api, namespace, "single-gpu", kubelet_node)
    claim = claims_of(api, namespace, pod)["gpu"]
    (device,) = devices(claim)
    assert device in WHOLE_GPUS
    env = container_got(api, namespace, "single-gpu", "app", claim)
    key = env_key(device)
    assert env[f"DRAPLUGIN_DEVICE_{key}_UUID"].startswith("GPU-")
    assert env[f"DRAPLUGIN_DEVICE_{key}_MODEL"]
    assert env[f"DRAPLUGIN_DEVICE_{key}_SHARING"] == "Exclusive"


def test_02_shared_claim_two_containers(kubelet_node: KubeletNode, api: KubeApi, namespace: str) -> None:
    apply_example(api, "02-shared-claim-two-containers", namespace)
    pod = wait_running(api, namespace, "two-containers", kubelet_node)
    claim = claims_of(api, namespace, pod)["gpu"]
    (device,) = devices(claim)
    trainer = container_got(api, namespace, "two-containers", "trainer", claim)
    profiler = container_got(api, namespace, "two-containers", "profiler", claim)
    key = env_key(device)
    assert trainer[f"DRAPLUGIN_DEVICE_{key}_UUID"] == profiler[f"DRAPLUGIN_DEVICE_{key}_UUID"]


def test_03_preallocated_claim_shared_by_two_pods(
    kube_cluster: ControlPlane, kubelet_node: KubeletNode, api: KubeApi, namespace: str, tmp_path: Path
) -> None:
    controller = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "dra-controller"),
            *("run", "--kubeconfig", str(kube_cluster.kubeconfig), "--driver-name", DRIVER),
        ],
        stdout=(tmp_path / "controller.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        docs = example_docs(EXAMPLES / "03-preallocated-shared-claim" / "shared-claim.yaml")
        claim_doc = next(d for d in docs if d["kind"] == "ResourceClaim")
        api.create(collection_path(claim_doc, namespace), claim_doc)
        claim_path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/team-gpu"

        def allocated() -> dict[str, Any] | None:
            if controller.poll() is not None:
                log = (tmp_path / "controller.log").read_text()
                raise AssertionError(f"dra-controller run exited {controller.returncode}: {log}")
            claim = api.get(claim_path)
            return claim if claim["status"].get("allocation") else None

        # Allocated by the controller, with no pod around.
        claim = wait_for("dra-controller to pre-allocate team-gpu", allocated, 60)
        assert not claim["status"].get("reservedFor")
        (device,) = devices(claim)
        assert device in WHOLE_GPUS

        for doc in docs:
            if doc["kind"] == "Pod":
                api.create(collection_path(doc, namespace), doc)
        pods = [wait_running(api, namespace, name, kubelet_node) for name in ("notebook", "dashboard")]
        claim = api.get(claim_path)
        assert devices(claim) == [device], "the allocation must not change once pods use the claim"
        assert {r["uid"] for r in claim["status"]["reservedFor"]} == {p["metadata"]["uid"] for p in pods}
        for name in ("notebook", "dashboard"):
            container_got(api, namespace, name, "app", claim)
    finally:
        controller.terminate()
        controller.wait(timeout=30)


def test_04_select_by_model_and_memory(api: KubeApi, namespace: str) -> None:
    apply_example(api, "04-select-by-model-and-memory", namespace)
    by_model = claims_of(api, namespace, wait_running(api, namespace, "a100-pod"))["gpu"]
    by_memory = claims_of(api, namespace, wait_running(api, namespace, "big-memory-pod"))["gpu"]
    assert devices(by_model)[0] in {"gpu-1", "gpu-2"}  # the two A100-SXM4-40GB
    assert devices(by_memory) == ["gpu-0"]  # the H100 (81559Mi); the A100s have 40Gi


def published_attribute(api: KubeApi, node: str, attribute: str) -> dict[str, str]:
    """One string attribute of every device the plugin published for the node, by device name."""
    return {
        device["name"]: device["attributes"][attribute]["string"]
        for piece in node_slices(api.api_client, node, DRIVER)
        for device in piece["spec"].get("devices", [])
        if attribute in device.get("attributes", {})
    }


def test_05_same_pcie_root_gets_the_two_gpus_of_one_root(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str
) -> None:
    """fake-gpus.yaml has two GPUs per root: gpu-0 + gpu-1 is the one whole-GPU pair (README)."""
    roots = published_attribute(api, kubelet_node.name, "resource.kubernetes.io/pcieRoot")
    assert roots["gpu-0"] == roots["gpu-1"] != roots["gpu-2"]
    apply_example(api, "05-same-pcie-root", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "gpu-pair", kubelet_node))["gpus"]
    assert devices(claim) == ["gpu-0", "gpu-1"]
    assert [r["request"] for r in results(claim)] == ["gpus", "gpus"]
    container_got(api, namespace, "gpu-pair", "app", claim)


def test_05_same_pcie_root_is_pending_when_no_free_pair_shares_a_root(api: KubeApi, namespace: str) -> None:
    """With gpu-0 taken (by example 04's memory selector), gpu-1 and gpu-2 sit on different roots."""
    for doc in example_docs(EXAMPLES / "04-select-by-model-and-memory" / "select.yaml"):
        if doc["metadata"]["name"] in ("by-memory", "big-memory-pod"):
            api.create(collection_path(doc, namespace), doc)
    holder = claims_of(api, namespace, wait_running(api, namespace, "big-memory-pod"))["gpu"]
    assert devices(holder) == ["gpu-0"]
    apply_example(api, "05-same-pcie-root", namespace)

    def unschedulable() -> str | None:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/gpu-pair")
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                message: str = condition.get("message", "")
                return message or None
        return None

    message = wait_for("the scheduler to report gpu-pair unschedulable", unschedulable, POD_TIMEOUT)
    assert "cannot allocate all claims" in message
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/gpu-pair")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")


def test_06_first_available_prefers_the_h100(kubelet_node: KubeletNode, api: KubeApi, namespace: str) -> None:
    apply_example(api, "06-first-available-fallback", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "fallback", kubelet_node))["gpu"]
    assert [(r["request"], r["device"]) for r in results(claim)] == [("gpu/h100", "gpu-0")]
    container_got(api, namespace, "fallback", "app", claim)


def test_06_first_available_falls_back_to_two_a100(api: KubeApi, namespace: str) -> None:
    """With the H100 taken (by example 04's memory selector), the claim gets two A100s."""
    for doc in example_docs(EXAMPLES / "04-select-by-model-and-memory" / "select.yaml"):
        if doc["metadata"]["name"] in ("by-memory", "big-memory-pod"):
            api.create(collection_path(doc, namespace), doc)
    holder = claims_of(api, namespace, wait_running(api, namespace, "big-memory-pod"))["gpu"]
    assert devices(holder) == ["gpu-0"]
    apply_example(api, "06-first-available-fallback", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "fallback"))["gpu"]
    assert sorted((r["request"], r["device"]) for r in results(claim)) == [
        ("gpu/two-a100", "gpu-1"),
        ("gpu/two-a100", "gpu-2"),
    ]


def test_07_all_gpus_on_node(kubelet_node: KubeletNode, api: KubeApi, namespace: str) -> None:
    apply_example(api, "07-all-gpus-on-node", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "whole-node", kubelet_node))["gpus"]
    assert set(devices(claim)) == WHOLE_GPUS
    container_got(api, namespace, "whole-node", "app", claim)


def test_08_mig_device(kubelet_node: KubeletNode, api: KubeApi, namespace: str) -> None:
    apply_example(api, "08-mig-device", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "mig-pod", kubelet_node))["mig"]
    (device,) = devices(claim)
    assert device in {"gpu-3-mig-1g10gb-0", "gpu-3-mig-1g10gb-1"}
    env = container_got(api, namespace, "mig-pod", "app", claim)  # the parent's /dev/nvidia3
    key = env_key(device)
    assert env[f"DRAPLUGIN_DEVICE_{key}_KIND"] == "mig"
    assert env[f"DRAPLUGIN_DEVICE_{key}_PARENT_UUID"].startswith("GPU-")
    assert env[f"DRAPLUGIN_DEVICE_{key}_UUID"].startswith("MIG-")


def test_09_time_slicing(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess, driver_root: Path
) -> None:
    apply_example(api, "09-time-slicing", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "time-sliced", kubelet_node))["gpu"]
    (device,) = devices(claim)
    for container in ("worker-a", "worker-b"):
        env = container_got(api, namespace, "time-sliced", container, claim)
        assert env[f"DRAPLUGIN_DEVICE_{env_key(device)}_SHARING"] == "TimeSlicing"
        assert env[f"DRAPLUGIN_DEVICE_{env_key(device)}_TIMESLICE_INTERVAL"] == "Long"
    # On the GPU: the driver's nvidia-smi set the time-slice to Long (3) before the pod started ...
    uuid = env[f"DRAPLUGIN_DEVICE_{env_key(device)}_UUID"]
    assert f"nvidia-smi compute-policy -i {uuid} --set-timeslice 3" in command_log(driver_root)
    # ... and sets it back to the default (0) when the claim is unprepared.
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    assert command_log(driver_root)[-1] == f"nvidia-smi compute-policy -i {uuid} --set-timeslice 0"


def test_10_mps(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess, driver_root: Path
) -> None:
    apply_example(api, "10-mps", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "mps", kubelet_node))["gpu"]
    (device,) = devices(claim)
    key = env_key(device)
    pipes = set()
    for container in ("inference-a", "inference-b"):
        env = container_got(api, namespace, "mps", container, claim)
        assert env[f"DRAPLUGIN_DEVICE_{key}_SHARING"] == "MPS"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{env[f'DRAPLUGIN_DEVICE_{key}_UUID']}=10240M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(MPS_DIR)
        # The claim's MPS server directory is mounted where the variables point.
        assert MPS_DIR in inside.mounts_in(api, namespace, "mps", container)
        pipes.add(env["CUDA_MPS_PIPE_DIRECTORY"])
        # The claim's MPS control daemon answers through the mounted pipe directory, with the limit set.
        code, out, err = pods.exec_in(api, namespace, "mps", container, [
            "sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control",
        ])  # fmt: skip
        assert (code, out.strip()) == (0, "50.0"), err
    assert len(pipes) == 1  # one MPS server for the claim
    # The daemon was started from the driver root for the claim's GPU, then configured.
    log = command_log(driver_root)
    uuid = env[f"DRAPLUGIN_DEVICE_{key}_UUID"]
    (start,) = [line for line in log if line.startswith("nvidia-cuda-mps-control -d")]
    assert start.endswith(f"CUDA_VISIBLE_DEVICES={uuid}"), start
    daemon = [line.split(": ", 1)[1].strip() for line in log if line.startswith("mps-daemon")]
    assert daemon[1:3] == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
    ]
    # Unprepare stops it.
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    stopped = [line for line in command_log(driver_root) if line.startswith("mps-daemon")]
    assert stopped[-2].rstrip().endswith("quit") and stopped[-1].endswith(": exit"), stopped[-2:]


def test_11_admin_access_sees_every_gpu_even_in_use(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str
) -> None:
    # A workload holds a GPU first; the monitor must still get all of them.
    apply_example(api, "01-single-gpu", namespace)
    busy = devices(claims_of(api, namespace, wait_running(api, namespace, "single-gpu", kubelet_node))["gpu"])
    apply_example(api, "11-admin-access-monitoring", namespace)
    claim = claims_of(api, namespace, wait_running(api, namespace, "gpu-monitor", kubelet_node))["gpus"]
    assert set(devices(claim)) == WHOLE_GPUS
    assert set(busy) <= WHOLE_GPUS
    assert all(r.get("adminAccess") is True for r in results(claim))
    container_got(api, namespace, "gpu-monitor", "exporter", claim)


def test_11_admin_access_refused_without_the_namespace_label(
    kube_cluster: ControlPlane, api: KubeApi
) -> None:
    docs = load_manifests(EXAMPLES / "11-admin-access-monitoring" / "monitor.yaml")
    template = next(d for d in docs if d["kind"] == "ResourceClaimTemplate")
    with kube_cluster.api_client() as client:
        unlabelled = create_namespace(client, prefix="no-admin-")
        try:
            with pytest.raises(ApiError) as info:
                api.create(collection_path(template, unlabelled), template)
        finally:
            delete_namespace(client, unlabelled)
    assert info.value.status in (403, 422)
    assert "admin" in str(info.value.body).lower()


def test_12_bad_opaque_config_is_reported_on_the_pod(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str
) -> None:
    apply_example(api, "12-bad-opaque-config", namespace)

    def prepare_failed() -> str | None:
        for event in pod_events(api, namespace, "bad-config"):
            if event["reason"] == "FailedPrepareDynamicResources":
                message: str = event["message"]
                return message
        return None

    message = wait_for("a FailedPrepareDynamicResources event on bad-config", prepare_failed, POD_TIMEOUT)
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.strategy: "
        "must be one of Exclusive, TimeSlicing, MPS, got 'TimeSlice'"
    ) in message
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/bad-config")
    assert pod["status"]["phase"] == "Pending"  # ContainerCreating: no container was started
    assert not any(s.get("containerID") for s in pod["status"].get("containerStatuses") or [])


@contextmanager
def plugin_restarted_with(api: KubeApi, plugin: PluginProcess, env: dict[str, str]) -> Iterator[None]:
    """The module's plugin restarted with more environment, and restarted as it was afterwards."""
    before = dict(plugin.extra_env)

    def restart(extra: dict[str, str]) -> None:
        plugin.stop()  # the module's plugin deletes its slices: the new ones are the restarted plugin's
        plugin.extra_env = extra
        plugin.start()
        plugin.wait_registered()
        wait_published(plugin, api.api_client)

    restart({**before, **env})
    try:
        yield
    finally:
        restart(before)


def metadata_files(plugin: PluginProcess, node: KubeletNode, uid: str) -> list[Path]:
    """The claim's device metadata documents and CDI specs on the node (docs/device-metadata.md)."""
    documents = plugin.kubelet_root_dir / "plugins" / DRIVER / "dra-device-metadata"
    return sorted(node.cdi_root.glob(f"{DRIVER}_metadata_{uid}_*.json")) + [
        path for path in documents.glob("*/*/metadata.json") if uid in path.read_text()
    ]


def test_14_device_metadata(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess
) -> None:
    apply_example(api, "14-device-metadata", namespace)
    published = {
        device["name"]: device["attributes"]
        for piece in node_slices(api.api_client, kubelet_node.name, DRIVER)
        for device in piece["spec"].get("devices", [])
    }
    uids = set()
    for pod_name, claim_name in (("reader-a", "gpu"), ("reader-b", "gpu"), ("template-reader", "my-gpu")):
        claim = claims_of(api, namespace, wait_running(api, namespace, pod_name, kubelet_node))[claim_name]
        (device,) = devices(claim)
        uids.add(claim["metadata"]["uid"])
        attributes = published[device]
        expected = [
            f"uuid={attributes['uuid']['string']}",
            f"pciBusID={attributes['resource.kubernetes.io/pciBusID']['string']}",
        ]

        def printed(pod: str = pod_name) -> list[str] | None:
            lines = pods.container_log(api, namespace, pod, "app").splitlines()
            return lines if len(lines) >= 2 else None

        # Read by the container itself from the file containerd mounted (the example's command).
        assert wait_for(f"{pod_name} to print from its metadata file", printed, POD_TIMEOUT)[:2] == expected
    assert len(uids) == 2  # the two readers of shared-gpu share one claim, the template's pod has its own
    for uid in uids:
        assert len(metadata_files(plugin, kubelet_node, uid)) == 2  # its document and its CDI spec
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    for uid in uids:
        assert metadata_files(plugin, kubelet_node, uid) == []  # gone with the claim's unprepare


def test_13_shared_gpu(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess, driver_root: Path
) -> None:
    # pod: (consumedCapacity.memory the scheduler counts, the MPS limit that enforces it)
    expected = {"small-inference": ("10Gi", "10240M"), "large-inference": ("30Gi", "30720M")}
    with plugin_restarted_with(api, plugin, {"SHARED_GPUS": "memory"}):
        published = node_slices(api.api_client, kubelet_node.name, DRIVER)
        whole = {
            d["name"]: d for s in published for d in s["spec"].get("devices", []) if d["name"] in WHOLE_GPUS
        }
        assert set(whole) == WHOLE_GPUS and all(
            d.get("allowMultipleAllocations") is True for d in whole.values()
        )
        apply_example(api, "13-shared-gpu", namespace)
        share_ids, uuids = set(), set()
        for pod_name, (consumed, limit) in expected.items():
            claim = claims_of(api, namespace, wait_running(api, namespace, pod_name, kubelet_node))["gpu"]
            (allocated,) = results(claim)
            assert allocated["device"] == "gpu-0", allocated
            assert allocated["consumedCapacity"]["memory"] == consumed, allocated
            share_ids.add(allocated["shareID"])
            env = container_got(api, namespace, pod_name, "server", claim)
            uuid = env["DRAPLUGIN_DEVICE_GPU_0_UUID"]
            uuids.add(uuid)
            assert env["DRAPLUGIN_DEVICE_GPU_0_SHARING"] == "MPS"
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{uuid}={limit}"
            assert MPS_DIR in inside.mounts_in(api, namespace, pod_name, "server")
            # The container reaches the GPU's one daemon, which has no daemon-wide limit of either claim:
            # each client's limit is the CUDA_MPS_PINNED_DEVICE_MEM_LIMIT of its own environment.
            code, out, err = pods.exec_in(api, namespace, pod_name, "server", [
                "sh", "-c", "echo get_default_active_thread_percentage | nvidia-cuda-mps-control",
            ])  # fmt: skip
            assert (code, out.strip()) == (0, "100.0"), err
        assert len(uuids) == 1 and len(share_ids) == 2  # one GPU, two shares of it
        (uuid,) = uuids
        # On the GPU (the recorded commands): one daemon for the GPU, started once, with no limits set;
        # the GPU in EXCLUSIVE_PROCESS compute mode while it runs.
        pipe = plugin.state_dir / "mps" / mpsgpu.owner_of(uuid) / "pipe"
        log = command_log(driver_root)
        (start,) = [line for line in log if line.startswith(f"nvidia-cuda-mps-control -d pipe={pipe} ")]
        assert start.endswith(f"CUDA_VISIBLE_DEVICES={uuid}"), start
        daemon = (pipe / "nvidia-cuda-mps-control.pid").read_text().strip()
        served = [line for line in log if line.startswith(f"mps-daemon {daemon}: ")]
        assert served and not [line for line in served if "set_default" in line], served
        mode = driver_root / TOOL_STATE / f"computemode-{uuid}"
        assert mode.read_text().strip() == "Exclusive_Process"
        # Unprepare of the last share stops the daemon and restores the compute mode.
        release_namespace(api, plugin, namespace, POD_TIMEOUT)
        assert not list(plugin.state_dir.glob("mps/*/pipe/nvidia-cuda-mps-control.pid"))
        assert mode.read_text().strip() == "Default"


def test_a_cdi_device_the_runtime_cannot_inject_fails_naming_the_spec_and_the_runtime_error(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess
) -> None:
    """A device node gone from the host (the spec still names it): containerd refuses to create the
    container, and the failure shows containerd's error next to the claim's CDI spec."""
    device_dir = plugin.state_dir / "fake-dev"
    # The GPUs' own nodes: the control nodes come from the driver root's dev, at spec level.
    gpu_nodes = sorted(p.name for p in device_dir.iterdir() if p.name.removeprefix("nvidia").isdigit())
    assert gpu_nodes, sorted(p.name for p in device_dir.iterdir())
    for name in gpu_nodes:
        (device_dir / name).unlink()
    try:
        apply_example(api, "01-single-gpu", namespace)
        with pytest.raises(pods.ContainerFailed) as info:
            wait_running(api, namespace, "single-gpu", kubelet_node)
    finally:
        make_device_nodes(device_dir, [f"/dev/{name}" for name in gpu_nodes])
    message = str(info.value)
    assert "CreateContainerError" in message, message
    missing = [name for name in gpu_nodes if f"{device_dir / name}" in message]
    assert missing and "no such file or directory" in message, message
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/single-gpu")
    uid = claims_of(api, namespace, pod)["gpu"]["metadata"]["uid"]
    # The claim's own spec, named after its UID (beside it, its request's device metadata spec).
    (spec,) = kubelet_node.cdi_root.glob(f"*-claim_{uid}.json")
    assert f"--- {spec}" in message, message


def test_every_example_has_a_test() -> None:
    tested = {name.split("_")[1] for name in globals() if name.startswith("test_") and name[5:7].isdigit()}
    examples = {path.name[:2] for path in EXAMPLES.iterdir() if path.is_dir() and path.name[:2].isdigit()}
    assert examples == tested, f"examples without a test: {sorted(examples - tested)}"
