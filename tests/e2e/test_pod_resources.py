"""The kubelet's pod-resources API names our devices: what monitoring agents read to attribute GPUs to pods.

The real kubelet of the session (containerd + runc) answers `List` and `Get` on
`<kubelet-root>/pod-resources/kubelet.sock`; the client is built from the
kubelet's own proto (tests/podresources.py). Both calls are on by default from
1.34 (`KubeletPodResourcesGet`, `KubeletPodResourcesDynamicResources`: beta in
1.34, GA and locked in 1.36), so no gate is set on either release.

One pod holds the four kinds of claims: a whole GPU from a claim that both its
containers and a second pod share, a MIG device (examples/fake-gpus.yaml's
gpu-3 is split into MIG devices), and, in one container, `nvidia.com/gpu: 1`
that the scheduler turns into an implicit claim (KEP-5004, the class of
examples/device-plugin/extended-resource/). Each container's answer must list
exactly its claims, each with our driver, the node's pool, the allocated
device and the CDI device our plugin returned for it.

Then the NVIDIA-compatible mode (`--device-naming=nvidia`, driver
`gpu.nvidia.com`): a pod's claims, read back through pod-resources and our
slices the way DCGM exporter maps them (tests/dcgm_view.py), land on the GPU
UUIDs of the allocated devices; and a second plugin started in that mode
beside a plugin registered as `gpu.nvidia.com` (the first one, standing in for
NVIDIA's: both register under `plugins_registry/gpu.nvidia.com-reg.sock`)
exits 1 with a Node Event. Fake GPUs only; DCGM exporter itself is not run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.drivername import cdi_kind
from dracommon.kubeapi import KubeApi
from draplugin.cdi.spec import claim_device_name, qualified_name
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.nvidiadriver import REASON as REFUSED_REASON
from tests import dcgm_view, podresources
from tests.e2e import scheduling
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 120.0
EXTENDED_RESOURCE = "nvidia.com/gpu"


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
def nvidia_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    """Our plugin as `gpu.nvidia.com` with NVIDIA's names, on the same fake GPUs."""
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("nvidia-plugin"),
        delete_slices_on_shutdown=True,
        driver_name=NVIDIA_DRIVER_NAME,
        extra_env={"DEVICE_NAMING": "nvidia"},
    ) as process:
        yield process


def device_class(api: KubeApi, driver: str) -> Iterator[str]:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    api.create(f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    })  # fmt: skip
    try:
        yield name
    finally:
        api.delete(f"{RESOURCE}/deviceclasses/{name}")


@pytest.fixture
def nvidia_class(api: KubeApi) -> Iterator[str]:
    yield from device_class(api, NVIDIA_DRIVER_NAME)


# --- helpers ------------------------------------------------------------------------------------------


def request(name: str, device_class: str, driver: str, kind: str) -> dict[str, Any]:
    selector = f'device.attributes["{driver}"].type == "{kind}"'
    return {
        "name": name,
        "exactly": {"deviceClassName": device_class, "selectors": [{"cel": {"expression": selector}}]},
    }


def create_claim(api: KubeApi, namespace: str, name: str, req: dict[str, Any]) -> None:
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [req]}},
    })  # fmt: skip


def create_template(api: KubeApi, namespace: str, name: str, req: dict[str, Any]) -> None:
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [req]}}},
    })  # fmt: skip


def container(name: str, image: str, claims: list[str], **resources: Any) -> dict[str, Any]:
    return {
        "name": name, "image": image, "imagePullPolicy": "Never",
        "resources": {"claims": [{"name": claim} for claim in claims], **resources},
    }  # fmt: skip


def run_pod(
    api: KubeApi, node: KubeletNode, namespace: str, name: str, claims: dict[str, dict[str, str]],
    containers: list[dict[str, Any]],
) -> dict[str, Any]:  # fmt: skip
    api.create(f"/api/v1/namespaces/{namespace}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"resourceClaims": [{"name": n, **source} for n, source in claims.items()],
                 "containers": containers},
    })  # fmt: skip
    return pods.wait_running(api, namespace, name, POD_TIMEOUT, node.cdi_root)


