"""Settings of `draplugin run`: every flag has an environment-variable mirror; the flag wins.

All checks happen here, at start-up, so a bad value stops the daemon with one
clear message instead of failing later in the middle of serving.

Size: one table of every setting with its flag, variable and check; splitting it would hide one from
the others.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dracommon.drivername import DEFAULT_DRIVER_NAME, DriverNameError, check_driver_name
from dracommon.duration import parse_duration
from dracommon.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from dracommon.kubeversion import KubernetesVersion, VersionError, parse_kubernetes_version
from dracommon.logs import LOG_FORMATS, LOG_LEVELS
from draplugin.devices.coexistence import DEFAULT_DEVICE_PLUGIN_DIR, CoexistencePolicy
from draplugin.devices.healthpolicy import (
    DEFAULT_APPLICATION_XIDS,
    DEFAULT_FATAL_XIDS,
    DEFAULT_TAINT_EFFECT,
    TAINT_EFFECTS,
    HealthPolicy,
    Recovery,
    parse_xids,
)
from draplugin.devices.naming import NVIDIA_DRIVER_NAME, DeviceNaming
from draplugin.devices.shared import SharedGpus, UnlimitedShares
from draplugin.nodeidentity import node_name_problem

DEFAULT_KUBELET_ROOT_DIR: Final = "/var/lib/kubelet"
DEFAULT_STATE_DIR: Final = "/var/lib/draplugin"
DEFAULT_CDI_ROOT: Final = "/var/run/cdi"
DEFAULT_METRICS_PORT: Final = 8080
# --driver-capabilities' default: draplugin.cdi.driverlayout.DEFAULT_CAPABILITIES, spelled here so
# that the default and the names in it are checked without importing the layout module (and its
# ELF reader) before the kubelet plugin's sockets open; tests/unit/test_plugin_start_imports.py
# holds the two equal. Any other name is checked against driverlayout.CAPABILITIES.
DEFAULT_DRIVER_CAPABILITIES: Final = "compute,utility,video"
DEFAULT_CAPABILITY_NAMES: Final = frozenset(DEFAULT_DRIVER_CAPABILITIES.split(","))
# Where the TCP listeners bind unless told (`--healthcheck-address`, `--metrics-address`).
DEFAULT_LISTEN_ADDRESS: Final = "127.0.0.1"
BACKENDS: Final = ("nvml", "fake")
# Devices are re-read this often (and at once on NVML events that signal a change).
DEFAULT_REDISCOVER_INTERVAL: Final = "60s"
# A prepare waits this long for the API server at most: under the kubelet's 45 s deadline for
# NodePrepareResources, so the kubelet hears our specific error instead of its own timeout.
DEFAULT_PREPARE_API_DEADLINE: Final = "40s"
PREPARE_API_DEADLINE_MAX_S: Final = 600.0
DEFAULT_USAGE_SAMPLE_INTERVAL: Final = "10s"
DEFAULT_IDLE_THRESHOLD_PERCENT: Final = "5"
DEFAULT_IDLE_AFTER: Final = "30m"
# --device-status: auto writes status.devices only where the API server can narrow the plugin's
# grant to its own node and driver (resourceclaims/driver, Kubernetes 1.36+; see claimstatus).
DEVICE_STATUS_AUTO: Final = "auto"
DEVICE_STATUS_MODES: Final = (DEVICE_STATUS_AUTO, "on", "off")
# --device-metadata (KEP-5304, draplugin.prepare.metadata): auto is on wherever the kubelet mounts
# the files, which is every supported release (it passes the plugin's CDI devices on; it has no
# gate of its own for them); off writes none (and still removes what an earlier run wrote).
DEVICE_METADATA_MODES: Final = ("auto", "on", "off")

# Kubernetes limits: the node name's rule is draplugin.nodeidentity's, the driver
# name's (a subdomain of at most 63) dracommon.drivername's, the namespace's, Secret names'
# and the pod UID's (a safe file-name part) dracommon.kubenames'.


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the flag and its variable."""


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: its flag, its environment mirror, and its default (None: no default)."""

    flag: str
    env: str
    default: str | None
    help: str
    # A switch: `--flag` alone means true; `--flag=false` and the variable take a value.
    boolean: bool = False

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


RUN_OPTIONS: Final = (
    Option("--driver-name", "DRIVER_NAME", DEFAULT_DRIVER_NAME, "DRA driver name (DNS subdomain, <= 63)"),
    # draplugin.devices.naming; docs/monitoring-agents.md says what tools read.
    Option(
        "--device-naming",
        "DEVICE_NAMING",
        DeviceNaming.DRAPLUGIN.value,
        "device names: draplugin (ours), or nvidia (NVIDIA's DRA driver's, for monitoring tools that "
        "know only it; needs --driver-name=gpu.nvidia.com and refuses a node where that driver runs)",
    ),
    Option("--node-name", "NODE_NAME", None, "name of the Node this plugin runs on (required)"),
    Option("--kubelet-root-dir", "KUBELET_ROOT_DIR", DEFAULT_KUBELET_ROOT_DIR, "the kubelet's --root-dir"),
    Option("--state-dir", "STATE_DIR", DEFAULT_STATE_DIR, "directory for the plugin's checkpoint"),
    Option("--cdi-root", "CDI_ROOT", DEFAULT_CDI_ROOT, "directory for generated CDI specs"),
    Option("--backend", "BACKEND", "nvml", "device discovery backend: nvml or fake"),
    Option("--kubeconfig", "KUBECONFIG", None, "kubeconfig file (default: in-cluster, then ~/.kube/config)"),
    Option("--log-format", "LOG_FORMAT", "text", "log line format: text or json"),
    Option("--log-level", "LOG_LEVEL", "info", "debug, info, warning or error"),
    Option("--metrics-port", "METRICS_PORT", str(DEFAULT_METRICS_PORT), "Prometheus port; 0 disables"),
    Option("--pod-uid", "POD_UID", None, "this pod's UID, for per-pod sockets during rolling updates"),
    Option("--healthcheck-port", "HEALTHCHECK_PORT", None, "TCP port for gRPC liveness; 0/unset disables"),
    # Under host networking both ports are the node's: one address, never every one by default.
    Option(
        "--healthcheck-address",
        "HEALTHCHECK_ADDRESS",
        DEFAULT_LISTEN_ADDRESS,
        "IP address the gRPC liveness port binds (the chart: the pod's IP, where the kubelet probes)",
    ),
    Option(
        "--metrics-address",
        "METRICS_ADDRESS",
        DEFAULT_LISTEN_ADDRESS,
        "IP address the Prometheus port binds (the chart: the pod's IP, where scrapers connect)",
    ),
    Option(
        "--delete-slices-on-shutdown",
        "DELETE_SLICES_ON_SHUTDOWN",
        "false",
        "delete this node's ResourceSlices on exit (off: a restart keeps them, so scheduling goes on)",
        boolean=True,
    ),
    # The fake backend's variable names are the chart's (DRAPLUGIN_FAKE_CONFIG).
    Option("--fake-gpus", "DRAPLUGIN_FAKE_GPUS", None, "fake backend: number of identical fake GPUs"),
    Option("--fake-model", "DRAPLUGIN_FAKE_MODEL", None, "fake backend: model of the --fake-gpus GPUs"),
    Option("--fake-config", "DRAPLUGIN_FAKE_CONFIG", None, "fake backend: YAML file describing the GPUs"),
    Option(
        "--fake-fault-file",
        "DRAPLUGIN_FAKE_FAULT_FILE",
        None,
        "fake backend: YAML `device: xid` file of injected faults (default <state-dir>/fake-faults.yaml)",
    ),
    Option(
        "--fake-device-dir",
        "DRAPLUGIN_FAKE_DEVICE_DIR",
        None,
        "fake backend: host directory for the fake GPUs' device nodes (default <state-dir>/fake-dev)",
    ),
    Option("--nvml-lib-path", "NVML_LIB_PATH", None, "nvml backend: libnvidia-ml.so.1 or the driver root"),
    Option(
        "--partitionable-mig",
        "PARTITIONABLE_MIG",
        "false",
        "publish MIG-capable GPUs as partitionable (every MIG placement, shared counters); prepare "
        "creates the allocated MIG device and unprepare destroys it",
        boolean=True,
    ),
    Option(
        "--shared-gpus",
        "SHARED_GPUS",
        SharedGpus.OFF.value,
        "publish whole GPUs for several claims at once (consumable capacity; prepare enforces each "
        "claim's share through its own MPS daemon): off, memory, or memory-and-compute",
    ),
    Option(
        "--nvidia-cdi-hook-path",
        "NVIDIA_CDI_HOOK_PATH",
        None,
        "nvml backend, shared GPUs: NVIDIA's nvidia-cdi-hook on the host (Container Toolkit 1.20+); "
        "each share's CDI device runs its apply-cuda-memory-limits, which sets the driver's "
        "per-cgroup memory limit for the container. The plugin checks the same path in its own view",
    ),
    Option(
        "--unlimited-shares",
        "UNLIMITED_SHARES",
        UnlimitedShares.SKIP.value,
        "nvml backend, shared GPUs whose shares' memory the driver cannot limit (no hook, cgroup v1, "
        "NVML NOT_SUPPORTED): skip publishes such a GPU whole; publish shares it with "
        "sharedMemoryLimit: none",
    ),
    Option(
        "--driver-root",
        "DRIVER_ROOT",
        None,
        "host directory of the NVIDIA driver install whose files CUDA containers get (/, or "
        "/run/nvidia/driver with the GPU Operator); default / for nvml, none for fake",
    ),
    Option(
        "--driver-root-mount",
        "DRIVER_ROOT_MOUNT",
        None,
        "where this process sees --driver-root (the chart mounts it at /driver-root); default: the same path",
    ),
    Option(
        "--driver-capabilities",
        "DRIVER_CAPABILITIES",
        DEFAULT_DRIVER_CAPABILITIES,
        "which of the driver root's files CUDA containers get, as NVIDIA_DRIVER_CAPABILITIES names them: "
        "a comma-separated list of compute, utility, video, graphics (EGL, GLX, Vulkan), or all",
    ),
    Option(
        "--mps-daemon",
        "MPS_DAEMON",
        "process",
        "where a claim's MPS control daemon runs: process (a detached process of the plugin; outside "
        "Kubernetes, ends with a container) or pod (a Pod per claim on this node that outlives plugin "
        "restarts; the chart's default, needs --mps-daemon-image and --pod-namespace)",
    ),
    Option("--mps-daemon-image", "MPS_DAEMON_IMAGE", None, "--mps-daemon=pod: the daemon Pods' image (ours)"),
    Option(
        "--mps-daemon-image-pull-policy",
        "MPS_DAEMON_IMAGE_PULL_POLICY",
        "IfNotPresent",
        "--mps-daemon=pod: the daemon Pods' imagePullPolicy (Always, IfNotPresent, Never)",
    ),
    Option(
        "--mps-daemon-image-pull-secrets",
        "MPS_DAEMON_IMAGE_PULL_SECRETS",
        None,
        "--mps-daemon=pod: the daemon Pods' imagePullSecrets, comma-separated Secret names (the chart's)",
    ),
    Option(
        "--mps-shm-size",
        "MPS_SHM_SIZE",
        None,
        "size of each MPS claim's shared-memory tmpfs (its /dev/shm), a quantity such as 8Gi; default: "
        "half the node's memory (as NVIDIA's driver); 0: a plain directory on the state dir (a plugin "
        "that may not mount)",
    ),
    Option(
        "--pod-namespace",
        "POD_NAMESPACE",
        None,
        "the plugin's namespace (--mps-daemon=pod creates Pods there)",
    ),
    Option(
        "--rediscover-interval",
        "REDISCOVER_INTERVAL",
        DEFAULT_REDISCOVER_INTERVAL,
        "how often devices are read again (MIG changes, GPUs lost or back), e.g. 60s; 0: only on NVML events",
    ),
    Option(
        "--health-application-xids",
        "HEALTH_APPLICATION_XIDS",
        ",".join(map(str, sorted(DEFAULT_APPLICATION_XIDS))),
        "XIDs caused by applications, which taint nothing (comma-separated; empty: none)",
    ),
    Option(
        "--health-fatal-xids",
        "HEALTH_FATAL_XIDS",
        ",".join(map(str, sorted(DEFAULT_FATAL_XIDS))),
        "XIDs that taint with --health-taint-effect (others: NoSchedule), comma-separated",
    ),
    Option(
        "--health-taint-effect",
        "HEALTH_TAINT_EFFECT",
        DEFAULT_TAINT_EFFECT,
        "taint effect for fatal XIDs, double-bit ECC and lost GPUs: NoSchedule, or NoExecute (evicts pods)",
    ),
    Option(
        "--health-recovery",
        "HEALTH_RECOVERY",
        "on-reset",
        "when a device's taint goes: on-reset (it came back), after:<duration> (also when quiet "
        "that long), never",
    ),
    Option(
        "--prepare-api-deadline",
        "PREPARE_API_DEADLINE",
        DEFAULT_PREPARE_API_DEADLINE,
        "longest a prepare waits for the API server (retrying within it), e.g. 40s; "
        "the kubelet's own deadline for the call wins when sooner",
    ),
    Option(
        "--kubernetes-version",
        "KUBERNETES_VERSION",
        None,
        "release of the API server (e.g. 1.34) whose ResourceSlice rules to follow; default: ask it",
    ),
    Option(
        "--device-status",
        "DEVICE_STATUS",
        DEVICE_STATUS_AUTO,
        "write status.devices (data and a Ready condition) on prepared claims: auto (on where the "
        "server narrows the grant to this node and driver, Kubernetes 1.36+), on, or off",
    ),
    Option(
        "--device-metadata",
        "DEVICE_METADATA",
        "auto",
        "write each prepared request's device metadata file (KEP-5304) and mount it into its "
        "containers: auto (on: every supported kubelet mounts it), on, or off",
    ),
    # Usage metrics and idle claims (draplugin.usage).
    Option(
        "--usage-sample-interval",
        "USAGE_SAMPLE_INTERVAL",
        DEFAULT_USAGE_SAMPLE_INTERVAL,
        "how often GPU usage is sampled for the per-device and per-claim metrics, e.g. 10s; 0 disables",
    ),
    Option(
        "--idle-threshold-percent",
        "IDLE_THRESHOLD_PERCENT",
        DEFAULT_IDLE_THRESHOLD_PERCENT,
        "a claim whose devices all stay below this utilization (0-100, time a kernel ran) for --idle-after "
        "is idle",
    ),
    Option(
        "--idle-after",
        "IDLE_AFTER",
        DEFAULT_IDLE_AFTER,
        "how long a claim must stay below --idle-threshold-percent to be reported idle (an Event), e.g. 30m",
    ),
    Option(
        "--usage-proc-root",
        "USAGE_PROC_ROOT",
        "/proc",
        "the node's /proc as this process sees it (the chart mounts it at /host/proc), to tie GPU "
        "processes to pods",
    ),
    Option(
        "--device-plugin-coexistence",
        "DEVICE_PLUGIN_COEXISTENCE",
        "refuse",
        "while an NVIDIA device plugin serves this node: refuse (publish no GPU), publish-tainted "
        "(publish with a NoSchedule device taint), or split:<GPU indexes> (publish only those)",
    ),
    Option(
        "--device-plugin-dir",
        "DEVICE_PLUGIN_DIR",
        DEFAULT_DEVICE_PLUGIN_DIR,
        "the kubelet's device plugin socket directory (fixed by the kubelet, whatever its --root-dir)",
    ),
)

FAKE_FAULT_FILE_NAME: Final = "fake-faults.yaml"
FAKE_DEVICE_DIR_NAME: Final = "fake-dev"
# Upper bound for --fake-gpus: a typo like 10000 should fail at start, not publish 79 slices.
FAKE_GPUS_MAX: Final = 1024
_TRUE: Final = ("true", "1", "yes", "on")
_FALSE: Final = ("false", "0", "no", "off")


@dataclass(frozen=True, slots=True)
class Settings:
    # A docstring of its own: without one, @dataclass builds one from the signature of its
    # 47-field __init__ (inspect.signature), a millisecond of the start before the sockets.
    """Every setting of `draplugin run`, checked (`validate`)."""

    driver_name: str
    node_name: str
    kubelet_root_dir: Path
    state_dir: Path
    cdi_root: Path
    backend: str
    kubeconfig: Path | None
    log_format: str
    log_level: str
    metrics_port: int
    pod_uid: str | None
    healthcheck_port: int | None
    healthcheck_address: str = DEFAULT_LISTEN_ADDRESS
    metrics_address: str = DEFAULT_LISTEN_ADDRESS
    delete_slices_on_shutdown: bool = False
    fake_gpus: int | None = None
    fake_model: str | None = None
    fake_config: Path | None = None
    fake_fault_file: Path | None = None
    fake_device_dir: Path | None = None
    nvml_lib_path: str | None = None
    # Dynamic MIG: devices for every MIG placement, created at prepare (draplugin.prepare.mig).
    partitionable_mig: bool = False
    # Shared whole GPUs: consumable memory (and compute), enforced through MPS (draplugin.devices.shared).
    shared_gpus: SharedGpus = SharedGpus.OFF
    # The hook that applies a share's memory limit, and what to do where it cannot (devices.shared).
    nvidia_cdi_hook_path: str | None = None
    unlimited_shares: UnlimitedShares = UnlimitedShares.SKIP
    # Device names (draplugin.devices.naming); nvidia goes with the driver name gpu.nvidia.com.
    device_naming: DeviceNaming = DeviceNaming.DRAPLUGIN
    # None: the API server's own release, read with GET /version.
    kubernetes_version: KubernetesVersion | None = None
    # status.devices on prepared claims (draplugin.prepare.claimstatus): auto, on or off.
    device_status: str = DEVICE_STATUS_AUTO
    # Device metadata files for containers (draplugin.prepare.metadata): auto, on or off.
    device_metadata: str = "auto"
    # The driver root on the host (paths in CDI specs) and where we read it; None: no driver files.
    driver_root: str | None = None
    driver_root_mount: Path | None = None
    # Which of the driver's files containers get (draplugin.cdi.driverlayout.CAPABILITIES).
    driver_capabilities: frozenset[str] = DEFAULT_CAPABILITY_NAMES
    # 0: no periodic re-discovery (NVML events still trigger one).
    rediscover_interval_s: float = 60.0
    prepare_api_deadline_s: float = 40.0
    health_policy: HealthPolicy = field(default_factory=HealthPolicy)
    # 0: no usage sampling (no per-device or per-claim usage metrics, no idle claims).
    usage_sample_interval_s: float = 10.0
    idle_threshold_percent: float = 5.0
    idle_after_s: float = 1800.0
    usage_proc_root: Path = Path("/proc")
    # Where MPS daemons run (draplugin.prepare.mps): "process", or "pod" with the image and namespace.
    mps_daemon: str = "process"
    mps_daemon_image: str | None = None
    mps_daemon_image_pull_policy: str = "IfNotPresent"
    mps_daemon_image_pull_secrets: tuple[str, ...] = ()
    # Bytes of each MPS claim's /dev/shm tmpfs; None: half the node's memory; 0: a plain directory.
    mps_shm_size: int | None = None
    pod_namespace: str | None = None
    # What to publish while an NVIDIA device plugin serves the node (devices.deviceplugin_guard).
    device_plugin_coexistence: CoexistencePolicy = field(default_factory=CoexistencePolicy)
    device_plugin_dir: Path = Path(DEFAULT_DEVICE_PLUGIN_DIR)

    def backend_options(self) -> dict[str, object]:
        """Keyword options for `draplugin.devices.load_backend(self.backend, ...)`."""
        options: dict[str, object] = {}
        if self.backend == "fake":
            if self.fake_config is not None:
                options["config_file"] = str(self.fake_config)
            if self.fake_gpus is not None:
                options["gpus"] = self.fake_gpus
            if self.fake_model is not None:
                options["model"] = self.fake_model
            # The runtime injects these nodes from the host: a path the host sees (a hostPath in the chart).
            options["device_dir"] = str(self.fake_device_dir or self.state_dir / FAKE_DEVICE_DIR_NAME)
        elif self.nvml_lib_path is not None:
            options["lib_path"] = self.nvml_lib_path
        if self.partitionable_mig:
            options["partitionable"] = True
        if self.shared_gpus is not SharedGpus.OFF:
            options["shared_gpus"] = self.shared_gpus
            if self.backend == "nvml":
                options["nvidia_cdi_hook_path"] = self.nvidia_cdi_hook_path
                options["unlimited_shares"] = self.unlimited_shares
        if self.device_naming is not DeviceNaming.DRAPLUGIN:
            options["naming"] = self.device_naming
        return options

    @property
    def fault_file(self) -> Path | None:
        """Where the fake backend reads injected faults; None for real hardware."""
        if self.backend != "fake":
            return None
        return self.fake_fault_file or self.state_dir / FAKE_FAULT_FILE_NAME


def resolve(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> dict[str, str | None]:
    """Pick each option's raw value: flag, else non-empty environment variable, else default.

    An empty environment variable counts as unset: Kubernetes manifests often
    set a variable from a field that can be empty.
    """
    values: dict[str, str | None] = {}
    for option in RUN_OPTIONS:
        flag_value = flags.get(option.dest)
        if flag_value is not None:
            values[option.dest] = flag_value
        elif environ.get(option.env):
            values[option.dest] = environ[option.env]
        else:
            values[option.dest] = option.default
    return values


def _name_of(dest: str) -> str:
    option = next(o for o in RUN_OPTIONS if o.dest == dest)
    return f"{option.flag} ({option.env})"


def _port(dest: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{_name_of(dest)}: {port} is outside 0-65535")
    return port


def _ip_address(dest: str, raw: str) -> str:
    """An IPv4 or IPv6 address literal, as the listener binds it (no names: nothing to resolve)."""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not an IP address") from None


def _absolute_dir(dest: str, raw: str) -> Path:
    path = Path(raw)
    if not path.is_absolute():
        raise ConfigError(f"{_name_of(dest)}: {raw!r} must be an absolute path")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{_name_of(dest)}: {raw} exists and is not a directory")
    return path


def _choice(dest: str, raw: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not one of {', '.join(choices)}")
    return raw


def _object_name(dest: str, raw: str, problem: Callable[[str], str | None]) -> str:
    """`raw` if it is a valid name by `problem` (a `dracommon.kubenames` rule), else why not."""
    why = problem(raw)
    if why is not None:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} {why}")
    return raw


def _node_name(raw: str) -> str:
    problem = node_name_problem(raw)  # the one check of a node name (draplugin.nodeidentity)
    if problem is not None:
        raise ConfigError(f"{_name_of('node_name')}: {problem}")
    return raw


def _driver_name(raw: str) -> str:
    try:
        return check_driver_name(raw)
    except DriverNameError as err:
        raise ConfigError(f"{_name_of('driver_name')}: {err}") from None


def device_naming_setting(values: Mapping[str, str | None], driver_name: str) -> DeviceNaming:
    """NVIDIA's names go with NVIDIA's driver name and only with it: a tool that finds
    `gpu.nvidia.com` expects NVIDIA's names, and NVIDIA's names under our driver name reach no tool."""
    naming = DeviceNaming(
        _choice(
            "device_naming", values.get("device_naming") or DeviceNaming.DRAPLUGIN.value, tuple(DeviceNaming)
        )
    )
    if (naming is DeviceNaming.NVIDIA) != (driver_name == NVIDIA_DRIVER_NAME):
        raise ConfigError(
            f"{_name_of('device_naming')}={naming.value} with {_name_of('driver_name')}={driver_name}: "
            f"NVIDIA's device names go with the driver name {NVIDIA_DRIVER_NAME} and only with it "
            f"(both, or neither)"
        )
    return naming


def _boolean(dest: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{_name_of(dest)}: {raw!r} is not a boolean (true or false)")


def _count(dest: str, raw: str, maximum: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not a whole number") from None
    if not 1 <= value <= maximum:
        raise ConfigError(f"{_name_of(dest)}: {value} is outside 1-{maximum}")
    return value


@dataclass(frozen=True, slots=True)
class _BackendSettings:
    """The backend-specific settings, checked against the backend (`_backend_settings`)."""

    fake_gpus: int | None
    fake_model: str | None
    fake_config: Path | None
    fake_fault_file: Path | None
    fake_device_dir: Path | None
    nvml_lib_path: str | None


def _absolute_path_or_none(dest: str, raw: str | None) -> str | None:
    if not raw:
        return None
    if not raw.startswith("/"):
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not an absolute path")
    return raw


def _backend_settings(values: Mapping[str, str | None], backend: str) -> _BackendSettings:
    """The backend-specific settings, checked against the chosen backend and each other."""
    fake = {dest: values.get(dest) or None for dest in ("fake_gpus", "fake_model", "fake_config")}
    fake["fake_fault_file"] = values.get("fake_fault_file") or None
    fake["fake_device_dir"] = values.get("fake_device_dir") or None
    nvml_lib_path = values.get("nvml_lib_path") or None
    if backend != "fake":
        given = [dest for dest, raw in fake.items() if raw is not None]
        if given:
            raise ConfigError(f"{_name_of(given[0])} only applies to --backend fake (BACKEND=fake)")
    elif nvml_lib_path is not None:
        raise ConfigError(f"{_name_of('nvml_lib_path')} only applies to --backend nvml")
    if fake["fake_config"] is not None and (fake["fake_gpus"] or fake["fake_model"]):
        other = "fake_gpus" if fake["fake_gpus"] else "fake_model"
        raise ConfigError(
            f"{_name_of('fake_config')} and {_name_of(other)} exclude each other: the file describes the GPUs"
        )
    fake_config = Path(fake["fake_config"]) if fake["fake_config"] else None
    if fake_config is not None and not fake_config.is_file():
        raise ConfigError(f"{_name_of('fake_config')}: {fake_config} is not a readable file")
    fault_file = Path(fake["fake_fault_file"]) if fake["fake_fault_file"] else None
    if fault_file is not None and not fault_file.is_absolute():
        raise ConfigError(f"{_name_of('fake_fault_file')}: {str(fault_file)!r} must be an absolute path")
    device_dir = Path(fake["fake_device_dir"]) if fake["fake_device_dir"] else None
    if device_dir is not None:
        _absolute_dir("fake_device_dir", str(device_dir))
    return _BackendSettings(
        fake_gpus=_count("fake_gpus", fake["fake_gpus"], FAKE_GPUS_MAX) if fake["fake_gpus"] else None,
        fake_model=fake["fake_model"],
        fake_config=fake_config,
        fake_fault_file=fault_file,
        fake_device_dir=device_dir,
        nvml_lib_path=nvml_lib_path,
    )


def driver_capabilities_setting(raw: str | None) -> frozenset[str]:
    """`compute,utility,video` (the default), `all`, or a list of CAPABILITIES; never empty."""
    if raw is None or not raw.strip():
        return DEFAULT_CAPABILITY_NAMES
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if DEFAULT_CAPABILITY_NAMES.issuperset(names):
        return frozenset(names)  # known names: the layout module is not needed to check them
    from draplugin.cdi.driverlayout import CAPABILITIES

    if "all" in names:
        return frozenset(CAPABILITIES)
    unknown = [name for name in names if name not in CAPABILITIES]
    if unknown:
        raise ConfigError(
            f"{_name_of('driver_capabilities')}: {', '.join(map(repr, unknown))} not known "
            f"(known: {', '.join(CAPABILITIES)}, all)"
        )
    return frozenset(names)


def driver_root_setting(values: Mapping[str, str | None], backend: str) -> tuple[str | None, Path | None]:
    """Real GPUs need the driver's files in containers (default `/`); fake ones only when asked."""
    raw = values.get("driver_root") or ("/" if backend == "nvml" else None)
    mount_raw = values.get("driver_root_mount") or None
    if raw is None:
        if mount_raw is not None:
            raise ConfigError(f"{_name_of('driver_root_mount')} needs {_name_of('driver_root')}")
        return None, None
    if not raw.startswith("/"):
        raise ConfigError(f"{_name_of('driver_root')}: {raw!r} must be an absolute path")
    # Not required to exist yet: the GPU Operator fills it after we start; prepare reports it.
    return raw, _absolute_dir("driver_root_mount", mount_raw or raw)


