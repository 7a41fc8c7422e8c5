"""Pods written for the device plugin (`limits: {nvidia.com/gpu: N}`, no ResourceClaim) run through DRA.

KEP-5004 (`DRAExtendedResource`: alpha in 1.34, on in the 1.34 build through
devcluster.controlplane's gates; GA in 1.37): a DeviceClass with
`extendedResourceName: nvidia.com/gpu` (examples/device-plugin/extended-resource/)
makes the scheduler turn the pod's extended resource into an implicit
ResourceClaim for that class, which it writes at binding (owned by the pod,
annotated `resource.kubernetes.io/extended-resource-claim`) and names in
`pod.status.extendedResourceClaimStatus`, with the request each container's
resource maps to. The kubelet prepares that claim through our plugin like any
other and gives each container the CDI devices of its requests; the tests read
from inside the containers what they got.

The node runs one `draplugin run --backend fake` for the module with the
inventory of examples/fake-gpus.yaml (three whole GPUs, the one the example's
README describes), on the session's real kubelet (containerd + runc). What a
device plugin on the same node changes is test_device_plugin_coexistence.py.

Size: the example's two pods, a pod that mixes a claim and the extended
resource, and `explain` on the pod that cannot fit.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.images import use_local_image
from devcluster.kubelet import KubeletNode
from devcluster.manifests import EXAMPLES, collection_path, load_manifests
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from draplugin.prepare.plan import env_key
from tests.e2e import inside, scheduling
from tests.e2e.cleanup import prepared_claims, release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
EXAMPLE = EXAMPLES / "device-plugin" / "extended-resource"
EXTENDED_RESOURCE = "nvidia.com/gpu"
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
POD_TIMEOUT = 120.0
WHOLE_GPUS = {"gpu-0", "gpu-1", "gpu-2"}  # examples/fake-gpus.yaml: gpu-3 is split into MIG devices


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    with running_plugin(
        kube_cluster, kubelet_node, api, tmp_path_factory.mktemp("plugin"), delete_slices_on_shutdown=True
    ) as process:
        yield process


@pytest.fixture(scope="module")
def extended_class(extended_resource_class: str, api: KubeApi) -> str:
    doc = api.get(f"{RESOURCE}/deviceclasses/{extended_resource_class}")
    assert doc["spec"]["extendedResourceName"] == EXTENDED_RESOURCE
    return extended_resource_class


@pytest.fixture
def namespace(test_namespace: str, api: KubeApi, plugin: PluginProcess, extended_class: str) -> Iterator[str]:
    """The test's namespace; afterwards, passed or failed, every GPU it used is free again."""
    yield test_namespace
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- helpers ------------------------------------------------------------------------------------------


def example_pods(node: KubeletNode) -> dict[str, dict[str, Any]]:
    """The example's pods by name, running the node's local workload image."""
    return {
        doc["metadata"]["name"]: use_local_image(doc, node.workload_image)
        for doc in load_manifests(EXAMPLE / "pods.yaml")
    }


