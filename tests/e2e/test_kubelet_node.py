"""Real kubelets: on containerd with runc (pods really run) and on the recording fake CRI.

On containerd, the API server reaches the kubelet (serving certificate from
the cluster CA, the API server's client certificate, RBAC), so logs, exec and
port-forward work as `kubectl logs/exec/port-forward` would use them.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.stream import portforward

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode, node_is_ready
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.e2e import inside

pytestmark = pytest.mark.kubelet

POD_TIMEOUT = 90.0


def workload_pod(name: str, node: KubeletNode, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node.name},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": node.workload_image, "imagePullPolicy": "Never", **container}
            ],
        },
    }


def test_kubelet_registers_ready_node_on_containerd(
    kube_cluster: ControlPlane, kubelet_node: KubeletNode
) -> None:
    with kube_cluster.api_client() as api:
        node = KubeApi(api).get(f"/api/v1/nodes/{kubelet_node.name}")
    assert node_is_ready(node)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == kube_cluster.kubernetes_version
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    # The API server reaches the kubelet on loopback, and nothing keeps pods off the node.
    assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
    assert not node["spec"].get("taints")
    # The kubelet watches this directory for plugin registration sockets.
    assert (kubelet_node.root_dir / "plugins_registry").is_dir()


def test_pod_runs_in_a_real_container_with_logs_and_exec_through_the_api_server(
    api: KubeApi, kubelet_node: KubeletNode, test_namespace: str
) -> None:
    pod = workload_pod("report", kubelet_node, env=[{"name": "GREETING", "value": "hello"}])
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod)
    running = pods.wait_running(api, test_namespace, "report", POD_TIMEOUT)
    assert running["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    # The image's own report, from the container's log (`kubectl logs`).
    log = wait_for("the report", lambda: pods.workload_report(api, test_namespace, "report", "main"), 30)
    assert inside.log_env(log)["GREETING"] == "hello"
    assert "== mounts\noverlay / overlay" in log  # the rootfs is containerd's overlay snapshot
    # `kubectl exec`: a process in the container's namespaces (its hostname is the pod's name).
    code, out, err = pods.exec_in(api, test_namespace, "report", "main", ["sh", "-c", "hostname; exit 3"])
    assert (code, out.strip()) == (3, "report"), err


def test_port_forward_reaches_a_port_inside_the_pod(
    api: KubeApi, kubelet_node: KubeletNode, test_namespace: str
) -> None:
    """`kubectl port-forward`: API server -> kubelet -> containerd, into the pod's network namespace
    (whose address the host has no route to)."""
    serve = "mkdir -p /www && echo forwarded > /www/index.html && exec httpd -f -p 8080 -h /www"
    api.create(
        f"/api/v1/namespaces/{test_namespace}/pods",
        workload_pod("web", kubelet_node, command=["sh", "-c", serve]),
    )
    pods.wait_running(api, test_namespace, "web", POD_TIMEOUT)
    core = k8s.CoreV1Api(api.api_client)

    def fetch() -> str | None:
        forward = portforward(
            core.connect_get_namespaced_pod_portforward, "web", test_namespace, ports="8080"
        )
        sock = forward.socket(8080)
        try:
            sock.settimeout(10)
            sock.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        except OSError:
            return None  # httpd not listening yet
        finally:
            sock.close()
            forward.close()
        return answer.decode(errors="replace") or None

    answer = wait_for("an answer through port-forward", fetch, 30, interval=0.5)
    assert answer.startswith("HTTP/1.") and answer.rstrip().endswith("forwarded"), answer


def test_an_image_that_is_not_imported_fails_at_once(
    api: KubeApi, kubelet_node: KubeletNode, test_namespace: str
) -> None:
    pod = workload_pod("missing-image", kubelet_node)
    pod["spec"]["containers"][0]["image"] = "localhost/draplugin-not-imported:1"
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod)
    started = time.monotonic()
    with pytest.raises(pods.ContainerFailed, match="ErrImageNeverPull"):
        pods.wait_running(api, test_namespace, "missing-image", POD_TIMEOUT)
    assert time.monotonic() - started < 30  # reported, not waited out


def test_kubectl_logs_and_exec_against_the_local_cluster(
    kube_cluster: ControlPlane, api: KubeApi, kubelet_node: KubeletNode, test_namespace: str
) -> None:
    """The commands a user types, with the cluster's kubeconfig (kubectl built by tests/cluster/build.sh)."""
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", workload_pod("for-kubectl", kubelet_node))
    pods.wait_running(api, test_namespace, "for-kubectl", POD_TIMEOUT)
    wait_for("the report", lambda: pods.workload_report(api, test_namespace, "for-kubectl", "main"), 30)
    kubectl = [str(kube_cluster.bin_dir / "kubectl"), "--kubeconfig", str(kube_cluster.kubeconfig)]
    kubectl += ["--namespace", test_namespace]
    logs = subprocess.run([*kubectl, "logs", "for-kubectl"], capture_output=True, text=True, timeout=60)
    assert logs.returncode == 0 and "== dev" in logs.stdout, logs.stderr
    exec_ = subprocess.run(
        [*kubectl, "exec", "for-kubectl", "--", "cat", "/etc/hostname"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (exec_.returncode, exec_.stdout.strip()) == (0, "for-kubectl"), exec_.stderr


def test_fakecri_kubelet_runs_pod_on_fake_runtime(
    kube_cluster: ControlPlane, fakecri_node: KubeletNode, test_namespace: str
) -> None:
    pods = f"/api/v1/namespaces/{test_namespace}/pods"
    with kube_cluster.api_client() as client:
        rest = KubeApi(client)
        node = rest.get(f"/api/v1/nodes/{fakecri_node.name}")
        assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("fakeRuntime://")
        rest.create(pods, {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "no-claims"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": fakecri_node.name},
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

        pod = wait_for("the pod to be Running on the fake-CRI node", running, POD_TIMEOUT)

    assert pod["spec"]["nodeName"] == fakecri_node.name
    records = [
        r for r in fakecri_node.container_records()
        if r["podNamespace"] == test_namespace and r["podName"] == "no-claims"
    ]  # fmt: skip
    assert len(records) == 1, fakecri_node.container_records()
    assert records[0]["containerName"] == "main"
    assert records[0]["podUID"] == pod["metadata"]["uid"]
    assert records[0]["env"]["GREETING"] == "hello"
    assert records[0]["cdiDevices"] == []