def health_policy_setting(values: Mapping[str, str | None]) -> HealthPolicy:
    """The `--health-*` settings as one policy; the XID sets must not overlap."""

    def xids(dest: str) -> frozenset[int]:
        try:
            return parse_xids(values.get(dest) or "")
        except ValueError as err:
            raise ConfigError(f"{_name_of(dest)}: {err}") from None

    application, fatal = xids("health_application_xids"), xids("health_fatal_xids")
    both = sorted(application & fatal)
    if both:
        raise ConfigError(
            f"{_name_of('health_application_xids')} and {_name_of('health_fatal_xids')} both list "
            f"XID {', '.join(map(str, both))}: an XID is either the application's or fatal"
        )
    effect = _choice(
        "health_taint_effect", values.get("health_taint_effect") or DEFAULT_TAINT_EFFECT, TAINT_EFFECTS
    )
    try:
        recovery = Recovery.parse(values.get("health_recovery") or "on-reset")
    except ValueError as err:
        raise ConfigError(f"{_name_of('health_recovery')}: {err}") from None
    return HealthPolicy(application, fatal, effect, recovery)  # type: ignore[arg-type]


def coexistence_setting(values: Mapping[str, str | None]) -> CoexistencePolicy:
    try:
        return CoexistencePolicy.parse(values.get("device_plugin_coexistence") or "refuse")
    except ValueError as err:
        raise ConfigError(f"{_name_of('device_plugin_coexistence')}: {err}") from None