def extended_claim(api: KubeApi, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    """The implicit claim the scheduler wrote for the pod, as the pod's status names it."""
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status, f"pod {pod['metadata']['name']} has no extendedResourceClaimStatus: {pod['status']}"
    claim = scheduling.claim(api, namespace, status["resourceClaimName"])
    assert claim["metadata"]["annotations"].get(EXTENDED_CLAIM_ANNOTATION) == "true", claim["metadata"]
    owners = [(o["kind"], o["name"], o["uid"]) for o in claim["metadata"]["ownerReferences"]]
    assert owners == [("Pod", pod["metadata"]["name"], pod["metadata"]["uid"])], owners
    return claim


# --- the tests ----------------------------------------------------------------------------------------


def test_an_unmodified_device_plugin_pod_gets_two_gpus_through_dra(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess, extended_class: str
) -> None:
    pod_doc = example_pods(kubelet_node)["two-gpus-a"]
    assert "resourceClaims" not in pod_doc["spec"]
    assert pod_doc["spec"]["containers"][0]["resources"] == {"limits": {EXTENDED_RESOURCE: 2}}
    api.create(collection_path(pod_doc, namespace), pod_doc)
    pod = pods.wait_running(api, namespace, "two-gpus-a", POD_TIMEOUT, kubelet_node.cdi_root)

    # The scheduler wrote the implicit claim: two devices of the mapped class, for container 0.
    claim = extended_claim(api, namespace, pod)
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == extended_class
    assert request["exactly"]["count"] == 2
    mappings = pod["status"]["extendedResourceClaimStatus"]["requestMappings"]
    assert mappings == [
        {"containerName": "cuda", "resourceName": EXTENDED_RESOURCE, "requestName": request["name"]}
    ]
    devices = sorted(scheduling.allocated_devices(claim, DRIVER))
    assert len(set(devices)) == 2 and set(devices) <= WHOLE_GPUS, devices
    assert {r["request"] for r in claim["status"]["allocation"]["devices"]["results"]} == {request["name"]}
    assert {r["uid"] for r in claim["status"]["reservedFor"]} == {pod["metadata"]["uid"]}

    # Our plugin prepared it (its checkpoint; the CDI spec named by the claim's UID) ...
    uid = claim["metadata"]["uid"]
    assert any(uid in entry for entry in prepared_claims(plugin, namespace)), prepared_claims(
        plugin, namespace
    )
    assert list(kubelet_node.cdi_root.glob(f"*{uid}*.json")), sorted(kubelet_node.cdi_root.iterdir())
    # ... and the container got both GPUs: their variables and their /dev/nvidia<index> nodes.
    env = inside.container_got(api, namespace, "two-gpus-a", "cuda", devices)
    assert not {k for k in env if k.endswith("_NAME") and k.startswith("DRAPLUGIN_DEVICE_")} - {
        f"DRAPLUGIN_DEVICE_{env_key(d)}_NAME" for d in devices
    }, env


def four_gpus_pending(api: KubeApi, namespace: str, node: KubeletNode) -> str:
    """The example's four-GPU pod, created and reported unschedulable: the scheduler's message."""
    pod_doc = example_pods(node)["four-gpus"]
    api.create(collection_path(pod_doc, namespace), pod_doc)
    return scheduling.wait_unschedulable(api, namespace, "four-gpus", POD_TIMEOUT)


def test_a_device_plugin_pod_asking_more_gpus_than_the_node_has_stays_pending(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, extended_class: str
) -> None:
    """The example's four-GPU pod on the three whole GPUs: Pending, and no claim written."""
    message = four_gpus_pending(api, namespace, kubelet_node)
    assert "cannot allocate all claims" in message, message
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/four-gpus")
    assert not pod["spec"].get("nodeName") and pod["status"]["phase"] == "Pending"
    # The implicit claim lives only in the scheduler's memory until a node fits.
    assert api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"] == []


def test_explain_names_the_class_a_pending_device_plugin_pod_was_mapped_to(
    kube_cluster: ControlPlane, kubelet_node: KubeletNode, api: KubeApi, namespace: str, extended_class: str
) -> None:
    """`explain pod/four-gpus` on the live cluster: the class it was mapped to, and 4 needed where 3 fit."""
    four_gpus_pending(api, namespace, kubelet_node)
    explained = scheduling.explain(kube_cluster, namespace, "pod/four-gpus")
    # The cluster's DRAExtendedResource gate is on (on 1.34 too): explain must see the implicit claim.
    assert len(explained["claims"]) == 1, explained
    (claim,) = explained["claims"]
    assert claim["allocated"] is False
    (mapped,) = claim["extendedResources"]
    assert (mapped["container"], mapped["resource"], mapped["count"], mapped["deviceClass"]) == (
        "cuda", EXTENDED_RESOURCE, 4, extended_class,
    )  # fmt: skip
    assert "extendedResourceName" in mapped["why"], mapped
    (node,) = claim["nodes"]
    (request,) = node["requests"]
    assert (node["node"], request["deviceClassName"], request["needed"], request["usable"]) == (
        kubelet_node.name, extended_class, "4", len(WHOLE_GPUS),
    )  # fmt: skip


def test_a_pod_mixing_a_claim_and_the_extended_resource_gets_both_each_container_its_own(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, gpu_device_class: str, plugin: PluginProcess
) -> None:
    """One container names a ResourceClaim, the other asks for nvidia.com/gpu: two claims, two GPUs,
    and each container sees only the GPU of its own request."""
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": gpu_device_class,
                                        "selectors": [{"cel": {"expression":
                                            f'device.attributes["{DRIVER}"].type == "gpu"'}}]}},
        ]}}},
    })  # fmt: skip
    doc = claim_pod(
        "mixed", kubelet_node.workload_image, {"resourceClaimTemplateName": "one-gpu"},
        containers=("claimed", "extended"),
    )  # fmt: skip
    doc["spec"]["containers"][1]["resources"] = {"limits": {EXTENDED_RESOURCE: 1}}
    api.create(f"/api/v1/namespaces/{namespace}/pods", doc)
    pod = pods.wait_running(api, namespace, "mixed", POD_TIMEOUT, kubelet_node.cdi_root)

    (status,) = pod["status"]["resourceClaimStatuses"]
    named = scheduling.claim(api, namespace, status["resourceClaimName"])
    implicit = extended_claim(api, namespace, pod)
    (claimed_device,) = scheduling.allocated_devices(named, DRIVER)
    (extended_device,) = scheduling.allocated_devices(implicit, DRIVER)
    assert claimed_device != extended_device
    assert {claimed_device, extended_device} <= WHOLE_GPUS
    (request,) = implicit["spec"]["devices"]["requests"]
    assert request["name"] == "container-1-request-0"  # container index 1, its first sorted resource
    assert pod["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {"containerName": "extended", "resourceName": EXTENDED_RESOURCE, "requestName": request["name"]}
    ]
    # Both claims prepared by our plugin.
    prepared = " ".join(prepared_claims(plugin, namespace))
    assert named["metadata"]["uid"] in prepared and implicit["metadata"]["uid"] in prepared, prepared

    devices = {"claimed": claimed_device, "extended": extended_device}
    envs = {c: inside.container_got(api, namespace, "mixed", c, [d]) for c, d in devices.items()}
    nodes = {d: f"/dev/nvidia{envs[c][f'DRAPLUGIN_DEVICE_{env_key(d)}_INDEX']}" for c, d in devices.items()}
    for container, other in (("claimed", extended_device), ("extended", claimed_device)):
        assert f"DRAPLUGIN_DEVICE_{env_key(other)}_NAME" not in envs[container], envs[container]
        found = inside.device_nodes_in(api, namespace, "mixed", container, [nodes[other]])
        assert found == {nodes[other]: "bad"}, (container, found)


def test_a_device_plugin_pods_claim_deleted_before_its_pod_is_released_once_the_pod_is_gone(
    kubelet_node: KubeletNode, api: KubeApi, namespace: str, plugin: PluginProcess, extended_class: str
) -> None:
    """The order of events that 1.34's controller-manager never resolves alone (tests/e2e/cleanup.py):
    the implicit claim is deleted while its pod runs, then the pod goes. The clean-up must still free
    both GPUs and leave nothing prepared, on every release."""
    pod_doc = example_pods(kubelet_node)["two-gpus-a"]
    api.create(collection_path(pod_doc, namespace), pod_doc)
    pod = pods.wait_running(api, namespace, "two-gpus-a", POD_TIMEOUT, kubelet_node.cdi_root)
    claim = extended_claim(api, namespace, pod)
    claim_path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim['metadata']['name']}"
    api.delete(claim_path)
    deleting = api.get(claim_path)  # the finalizer keeps it while the pod holds it
    assert deleting["metadata"].get("deletionTimestamp") and deleting["status"]["reservedFor"], deleting

    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    assert api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"] == []
    assert prepared_claims(plugin, namespace) == []
