"""A node that offers `nvidia.com/gpu` both ways: through a device plugin and through DRA.

A fake device plugin (tests/fakedeviceplugin.py, kubelet device plugin API
v1beta1, serving `nvidia-gpu.sock` as NVIDIA's does) registers two devices of
its own with the node's kubelet, so the Node advertises `nvidia.com/gpu: 2` in
its allocatable; on the same node our plugin
publishes its fake GPUs, and the example's DeviceClass maps `nvidia.com/gpu` to
them (`extendedResourceName`). The node plugin's guard against two allocators
on one GPU is set to `--device-plugin-coexistence=split:0,1,2,3`
(`DEVICE_PLUGIN_COEXISTENCE`): the device plugin's devices and ours are
different ones here, so every GPU of ours is published, untainted.

What kube-scheduler then does (pkg/scheduler/framework/plugins/noderesources
and dynamicresources, 1.34.4 and 1.37.2): on a node whose allocatable has the
resource, the device plugin serves it and DRA is not asked, not even for the
part the device plugin cannot give; the kubelet hands the device plugin's
devices to the container (Allocate). The releases differ when the device plugin
has no healthy device (allocatable 0, capacity 2): 1.37 takes "allocatable > 0"
as the sign of a device plugin and serves the pod through DRA; 1.34 takes the
resource's presence in allocatable, so the pod stays Pending there.

The node is a kubelet of its own for this module (containerd + runc), started
with a private device plugin directory (devcluster.kubelet,
`private_device_plugin_dir`): the kubelet's directory is a machine-wide
constant, and its checkpoint would give every kubelet started later on this
machine an `nvidia.com/gpu` resource. The Node is deleted when the module ends.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KUBELET_DEVICE_PLUGIN_DIR, KubeletNode
from devcluster.plugin import PluginProcess, node_slices
from devcluster.procs import ComponentError
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin.devices.deviceplugin_guard import DETECTED_REASON
from tests.e2e import inside, scheduling
from tests.e2e.cleanup import prepared_claims, release_namespace
from tests.e2e.plugin import running_plugin
from tests.fakedeviceplugin import DEVICES_ENV, ENDPOINT, DevicePluginProcess, running_device_plugin

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
EXTENDED_RESOURCE = "nvidia.com/gpu"
DEVICE_PLUGIN_DEVICES = ("dp-gpu-0", "dp-gpu-1")
# The guard's setting (draplugin/devices/deviceplugin_guard.py): publish every GPU of the fake
# inventory (indexes 0-3), untainted, beside the device plugin's own devices.
COEXISTENCE = {"DEVICE_PLUGIN_COEXISTENCE": "split:0,1,2,3"}
WHOLE_GPUS = {"gpu-0", "gpu-1", "gpu-2"}  # examples/fake-gpus.yaml: gpu-3 is split into MIG devices
POD_TIMEOUT = 120.0
NODE_TIMEOUT = 60.0


# --- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dp_node(kube_cluster: ControlPlane) -> Iterator[KubeletNode]:
    # A short root: unix socket paths are limited to 107 bytes.
    node = KubeletNode(
        kube_cluster, Path(tempfile.mkdtemp(prefix="dra-dp-")), name="dp-node", private_device_plugin_dir=True
    )
    try:
        node.start()
    except ComponentError as err:
        node.stop()
        pytest.fail(f"cannot start the device plugin node: {err}", pytrace=False)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture(scope="module")
def device_plugin(
    dp_node: KubeletNode, api: KubeApi, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevicePluginProcess]:
    """The fake device plugin, registered: the Node advertises its two devices."""
    assert dp_node.device_plugin_dir is not None
    with running_device_plugin(
        dp_node.device_plugin_dir, DEVICE_PLUGIN_DEVICES, tmp_path_factory.mktemp("device-plugin")
    ) as process:
        wait_advertised(api, dp_node.name, process, allocatable="2")
        yield process


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    dp_node: KubeletNode,
    device_plugin: DevicePluginProcess,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    """Our plugin on the node, started after the device plugin (its guard sees it from the start)."""
    assert dp_node.device_plugin_dir is not None
    settings = {**COEXISTENCE, "DEVICE_PLUGIN_DIR": str(dp_node.device_plugin_dir)}
    with running_plugin(
        kube_cluster, dp_node, api, tmp_path_factory.mktemp("plugin"),
        delete_slices_on_shutdown=True, extra_env=settings,
    ) as process:  # fmt: skip
        yield process


@pytest.fixture
def namespace(
    test_namespace: str, api: KubeApi, plugin: PluginProcess, extended_resource_class: str
) -> Iterator[str]:
    yield test_namespace
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- helpers ------------------------------------------------------------------------------------------


def wait_advertised(api: KubeApi, node: str, device_plugin: DevicePluginProcess, *, allocatable: str) -> None:
    """Wait until the Node's status has the device plugin's resource with this allocatable count."""

    def advertised() -> bool:
        if device_plugin.process.poll() is not None:
            raise AssertionError(f"the fake device plugin exited:\n{device_plugin.log_tail()}")
        status = api.get(f"/api/v1/nodes/{node}")["status"]
        return bool(
            status.get("allocatable", {}).get(EXTENDED_RESOURCE) == allocatable
            and status.get("capacity", {}).get(EXTENDED_RESOURCE) == str(len(DEVICE_PLUGIN_DEVICES))
        )

    wait_for(
        f"node {node} to advertise {EXTENDED_RESOURCE} allocatable={allocatable}", advertised, NODE_TIMEOUT
    )


def extended_pod(name: str, node: KubeletNode, count: int) -> dict[str, Any]:
    """A device-plugin-era pod for the node: `limits: {nvidia.com/gpu: count}`, no claim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            # The node's kubelet mounts in a namespace of its own (module docstring): no projected token.
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "cuda", "image": node.workload_image, "imagePullPolicy": "Never",
                "resources": {"limits": {EXTENDED_RESOURCE: count}},
            }],
        },
    }  # fmt: skip


