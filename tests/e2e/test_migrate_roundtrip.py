"""`dra-controller migrate` round trip: device-plugin manifests, converted, run on the real cluster.

The three workloads of examples/device-plugin/ (the Pod of Kubernetes'
"Schedule GPUs" page on an H100 node, a two-GPU Deployment on A100 40GB nodes,
a Job that needs more than 70000 MiB and driver 570 or 580) are converted by
the command as a user runs it, and what it prints is applied as it is (the
local workload image swapped in, and the trainer's 4-CPU request lowered: the
test machine has 2 cores). The node's fake inventory mixes products and
memory sizes, so each selector has devices to reject: every converted pod must
get a device of the product and memory its old node selection asked for, as
the API server records the allocation, as the plugin published the device, and
as the container sees it. With the A100 40GB GPUs taken, a second trainer
replica cannot be placed, and `dra-controller explain` says why.

The unit tests (tests/unit/test_migrate.py) check the conversion's text; this
module checks that its meaning survives the real scheduler and kubelet.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.images import use_local_image
from devcluster.kubelet import KubeletNode
from devcluster.manifests import DEVICE_CLASSES, EXAMPLES, collection_path, load_manifests
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.quantity import parse_quantity
from draplugin.prepare.plan import env_key
from tests.e2e import inside, scheduling
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
WORKLOADS = EXAMPLES / "device-plugin"
POD_TIMEOUT = 120.0
MiB = 1 << 20

# Mixed products and memory sizes: each old selection matches some GPUs and rejects others.
INVENTORY = {
    "gpus": [
        {"model": "H100-80GB-HBM3", "count": 1},  # gpu-0: 81559 MiB
        {"model": "A100-SXM4-40GB", "count": 2},  # gpu-1, gpu-2: 40960 MiB
        {"model": "A100-SXM4-80GB", "count": 1},  # gpu-3: 81920 MiB
        {"model": "L4", "count": 1},  # gpu-4: 23034 MiB
    ],
}


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    state = tmp_path_factory.mktemp("plugin")
    inventory = state / "mixed-gpus.yaml"
    inventory.write_text(yaml.safe_dump(INVENTORY))
    with running_plugin(
        kube_cluster, kubelet_node, api, state, delete_slices_on_shutdown=True, fake_config=inventory
    ) as process:
        yield process


@pytest.fixture(scope="module")
def device_classes(api: KubeApi, plugin: PluginProcess) -> Iterator[None]:
    """The chart's DeviceClasses, which the converted templates name."""
    created = []
    for doc in load_manifests(DEVICE_CLASSES):
        try:
            api.create(collection_path(doc, ""), doc)
            created.append(doc["metadata"]["name"])
        except ApiError as err:
            if err.status != 409:
                raise
    yield
    for name in created:
        api.delete(f"{RESOURCE}/deviceclasses/{name}")


@pytest.fixture
def namespace(
    test_namespace: str, api: KubeApi, plugin: PluginProcess, device_classes: None
) -> Iterator[str]:
    """The test's namespace; afterwards its workloads are gone and every GPU they used is free."""
    yield test_namespace
    # First the controllers' objects, which would recreate the pods that release_namespace deletes;
    # their pods are orphaned, not deleted gracefully: release_namespace removes them at once.
    owners = [f"/apis/apps/v1/namespaces/{test_namespace}/{kind}" for kind in ("deployments", "replicasets")]
    owners.append(f"/apis/batch/v1/namespaces/{test_namespace}/jobs")
    try:
        for collection in owners:
            api.delete(collection, query={"propagationPolicy": "Orphan"})
        wait_for(
            "the workloads to be gone", lambda: not any(api.get(c)["items"] for c in owners), POD_TIMEOUT
        )
    finally:
        release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- helpers ------------------------------------------------------------------------------------------


