"""`dra-controller top` against the real API server: it finds the kubelet plugin pods by label and
reads each through the API server's pod proxy; a pod the proxy cannot reach is named with the
server's own reason while `--endpoint` URLs are still shown.

The plugin pods here are objects whose status says Running at a loopback address (no kubelet
runs them), so the proxy request really reaches the API server's pod proxy, which refuses
loopback pod addresses: the same answer `make cluster` gets, and why it prints `--endpoint`.
"""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import KubeApi
from tests.unit.test_top import NODE_A

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
PLUGIN_LABELS = {"app.kubernetes.io/name": "draplugin", "app.kubernetes.io/component": "kubelet-plugin"}


def plugin_pod(name: str, node: str, *, args: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": PLUGIN_LABELS},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "plugin", "image": "localhost/draplugin:test", "args": args}],
        },
    }


@pytest.fixture
def api(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


@pytest.fixture
def plugin_pods(api: KubeApi, test_namespace: str) -> list[str]:
    """Two plugin pods that say they run (at 127.0.0.1) and one that is still Pending."""
    path = f"/api/v1/namespaces/{test_namespace}/pods"
    for name, node, running in (
        ("plugin-a", "node-a", True),
        ("plugin-b", "node-b", True),
        ("plugin-c", "node-c", False),
    ):
        api.create(path, plugin_pod(name, node, args=["--metrics-port=9400"]))
        if running:
            status = {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
            api.patch_status(f"{path}/{name}", {"status": status})
    return ["plugin-a", "plugin-b"]


@pytest.fixture
def served_endpoint() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(NODE_A.encode())

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    server.server_close()


def top(kube_cluster: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", "top", "--kubeconfig", str(kube_cluster.kubeconfig), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_top_reads_the_plugin_pods_through_the_pod_proxy_and_names_each_it_cannot_reach(
    kube_cluster: ControlPlane, test_namespace: str, plugin_pods: list[str], served_endpoint: str
) -> None:
    run = top(kube_cluster, "--plugin-namespace", test_namespace, "--endpoint", served_endpoint, "-o", "json")
    assert run.returncode == 1, run.stdout + run.stderr
    data = json.loads(run.stdout)
    # The --endpoint URL is shown although both pods fail.
    assert {d["claim"] for d in data["devices"]} == {"train", "notebook"}
    errors = {e["endpoint"]: e["error"] for e in data["errors"]}
    assert set(errors) == {
        f"pod {test_namespace}/plugin-a (node node-a, port 9400)",
        f"pod {test_namespace}/plugin-b (node node-b, port 9400)",
    }
    for error in errors.values():
        # The API server's own answer from its pod proxy: it will not proxy to a loopback address.
        assert "through the API server's pod proxy: HTTP " in error, error
        assert "address not allowed" in error, error
    assert f"note: skipped pod {test_namespace}/plugin-c: Pending" in run.stderr
    for pod in plugin_pods:
        assert f"error: cannot read pod {test_namespace}/{pod}" in run.stderr


def test_top_on_one_node_reads_only_that_nodes_plugin(
    kube_cluster: ControlPlane, test_namespace: str, plugin_pods: list[str]
) -> None:
    run = top(kube_cluster, "--plugin-namespace", test_namespace, "--node", "node-b", "-o", "json")
    assert run.returncode == 1
    assert [e["endpoint"] for e in json.loads(run.stdout)["errors"]] == [
        f"pod {test_namespace}/plugin-b (node node-b, port 9400)"
    ]


def test_top_without_plugin_pods_says_which_labels_it_looked_for(
    kube_cluster: ControlPlane, test_namespace: str
) -> None:
    run = top(kube_cluster, "--plugin-namespace", test_namespace)
    assert run.returncode == 1
    assert (
        f"no running kubelet plugin pod with labels app.kubernetes.io/component=kubelet-plugin in namespace "
        f"{test_namespace} serves metrics" in run.stderr
    )
