"""A real kubelet on a container runtime: containerd with runc (default) or the recording fake CRI.

The kubelet runs as root on the test machine with its own root directory, so
its plugin registry (`<root>/plugins_registry`) and plugin directory
(`<root>/plugins`) are where a DRA plugin under test puts its sockets.

Runtimes (`runtime=`):
- "containerd" (default): containerd + runc (devcluster/containerd.py); pods
  really run, and containerd applies our CDI specs itself.
- "fakecri": the recording fake runtime (tests/cluster/cmd/fakecri), which
  "runs" containers without running anything and records every
  CreateContainer call, CDI device IDs included, as one JSON line. Only for
  tests that check what the kubelet sent and gain nothing from a real runtime.

The API server reaches the kubelet on loopback (logs, exec, port-forward):
the kubelet serves a certificate from the cluster CA for 127.0.0.1 and
accepts the API server's client certificate, authorizing it through the API
server (webhook). The kubelet refuses a loopback node IP, so it runs with
`--cloud-provider=external`, and start() does the cloud controller's part:
it sets the Node's address to 127.0.0.1 and removes the "uninitialized" taint.

Settings follow what a kubelet needs on a cgroup v1 machine without systemd:
cgroupfs, no per-QoS cgroups, no node-allocatable enforcement, no eviction
thresholds, cgroup v1 allowed. With protectKernelDefaults off (the default)
the kubelet sets a few sysctls of the machine it runs on
(vm.overcommit_memory, kernel.panic, kernel.panic_on_oops), as it does on
every node.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from devcluster import images, leftovers, pki
from devcluster.binaries import NODE_BINARIES, require_binaries
from devcluster.containerd import Containerd
from devcluster.controlplane import ControlPlane, free_port, write_kubeconfig
from devcluster.nodens import NODE_VIEW, NodeNamespace
from devcluster.procs import ComponentError, ProcessGroup
from dracommon.kubeapi import ApiError, KubeApi

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
    leftovers.unmount_under(directory)


RUNTIMES = ("containerd", "fakecri")
# k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath: not under --root-dir.
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"


class KubeletNode:
    """A container runtime + kubelet registered as Node `name`; start() waits for Ready."""

    def __init__(
        self,
        cluster: ControlPlane,
        state_dir: Path,
        name: str = DEFAULT_NODE_NAME,
        startup_timeout: float = 120.0,
        remove_state_on_stop: bool = True,
        runtime: str = "containerd",
        private_device_plugin_dir: bool = False,
        node_ip: str = "127.0.0.1",
        labels: Mapping[str, str] | None = None,
        own_mount_namespace: bool = False,
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown container runtime {runtime!r}; choose one of: {', '.join(RUNTIMES)}")
        self.cluster = cluster
        self.name = name
        self.runtime = runtime
        self.state_dir = state_dir
        self.root_dir = state_dir / "root"
        self.cdi_root = state_dir / "cdi"
        self.record_path = state_dir / "cri-record.jsonl"
        self.startup_timeout = startup_timeout
        self.remove_state_on_stop = remove_state_on_stop
        self.processes = ProcessGroup(cluster.logs)
        self.startup_seconds = 0.0
        # Each node of a several-node cluster has an address of its own on loopback (127.0.0.0/8):
        # the kubelet serves there, and host-network pods (the chart's plugin) bind their ports there.
        self.node_ip = node_ip
        self.labels = dict(labels or {})
        self.containerd = (
            Containerd(self.processes, state_dir, self.cdi_root, name) if runtime == "containerd" else None
        )
        # Kubelet and runtime in a mount namespace of the node's own (devcluster.nodens), so the chart's
        # hostPaths, the same for every plugin pod, name this node's directories.
        self.namespace = NodeNamespace(self.processes, state_dir, name) if own_mount_namespace else None
        if self.namespace is not None and self.containerd is not None:
            self.containerd.enter = self.namespace.enter
        self._kubelet_argv: list[str] = []
        self._fakecri_socket = state_dir / "cri.sock"
        # The kubelet's device plugin directory is a constant, /var/lib/kubelet/device-plugins,
        # whatever --root-dir says, so every kubelet on the machine would share it (the last one
        # started owns kubelet.sock, and its checkpoint file outlives it). With
        # `private_device_plugin_dir` the kubelet runs in a mount namespace of its own where this
        # directory is bound there: a device plugin registers with this kubelet alone. The price:
        # mounts the kubelet makes (projected volumes such as service account tokens) are not seen
        # by the runtime, which runs outside that namespace, so pods on such a node should not need
        # them (`automountServiceAccountToken: false`).
        self.device_plugin_dir: Path | None = (
            state_dir / "device-plugins" if private_device_plugin_dir or own_mount_namespace else None
        )

    @property
    def cri_socket(self) -> Path:
        return self.containerd.socket if self.containerd else self._fakecri_socket

    @property
    def workload_image(self) -> str:
        """The image pods on this node run (imported, never pulled); the fake CRI runs any name."""
        if self.containerd is not None and self.containerd.workload is not None:
            return self.containerd.workload.name
        return images.workload_image().name

    @property
    def kubelet_root_dir(self) -> Path:
        """The root dir as the kubelet is told it: in a node's own namespace its short view there
        (the plugins' registration sockets below it must fit a unix socket path, 107 bytes)."""
        return NODE_VIEW / "root" if self.namespace is not None else self.root_dir

    @property
    def plugins_registry(self) -> Path:
        return self.root_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root_dir / "plugins"

    def container_records(self) -> list[dict[str, Any]]:
        """One dict per CreateContainer the kubelet sent to the fake runtime, oldest first."""
        if self.containerd is not None:
            raise RuntimeError("container_records() needs the fake CRI; this node runs containerd")
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
        require_binaries(self.cluster.bin_dir, NODE_BINARIES if self.containerd is None else ("kubelet",))
        for directory in (self.root_dir, self.cdi_root, self.state_dir / "pod-logs", self.state_dir / "pki"):
            directory.mkdir(parents=True, exist_ok=True)
        try:
            if self.namespace is not None:
                self.namespace.start()
            self._start_runtime()
            self._start_kubelet()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("kubelet node ready node=%s seconds=%.1f", self.name, self.startup_seconds)

    def stop(self) -> None:
        # The kubelet first (it would restart what the runtime stops), then the
        # runtime with its pods, then anything else.
        for component in [c for c in self.processes.components if c.name == f"kubelet-{self.name}"]:
            self.processes.stop(component)
        if self.containerd is not None:
            self.containerd.stop()
        self.processes.stop_all()
        self._delete_node()
        # The kubelet bind-mounts its root dir onto itself (to make it a
        # shared mount) and mounts pod volumes below it; those outlive it.
        unmount_below(self.state_dir)
        if self.remove_state_on_stop:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    # ------------------------------------------------------------ start-up

    def _start_runtime(self) -> None:
        if self.containerd is not None:
            self.containerd.start()
            return
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
        serving = pki.serving_cert(
            self.cluster.client_ca,
            self.state_dir / "pki",
            "kubelet-serving",
            self.name,
            (self.node_ip,),
            (self.name,),
        )
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "containerRuntimeEndpoint": f"unix://{self.cri_socket}",
            "imageServiceEndpoint": f"unix://{self.cri_socket}",
            # The API server's logs/exec/port-forward requests: a serving
            # certificate it can verify, its client certificate accepted, and
            # what it may do decided by the API server's RBAC (webhook).
            "tlsCertFile": str(serving.cert),
            "tlsPrivateKeyFile": str(serving.key),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.cluster.client_ca.cert)},
            },
            "authorization": {"mode": "Webhook"},
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

    def _private_mounts(self) -> list[str]:
        """The command prefix that gives the kubelet its own device plugin directory, if it has one."""
        if self.namespace is not None:
            return self.namespace.enter()  # the node's namespace binds its device plugin directory
        if self.device_plugin_dir is None:
            return []
        self.device_plugin_dir.mkdir(parents=True, exist_ok=True)
        KUBELET_DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)  # the mount point
        return [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", 'mount --bind "$0" "$1" && shift && exec "$@"',
            str(self.device_plugin_dir), str(KUBELET_DEVICE_PLUGIN_DIR),
        ]  # fmt: skip

    def _start_kubelet(self) -> None:
        labels = ",".join(f"{key}={value}" for key, value in sorted(self.labels.items()))
        self._kubelet_argv = [
            *self._private_mounts(),
            str(self.cluster.bin_dir / "kubelet"),
            f"--config={self._config()}",
            f"--kubeconfig={self._kubeconfig()}",
            f"--root-dir={self.kubelet_root_dir}",
            f"--cert-dir={self.state_dir / 'pki'}",
            f"--hostname-override={self.name}",
            # The kubelet rejects a loopback --node-ip; as with an external
            # cloud provider, it keeps the addresses set for it (module docstring).
            "--cloud-provider=external",
            *([f"--node-labels={labels}"] if labels else []),
            "--v=2",
        ]  # fmt: skip
        self._run_kubelet(initialize=True)

    def kill_kubelet(self) -> None:
        """SIGKILL the kubelet, as a machine or kubelet crash would stop it: no clean-up of any kind."""
        for component in [c for c in self.processes.components if c.name == f"kubelet-{self.name}"]:
            os.kill(component.process.pid, signal.SIGKILL)
            component.process.wait()
            component.log_file.close()
            self.processes.components.remove(component)

    def restart_kubelet(self) -> None:
        """The kubelet again, with the same configuration and state, once killed; waits for Ready."""
        if any(c.name == f"kubelet-{self.name}" for c in self.processes.components):
            raise RuntimeError(f"the kubelet of node {self.name} is running")
        self._run_kubelet(initialize=False)

    def _run_kubelet(self, initialize: bool) -> None:
        kubelet = self.processes.start(f"kubelet-{self.name}", self._kubelet_argv)
        with self.cluster.api_client() as api:
            rest = KubeApi(api)

            def get_node() -> dict[str, Any] | None:
                try:
                    return rest.get(f"/api/v1/nodes/{self.name}")
                except ApiError as err:
                    if err.status == 404:
                        return None
                    raise

            self.processes.wait_until(
                f"Node {self.name} registered",
                lambda: get_node() is not None,
                self.startup_timeout,
                blame=kubelet,
            )
            if initialize:
                self._initialize_node(rest, get_node() or {})
            self.processes.wait_until(
                f"Node {self.name} Ready",
                lambda: node_is_ready(get_node() or {}),
                self.startup_timeout,
                blame=kubelet,
            )

    def _initialize_node(self, rest: KubeApi, node: Mapping[str, Any]) -> None:
        """The external cloud controller's part: a loopback address, then the taint off."""
        path = f"/api/v1/nodes/{self.name}"
        addresses = [
            {"type": "InternalIP", "address": self.node_ip},
            {"type": "Hostname", "address": self.name},
        ]
        taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != UNINITIALIZED_TAINT]
        try:
            rest.patch_status(path, {"status": {"addresses": addresses}})
            rest.merge_patch(path, {"spec": {"taints": taints or None}})
        except ApiError as err:
            raise ComponentError(
                f"initializing Node {self.name} (address, {UNINITIALIZED_TAINT} taint): {err}"
            ) from err

    def _delete_node(self) -> None:
        try:
            with self.cluster.api_client() as api:
                KubeApi(api).delete(f"/api/v1/nodes/{self.name}", timeout=5)
        except ApiError as err:
            if err.status != 404:
                log.warning("deleting node=%s failed status=%s", self.name, err.status)
        except Exception as err:  # the control plane may already be gone
            log.warning("deleting node=%s failed error=%s", self.name, err)
