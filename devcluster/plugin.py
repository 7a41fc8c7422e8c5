"""The plugin as a host process: `draplugin run --backend fake` for one kubelet, restartable.

The end-to-end tests use it to run, kill (at armed crash points) and restart
the plugin next to a real kubelet, which the chart's DaemonSet pod
(devcluster/chart.py) cannot do: a container's restarts are the kubelet's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devcluster.binaries import REPO_ROOT
from devcluster.wait import past_deadline
from dracommon.drivername import DEFAULT_DRIVER_NAME
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.kubelet.sockets import socket_paths
from draplugin.prepare.wiring import BOOT_ID_FILE_ENV, FAKE_CONFIG_ENV

# What draplugin.nodestart logs once the prepare driver has recovered and serves claims.
RECOVERY_DONE_LINE = b"start-up recovery done"

FAKE_GPUS = REPO_ROOT / "examples" / "fake-gpus.yaml"
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class PluginProcess:
    """`draplugin run --backend fake` for one kubelet, restartable, with its log in a file."""

    kubeconfig: Path
    node_name: str
    kubelet_root_dir: Path
    cdi_root: Path
    state_dir: Path
    fake_config: Path = FAKE_GPUS
    driver_name: str = DEFAULT_DRIVER_NAME
    boot_id: str = "demo-boot-1"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # On: SIGTERM makes the plugin delete its slices (a plugin that is not restarted).
    # Off: a restart keeps them, as in production, and the scheduler goes on allocating.
    delete_slices_on_shutdown: bool = False
    # 0: no Prometheus endpoint; a port: /metrics on it (for `dra-controller top --endpoint`).
    metrics_port: int = 0
    # The device backend's flags; the default is fake GPUs from `fake_config`. A test of the
    # NVML path passes `("--backend", "nvml", "--nvml-lib-path", <driver root>)`.
    backend_args: tuple[str, ...] = ("--backend", "fake")
    # Run before the plugin's command line (it must exec it, so the process is the plugin's): a test
    # that gives the plugin a mount namespace of its own, with the NVML double's /proc files on /proc.
    command_prefix: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.state_dir / "plugin.log"

    @property
    def checkpoint_path(self) -> Path:
        return self.state_dir / "checkpoint.json"

    @property
    def boot_id_file(self) -> Path:
        return self.state_dir / "boot_id"

    @property
    def registration_socket(self) -> Path:
        return socket_paths(self.kubelet_root_dir, self.driver_name, None).registration

    def start(self, crash_at: str | None = None, timeout_s: float = 30.0) -> None:
        """Start the plugin (optionally armed to SIGKILL itself at a crash point); wait for its sockets."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("plugin is already running")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.boot_id_file.write_text(self.boot_id + "\n")
        env = dict(os.environ)
        env.pop("DRAPLUGIN_CRASH_AT", None)
        env.update(self.extra_env)
        if "fake" in self.backend_args:
            env[FAKE_CONFIG_ENV] = str(self.fake_config)
        env[BOOT_ID_FILE_ENV] = str(self.boot_id_file)
        if crash_at:
            env["DRAPLUGIN_CRASH_AT"] = crash_at
        command = [
            *self.command_prefix,
            sys.executable, "-m", "draplugin.cli", "run",
            *self.backend_args,
            "--driver-name", self.driver_name,
            "--node-name", self.node_name,
            "--kubelet-root-dir", str(self.kubelet_root_dir),
            "--cdi-root", str(self.cdi_root),
            "--state-dir", str(self.state_dir),
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", str(self.metrics_port),
            f"--delete-slices-on-shutdown={str(self.delete_slices_on_shutdown).lower()}",
        ]  # fmt: skip
        before = self._socket_identity()
        started = time.monotonic()
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1} crash_at={crash_at or '-'}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
            )
        self.starts += 1
        # A killed plugin leaves its socket file behind: wait for a new one.
        while self._socket_identity() in (None, before):
            if self.process.poll() is not None:
                raise RuntimeError(f"plugin exited with {self.process.returncode}:\n{self.log_tail()}")
            over, how_long = past_deadline(started, timeout_s)  # stretched while the machine is loaded
            if over:
                raise RuntimeError(f"plugin sockets did not appear within {how_long}:\n{self.log_tail()}")
            time.sleep(0.05)
        # The sockets open before start-up recovery (draplugin.nodestart): callers that look at the
        # checkpoint, CDI specs or slices right after a start need recovery done, as before.
        while not self._recovered_since(log_offset):
            if self.process.poll() is not None:
                raise RuntimeError(f"plugin exited with {self.process.returncode}:\n{self.log_tail()}")
            over, how_long = past_deadline(started, timeout_s)
            if over:
                raise RuntimeError(f"plugin start-up recovery not done within {how_long}:\n{self.log_tail()}")
            time.sleep(0.05)

    def _recovered_since(self, offset: int) -> bool:
        if self.driver_name == NVIDIA_DRIVER_NAME:
            return True  # built before its sockets: recovered once they exist
        with self.log_path.open("rb") as log:
            log.seek(offset)
            return RECOVERY_DONE_LINE in log.read()

    def _socket_identity(self) -> tuple[int, int] | None:
        try:
            info = self.registration_socket.stat()
        except FileNotFoundError:
            return None
        return info.st_ino, info.st_mtime_ns

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Wait until the kubelet has registered this start of the plugin (its log says so)."""
        started = time.monotonic()
        marker = f"--- start {self.starts} "
        while True:
            current = self.log_text().rpartition(marker)[2]
            if "kubelet registered the plugin" in current:
                return
            if not self.running:
                raise RuntimeError(f"plugin exited before registering:\n{self.log_tail()}")
            over, how_long = past_deadline(started, timeout_s)  # stretched while the machine is loaded
            if over:
                raise RuntimeError(f"the kubelet did not register the plugin within {how_long}")
            time.sleep(0.05)

    def wait_exit(self, timeout_s: float) -> int:
        if self.process is None:
            raise RuntimeError("plugin was never started")
        return self.process.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait (the plugin removes its sockets); SIGKILL if it does not stop."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def node_slices(api_client: Any, node_name: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceSlices of `driver` for the node, as the API server has them."""
    from dracommon.kubeapi import KubeApi

    query = {"fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}"}
    items: list[dict[str, Any]] = KubeApi(api_client).get(RESOURCE_SLICES, query)["items"]
    return items