MPS_DAEMON_MODES: Final = ("process", "pod")
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")


def mps_daemon_setting(values: Mapping[str, str | None]) -> tuple[str, str | None, str, str | None]:
    """(mode, image, pull policy, namespace): the pod mode needs the image and the namespace."""
    mode = _choice("mps_daemon", values.get("mps_daemon") or "process", MPS_DAEMON_MODES)
    image = values.get("mps_daemon_image") or None
    policy = _choice(
        "mps_daemon_image_pull_policy",
        values.get("mps_daemon_image_pull_policy") or "IfNotPresent",
        PULL_POLICIES,
    )
    namespace = values.get("pod_namespace") or None
    if namespace is not None:
        # A namespace is a DNS label: no dots, which a subdomain would let through.
        namespace = _object_name("pod_namespace", namespace, dns_label_problem)
    if mode == "pod":
        for dest, value in (("mps_daemon_image", image), ("pod_namespace", namespace)):
            if value is None:
                raise ConfigError(f"{_name_of('mps_daemon')}=pod needs {_name_of(dest)}")
    return mode, image, policy, namespace


def _size(dest: str, raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    from dracommon.quantity import parse_quantity

    try:
        value = parse_quantity(raw).value()
    except ValueError as err:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not a quantity: {err}") from None
    if value < 0:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} must not be negative")
    return int(value)