def migrate(*paths: Path) -> tuple[list[dict[str, Any]], str]:
    """`dra-controller migrate -f PATH...`: the converted objects and the report on standard error."""
    args = [arg for path in paths for arg in ("-f", str(path))]
    done = subprocess.run(
        [str(scheduling.DRA_CONTROLLER), "migrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"migrate exited {done.returncode}: {done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc], done.stderr


def published(api: KubeApi, node: str) -> dict[str, dict[str, Any]]:
    """The devices the plugin published for the node, by name."""
    return {
        d["name"]: d for s in node_slices(api.api_client, node, DRIVER) for d in s["spec"].get("devices", [])
    }


def product_label(device: dict[str, Any]) -> str:
    """The GPU Feature Discovery form of the device's product name (spaces as '-')."""
    name: str = device["attributes"]["productName"]["string"]
    return name.replace(" ", "-")


def memory_mib(device: dict[str, Any]) -> int:
    return parse_quantity(device["capacity"]["memory"]["value"]).as_integer() // MiB


def wait_pod_of(api: KubeApi, namespace: str, selector: str, node: KubeletNode) -> dict[str, Any]:
    """The one Running pod matching the label selector (a Deployment's or a Job's)."""

    def one() -> str | None:
        items = api.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": selector})["items"]
        return items[0]["metadata"]["name"] if len(items) == 1 else None

    name: str = wait_for(f"a pod for {selector}", one, POD_TIMEOUT)
    return pods.wait_running(api, namespace, name, POD_TIMEOUT, node.cdi_root)


def gpu_of(api: KubeApi, namespace: str, pod: dict[str, Any], count: int) -> list[str]:
    """The devices of the pod's converted `gpu` claim (and that the pod has no other claim)."""
    names = scheduling.pod_claim_names(pod)
    assert set(names) == {"gpu"}, names
    devices = scheduling.allocated_devices(scheduling.claim(api, namespace, names["gpu"]), DRIVER)
    assert len(devices) == count, devices
    return devices


def container_sees(
    api: KubeApi,
    namespace: str,
    pod: dict[str, Any],
    devices: list[str],
    inventory: dict[str, dict[str, Any]],
) -> None:
    """Inside the pod's container: each device, with the UUID and product the plugin published for it."""
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]["name"]
    env = inside.container_got(api, namespace, name, container, devices)
    for device in devices:
        key = env_key(device)
        attributes = inventory[device]["attributes"]
        assert env[f"DRAPLUGIN_DEVICE_{key}_UUID"] == attributes["uuid"]["string"], env
        assert env[f"DRAPLUGIN_DEVICE_{key}_MODEL"] == attributes["productName"]["string"], env


# --- the test -----------------------------------------------------------------------------------------


def test_converted_device_plugin_workloads_get_the_gpus_their_node_selection_asked_for(
    kube_cluster: ControlPlane, kubelet_node: KubeletNode, api: KubeApi, namespace: str
) -> None:
    docs, report = migrate(WORKLOADS / "pod.yaml", WORKLOADS / "deployment.yaml", WORKLOADS / "job.yaml")
    assert "3 object(s) converted, 3 ResourceClaimTemplate(s) written" in report, report
    by_kind = {doc["kind"]: doc for doc in docs if doc["kind"] != "ResourceClaimTemplate"}
    assert sorted(by_kind) == ["Deployment", "Job", "Pod"]
    for doc in docs:
        text = yaml.safe_dump(doc)
        assert "nvidia.com/gpu.product" not in text and "nvidia.com/gpu.memory" not in text, text
        assert "nvidia.com/gpu:" not in text.replace("key: nvidia.com/gpu\n", ""), text  # only tolerations
    trainer = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert trainer["resources"]["requests"] == {"cpu": "4"}  # kept by migrate
    trainer["resources"]["requests"]["cpu"] = "100m"  # the test machine has 2 cores

    inventory = published(api, kubelet_node.name)
    for doc in docs:  # templates first: the workloads name them
        if doc["kind"] == "ResourceClaimTemplate":
            api.create(collection_path(doc, namespace), doc)

    # The Pod asked for an H100 node: it gets the H100, not one of the four other GPUs.
    api.create(
        collection_path(by_kind["Pod"], namespace),
        use_local_image(by_kind["Pod"], kubelet_node.workload_image),
    )
    pod = pods.wait_running(api, namespace, "example-vector-add", POD_TIMEOUT, kubelet_node.cdi_root)
    (h100,) = gpu_of(api, namespace, pod, 1)
    assert product_label(inventory[h100]) == "NVIDIA-H100-80GB-HBM3"
    container_sees(api, namespace, pod, [h100], inventory)

    # The Deployment asked for 2 GPUs on A100 40GB nodes: both A100 40GB, neither the A100 80GB.
    deployment = use_local_image(by_kind["Deployment"], kubelet_node.workload_image)
    api.create(collection_path(deployment, namespace), deployment)
    first_trainer = wait_pod_of(api, namespace, "app=trainer", kubelet_node)
    a100s = gpu_of(api, namespace, first_trainer, 2)
    assert {product_label(inventory[d]) for d in a100s} == {"NVIDIA-A100-SXM4-40GB"}, a100s
    container_sees(api, namespace, first_trainer, a100s, inventory)

    # The Job asked for more than 70000 MiB: of the free A100 80GB and L4, the A100 80GB.
    job = use_local_image(by_kind["Job"], kubelet_node.workload_image)
    api.create(collection_path(job, namespace), job)
    solver = wait_pod_of(api, namespace, "job-name=big-memory", kubelet_node)
    (big,) = gpu_of(api, namespace, solver, 1)
    assert memory_mib(inventory[big]) > 70000, inventory[big]["capacity"]
    assert product_label(inventory[big]) == "NVIDIA-A100-SXM4-80GB"
    assert inventory[big]["attributes"]["driverVersion"]["version"].split(".")[0] in ("570", "580")
    container_sees(api, namespace, solver, [big], inventory)

    # A second trainer replica: no A100 40GB is free (the L4 is, but it is not one): Pending,
    # and `explain` says which devices the selector removed and which are in use.
    api.merge_patch(f"/apis/apps/v1/namespaces/{namespace}/deployments/trainer", {"spec": {"replicas": 2}})

    def second_trainer() -> str | None:
        items = api.get(f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": "app=trainer"})["items"]
        others = [
            p["metadata"]["name"] for p in items if p["metadata"]["name"] != first_trainer["metadata"]["name"]
        ]
        return others[0] if others else None

    pending = wait_for("a second trainer pod", second_trainer, POD_TIMEOUT)
    message = scheduling.wait_unschedulable(api, namespace, pending, POD_TIMEOUT)
    assert "cannot allocate all claims" in message, message
    explained = scheduling.explain(kube_cluster, namespace, f"pod/{pending}")
    (claim,) = explained["claims"]
    assert claim["allocated"] is False
    # Other modules' kubelets may also be registered: this test's devices are on kubelet_node.
    (node,) = [n for n in claim["nodes"] if n["node"] == kubelet_node.name]
    (request,) = node["requests"]
    assert (request["needed"], request["usable"]) == ("2", 0), request
    (pool,) = request["pools"]
    # The selector removed the H100, the A100 80GB and the L4; the two A100 40GB are the first trainer's.
    assert pool["removed"] == {"request-selector": 3, "in-use": 2}, pool
    holder = scheduling.pod_claim_names(first_trainer)["gpu"]
    assert pool["inUseBy"] == {f"{namespace}/{holder}": 2}, pool
