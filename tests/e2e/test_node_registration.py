"""`draplugin run` alone makes a node usable: it registers with the real kubelet, publishes the
node's ResourceSlices itself, streams device health in the kubelet's preferred version, and a
pod claiming one GPU runs with our CDI device.

Nothing in this process publishes slices or prepares claims: the scheduler
allocates from what the daemon published, and the kubelet prepares through
the daemon's socket. The daemon runs with a pod UID, as the chart runs it,
so prepare and unprepare also go through the cross-process call lock.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from dracommon.kubeversion import server_version
from draplugin.kubelet.sockets import socket_paths
from tests.e2e import inside
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    metrics_port: int
    pod_uid: str

    @property
    def log_path(self) -> Path:
        return self.state_dir / "plugin.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text: str = response.read().decode()
            return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def daemon(kube_cluster: ControlPlane, kubelet_node: KubeletNode) -> Iterator[Daemon]:
    state_dir = Path(tempfile.mkdtemp(prefix="nd-e2e-"))
    port = free_port()
    pod_uid = f"e2e-{uuid.uuid4().hex[:12]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAPLUGIN_")}
    with (state_dir / "plugin.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "draplugin.cli", "run", "--backend", "fake", "--fake-gpus", "2"),
                *("--node-name", kubelet_node.name, "--kubeconfig", str(kube_cluster.kubeconfig)),
                *("--kubelet-root-dir", str(kubelet_node.root_dir), "--cdi-root", str(kubelet_node.cdi_root)),
                *("--state-dir", str(state_dir), "--metrics-port", str(port), "--pod-uid", pod_uid),
                *("--log-format", "json", "--delete-slices-on-shutdown"),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = Daemon(proc, state_dir, port, pod_uid)
    try:
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(state_dir, ignore_errors=True)


def node_slices(api: KubeApi, node: str) -> list[dict[str, Any]]:
    selector = f"spec.nodeName={node},spec.driver={DRIVER}"
    found = api.get(f"{RESOURCE}/resourceslices", query={"fieldSelector": selector})
    items: list[dict[str, Any]] = found["items"]
    return items


def health_streams(daemon: Daemon, version: str) -> float:
    """How many device health streams of this DRAResourceHealth version the kubelet opened."""
    prefix = f'draplugin_kubelet_health_streams_total{{version="{version}"}} '
    lines = [line for line in daemon.metrics().splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


def registered(daemon: Daemon) -> bool:
    assert daemon.proc.poll() is None, daemon.log_text()
    return 'draplugin_kubelet_registration_notifications_total{registered="true"} 1.0' in daemon.metrics()


def test_daemon_registers_publishes_and_runs_a_pod_with_our_cdi_device(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    daemon: Daemon,
    gpu_device_class: str,
    test_namespace: str,
) -> None:
    paths = socket_paths(kubelet_node.root_dir, DRIVER, daemon.pod_uid)
    # The real kubelet found our socket in its plugins_registry and accepted the registration.
    wait_for("the kubelet to register the plugin", lambda: registered(daemon), 60)
    assert paths.registration.parent == kubelet_node.plugins_registry and paths.registration.is_socket()
    assert "kubelet registered the plugin" in daemon.log_text()
    kubelet_log = (kube_cluster.logs / f"kubelet-{kubelet_node.name}.log").read_text(errors="replace")
    # The kubelet's DRA manager dialed the endpoint we reported at registration.
    marker = f'endpoint="{paths.dra}" connected=true'
    connected = [line for line in kubelet_log.splitlines() if marker in line]
    assert connected and f'driverName="{DRIVER}"' in connected[0]

    with kube_cluster.api_client() as client:
        api = KubeApi(client)
        node_uid = api.get(f"/api/v1/nodes/{kubelet_node.name}")["metadata"]["uid"]
        # The kubelet opened the device health stream in the newest version both sides know:
        # v1 from 1.37 on; v1alpha1 before (1.34 with ResourceHealthStatus on, as devcluster sets it).
        _, minor = server_version(api)
        chosen, other = ("v1", "v1alpha1") if minor >= 37 else ("v1alpha1", "v1")
        wait_for(
            f"the kubelet to open the {chosen} health stream", lambda: health_streams(daemon, chosen), 60
        )
        assert health_streams(daemon, other) == 0, daemon.metrics()

        def two_devices() -> list[dict[str, Any]] | None:
            slices = node_slices(api, kubelet_node.name)
            devices = [d for s in slices for d in s["spec"].get("devices", [])]
            return slices if [d["name"] for d in devices] == ["gpu-0", "gpu-1"] else None

        (published,) = wait_for("the daemon's ResourceSlice for the kubelet node", two_devices, 60)
        assert published["metadata"]["ownerReferences"][0]["uid"] == node_uid

        ns = test_namespace
        api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": gpu_device_class}},
            ]}}},
        })  # fmt: skip
        # The image's entrypoint prints the environment and /dev it got to its log.
        pod = claim_pod(
            "one-gpu",
            kubelet_node.workload_image,
            {"resourceClaimTemplateName": "one-gpu"},
            containers=("main",),
            nodeSelector={"kubernetes.io/hostname": kubelet_node.name},
            automountServiceAccountToken=False,
            terminationGracePeriodSeconds=0,
        )
        api.create(f"/api/v1/namespaces/{ns}/pods", pod)

        pod = pods.wait_running(api, ns, "one-gpu", POD_TIMEOUT, kubelet_node.cdi_root)
        assert daemon.proc.poll() is None, daemon.log_text()
        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim_name}")
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRIVER, kubelet_node.name)
        # containerd injected the claim's CDI device: its variables and its device node.
        log = wait_for("the container's report", lambda: pods.workload_report(api, ns, "one-gpu", "main"), 30)
        key = result["device"].upper().replace("-", "_")
        assert inside.log_env(log)[f"DRAPLUGIN_DEVICE_{key}_NAME"] == result["device"]
        index = inside.log_env(log)[f"DRAPLUGIN_DEVICE_{key}_INDEX"]
        assert re.search(rf"^c.* 1, +3 .* nvidia{index}$", log, re.MULTILINE), log
        # status.devices (--device-status=auto): the GPU's UUID on 1.36+, nothing on 1.34/1.35.
        claim_url = f"{RESOURCE}/namespaces/{ns}/resourceclaims/{claim_name}"
        uuids = {d["name"]: d["attributes"]["uuid"]["string"] for d in published["spec"]["devices"]}
        if minor >= 36:

            def device_status() -> list[dict[str, Any]] | None:
                found: list[dict[str, Any]] | None = api.get(claim_url).get("status", {}).get("devices")
                return found

            (entry,) = wait_for("the plugin to write status.devices", device_status, 30)
            assert (entry["driver"], entry["device"]) == (DRIVER, result["device"])
            assert entry["data"]["uuid"] == uuids[result["device"]]
        else:
            assert "devices" not in claim["status"]
        # The claim went through our prepare driver and its checkpoint.
        checkpoint = json.loads((daemon.state_dir / "checkpoint.json").read_text())
        assert [c["uid"] for c in checkpoint["claims"]] == [claim["metadata"]["uid"]]

        api.delete(f"/api/v1/namespaces/{ns}/pods/one-gpu")

        def unprepared() -> bool:
            claims: list[Any] = json.loads((daemon.state_dir / "checkpoint.json").read_text())["claims"]
            return claims == []

        wait_for("the kubelet to unprepare the claim", unprepared, POD_TIMEOUT, interval=0.5)

        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=STOP_TIMEOUT) == 0, daemon.log_text()
        assert not paths.registration.exists() and not paths.dra.exists()
        assert node_slices(api, kubelet_node.name) == []
