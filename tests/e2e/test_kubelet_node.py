"""A real kubelet registers on the recording fake CRI and runs a pod."""

from __future__ import annotations

from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode, node_is_ready
from devcluster.rest import KubeJSON
from devcluster.wait import wait_for

pytestmark = pytest.mark.kubelet


def test_kubelet_registers_ready_node(kube_cluster: ControlPlane, kubelet_node: KubeletNode) -> None:
    with kube_cluster.api_client() as api:
        node = KubeJSON(api).get(f"/api/v1/nodes/{kubelet_node.name}")
    assert node_is_ready(node)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kube_cluster.kubernetes_version
    assert info["containerRuntimeVersion"].startswith("fakeRuntime://")
    # The kubelet watches this directory for plugin registration sockets.
    assert (kubelet_node.root_dir / "plugins_registry").is_dir()


def test_kubelet_runs_pod_on_fake_runtime(
    kube_cluster: ControlPlane, kubelet_node: KubeletNode, test_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{test_namespace}/pods"
    with kube_cluster.api_client() as api:
        rest = KubeJSON(api)
        rest.create(pods, {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "no-claims"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": kubelet_node.name},
                "automountServiceAccountToken": False,
                "containers": [{
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "env": [{"name": "GREETING", "value": "hello"}],
                }],
            },
        })  # fmt: skip

        def running() -> dict[str, Any] | None:
            pod = rest.get(f"{pods}/no-claims")
            return pod if pod["status"].get("phase") == "Running" else None

        pod = wait_for("the pod to be Running on the kubelet node", running, 90)

    assert pod["spec"]["nodeName"] == kubelet_node.name
    records = [
        r for r in kubelet_node.container_records()
        if r["podNamespace"] == test_namespace and r["podName"] == "no-claims"
    ]  # fmt: skip
    assert len(records) == 1, kubelet_node.container_records()
    assert records[0]["containerName"] == "main"
    assert records[0]["podUID"] == pod["metadata"]["uid"]
    assert records[0]["env"]["GREETING"] == "hello"
    assert records[0]["cdiDevices"] == []