def allocation(api: KubeApi, namespace: str, claim: str, driver: str) -> tuple[str, str, str]:
    """(claim UID, pool, device) of a claim with one allocated device."""
    found = scheduling.claim(api, namespace, claim)
    ((device,),) = [scheduling.allocated_devices(found, driver)]
    (result,) = found["status"]["allocation"]["devices"]["results"]
    return found["metadata"]["uid"], result["pool"], device


Entry = tuple[str, str, str, frozenset[str]]


def answered(pod: dict[str, Any]) -> dict[str, dict[str, list[Entry]]]:
    """container → claim → [(driver, pool, device, CDI devices)], from a pod-resources answer."""
    return {
        c["name"]: {
            f"{d.get('claim_namespace')}/{d.get('claim_name')}": [
                (r.get("driver_name", ""), r.get("pool_name", ""), r.get("device_name", ""),
                 frozenset(cdi["name"] for cdi in r.get("cdi_devices", ())))
                for r in d.get("claim_resources", ())
            ]
            for d in c.get("dynamic_resources", ())
        }
        for c in pod.get("containers", ())
    }  # fmt: skip


def ours(answer: dict[str, dict[str, list[Entry]]], cdi: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """The answer with each CDI list checked and dropped: it holds the device's CDI device (`cdi`:
    claim → (its UID, that device's CDI ID)) and nothing but ours for that claim (the device
    metadata of `--device-metadata`, docs/device-metadata.md, is one more)."""
    for claims in answer.values():
        for claim, entries in claims.items():
            uid, device_id = cdi[claim]
            for *_, ids in entries:
                assert device_id in ids, (claim, ids)
                assert all(i.startswith(f"{DRIVER}/") and uid in i for i in ids), (claim, ids)
    return {
        container: {claim: [entry[:3] for entry in entries] for claim, entries in claims.items()}
        for container, claims in answer.items()
    }


def listed(node: KubeletNode, namespace: str, name: str) -> dict[str, Any]:
    (pod,) = [
        p for p in podresources.list_pods(node.root_dir) if (p["namespace"], p["name"]) == (namespace, name)
    ]
    return pod


# --- the tests ----------------------------------------------------------------------------------------


def test_pod_resources_names_our_driver_pool_and_device_for_every_kind_of_claim(
    kubelet_node: KubeletNode, api: KubeApi, test_namespace: str, plugin: PluginProcess,
    gpu_device_class: str, extended_resource_class: str,
) -> None:  # fmt: skip
    ns, image = test_namespace, kubelet_node.workload_image
    try:
        create_claim(api, ns, "shared-gpu", request("gpu", gpu_device_class, DRIVER, "gpu"))
        create_template(api, ns, "one-mig", request("mig", gpu_device_class, DRIVER, "mig"))
        claims = {
            "shared": {"resourceClaimName": "shared-gpu"},
            "mig": {"resourceClaimTemplateName": "one-mig"},
        }
        pod = run_pod(api, kubelet_node, ns, "monitored", claims, [
            container("a", image, ["shared", "mig"]),
            container("b", image, ["shared"], limits={EXTENDED_RESOURCE: 1}),
        ])  # fmt: skip
        run_pod(api, kubelet_node, ns, "also-shared", {"shared": {"resourceClaimName": "shared-gpu"}},
                [container("c", image, ["shared"])])  # fmt: skip

        names = scheduling.pod_claim_names(pod)
        extended = pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        kind = cdi_kind(DRIVER)

        cdi: dict[str, tuple[str, str]] = {}

        def entry(claim: str) -> tuple[str, list[tuple[str, str, str]]]:
            uid, pool, device = allocation(api, ns, claim, DRIVER)
            cdi[f"{ns}/{claim}"] = (uid, qualified_name(claim_device_name(uid, device), kind))
            return f"{ns}/{claim}", [(DRIVER, pool, device)]

        shared, mig, implicit = entry("shared-gpu"), entry(names["mig"]), entry(extended)
        assert shared[1][0][1] == kubelet_node.name  # the pool is the node's
        assert "-mig-" in mig[1][0][2] and shared[1][0][2] != implicit[1][0][2], (mig, shared, implicit)
        expected = {"a": dict([shared, mig]), "b": dict([shared, implicit])}
        assert ours(answered(listed(kubelet_node, ns, "monitored")), cdi) == expected
        assert ours(answered(podresources.get_pod(kubelet_node.root_dir, ns, "monitored")), cdi) == expected
        assert ours(answered(listed(kubelet_node, ns, "also-shared")), cdi) == {"c": dict([shared])}
    finally:
        release_namespace(api, plugin, ns, POD_TIMEOUT)


def test_dcgm_maps_the_nvidia_named_devices_of_a_pod_to_their_gpus(
    kubelet_node: KubeletNode,
    api: KubeApi,
    test_namespace: str,
    nvidia_plugin: PluginProcess,
    nvidia_class: str,
) -> None:
    ns, image = test_namespace, kubelet_node.workload_image
    try:
        create_template(api, ns, "one-gpu", request("gpu", nvidia_class, NVIDIA_DRIVER_NAME, "gpu"))
        create_template(api, ns, "one-mig", request("mig", nvidia_class, NVIDIA_DRIVER_NAME, "mig"))
        claims = {
            "gpu": {"resourceClaimTemplateName": "one-gpu"},
            "mig": {"resourceClaimTemplateName": "one-mig"},
        }
        pod = run_pod(api, kubelet_node, ns, "dcgm", claims, [container("app", image, ["gpu", "mig"])])
        names = scheduling.pod_claim_names(pod)
        slices = node_slices(api.api_client, kubelet_node.name, NVIDIA_DRIVER_NAME)
        by_name = {d["name"]: d["attributes"] for s in slices for d in s["spec"].get("devices", ())}

        _, pool, gpu = allocation(api, ns, names["gpu"], NVIDIA_DRIVER_NAME)
        _, _, mig = allocation(api, ns, names["mig"], NVIDIA_DRIVER_NAME)
        found = dcgm_view.attribute([listed(kubelet_node, ns, "dcgm")], dcgm_view.device_index(slices))
        assert sorted((a.container, a.claim, a.pool, a.device, a.gpu) for a in found) == sorted([
            ("app", names["gpu"], pool, gpu, dcgm_view.GpuOf(by_name[gpu]["uuid"]["string"])),
            ("app", names["mig"], pool, mig, dcgm_view.GpuOf(
                by_name[mig]["parentUUID"]["string"], mig_uuid=by_name[mig]["uuid"]["string"],
                profile=by_name[mig]["profile"]["string"])),
        ])  # fmt: skip
    finally:
        release_namespace(api, nvidia_plugin, ns, POD_TIMEOUT)


def test_a_second_plugin_as_gpu_nvidia_com_on_the_node_refuses_to_start(
    kubelet_node: KubeletNode,
    api: KubeApi,
    nvidia_plugin: PluginProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    second = PluginProcess(
        kubeconfig=nvidia_plugin.kubeconfig, node_name=kubelet_node.name,
        kubelet_root_dir=kubelet_node.root_dir, cdi_root=kubelet_node.cdi_root,
        state_dir=tmp_path_factory.mktemp("second"),
        driver_name=NVIDIA_DRIVER_NAME, extra_env={"DEVICE_NAMING": "nvidia"},
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="plugin exited with 1"):
        second.start()
    assert "NVIDIA's DRA driver runs on this node" in second.log_text(), second.log_tail()
    assert nvidia_plugin.running  # the first one is left serving

    def refused() -> list[dict[str, Any]] | None:
        events = api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
        return [
            e for e in events if e["reason"] == REFUSED_REASON and e["regarding"]["name"] == kubelet_node.name
        ] or None

    (event, *_) = wait_for("the refusal's Node Event", refused, timeout=30.0)
    assert "gpu.nvidia.com-reg.sock" in event["note"], event