def wait_published(
    plugin: PluginProcess,
    api_client: Any,
    timeout_s: float = 60.0,
    expected_devices: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Wait until the plugin's own ResourceSlices list exactly the devices of its inventory.

    The expected names come from the same fake inventory file the plugin reads
    (or, for another backend, from the caller); nothing is published from here.
    Slices left by an earlier run with other devices do not count: the plugin
    replaces them.
    """
    from devcluster.wait import wait_for
    from draplugin.devices import load_backend

    if expected_devices is not None:
        expected = sorted(expected_devices)
    else:
        backend = load_backend("fake", plugin.node_name, config_file=str(plugin.fake_config))
        expected = sorted(d.name for d in backend.discover())

    def published() -> list[dict[str, Any]] | None:
        if not plugin.running:
            raise RuntimeError(f"plugin exited:\n{plugin.log_tail()}")
        slices = node_slices(api_client, plugin.node_name, plugin.driver_name)
        names = sorted(d["name"] for s in slices for d in s["spec"].get("devices", []))
        return slices if names == expected else None

    what = f"the plugin to publish {len(expected)} devices for node {plugin.node_name}"
    slices: list[dict[str, Any]] = wait_for(what, published, timeout_s, interval=0.1)
    return slices


def delete_node_slices(api_client: Any, node_name: str, driver: str) -> None:
    """Remove what a plugin stopped without --delete-slices-on-shutdown left behind."""
    from dracommon.kubeapi import KubeApi

    query = {"fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}"}
    KubeApi(api_client).delete(RESOURCE_SLICES, query=query)