def published_gpus(api: KubeApi, node: str) -> dict[str, list[Any]]:
    """Our whole GPUs as published for the node, each with its device taints."""
    return {
        d["name"]: d.get("taints") or []
        for s in node_slices(api.api_client, node, DRIVER)
        for d in s["spec"].get("devices", [])
        if d["attributes"].get("type", {}).get("string") == "gpu"
    }


def claims_in(api: KubeApi, namespace: str) -> list[str]:
    items = api.get(f"{scheduling.RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]
    return [c["metadata"]["name"] for c in items]


# --- the tests ----------------------------------------------------------------------------------------


def test_the_scheduler_prefers_the_device_plugin_on_a_node_that_advertises_the_resource(
    dp_node: KubeletNode,
    api: KubeApi,
    namespace: str,
    device_plugin: DevicePluginProcess,
    plugin: PluginProcess,
) -> None:
    # Our plugin saw the device plugin (its guard's Event on the Node) and, as set, still publishes
    # every GPU untainted: DRA could serve the pod, and the class maps the resource.
    on_node = f"involvedObject.kind=Node,involvedObject.name={dp_node.name}"
    query = {"fieldSelector": f"{on_node},reason={DETECTED_REASON}"}
    wait_for("the guard's Event on the Node", lambda: api.get("/api/v1/events", query)["items"], NODE_TIMEOUT)
    gpus = published_gpus(api, dp_node.name)
    assert gpus == {name: [] for name in sorted(WHOLE_GPUS)}, (gpus, plugin.log_tail())
    before = len(device_plugin.allocations())
    api.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod("one-gpu", dp_node, 1))
    pod = pods.wait_running(api, namespace, "one-gpu", POD_TIMEOUT, dp_node.cdi_root)

    # No implicit claim: the scheduler left the resource to the device plugin ...
    assert not pod["status"].get("extendedResourceClaimStatus"), pod["status"]
    assert claims_in(api, namespace) == []
    assert prepared_claims(plugin, namespace) == []
    # ... and the kubelet (this node's, alone: the machine-wide directory never saw the plugin's socket)
    # asked the device plugin for one of its devices, which the container got.
    assert not (KUBELET_DEVICE_PLUGIN_DIR / ENDPOINT).exists()
    (allocated,) = device_plugin.allocations()[before:]
    assert len(allocated) == 1 and allocated[0] in DEVICE_PLUGIN_DEVICES, allocated
    env = inside.log_env(pods.container_log(api, namespace, "one-gpu", "cuda"))
    assert env.get(DEVICES_ENV) == allocated[0], env
    assert not [k for k in env if k.startswith("DRAPLUGIN_DEVICE_")], env


