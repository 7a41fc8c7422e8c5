"""containerd with runc as the container runtime under a test kubelet.

Everything is private to one node's state directory: containerd's root, state
dir, socket, config, the CNI configuration and its address store, and the
pods' network namespaces. Pods get addresses from a bridge that has no address
of its own on the host (CNI `bridge`, `isGateway: false`, no masquerade): the
pod addresses exist only inside the network namespaces containerd creates, the
host has no route to them, and nothing leaves the machine. The streaming
server (exec, attach, port-forward) listens on loopback.

The CRI plugin has CDI on, reading the node's CDI root, so the devices our
plugin prepares are injected by containerd's own CDI support. The machine has
cgroup v1 and no systemd: runc uses cgroupfs.

Binaries: containerd, containerd-shim-runc-v2, ctr and crictl from
tests/cluster/build_runtime.sh; runc and the CNI plugins from Debian
(tests/cluster/install_debs.sh). A missing piece fails start() at once with the
command that provides it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster import images, leftovers
from devcluster.binaries import REPO_ROOT
from devcluster.procs import Component, ComponentError, ProcessGroup
from devcluster.wait import load_stretch

log = logging.getLogger(__name__)

RUNTIME_MODULE = REPO_ROOT / "tests" / "cluster" / "runtime"
BUILD_COMMAND = "tests/cluster/build_runtime.sh"
INSTALL_COMMAND = images.INSTALL_COMMAND
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "crictl")
RUNC = Path("/usr/sbin/runc")
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local")
STARTUP_TIMEOUT = 30.0
NOT_READY_GRACE = 5.0


class RuntimeSetupError(ComponentError):
    """The runtime cannot start: something is missing or broken; the message says how to fix it."""


def pinned_containerd_version(go_mod: Path = RUNTIME_MODULE / "go.mod") -> str:
    """The containerd version tests/cluster/runtime/go.mod pins, e.g. v2.4.2."""
    match = re.search(r"^\s*github\.com/containerd/containerd/v2\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise RuntimeSetupError(f"{go_mod} does not require github.com/containerd/containerd/v2")
    return match.group(1)


def runtime_bin_dir() -> Path:
    """$DRA_RUNTIME_BIN_DIR, else the cache directory build_runtime.sh writes to."""
    override = os.environ.get("DRA_RUNTIME_BIN_DIR")
    if override:
        return Path(override)
    return Path.home() / ".cache" / "draplugin-kube" / f"runtime-{pinned_containerd_version()}"


def require_runtime(bin_dir: Path) -> None:
    """Fail with the fixing command if a binary or Debian package the runtime needs is missing."""
    missing = [name for name in RUNTIME_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise RuntimeSetupError(
            f"container runtime binaries missing from {bin_dir}: {', '.join(missing)}. "
            f"Build them with `{BUILD_COMMAND}` (or `make kube`)."
        )
    debian = [str(RUNC)] if not os.access(RUNC, os.X_OK) else []
    debian += [str(CNI_BIN_DIR / p) for p in CNI_PLUGINS if not os.access(CNI_BIN_DIR / p, os.X_OK)]
    if debian:
        raise RuntimeSetupError(
            f"missing {', '.join(debian)} (Debian packages runc, containernetworking-plugins); "
            f"install them with `{INSTALL_COMMAND}` (or `make kube`)."
        )


class Containerd:
    """One containerd for one node; start() returns once the CRI reports runtime and network ready
    and the sandbox and workload images are imported."""

    def __init__(self, processes: ProcessGroup, state_dir: Path, cdi_root: Path, name: str) -> None:
        self.processes = processes
        self.bin_dir = runtime_bin_dir()
        self.name = name
        self.dir = state_dir / "containerd"
        self.socket = self.dir / "containerd.sock"
        self.cdi_root = cdi_root
        self.config_path = self.dir / "config.toml"
        self.cni_conf_dir = self.dir / "cni-conf"
        # Interface names are at most 15 bytes; the hash keeps two nodes' bridges apart.
        self._tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
        self.bridge = f"dra-{self._tag}"
        self.workload: images.LocalImage | None = None
        self.pause: images.LocalImage | None = None
        self.component: Component | None = None
        self.version = ""
        self._not_ready_since = 0.0
        # The argv prefix containerd runs under (a node's mount namespace: devcluster.nodens).
        self.enter: Callable[[], list[str]] = list

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"

    def start(self) -> None:
        require_runtime(self.bin_dir)
        try:
            self.pause, self.workload = images.pause_image(), images.workload_image()
        except images.ImageError as err:
            raise RuntimeSetupError(str(err)) from err
        for directory in (self.dir, self.cni_conf_dir, self.cdi_root):
            directory.mkdir(parents=True, exist_ok=True)
        self._write_cni_config()
        self.config_path.write_text(self._config())
        self.component = self.processes.start(
            f"containerd-{self.name}",
            [
                *self.enter(),
                str(self.bin_dir / "containerd"),
                "--config",
                str(self.config_path),
                "--log-level",
                "info",
            ],
            # containerd finds containerd-shim-runc-v2 on its PATH.
            env={"PATH": f"{self.bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
        )
        self.processes.wait_until(
            f"containerd CRI ready on {self.socket}", self._cri_ready, STARTUP_TIMEOUT, blame=self.component
        )
        try:
            for image in (self.pause, self.workload):
                images.import_image(self.ctr, self.socket, image.archive)
        except images.ImageError as err:
            raise RuntimeSetupError(str(err)) from err
        log.info("containerd ready node=%s version=%s socket=%s", self.name, self.version, self.socket)

    def crictl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run crictl against this containerd (output captured, never raises on exit status)."""
        command = [str(self.bin_dir / "crictl"), "--runtime-endpoint", self.endpoint,
                   "--image-endpoint", self.endpoint, "--timeout", "20s", *args]  # fmt: skip
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def remove_all_pods(self) -> None:
        """Stop and remove every pod sandbox: containerd's shims and containers outlive containerd."""
        if self.component is None or not self.component.alive():
            return
        done = self.crictl("rmp", "--force", "--all", timeout=120)
        if done.returncode != 0:
            log.warning("removing pods node=%s failed: %s", self.name, done.stderr.strip())

    def stop(self) -> None:
        self.remove_all_pods()
        if self.component is not None:
            self.processes.stop(self.component)
            self.component = None
        self._reap_leftovers()
        # The bridge is the only thing of ours outside the state directory.
        subprocess.run(["ip", "link", "delete", self.bridge], capture_output=True, check=False)

    def _reap_leftovers(self) -> None:
        """Containers, shims and mounts that outlived containerd (pod removal failed, or containerd
        was killed): the containers in our private runc root, the shims started with our socket
        address, and the sandboxes' network namespaces, /dev/shm and rootfs mounts below our dir."""
        killed = leftovers.kill_processes_under(self.dir)
        unmounted = leftovers.unmount_under(self.dir)
        if killed or unmounted:
            log.warning(
                "node=%s removed %d leftover processes (%s), %d mounts", self.name, len(killed),
                ", ".join(h.command.split(" ", 1)[0].rsplit("/", 1)[-1] for h in killed), len(unmounted),
            )  # fmt: skip

    # ------------------------------------------------------------ start-up

    def _cri_ready(self) -> bool:
        if not self.socket.exists():
            return False
        done = self.crictl("info", timeout=30)
        if done.returncode != 0:
            return False
        info: dict[str, Any] = json.loads(done.stdout)
        conditions = {c["type"]: c for c in info.get("status", {}).get("conditions", [])}
        broken = [
            f"{kind}=false ({conditions[kind].get('reason')}: {conditions[kind].get('message')})"
            for kind in ("RuntimeReady", "NetworkReady")
            if kind in conditions
            and conditions[kind].get("status") is not True
            and conditions[kind].get("reason")
        ]
        if broken:
            # Not ready with a reason, for longer than loading the CNI config
            # takes, is a broken set-up and not a slow one: say so now.
            now = time.monotonic()
            self._not_ready_since = self._not_ready_since or now
            if now - self._not_ready_since > NOT_READY_GRACE * load_stretch():
                raise RuntimeSetupError(
                    f"containerd reports {', '.join(broken)}; "
                    f"config {self.config_path}, CNI {self.cni_conf_dir}"
                )
        ready = all(
            conditions.get(kind, {}).get("status") is True for kind in ("RuntimeReady", "NetworkReady")
        )
        if ready:
            version = self.crictl("version")
            match = re.search(r"RuntimeVersion:\s*(\S+)", version.stdout)
            self.version = match.group(1) if match else ""
        return ready

    def _write_cni_config(self) -> None:
        subnet = f"10.88.{int(self._tag[:2], 16)}.0/24"
        network = {
            "cniVersion": "1.0.0",
            "name": f"draplugin-{self._tag}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    # No gateway address on the host and no NAT: pod addresses
                    # exist only inside the pods' network namespaces.
                    "isGateway": False,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": subnet}]],
                        "dataDir": str(self.dir / "cni-ipam"),
                    },
                }
            ],
        }
        for old in self.cni_conf_dir.glob("*"):
            old.unlink()
        (self.cni_conf_dir / "10-draplugin.conflist").write_text(json.dumps(network, indent=2) + "\n")

    def _config(self) -> str:
        """containerd's config (version 4): private paths, CRI with CDI, runc on cgroupfs.

        CDI is always on in containerd 2.4 (no switch); `cdi_spec_dirs` points it at the node's root.
        """
        cri = "plugins.'io.containerd.cri.v1.runtime'"
        return f"""version = 4
root = {_toml(self.dir / "root")}
state = {_toml(self.dir / "state")}
# No drop-ins from the host's /etc/containerd.
imports = []
# Plugins that would touch shared host paths (/opt/containerd, the NRI socket)
# or are not needed here.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.image-verifier.v1.bindir",
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.zfs",
]

[plugins.'io.containerd.server.v1.grpc']
  address = {_toml(self.socket)}
[plugins.'io.containerd.server.v1.ttrpc']
  address = {_toml(f"{self.socket}.ttrpc")}

[{cri}]
  cdi_spec_dirs = [{_toml(self.cdi_root)}]
  # Pod network namespaces below the state dir, not in the shared /var/run/netns.
  netns_mounts_under_state_dir = true
  # The machine grants root no CAP_SYS_RESOURCE, so runc cannot lower an
  # oom_score_adj (the kubelet asks -998 for sandboxes): clamp to containerd's own.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        BinaryName = {_toml(RUNC)}
        # runc's container state below ours, not in the shared /run/containerd/runc.
        Root = {_toml(self.dir / "runc")}
        SystemdCgroup = false
  [{cri}.cni]
    bin_dirs = [{_toml(CNI_BIN_DIR)}]
    conf_dir = {_toml(self.cni_conf_dir)}
    max_conf_num = 1

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {_toml(self.pause.name if self.pause else "")}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def pids_with_args(args: list[str]) -> list[int]:
    """Processes whose command line contains `args` in a row."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        words = [a.decode(errors="replace") for a in argv]
        if any(words[i : i + len(args)] == args for i in range(len(words))):
            found.append(int(entry.name))
    return found


def _toml(value: object) -> str:
    """A TOML basic string (JSON string escaping is a subset TOML accepts)."""
    return json.dumps(str(value))