def _interval(dest: str, raw: str) -> float:
    try:
        return parse_duration(raw)
    except ValueError as err:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} {err}") from None


def _percent(dest: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} is not a number") from None
    if not 0 <= value <= 100:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} must be from 0 to 100")
    return value


def _deadline(dest: str, raw: str, maximum: float) -> float:
    seconds = _interval(dest, raw)
    if not 0 < seconds <= maximum:
        raise ConfigError(f"{_name_of(dest)}: {raw!r} must be more than 0 and at most {maximum:g}s")
    return seconds


def validate(values: Mapping[str, str | None]) -> Settings:
    """Turn resolved raw values into `Settings`, or raise `ConfigError` naming the bad setting."""

    def required(dest: str) -> str:
        raw = values.get(dest)
        if raw is None or raw == "":
            raise ConfigError(f"{_name_of(dest)} is required")
        return raw

    kubeconfig_raw = values.get("kubeconfig")
    kubeconfig = Path(kubeconfig_raw) if kubeconfig_raw else None
    if kubeconfig is not None and not kubeconfig.is_file():
        raise ConfigError(f"{_name_of('kubeconfig')}: {kubeconfig} is not a readable file")

    pod_uid = values.get("pod_uid") or None
    if pod_uid is not None and (why := uid_problem(pod_uid)) is not None:
        raise ConfigError(f"{_name_of('pod_uid')}: {pod_uid!r} is not a valid pod UID: it {why}")

    health_raw = values.get("healthcheck_port")
    healthcheck_port = _port("healthcheck_port", health_raw) if health_raw else 0

    backend = _choice("backend", required("backend"), BACKENDS)
    chosen = _backend_settings(values, backend)
    delete_raw = values.get("delete_slices_on_shutdown") or "false"
    version_raw = values.get("kubernetes_version") or None
    try:
        kubernetes_version = parse_kubernetes_version(version_raw) if version_raw else None
    except VersionError as err:
        raise ConfigError(f"{_name_of('kubernetes_version')}: {err}") from None

    driver_root, driver_root_mount = driver_root_setting(values, backend)
    mps_mode, mps_image, mps_pull_policy, pod_namespace = mps_daemon_setting(values)
    driver_name = _driver_name(required("driver_name"))
    return Settings(
        driver_name=driver_name,
        device_naming=device_naming_setting(values, driver_name),
        node_name=_node_name(required("node_name")),
        kubelet_root_dir=_absolute_dir("kubelet_root_dir", required("kubelet_root_dir")),
        state_dir=_absolute_dir("state_dir", required("state_dir")),
        cdi_root=_absolute_dir("cdi_root", required("cdi_root")),
        backend=backend,
        kubeconfig=kubeconfig,
        log_format=_choice("log_format", required("log_format"), LOG_FORMATS),
        log_level=_choice("log_level", required("log_level"), LOG_LEVELS),
        metrics_port=_port("metrics_port", required("metrics_port")),
        pod_uid=pod_uid,
        healthcheck_port=healthcheck_port or None,
        healthcheck_address=_ip_address("healthcheck_address", required("healthcheck_address")),
        metrics_address=_ip_address("metrics_address", required("metrics_address")),
        delete_slices_on_shutdown=_boolean("delete_slices_on_shutdown", delete_raw),
        partitionable_mig=_boolean("partitionable_mig", values.get("partitionable_mig") or "false"),
        shared_gpus=SharedGpus(
            _choice("shared_gpus", values.get("shared_gpus") or SharedGpus.OFF.value, tuple(SharedGpus))
        ),
        nvidia_cdi_hook_path=_absolute_path_or_none(
            "nvidia_cdi_hook_path", values.get("nvidia_cdi_hook_path")
        ),
        unlimited_shares=UnlimitedShares(
            _choice(
                "unlimited_shares",
                values.get("unlimited_shares") or UnlimitedShares.SKIP.value,
                tuple(UnlimitedShares),
            )
        ),
        fake_gpus=chosen.fake_gpus,
        fake_model=chosen.fake_model,
        fake_config=chosen.fake_config,
        fake_fault_file=chosen.fake_fault_file,
        fake_device_dir=chosen.fake_device_dir,
        nvml_lib_path=chosen.nvml_lib_path,
        kubernetes_version=kubernetes_version,
        device_status=_choice(
            "device_status", values.get("device_status") or DEVICE_STATUS_AUTO, DEVICE_STATUS_MODES
        ),
        device_metadata=_choice(
            "device_metadata", values.get("device_metadata") or "auto", DEVICE_METADATA_MODES
        ),
        driver_root=driver_root,
        driver_root_mount=driver_root_mount,
        driver_capabilities=driver_capabilities_setting(values.get("driver_capabilities")),
        rediscover_interval_s=_interval(
            "rediscover_interval", values.get("rediscover_interval") or DEFAULT_REDISCOVER_INTERVAL
        ),
        health_policy=health_policy_setting(values),
        usage_sample_interval_s=_interval(
            "usage_sample_interval", values.get("usage_sample_interval") or DEFAULT_USAGE_SAMPLE_INTERVAL
        ),
        idle_threshold_percent=_percent(
            "idle_threshold_percent", values.get("idle_threshold_percent") or DEFAULT_IDLE_THRESHOLD_PERCENT
        ),
        idle_after_s=_interval("idle_after", values.get("idle_after") or DEFAULT_IDLE_AFTER),
        usage_proc_root=_absolute_dir("usage_proc_root", values.get("usage_proc_root") or "/proc"),
        mps_daemon=mps_mode,
        mps_daemon_image=mps_image,
        mps_daemon_image_pull_policy=mps_pull_policy,
        mps_daemon_image_pull_secrets=tuple(
            _object_name("mps_daemon_image_pull_secrets", name.strip(), dns_subdomain_problem)
            for name in (values.get("mps_daemon_image_pull_secrets") or "").split(",")
            if name.strip()
        ),
        mps_shm_size=_size("mps_shm_size", values.get("mps_shm_size")),
        pod_namespace=pod_namespace,
        device_plugin_coexistence=coexistence_setting(values),
        device_plugin_dir=_absolute_dir(
            "device_plugin_dir", values.get("device_plugin_dir") or DEFAULT_DEVICE_PLUGIN_DIR
        ),
        prepare_api_deadline_s=_deadline(
            "prepare_api_deadline",
            values.get("prepare_api_deadline") or DEFAULT_PREPARE_API_DEADLINE,
            PREPARE_API_DEADLINE_MAX_S,
        ),
    )


def load(flags: Mapping[str, str | None], environ: Mapping[str, str] | None = None) -> Settings:
    return validate(resolve(flags, os.environ if environ is None else environ))
