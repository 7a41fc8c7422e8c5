"""The two plugins as processes against one API server: ours (`draplugin run --backend fake`) and the
dra-example-driver kubelet plugin, each with its own driver name, node (= pool) and directories.

Start-up is timed the same way for both: from the spawn to both sockets (registration and DRA)
existing, and to the node's ResourceSlices listing every device of its inventory.

Our modules (and the floor script's) are compiled to bytecode before each start, untimed, as `pip
install` does for the image's copy: with PYTHONDONTWRITEBYTECODE set (as on the machines this runs
on, and in the image) a checkout would otherwise compile every module from source at every start,
tens of milliseconds no installed plugin pays, while the floor's grpc and standard library come
compiled.
"""

from __future__ import annotations

import compileall
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devcluster.binaries import REPO_ROOT
from dracommon.kubeapi import KubeApi
from draplugin.devices.fake import DEFAULT_MODEL
from draplugin.kubelet.sockets import PLUGINS_DIR_NAME, REGISTRY_DIR_NAME, socket_paths
from draplugin.prepare.wiring import BOOT_ID_FILE_ENV

PEER_BINARY = "dra-example-kubeletplugin"
PEER_NAME = "dra-example-driver v0.4.0"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# The example driver's client is rate-limited to 5 QPS (burst 10) by default, ours is not
# limited: both get a limit well above what 64 concurrent prepares ask for.
PEER_QPS = "10000"
POLL_S = 0.005
# What ours and the floor script import from the checkout (compiled first: see the docstring).
PROJECT_PACKAGES = ("draplugin", "dracommon", "bench")


def compile_bytecode() -> None:
    """Every module of the project's packages compiled to its __pycache__, as an install does; a
    module already compiled and unchanged is left as it is (its check: a stat per file)."""
    for package in PROJECT_PACKAGES:
        if not compileall.compile_dir(REPO_ROOT / package, quiet=1):
            raise RuntimeError(f"compiling {REPO_ROOT / package} to bytecode failed")


@dataclass
class Started:
    sockets_s: float
    published_s: float | None  # None: the devices were not all published before the timeout
    publish_error: str = ""


@dataclass
class Plugin:
    label: str
    driver: str
    node: str
    root: Path
    devices: int
    kubeconfig: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = field(default=0)

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def dra_socket(self) -> Path:
        return socket_paths(self.kubelet_root, self.driver).dra

    @property
    def registration_socket(self) -> Path:
        return socket_paths(self.kubelet_root, self.driver).registration

    @property
    def log_path(self) -> Path:
        return self.root / "plugin.log"

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def start(self, rest: KubeApi, *, publish_timeout_s: float = 60.0) -> Started:
        for sock in (self.dra_socket, self.registration_socket):
            sock.unlink(missing_ok=True)
        command, env = self.command()
        # What the kubelet creates before any plugin starts.
        for sub in (REGISTRY_DIR_NAME, PLUGINS_DIR_NAME):
            (self.kubelet_root / sub).mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        log.close()
        self.starts += 1
        while not (self.dra_socket.exists() and self.registration_socket.exists()):
            self._check_running()
            if time.perf_counter() - started > publish_timeout_s:
                raise RuntimeError(f"{self.label}: sockets did not appear:\n{self.log_tail()}")
            time.sleep(POLL_S)
        sockets_s = time.perf_counter() - started
        expected = self.devices
        while self.published(rest) != expected:
            if self.process.poll() is not None:
                return Started(
                    sockets_s, None, f"exited with {self.process.returncode}: {self._publish_error()}"
                )
            if (failed := self.publish_failed()) or time.perf_counter() - started > publish_timeout_s:
                return Started(sockets_s, None, failed or f"timed out: {self._publish_error()}")
            time.sleep(0.02)
        return Started(sockets_s, time.perf_counter() - started)

    def sockets_only(self) -> float:
        """One more start, timed as `start` times it, to both sockets; then stopped (SIGTERM)."""
        for sock in (self.dra_socket, self.registration_socket):
            sock.unlink(missing_ok=True)
        command, env = self.command()
        log = self.log_path.open("ab")
        started = time.perf_counter()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        log.close()
        self.starts += 1
        try:
            while not (self.dra_socket.exists() and self.registration_socket.exists()):
                self._check_running()
                if time.perf_counter() - started > 60.0:
                    raise RuntimeError(f"{self.label}: sockets did not appear:\n{self.log_tail()}")
                time.sleep(POLL_S)
            return time.perf_counter() - started
        finally:
            self.stop()

    def published(self, rest: KubeApi) -> int:
        query = {"fieldSelector": f"spec.nodeName={self.node},spec.driver={self.driver}"}
        items = rest.get(SLICES, query)["items"]
        return sum(len(s["spec"].get("devices", [])) for s in items)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def rss_mib(self) -> float:
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"{self.label}: no VmRSS")

    def cpu_s(self) -> float:
        """CPU seconds (user + system, every thread) the process has used so far, from /proc."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def main_thread_cpu_s(self) -> float:
        """CPU seconds the process's main thread has been on a CPU so far (schedstat, in ns): for
        ours, the event loop that runs every claim's Python code."""
        assert self.process is not None
        pid = self.process.pid
        return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def delete_slices(self, rest: KubeApi) -> None:
        query = {"fieldSelector": f"spec.nodeName={self.node},spec.driver={self.driver}"}
        for item in rest.get(SLICES, query)["items"]:
            rest.delete(f"{SLICES}/{item['metadata']['name']}")

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def publish_failed(self) -> str:
        """The plugin's own word that publishing failed ('' if none): no point waiting longer."""
        return ""

    def _check_running(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.label} exited with {self.process.returncode}:\n{self.log_tail()}")

    def _publish_error(self) -> str:
        lines = [line for line in self.log_tail(200).splitlines() if "rror" in line or "nvalid" in line]
        return lines[-1][:300] if lines else "no error in its log"


