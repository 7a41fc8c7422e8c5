"""`draplugin run --backend fake` as a real process against the real API server.

It publishes the fake GPUs in a ResourceSlice the API server accepts, owned
by the Node; an injected fault taints that device; SIGTERM stops it cleanly
and, with --delete-slices-on-shutdown, takes the slices away.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
STOP_TIMEOUT = 20.0


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    root: Path
    log_path: Path

    @property
    def fault_file(self) -> Path:
        return self.root / "state" / "fake-faults.yaml"

    def log_lines(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=STOP_TIMEOUT)


def _start(cluster: ControlPlane, node: str, *extra: str) -> Daemon:
    root = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))  # short: 107-byte socket path limit
    log_path = root / "plugin.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAPLUGIN_")}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "draplugin.cli", "run", "--backend", "fake", "--fake-gpus", "4"),
                *("--node-name", node, "--kubeconfig", str(cluster.kubeconfig)),
                *("--kubelet-root-dir", str(root / "kubelet"), "--state-dir", str(root / "state")),
                *("--cdi-root", str(root / "cdi"), "--metrics-port", "0", "--log-format", "json"),
                *extra,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return Daemon(proc, root, log_path)


def _cleanup(daemon: Daemon) -> None:
    if daemon.proc.poll() is None:
        daemon.proc.kill()
        daemon.proc.wait()
    shutil.rmtree(daemon.root, ignore_errors=True)


def node_slices(rest: KubeApi, node: str) -> list[dict[str, Any]]:
    found = rest.get(SLICES, query={"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"})
    return sorted(found["items"], key=lambda s: s["metadata"]["name"])


def published_devices(rest: KubeApi, node: str, daemon: Daemon, count: int) -> list[dict[str, Any]] | None:
    assert daemon.proc.poll() is None, daemon.log_path.read_text()
    devices = [d for s in node_slices(rest, node) for d in s["spec"].get("devices", [])]
    return devices if len(devices) == count else None


def test_publishes_four_gpus_owned_by_the_node_taints_a_fault_and_cleans_up_on_sigterm(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        node_uid = rest.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        daemon = _start(kube_cluster, node, "--delete-slices-on-shutdown")
        try:
            devices = wait_for(
                "4 published devices", lambda: published_devices(rest, node, daemon, 4), timeout=60
            )
            assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
            (published,) = node_slices(rest, node)
            assert published["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
            ]
            assert published["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 1}
            assert all("taints" not in d for d in devices)

            daemon.fault_file.write_text("gpu-1: 48\n")  # double-bit ECC: running work is lost

            def tainted() -> dict[str, Any] | None:
                by_name = {d["name"]: d for s in node_slices(rest, node) for d in s["spec"]["devices"]}
                return by_name if by_name["gpu-1"].get("taints") else None

            by_name = wait_for("a taint on gpu-1", tainted, timeout=30)
            (taint,) = by_name["gpu-1"]["taints"]
            assert (taint["key"], taint["value"]) == (f"{DRIVER}/unhealthy", "xid-48")
            assert taint["effect"] == "NoSchedule"  # the default --health-taint-effect
            assert "timeAdded" in taint  # set by the API server: it stored our taint as a taint
            assert all("taints" not in by_name[name] for name in ("gpu-0", "gpu-2", "gpu-3"))

            assert daemon.terminate() == 0, daemon.log_path.read_text()
            messages = [line["msg"] for line in daemon.log_lines()]
            assert "shutting down" in messages and messages[-1] == "stopped"
            assert not list((daemon.root / "kubelet" / "plugins_registry").iterdir())
        finally:
            _cleanup(daemon)
        assert node_slices(rest, node) == []


def test_slices_stay_after_sigterm_without_the_flag(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        daemon = _start(kube_cluster, node)
        try:
            wait_for("4 published devices", lambda: published_devices(rest, node, daemon, 4), timeout=60)
            assert daemon.terminate() == 0, daemon.log_path.read_text()
        finally:
            _cleanup(daemon)
        assert len(node_slices(rest, node)) == 1


def test_starts_before_its_node_exists_and_publishes_once_it_does(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    name = f"late-node-{os.getpid()}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        daemon = _start(kube_cluster, name)
        try:
            # Serving the kubelet does not wait for the API server.
            registry = daemon.root / "kubelet" / "plugins_registry"
            wait_for("the registration socket", lambda: any(registry.glob("*.sock")), timeout=30)
            wait_for(
                "a logged retry of the Node lookup",
                # The retry's reason is its `error` field (one structured log style), not the message.
                lambda: any("not found" in str(line.get("error", "")) for line in daemon.log_lines()),
                timeout=30,
            )
            assert node_slices(rest, name) == []
            fake_node(name)
            node_uid = rest.get(f"/api/v1/nodes/{name}")["metadata"]["uid"]
            wait_for("4 published devices", lambda: published_devices(rest, name, daemon, 4), timeout=90)
            (published,) = node_slices(rest, name)
            assert published["metadata"]["ownerReferences"][0]["uid"] == node_uid
            assert daemon.terminate() == 0, daemon.log_path.read_text()
        finally:
            _cleanup(daemon)
