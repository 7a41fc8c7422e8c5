"""A real kubelet on the recording fake container runtime (tests/cluster/cmd/fakecri).

The kubelet runs as root on the test machine with its own root directory, so
its plugin registry (`<root>/plugins_registry`) and plugin directory
(`<root>/plugins`) are where a DRA plugin under test puts its sockets. The
fake runtime "runs" containers without running anything and records every
CreateContainer call, CDI device IDs included, as one JSON line.

Settings follow what a kubelet needs on a cgroup v1 machine without systemd
and without a real runtime: no per-QoS cgroups, no node-allocatable
enforcement, no eviction thresholds, cgroup v1 allowed. With
protectKernelDefaults off (the default) the kubelet sets a few sysctls of the
machine it runs on (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops),
as it does on every node.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes.client.exceptions import ApiException

from devcluster import pki
from devcluster.binaries import NODE_BINARIES, require_binaries
from devcluster.controlplane import ControlPlane, free_port, write_kubeconfig
from devcluster.procs import ProcessGroup
from devcluster.rest import KubeJSON

log = logging.getLogger(__name__)

DEFAULT_NODE_NAME = "kubelet-node"


def node_is_ready(node: Mapping[str, Any]) -> bool:
    """Whether a Node (API JSON) has condition Ready=True."""
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gates_to_map(feature_gates: str) -> dict[str, bool]:
    """'A=true,B=false' -> {'A': True, 'B': False} (KubeletConfiguration form)."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in feature_gates.split(","))):
        name, _, value = item.partition("=")
        gates[name] = value.strip().lower() == "true"
    return gates


def unmount_below(directory: Path) -> None:
    """Lazily unmount whatever the kubelet mounted under `directory` (volumes)
    so removing the directory cannot reach into, or fail on, a mount."""
    prefix = str(directory.resolve()) + os.sep
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    # Field 5 is the mount point; octal escapes (\040) stand for spaces.
    points = [line.split()[4].encode().decode("unicode_escape") for line in mountinfo]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