@dataclass
class OurPlugin(Plugin):
    # Set for the one start whose log lists the modules it imports (`-X importtime`), untimed.
    profile_imports: bool = False

    def command(self) -> tuple[list[str], dict[str, str]]:
        compile_bytecode()  # before the clock starts (Plugin.start times from the spawn)
        command = [
            sys.executable, "-m", "draplugin.cli", "run",
            # A fake GPU file, not --fake-gpus: that flag stops at 1,024 GPUs, the file does not.
            "--backend", "fake", "--fake-config", str(self._fake_config()),
            "--fake-device-dir", str(self.root / "dev"),
            "--driver-name", self.driver,
            "--node-name", self.node,
            "--kubelet-root-dir", str(self.kubelet_root),
            "--cdi-root", str(self.root / "cdi"),
            "--state-dir", str(self.root / "state"),
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", "0",
            "--delete-slices-on-shutdown=true",
            # Like for like: the peer (dra-example-driver v0.4.0) does not turn on its helper's
            # device metadata files, so ours writes none either (docs/device-metadata.md).
            "--device-metadata", "off",
            # Nor does it write status.devices by default (its --gpu-device-status is off). Ours
            # would write them in the background after the answers, and the unprepare right after
            # each batch asks for 64 more SSA writes that run while the next batch, often the
            # peer's, is being timed: work on the same two cores that only one side does.
            "--device-status", "off",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRAPLUGIN_")}
        env[BOOT_ID_FILE_ENV] = str(self._boot_id())
        if self.profile_imports:
            env["PYTHONPROFILEIMPORTTIME"] = "1"
        return command, env

    def _fake_config(self) -> Path:
        path = self.root / "fake-gpus.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"gpus": [{"model": DEFAULT_MODEL, "count": self.devices}]}))
        return path

    def _boot_id(self) -> Path:
        path = self.root / "boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("bench-boot\n")
        return path


@dataclass
class PeerPlugin(Plugin):
    binary: Path = Path(PEER_BINARY)

    def command(self) -> tuple[list[str], dict[str, str]]:
        command = [
            str(self.binary),
            f"--node-name={self.node}",
            f"--driver-name={self.driver}",
            f"--num-devices={self.devices}",
            f"--cdi-root={self.root / 'cdi'}",
            f"--kubelet-registrar-directory-path={self.kubelet_root / REGISTRY_DIR_NAME}",
            f"--kubelet-plugins-directory-path={self.kubelet_root / PLUGINS_DIR_NAME}",
            f"--kubeconfig={self.kubeconfig}",
            f"--kube-api-qps={PEER_QPS}",
            f"--kube-api-burst={PEER_QPS}",
        ]
        return command, dict(os.environ)

    def publish_failed(self) -> str:
        # The ResourceSlice controller logs a failed create (such as more than 128 devices in one
        # slice, which the example driver's single-slice pool asks for) and retries it forever.
        lines = [line for line in self.log_tail(50).splitlines() if 'err="create resource slice' in line]
        return lines[-1][:300] if lines else ""


FLOOR_NAME = "bare grpc.aio floor (bench/plugin_floor.py)"
IMPORTS_FLOOR_NAME = "the floor importing what ours imports, less its own (bench/plugin_floor.py --imports)"
IMPORT_TIME_PREFIX = "import time:"


def modules_imported(log: str) -> list[str]:
    """The modules outside the project that `-X importtime` lines in `log` name, in their order,
    once each (it prints one line per import attempt: `import time: self | cumulative | name`)."""
    seen: dict[str, None] = {}
    for line in log.splitlines():
        if not line.startswith(IMPORT_TIME_PREFIX):
            continue
        name = line.rsplit("|", 1)[-1].strip()
        if name and name != "imported package" and name.split(".", 1)[0] not in PROJECT_PACKAGES:
            seen[name] = None
    return list(seen)


def floor_run(root: Path, *, imports: Path | None = None, timeout_s: float = 60.0) -> tuple[float, float]:
    """Start bench/plugin_floor.py (with `imports`: importing the modules that file lists first),
    timed as the plugins are (spawn to both sockets), and return (seconds to sockets ready, RSS in
    MiB once they are); `floor_runs` for several starts."""
    root.mkdir(parents=True, exist_ok=True)
    registration, dra = root / "reg.sock", root / "dra.sock"
    for sock in (registration, dra):
        sock.unlink(missing_ok=True)
    listed = ["--imports", str(imports)] if imports is not None else []
    command = [sys.executable, "-m", "bench.plugin_floor", *listed, str(registration), str(dra)]
    compile_bytecode()
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT)
    try:
        while not (registration.exists() and dra.exists()):
            if process.poll() is not None:
                raise RuntimeError(f"the floor script exited with {process.returncode}")
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError("the floor script's sockets did not appear")
            time.sleep(POLL_S)
        sockets_s = time.perf_counter() - started
        time.sleep(0.5)  # settle, as the plugins do before their RSS is read
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return sockets_s, int(line.split()[1]) / 1024
        raise RuntimeError("the floor script has no VmRSS")
    finally:
        process.terminate()
        process.wait(timeout=15)


def floor_runs(
    root: Path, starts: int, *, imports: Path | None = None, label: str = "floor"
) -> tuple[float, float]:
    """The median start to both sockets of `starts` floor starts, and the RSS of the first."""
    runs = [floor_run(root, imports=imports) for _ in range(max(1, starts))]
    print(f"  {label}, starts to sockets (s): {' '.join(f'{start:.3f}' for start, _ in runs)}")
    return statistics.median(start for start, _ in runs), runs[0][1]
