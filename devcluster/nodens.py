"""A node's own view of the machine's paths: one mount namespace for its kubelet and containerd.

Several kubelets on one machine each have their own root, CDI and state
directories, but the chart's DaemonSet gives every plugin pod the same
hostPath volumes (`kubeletPlugin.kubeletRootDir`, `cdiRoot`, `stateDir`), as
it must on real nodes, where those paths are the same on every machine. Here
each node's containerd and kubelet run in a private mount namespace of the
node's own, in which NODE_VIEW is the node's state directory bound there, and
the kubelet's device plugin directory (a constant, whatever --root-dir says) is
the node's own too. The runtime resolves the chart's hostPaths in that
namespace, so `NODE_VIEW/root/plugins_registry` in a plugin pod on node A is
node A's registry, and the same value on node B is node B's. Outside the
namespace the node's files are where they always are, below its state dir.

The namespace is held by a `sleep` started with it (so it outlives a killed
kubelet); containerd and the kubelet enter it with nsenter, which execs them
(the process the ProcessGroup tracks is the component itself). Mounts made in
it (the kubelet's volumes, containerd's rootfs) are invisible outside and go
with it when its last process exits.
"""

from __future__ import annotations

from pathlib import Path

from devcluster.procs import Component, ProcessGroup

# Where a node's processes see the node's state directory (the chart's hostPaths point below it).
NODE_VIEW = Path("/run/draplugin-node")
# k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath: not under --root-dir.
KUBELET_DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
READY_TIMEOUT = 30.0


class NodeNamespace:
    """The mount namespace of one node: `start()` makes it, `enter()` is the command prefix into it."""

    def __init__(self, processes: ProcessGroup, state_dir: Path, name: str) -> None:
        self.processes = processes
        self.state_dir = state_dir
        self.name = name
        self.device_plugin_dir = state_dir / "device-plugins"
        self.holder: Component | None = None

    def start(self) -> None:
        for directory in (NODE_VIEW, KUBELET_DEVICE_PLUGIN_DIR, self.device_plugin_dir):
            directory.mkdir(parents=True, exist_ok=True)  # mount points, and the node's own directory
        self.holder = self.processes.start(f"mountns-{self.name}", [
            "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", 'mount --bind "$1" "$2" && mount --bind "$3" "$4" && exec sleep infinity',
            "sh", str(self.state_dir), str(NODE_VIEW),
            str(self.device_plugin_dir), str(KUBELET_DEVICE_PLUGIN_DIR),
        ])  # fmt: skip
        holder = self.holder
        self.processes.wait_until(
            f"mount namespace of node {self.name}", lambda: self._mounted(holder), READY_TIMEOUT, blame=holder
        )

    def enter(self) -> list[str]:
        """The argv prefix that runs a command in this namespace."""
        if self.holder is None:
            raise RuntimeError(f"the mount namespace of node {self.name} is not started")
        return ["nsenter", f"--mount=/proc/{self.holder.process.pid}/ns/mnt", "--"]

    @staticmethod
    def _mounted(holder: Component) -> bool:
        """Both binds are in place once the holder has exec'd sleep (the shell runs the mounts first)."""
        try:
            argv = Path(f"/proc/{holder.process.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return False
        return argv[0] == b"sleep"