class KubeletNode:
    """fakecri + kubelet registered as Node `name`; start() waits for Ready."""

    def __init__(
        self,
        cluster: ControlPlane,
        state_dir: Path,
        name: str = DEFAULT_NODE_NAME,
        startup_timeout: float = 120.0,
        remove_state_on_stop: bool = True,
    ) -> None:
        self.cluster = cluster
        self.name = name
        self.state_dir = state_dir
        self.root_dir = state_dir / "root"
        self.cdi_root = state_dir / "cdi"
        self.record_path = state_dir / "cri-record.jsonl"
        self.cri_socket = state_dir / "cri.sock"
        self.startup_timeout = startup_timeout
        self.remove_state_on_stop = remove_state_on_stop
        self.processes = ProcessGroup(cluster.logs)
        self.startup_seconds = 0.0

    @property
    def plugins_registry(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    def container_records(self) -> list[dict[str, Any]]:
        """One dict per CreateContainer the kubelet sent to the runtime, oldest first."""
        if not self.record_path.exists():
            return []
        return [json.loads(line) for line in self.record_path.read_text().splitlines() if line.strip()]

    def cdi_ids_per_device(self, ids: list[str]) -> list[str]:
        """A container's CDI IDs as this kubelet means them: one per prepared device.

        Kubelet 1.34 appends a driver's devices to its claim record on every
        NodePrepareResources answer without clearing the previous ones, so when
        two pods sharing a claim both prepare it, the second pod's containers
        receive each CDI ID twice (pkg/kubelet/cm/dra manager.go/claiminfo.go
        at v1.34.4; from 1.35 on the record is reset before each answer is
        added). Our plugin answers identically each time; that repetition is the
        kubelet's, so it is folded here for 1.34 only and kept visible for newer
        kubelets, where a repeated ID would be our bug.
        """
        minor = int(self.cluster.kubernetes_version.split(".")[1])
        return list(dict.fromkeys(ids)) if minor <= 34 else ids

    def start(self) -> None:
        started = time.monotonic()
        require_binaries(self.cluster.bin_dir, NODE_BINARIES)
        for directory in (self.root_dir, self.cdi_root, self.state_dir / "pod-logs", self.state_dir / "pki"):
            directory.mkdir(parents=True, exist_ok=True)
        try:
            self._start_runtime()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("kubelet node ready node=%s seconds=%.1f", self.name, self.startup_seconds)

    def stop(self) -> None:
        self.processes.stop_all()
        self._delete_node()
        # The kubelet bind-mounts its root dir onto itself (to make it a
        # shared mount) and mounts pod volumes below it; those outlive it.
        unmount_below(self.state_dir)
        if self.remove_state_on_stop:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # ------------------------------------------------------------ start-up

    def _start_runtime(self) -> None:
        runtime = self.processes.start(f"fakecri-{self.name}", [
            str(self.cluster.bin_dir / "fakecri"),
            f"--socket={self.cri_socket}",
            f"--record={self.record_path}",
        ])  # fmt: skip
        self.processes.wait_until("fake CRI socket", self.cri_socket.exists, 30, blame=runtime)

    def _kubeconfig(self) -> Path:
        # A node identity (system:node:<name>, group system:nodes), so the Node
        # authorizer and NodeRestriction treat this kubelet like a real one.
        cert = pki.client_cert(
            self.cluster.client_ca, self.state_dir / "pki", "kubelet-client",
            f"system:node:{self.name}", ("system:nodes",),
        )  # fmt: skip
        return write_kubeconfig(
            self.state_dir / "kubeconfig",
            self.cluster.server,
            self.cluster.ca_file,
            {"client-certificate": str(cert.cert), "client-key": str(cert.key)},
            self.name,
        )

    def _config(self) -> Path:
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "containerRuntimeEndpoint": f"unix://{self.cri_socket}",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            # The machine has cgroup v1 and no systemd: no pod/QoS cgroup tree,
            # nothing to enforce node allocatable on.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failCgroupV1": False,
            "failSwapOn": False,
            "evictionHard": {},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "localStorageCapacityIsolation": False,
            "registerNode": True,
            "podLogsDir": str(self.state_dir / "pod-logs"),
            "volumePluginDir": str(self.state_dir / "volume-plugins"),
            "staticPodPath": "",
            "shutdownGracePeriod": "0s",
            "featureGates": gates_to_map(self.cluster.dra.feature_gates),
        }
        path = self.state_dir / "kubelet-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _start_kubelet(self) -> None:
        kubelet = self.processes.start(f"kubelet-{self.name}", [
            str(self.cluster.bin_dir / "kubelet"),
            f"--config={self._config()}",
            f"--kubeconfig={self._kubeconfig()}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.state_dir / 'pki'}",
            # No --node-ip: the kubelet rejects loopback node IPs and picks
            # the machine's address instead.
            f"--hostname-override={self.name}",
            "--v=2",
        ])  # fmt: skip
        with self.cluster.api_client() as api:
            rest = KubeJSON(api)

            def ready() -> bool:
                try:
                    return node_is_ready(rest.get(f"/api/v1/nodes/{self.name}"))
                except ApiException as err:
                    if err.status == 404:
                        return False
                    raise

            self.processes.wait_until(f"Node {self.name} Ready", ready, self.startup_timeout, blame=kubelet)

    def _delete_node(self) -> None:
        try:
            with self.cluster.api_client() as api:
                KubeJSON(api).delete(f"/api/v1/nodes/{self.name}", timeout=5)
        except ApiException as err:
            if err.status != 404:
                log.warning("deleting node=%s failed status=%s", self.name, err.status)
        except Exception as err:  # the control plane may already be gone
            log.warning("deleting node=%s failed error=%s", self.name, err)
