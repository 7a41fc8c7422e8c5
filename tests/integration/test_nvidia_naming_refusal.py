"""`draplugin run --device-naming=nvidia` refuses a node where NVIDIA's DRA driver already publishes.

On the real API server: a ResourceSlice of `gpu.nvidia.com` for the node, named as the kubelet
plugin helper NVIDIA's driver uses names its slices (`<index>-<driver>-<node>-` plus the API
server's random suffix: dynamic-resource-allocation v0.37.2 resourceslicecontroller.go), makes the
plugin exit 1 before it publishes anything, with a Warning Event on the Node; NVIDIA's slice is
left as it was. A node with only slices of ours starts normally. No kubelet is needed: the plugin
stops before it registers.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.plugin import PluginProcess, delete_node_slices, node_slices
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.nvidiadriver import REASON

pytestmark = pytest.mark.cluster

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture
def api(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kubelet-"))
    yield path
    shutil.rmtree(path)


def nvidia_plugin(kube_cluster: ControlPlane, node: str, root: Path, state: Path) -> PluginProcess:
    return PluginProcess(
        kubeconfig=kube_cluster.kubeconfig, node_name=node, kubelet_root_dir=root, cdi_root=state / "cdi",
        state_dir=state, driver_name=NVIDIA_DRIVER_NAME, extra_env={"DEVICE_NAMING": "nvidia"},
        delete_slices_on_shutdown=True,
    )  # fmt: skip


def test_a_slice_of_nvidias_driver_on_the_node_stops_the_plugin_and_stays(
    kube_cluster: ControlPlane, api: KubeApi, fake_node: Any, kubelet_root: Path, tmp_path: Path
) -> None:
    node = fake_node()
    uid = api.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
    theirs = api.create(SLICES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"generateName": f"0-{NVIDIA_DRIVER_NAME}-{node}-",
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid,
                                          "controller": True}]},
        "spec": {"driver": NVIDIA_DRIVER_NAME, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]},
    })  # fmt: skip
    plugin = nvidia_plugin(kube_cluster, node, kubelet_root, tmp_path)
    with pytest.raises(RuntimeError, match="plugin exited with 1"):
        plugin.start()
    assert theirs["metadata"]["name"] in plugin.log_text(), plugin.log_tail()
    assert [s["metadata"]["name"] for s in node_slices(api.api_client, node, NVIDIA_DRIVER_NAME)] == [
        theirs["metadata"]["name"]
    ]

    def refused() -> list[dict[str, Any]] | None:
        events = api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
        return [e for e in events if e["reason"] == REASON and e["regarding"]["name"] == node] or None

    (event, *_) = wait_for("the refusal's Node Event", refused, timeout=30.0)
    assert event["type"] == "Warning" and theirs["metadata"]["name"] in event["note"], event


def test_our_own_slices_left_by_a_restart_are_no_sign(
    kube_cluster: ControlPlane, api: KubeApi, fake_node: Any, kubelet_root: Path, tmp_path: Path
) -> None:
    """A plugin that stops keeps its slices (the default); started again, it is not refused for them."""
    node = fake_node()
    plugin = nvidia_plugin(kube_cluster, node, kubelet_root, tmp_path)
    plugin.delete_slices_on_shutdown = False
    try:
        plugin.start()
        published = wait_for(
            "our slices", lambda: node_slices(api.api_client, node, NVIDIA_DRIVER_NAME) or None, timeout=60.0
        )
        assert {s["metadata"]["name"] for s in published} == {f"{node}-{NVIDIA_DRIVER_NAME}-0"}
        plugin.stop()
        plugin.start()  # raises if it exits
        assert plugin.running and "NVIDIA's DRA driver runs" not in plugin.log_text()
    finally:
        plugin.stop()
        delete_node_slices(api.api_client, node, NVIDIA_DRIVER_NAME)