def test_a_pod_asking_more_than_the_device_plugin_has_is_not_topped_up_through_dra(
    dp_node: KubeletNode,
    api: KubeApi,
    namespace: str,
    device_plugin: DevicePluginProcess,
    plugin: PluginProcess,
) -> None:
    """Three GPUs: the device plugin has two and DRA three free, yet the pod does not fit."""
    api.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod("three-gpus", dp_node, 3))
    message = scheduling.wait_unschedulable(api, namespace, "three-gpus", POD_TIMEOUT)
    assert f"Insufficient {EXTENDED_RESOURCE}" in message, message
    assert claims_in(api, namespace) == []


@pytest.fixture
def unhealthy_device_plugin(
    dp_node: KubeletNode, api: KubeApi, device_plugin: DevicePluginProcess
) -> Iterator[DevicePluginProcess]:
    """Every device of the device plugin Unhealthy: allocatable 0, capacity 2; healthy again after."""
    device_plugin.set_unhealthy(["*"])
    wait_advertised(api, dp_node.name, device_plugin, allocatable="0")
    yield device_plugin
    device_plugin.set_unhealthy([])
    wait_advertised(api, dp_node.name, device_plugin, allocatable="2")


def test_with_no_healthy_device_plugin_gpu_137_uses_dra_and_134_waits(
    kube_cluster: ControlPlane,
    dp_node: KubeletNode,
    api: KubeApi,
    namespace: str,
    unhealthy_device_plugin: DevicePluginProcess,
    plugin: PluginProcess,
) -> None:
    before = len(unhealthy_device_plugin.allocations())
    api.create(f"/api/v1/namespaces/{namespace}/pods", extended_pod("fallback", dp_node, 1))
    minor = int(kube_cluster.kubernetes_version.removeprefix("v").split(".")[1])
    if minor <= 34:
        # 1.34: the resource is in the Node's allocatable (at 0), so it is the device plugin's.
        message = scheduling.wait_unschedulable(api, namespace, "fallback", POD_TIMEOUT)
        assert f"Insufficient {EXTENDED_RESOURCE}" in message, message
        assert claims_in(api, namespace) == []
        return
    # 1.37 (read at 1.37.2): allocatable 0 is no device plugin; the scheduler writes the implicit claim.
    pod = pods.wait_running(api, namespace, "fallback", POD_TIMEOUT, dp_node.cdi_root)
    status = pod["status"]["extendedResourceClaimStatus"]
    claim = scheduling.claim(api, namespace, status["resourceClaimName"])
    (device,) = scheduling.allocated_devices(claim, DRIVER)
    assert device in WHOLE_GPUS
    assert claim["metadata"]["uid"] in " ".join(prepared_claims(plugin, namespace))
    env = inside.container_got(api, namespace, "fallback", "cuda", [device])
    assert DEVICES_ENV not in env, env
    assert unhealthy_device_plugin.allocations()[before:] == []  # the kubelet did not ask the device plugin
