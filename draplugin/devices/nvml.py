"""Real GPUs through NVML (`pynvml` from nvidia-ml-py). The only module that talks to NVML.

Discovery reads every GPU, its MIG profiles with their placements and (with
MIG on) the MIG devices that exist, into the backend-neutral `GpuInfo`
description; `draplugin.devices.schema` turns that into devices. The NVML
module is injectable so unit tests run the same code against a fake
(`tests/unit/fakenvml.py`) that reuses pynvml's real constants, ctypes
structures and error classes.

A missing or broken `libnvidia-ml.so.1` becomes one `NvmlUnavailableError`
that says which library was wanted, where it was looked for, and how to point
us at it (`--nvml-lib-path`: the library file or the driver root).

Size: one module on purpose: it is the only code that talks to NVML.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from draplugin.cdi.driverlayout import DriverRootError, host_arch
from draplugin.cdi.libdirs import find_library_file
from draplugin.devices.health import GPU_LOST_REASON, HealthTracker
from draplugin.devices.memlimit_probe import gpu_problem, node_support
from draplugin.devices.mig import (
    MIG_ERROR,
    MIG_MODE_DISABLED,
    MIG_MODE_ENABLED,
    MIG_PLACEMENT_TAKEN,
    CreatedMig,
    MigOperationError,
    MigPlacement,
)
from draplugin.devices.model import CounterSet, Device
from draplugin.devices.naming import DeviceNaming
from draplugin.devices.schema import (
    MAX_NUMA_NODES,
    NVIDIA_CONTROL_NODES,
    DeviceNodeSpec,
    GpuInfo,
    MigInstance,
    MigProfile,
    SystemInfo,
    build_devices,
)
from draplugin.devices.shared import SharedGpus, UnlimitedShares, is_shared, with_memory_limit

log = logging.getLogger(__name__)

LIBRARY_NAME = "libnvidia-ml.so.1"
# The dynamic loader's own search order, for the error message when no path was given.
LOADER_SEARCH = "LD_LIBRARY_PATH, /etc/ld.so.cache, /lib, /usr/lib"

_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
# nvml.h nvmlBrandType_enum, named as NVIDIA's driver publishes them (go-nvlib GetBrandAsString).
_BRANDS = {
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
_ADDRESSING_MODES = {1: "HMM", 2: "ATS", 0: "None"}
# Hopper and later switch MIG mode without a GPU reset; Ampere only sets a pending mode.
_ARCH_HOPPER = 9
_ALL_GPU_INSTANCES = 0xFFFFFFFF
# XID 79: the GPU has fallen off the bus. Its devices are re-read at once.
XID_FALLEN_OFF_BUS = 79
# Error codes that mean a GPU which was there is gone (or the driver lost it), not a
# transient failure: its devices stay published with a `gpu-lost` taint until it answers again.
_LOST_ERRORS = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN", "NVML_ERROR_NOT_FOUND")
# Events that say the devices may have changed, besides XIDs; older libraries lack some.
_CHANGE_EVENTS = ("nvmlEventMigConfigChange", "nvmlEventTypeGpuUnavailableError")
_RECOVERY_EVENT = "nvmlEventTypeGpuRecoveryAction"
# GPU instance IDs are small (under 32 on every MIG GPU so far): probing them by ID avoids
# NVML's out-array of opaque handles and finds a bare GPU instance (no compute instance) too.
_MAX_GPU_INSTANCE_ID = 32


class NodeEventSink(Protocol):
    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None: ...


class NvmlUnavailableError(RuntimeError):
    """NVML cannot be used on this node; the message says why and what to do."""


def find_library(lib_path: str | None) -> str | None:
    """The library file to load, or None to let the dynamic loader search.

    `lib_path` may name the library file or a driver root directory. In a root,
    every link is resolved inside it (Debian's `libnvidia-ml.so.1` points at an
    absolute `/etc/alternatives/...`, which is the root's, not ours) and the
    directories searched are driver discovery's (`draplugin.cdi.libdirs`: the
    usual ones, `nvidia/current`, and the root's ld.so.cache and ld.so.conf).
    A directory named like the library (a broken host mount) is reported, not loaded.
    """
    if lib_path is None:
        return None
    path = Path(lib_path)
    if path.is_file():
        return str(path)
    if not path.exists():
        raise NvmlUnavailableError(f"NVML library path {lib_path} does not exist (--nvml-lib-path)")
    if path.name.startswith("libnvidia-ml"):
        raise NvmlUnavailableError(
            f"NVML library path {lib_path} is a directory, not the library file; "
            "the host path mounted into the container is probably missing on the host"
        )
    try:
        found, looked = find_library_file(path, LIBRARY_NAME, host_arch())
    except DriverRootError as err:  # a link loop, or a link out of the root, on the way
        raise NvmlUnavailableError(
            f"NVML library {LIBRARY_NAME} under driver root {lib_path}: {err}"
        ) from None
    if found is not None:
        return str(path / found.real)
    raise NvmlUnavailableError(
        f"NVML library {LIBRARY_NAME} not found under driver root {lib_path}; looked in: " + ", ".join(looked)
    )


def _import_pynvml() -> Any:
    import pynvml

    return pynvml


def normalize_bus_id(bus_id: str) -> str:
    """NVML's '00000000:18:00.0' → sysfs's '0000:18:00.0' (4-digit domain, lower case)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus_id.lower()


def pcie_root(sysfs_root: str, bus_id: str) -> str | None:
    """The PCIe root complex ('pci0000:00') of a device, from its sysfs path; None if unknown."""
    link = Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id
    try:
        resolved = Path(os.path.realpath(link))
    except OSError:
        return None
    for part in resolved.parts:
        if part.startswith("pci") and ":" in part:
            return part
    return None


def numa_node(sysfs_root: str, bus_id: str) -> int | None:
    """The NUMA node a PCI device is attached to, from sysfs `numa_node`; None if it has none.

    The kernel writes -1 for a device without NUMA affinity (single-socket
    machines, most VMs); like upstream's deviceattribute helper, that and an
    unreadable or out-of-range value mean "publish no numaNode", never a guess.
    """
    path = Path(sysfs_root) / "bus" / "pci" / "devices" / bus_id / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if 0 <= node < MAX_NUMA_NODES else None


class NvmlBackend:
    """Devices from NVML. Discovery runs at construction and on `refresh()`.

    A GPU that was discovered and then answers a per-device call with
    GPU_IS_LOST (or UNKNOWN / NOT_FOUND) keeps its devices, as last read, with a
    `gpu-lost` fault in the attached tracker; when it answers again the tracker
    hears it recovered. A GPU that NVML no longer counts at all is gone: its
    devices leave the list.
    """

    def __init__(
        self,
        node_name: str,
        *,
        lib_path: str | None = None,
        partitionable: bool = False,
        shared_gpus: SharedGpus = SharedGpus.OFF,
        nvidia_cdi_hook_path: str | None = None,
        unlimited_shares: UnlimitedShares = UnlimitedShares.SKIP,
        naming: DeviceNaming = DeviceNaming.DRAPLUGIN,
        sysfs_root: str = "/sys",
        proc_root: str = "/proc",
        mounts_file: str = "/proc/self/mounts",
        nvml: Any = None,
    ) -> None:
        self._node_name = node_name
        self._partitionable = partitionable
        self._shared_gpus = shared_gpus
        # Shares get the driver's per-cgroup memory limit through this hook (memlimit_probe).
        self._hook_path = nvidia_cdi_hook_path
        self._unlimited_shares = unlimited_shares
        self._mounts_file = mounts_file
        self._naming = naming
        self._sysfs_root = sysfs_root
        self._proc_root = proc_root
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._init(lib_path)
        self._lock = threading.Lock()
        self._devices: list[Device] = []
        self._counter_sets: list[CounterSet] = []
        # (parent UUID, GPU instance id) → device name, for routing health events.
        self._by_instance: dict[tuple[str, int], str] = {}
        self._by_parent: dict[str, list[str]] = {}
        self._gpus: list[GpuInfo] = []
        self._system: SystemInfo | None = None
        self._lost: set[str] = set()  # UUIDs of GPUs kept from an earlier read: NVML lost them
        self._health: HealthTracker | None = None
        # Called with (device names, xid) for every XID event, application XIDs too (usage metrics).
        self._xid_listeners: list[Callable[[list[str], int], None]] = []
        self._generation = 0  # bumped when the GPUs change: the event monitor registers new ones
        self._refresh_lock = threading.Lock()
        # Where problems an admin must fix go as Node Events (`attach_events`); until then, held.
        self._events: NodeEventSink | None = None
        self._notices: dict[str, tuple[str, str]] = {}  # GPU UUID → (reason, note), current problems
        self._posted: set[tuple[str, str]] = set()  # (UUID, reason) already posted while it lasts
        # One lock per GPU around MIG mode switches, creates and destroys: 64 claims prepare at
        # once, and one claim's switch-off must never land between another's switch-on and create.
        self._mig_locks: dict[str, threading.Lock] = {}
        self._mig_locks_guard = threading.Lock()
        self.refresh()

    @property
    def name(self) -> str:
        return "nvml"

    def discover(self) -> list[Device]:
        with self._lock:
            return list(self._devices)

    def shared_counters(self) -> list[CounterSet]:
        with self._lock:
            return list(self._counter_sets)

    def add_xid_listener(self, listener: Callable[[list[str], int], None]) -> None:
        """`listener(device names, xid)` runs on the event watch's thread for every XID event."""
        self._xid_listeners.append(listener)

    @property
    def nvml(self) -> Any:
        """The initialised pynvml module, for other readers of the same GPUs (usage sampling)."""
        return self._nvml

    def attach_health(self, tracker: HealthTracker) -> None:
        """Where lost and recovered GPUs found by `refresh` are reported."""
        self._health = tracker

    def attach_events(self, sink: NodeEventSink) -> None:
        """Where discovery problems an admin must fix (a GPU in MIG mode without MIG devices) go
        as Node Events; those found before are posted now."""
        self._events = sink
        self._post_notices()

    def driver_version(self) -> str | None:
        """The driver's own version string, as NVML gives it ("550.135", "580.95.05"): what the
        driver's library files are named after. The published `driverVersion` is the semver form
        ("550.135.0"), which names no file."""
        with self._lock:
            return self._system.driver_version if self._system is not None else None

    def refresh(self) -> bool:
        """Re-read the hardware (a MIG layout change, a GPU lost or back). True if the devices changed."""
        with self._refresh_lock:
            return self._refresh()

    def _refresh(self) -> bool:
        system, gpus, lost = self._read_all()
        try:
            devices, counter_sets = build_devices(
                system, gpus, partitionable=self._partitionable, shared=self._shared_gpus, naming=self._naming
            )
        except ValueError as err:
            # Hardware in a state we cannot describe (mid MIG reconfiguration): keep the last list.
            if self._system is None:
                raise
            log.error(
                "nvml re-discovery gave invalid devices, keeping the last ones", extra={"error": str(err)}
            )
            return False
        devices, limit_notices = self._mark_memory_limits(devices, gpus)
        by_parent: dict[str, list[str]] = {}
        by_instance: dict[tuple[str, int], str] = {}
        for gpu in gpus:
            names = [d.name for d in devices if d.uuid == gpu.uuid or d.parent_uuid == gpu.uuid]
            by_parent[gpu.uuid] = names
        for device in devices:
            gi = _gi_of(device, gpus)
            if device.parent_uuid is not None and gi is not None:
                by_instance[(device.parent_uuid, gi)] = device.name
        with self._lock:
            changed = devices != self._devices or counter_sets != self._counter_sets
            gpus_changed = [g.uuid for g in gpus] != [g.uuid for g in self._gpus]
            self._devices, self._counter_sets = devices, counter_sets
            self._by_parent, self._by_instance = by_parent, by_instance
            self._gpus, self._system = gpus, system
            if gpus_changed:
                self._generation += 1
            back, self._lost = self._lost - lost, lost
        if changed:
            log.info(
                "nvml discovery done", extra={"gpus": len(gpus), "devices": len(devices), "lost": len(lost)}
            )
        self._report_lost(lost, back, by_parent)
        self._note_problems(gpus, lost, limit_notices)
        return changed

    def _mark_memory_limits(
        self, devices: list[Device], gpus: list[GpuInfo]
    ) -> tuple[list[Device], dict[str, tuple[str, str]]]:
        """Each shared GPU marked with whether its shares' memory gets the driver's limit; one
        without it unshared or marked, by --unlimited-shares, with a notice saying why."""
        shared = [d for d in devices if is_shared(d)]
        if not shared:
            return devices, {}
        node = node_support(self._hook_path, self._mounts_file).problem
        problems: dict[str, str | None] = {}
        for device in shared:
            problem = node
            if problem is None:
                try:
                    handle = self._nvml.nvmlDeviceGetHandleByUUID(device.uuid)
                except self._nvml.NVMLError as err:
                    problem = f"the GPU's handle cannot be read ({err})"
                else:
                    problem = gpu_problem(self._nvml, handle)
            problems[device.uuid] = problem
        notices: dict[str, tuple[str, str]] = {}
        by_uuid = {g.uuid: g for g in gpus}
        for uuid, problem in problems.items():
            if problem is None:
                continue
            gpu = by_uuid.get(uuid)
            what = f"GPU {gpu.index} ({uuid})" if gpu is not None else f"GPU {uuid}"
            if self._unlimited_shares is UnlimitedShares.SKIP:
                outcome = "is published whole, for one claim at a time (--unlimited-shares=skip)"
            else:
                outcome = (
                    "is published for shares with sharedMemoryLimit: none: nothing limits a share's "
                    "memory (--unlimited-shares=publish)"
                )
            notices[uuid] = ("SharedGpuMemoryNotLimited", f"{what} {outcome}: {problem}")
        marked = [
            with_memory_limit(d, problems[d.uuid] is None, self._unlimited_shares) if is_shared(d) else d
            for d in devices
        ]
        return marked, notices

    def _note_problems(
        self, gpus: list[GpuInfo], lost: set[str], extra: dict[str, tuple[str, str]] | None = None
    ) -> None:
        """Log and (once while it lasts) post what makes a GPU publish nothing without an error,
        and the shared GPUs whose shares' memory the driver does not limit (`extra`)."""
        notices: dict[str, tuple[str, str]] = dict(extra or {})
        for gpu in gpus:
            if gpu.uuid in lost or not gpu.mig_enabled or gpu.mig_instances:
                continue
            if self._partitionable and gpu.mig_profiles:
                continue  # partitionable: its MIG placements are published, created at prepare
            notices[gpu.uuid] = (
                "MigEnabledWithoutDevices",
                f"GPU {gpu.index} ({gpu.uuid}, {gpu.product_name}) is in MIG mode but has no MIG "
                "devices: nothing of it is published. Create MIG devices (nvidia-smi mig -cgi ... -C), "
                "turn MIG mode off (nvidia-smi -i <gpu> -mig 0), or run the plugin partitionable",
            )
        with self._lock:
            new = {u: n for u, n in notices.items() if self._notices.get(u) != n}
            self._notices = notices
            # A problem that went away may be posted again when it comes back.
            self._posted = {(u, r) for u, r in self._posted if notices.get(u, ("", ""))[0] == r}
        for note in new.values():
            log.warning("GPU needs attention", extra={"reason": note[0], "detail": note[1]})
        self._post_notices()

    def _post_notices(self) -> None:
        sink = self._events
        if sink is None:
            return
        with self._lock:
            due = [(u, r, n) for u, (r, n) in self._notices.items() if (u, r) not in self._posted]
            self._posted.update((u, r) for u, r, _ in due)
        for _, reason, note in due:
            try:
                sink.node_event(reason, note)
            except Exception:  # an Event must never stop discovery
                log.exception("posting a node event failed", extra={"reason": reason})

    def _report_lost(self, lost: set[str], back: set[str], by_parent: dict[str, list[str]]) -> None:
        tracker = self._health
        if tracker is None:
            return
        for uuid in sorted(lost):
            names = by_parent.get(uuid, [])
            tracker.report_unhealthy(
                names, tracker.policy.fatal_effect, GPU_LOST_REASON, f"NVML lost GPU {uuid}"
            )
        for uuid in sorted(back):
            tracker.report_recovered(by_parent.get(uuid, []), f"GPU {uuid} answers NVML again")

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError as err:
            log.debug("nvml shutdown failed", extra={"error": str(err)})

    # --- library ----------------------------------------------------------------------------------------

    def _init(self, lib_path: str | None) -> None:
        nvml = self._nvml
        library = find_library(lib_path)
        if library is not None:
            try:
                # pynvml loads libnvidia-ml.so.1 by soname unless a library is already set.
                nvml.nvmlLib = ctypes.CDLL(library)
            except OSError as err:
                raise NvmlUnavailableError(f"cannot load NVML library {library}: {err}") from err
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound as err:
            where = library if library is not None else f"the dynamic loader's search path ({LOADER_SEARCH})"
            raise NvmlUnavailableError(
                f"NVML library {LIBRARY_NAME} not found: looked in {where}. On a GPU node, mount the NVIDIA "
                "driver root into the plugin and pass --nvml-lib-path=<driver root or library file>; "
                "without GPUs use --backend fake"
            ) from err
        except nvml.NVMLError as err:
            raise NvmlUnavailableError(f"NVML initialisation failed ({LIBRARY_NAME}): {err}") from err

    # --- discovery --------------------------------------------------------------------------------------

    def _read_all(self) -> tuple[SystemInfo, list[GpuInfo], set[str]]:
        """The system, its GPUs, and the UUIDs of GPUs kept from the last read because NVML lost them."""
        nvml = self._nvml
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        system = SystemInfo(
            driver_version=_text(nvml.nvmlSystemGetDriverVersion()),
            cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
        )
        known = {gpu.index: gpu for gpu in self._gpus}
        lost_codes = {getattr(nvml, name) for name in _LOST_ERRORS if hasattr(nvml, name)}
        gpus: list[GpuInfo] = []
        lost: set[str] = set()
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                gpus.append(self._read_gpu(index))
            except nvml.NVMLError as err:
                before = self._known_gpu(index, known)
                if before is None:
                    # One broken GPU must not hide the healthy ones; never seen, it is not published.
                    log.error("skipping GPU that NVML cannot read", extra={"index": index, "error": str(err)})
                    continue
                # Seen before: keep it as last read rather than make its devices flap out of the slices.
                gpus.append(before)
                if getattr(err, "value", None) in lost_codes:
                    lost.add(before.uuid)
                    log.error("GPU lost", extra={"index": index, "uuid": before.uuid, "error": str(err)})
                else:
                    log.warning(
                        "GPU unreadable, keeping it as last read", extra={"index": index, "error": str(err)}
                    )
        return system, gpus, lost

    def _known_gpu(self, index: int, known: dict[int, GpuInfo]) -> GpuInfo | None:
        """The GPU at `index` as last read: by UUID if NVML still gives one, else by index."""
        nvml = self._nvml
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))
        except nvml.NVMLError:
            return known.get(index)
        return next((gpu for gpu in self._gpus if gpu.uuid == uuid), None)

    def _read_gpu(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        bus_id = normalize_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        major_cc, minor_cc = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        mig_capable, mig_enabled = self._mig_mode(handle)
        # Read with MIG mode off too: nvml.h answers NOT_SUPPORTED for profile info and placements
        # only where the GPU "doesn't support MIG" (placements "regardless of whether MIG is enabled").
        profiles = self._read_profiles(handle) if mig_capable else ()
        instances = self._read_instances(handle, minor, profiles) if mig_enabled else ()
        architecture = int(nvml.nvmlDeviceGetArchitecture(handle))
        return GpuInfo(
            index=int(nvml.nvmlDeviceGetIndex(handle)),
            minor=minor,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            product_name=_text(nvml.nvmlDeviceGetName(handle)),
            brand=_BRANDS.get(int(nvml.nvmlDeviceGetBrand(handle)), "Unknown"),
            architecture=_ARCHITECTURES.get(architecture, "Unknown"),
            cuda_compute_capability=(int(major_cc), int(minor_cc)),
            memory_bytes=self._memory_bytes(handle, index),
            addressing_mode=self._addressing_mode(handle),
            mig_switch_needs_reset=architecture < _ARCH_HOPPER,
            pci_bus_id=bus_id,
            pcie_root=pcie_root(self._sysfs_root, bus_id),
            numa_node=numa_node(self._sysfs_root, bus_id),
            device_nodes=(f"/dev/nvidia{minor}", *NVIDIA_CONTROL_NODES),
            mig_enabled=mig_enabled,
            mig_profiles=profiles,
            mig_instances=instances,
            memory_slice_count=max((s + p.memory_slices for p in profiles for s in p.placements), default=8),
        )

    def _memory_bytes(self, handle: Any, index: int) -> int | None:
        """The GPU's memory; None where NVML has none to report (unified memory: GB10 and other
        coherent parts answer NOT_SUPPORTED). NVIDIA's driver publishes such a GPU without a
        memory capacity, and so do we, rather than lose the GPU."""
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
        except nvml.NVMLError_NotSupported:
            log.warning(
                "GPU has no memory info (unified memory?): published without memory", extra={"index": index}
            )
            return None

    def _addressing_mode(self, handle: Any) -> str | None:
        """HMM or ATS on coherent-memory systems (NVIDIA's `addressingMode`); None where the
        platform or the library (older than 580) has none."""
        nvml = self._nvml
        try:
            return _ADDRESSING_MODES.get(int(nvml.nvmlDeviceGetAddressingMode(handle)))
        except (nvml.NVMLError, AttributeError):
            return None

    def _mig_mode(self, handle: Any) -> tuple[bool, bool]:
        """(MIG capable, MIG on now). The current mode is what counts: a pending one (Ampere,
        set but waiting for a reset) changes nothing until the reset."""
        nvml = self._nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError_NotSupported:
            return False, False
        return True, int(current) == nvml.NVML_DEVICE_MIG_ENABLE

    def _read_profiles(self, handle: Any) -> tuple[MigProfile, ...]:
        nvml = self._nvml
        profiles: dict[int, MigProfile] = {}
        for profile_index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            placements = self._placements(handle, int(info.id), int(info.instanceCount))
            if not placements:
                continue
            name = _text(info.name).removeprefix("MIG ").strip()
            profiles[int(info.id)] = MigProfile(
                name=name,
                memory_slices=placements[0][1],
                memory_bytes=int(info.memorySizeMB) << 20,
                multiprocessors=int(info.multiprocessorCount),
                copy_engines=int(info.copyEngineCount),
                decoders=int(info.decoderCount),
                encoders=int(info.encoderCount),
                jpeg_engines=int(info.jpegCount),
                ofa_engines=int(info.ofaCount),
                placements=tuple(start for start, _ in placements),
                profile_id=int(info.id),
                compute_slices=int(info.sliceCount),
            )
        return tuple(profiles[k] for k in sorted(profiles))

    def _placements(self, handle: Any, profile_id: int, max_count: int) -> list[tuple[int, int]]:
        nvml = self._nvml
        size = max(max_count, 8)
        array = (nvml.c_nvmlGpuInstancePlacement_t * size)()
        count = ctypes.c_uint(size)
        try:
            nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
        except nvml.NVMLError as err:
            log.debug("no placements", extra={"profile": profile_id, "error": str(err)})
            return []
        return sorted((int(array[i].start), int(array[i].size)) for i in range(count.value))

    def _read_instances(
        self, handle: Any, minor: int, profiles: tuple[MigProfile, ...]
    ) -> tuple[MigInstance, ...]:
        nvml = self._nvml
        by_id = {p.profile_id: p for p in profiles}
        instances: list[MigInstance] = []
        for k in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                # Holes are normal: not every slot holds a MIG device. Past the last one NVML
                # answers INVALID_ARGUMENT (nvml.h: the index is invalid), which is a hole too.
                continue
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
            ci = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
            gi_handle = nvml.nvmlDeviceGetGpuInstanceById(handle, gi)
            info = nvml.nvmlGpuInstanceGetInfo(gi_handle)
            profile = by_id.get(int(info.profileId))
            if profile is None:
                log.error("MIG device with unknown profile skipped", extra={"gpu_minor": minor, "gi": gi})
                continue
            part, part_start = self._compute_part(gi_handle, ci, profile)
            instances.append(
                MigInstance(
                    profile=part,
                    placement_start=int(info.placement.start),
                    uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                    gpu_instance_id=gi,
                    compute_instance_id=ci,
                    device_nodes=self._mig_caps(minor, gi, ci),
                    compute_slice_start=part_start,
                )
            )
        return tuple(instances)

    def _compute_part(self, gi_handle: Any, ci: int, profile: MigProfile) -> tuple[MigProfile, int | None]:
        """What one compute instance of a GPU instance offers, and where it starts in it.

        A compute instance spanning its GPU instance is the GPU instance's profile (start None).
        One of several ("1c.3g.40gb") is its own MIG device with its own UUID: its own
        multiprocessors and engine counts from its compute instance profile, the GPU instance's
        memory (shared by all its compute instances), and its start in the name.
        """
        nvml = self._nvml
        info = nvml.nvmlComputeInstanceGetInfo(nvml.nvmlGpuInstanceGetComputeInstanceById(gi_handle, ci))
        ci_profile = self._ci_profile(gi_handle, int(info.profileId))
        if ci_profile is None or not profile.compute_slices:
            return profile, None
        slices = int(ci_profile.sliceCount)
        if slices >= profile.compute_slices:
            return profile, None
        part = replace(
            profile,
            name=f"{slices}c.{profile.name}",
            multiprocessors=int(ci_profile.multiprocessorCount),
            copy_engines=int(ci_profile.sharedCopyEngineCount),
            decoders=int(ci_profile.sharedDecoderCount),
            encoders=int(ci_profile.sharedEncoderCount),
            jpeg_engines=int(ci_profile.sharedJpegCount),
            ofa_engines=int(ci_profile.sharedOfaCount),
        )
        return part, int(info.placement.start)

    def _ci_profile(self, gi_handle: Any, profile_id: int) -> Any:
        """The compute instance profile with this NVML ID, or None."""
        nvml = self._nvml
        for index in range(int(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8))):
            try:
                info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi_handle, index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nvml.NVMLError:
                continue
            if int(info.id) == profile_id:
                return info
        return None

    def _mig_caps(self, minor: int, gi: int, ci: int) -> tuple[str, ...]:
        """The nvidia-caps device nodes that grant access to one MIG device, from /proc.

        Each is a `DeviceNodeSpec` with the `nvidia-caps` major of `<proc>/devices` and the
        minor (`DeviceFileMinor`) and mode (`DeviceFileMode`, decimal) of its `access` file, as
        NVIDIA's DRA driver writes them: the node of a MIG device this plugin made exists in its
        own container's `/dev` only, so the runtime must make it from the numbers. Without the
        major (no such line) it is the bare path, and the runtime stats the host's node.
        """
        proc = Path(self._proc_root)
        base = proc / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
        major = None
        with contextlib.suppress(OSError):
            character = False
            for line in (proc / "devices").read_text(encoding="ascii", errors="replace").splitlines():
                if line.endswith(":"):
                    character = line.startswith("Character")  # "Character devices:", "Block devices:"
                    continue
                number, _, driver = line.strip().partition(" ")
                if character and driver.strip() == "nvidia-caps" and number.isdigit():
                    major = int(number)
        nodes: list[str] = []
        for access in (base / "access", base / f"ci{ci}" / "access"):
            try:
                text = access.read_text(encoding="ascii")
            except OSError:
                continue
            fields: dict[str, int] = {}
            for line in text.splitlines():
                key, _, value = line.partition(":")
                if value.strip().isdigit():
                    fields[key.strip()] = int(value)
            cap_minor = fields.get("DeviceFileMinor")
            if cap_minor is None:
                continue
            path = f"/dev/nvidia-caps/nvidia-cap{cap_minor}"
            mode = fields.get("DeviceFileMode")
            nodes.append(
                path
                if major is None
                else DeviceNodeSpec(path, major, cap_minor, None if mode is None else mode & 0o7777)
            )
        return tuple(nodes)

    # --- dynamic MIG (draplugin.devices.mig.MigPartitioner, MigModeSwitch) --------------------------

    def mig_check_free(self, placement: MigPlacement) -> None:
        nvml = self._nvml
        try:
            handle = self._mig_parent(placement, require_mig_mode=False)
            if not self._mig_mode(handle)[1]:
                if self._switch_needs_reset(handle):
                    raise self._mig_mode_off(placement)
                return  # MIG off: no GPU instance can exist; create switches the mode on
            size = self._placement_size(handle, placement)
            for gi_handle in self._gpu_instances(handle):
                info = nvml.nvmlGpuInstanceGetInfo(gi_handle)
                start, length = int(info.placement.start), int(info.placement.size)
                if start < placement.start + size and placement.start < start + length:
                    raise MigOperationError(
                        MIG_PLACEMENT_TAKEN,
                        f"MIG placement {placement.profile}@{placement.start} on GPU {placement.parent_uuid} "
                        f"overlaps existing GPU instance {int(info.id)} "
                        f"(slices {start}..{start + length - 1}), "
                        "which this claim did not create",
                    )
        except nvml.NVMLError as err:
            raise MigOperationError(MIG_ERROR, f"NVML: checking MIG placement failed: {err}") from None

    def mig_create(self, placement: MigPlacement) -> CreatedMig:
        nvml = self._nvml
        with self._mig_lock(placement.parent_uuid):
            try:
                handle = self._mig_parent(placement, require_mig_mode=False)
                if not self._mig_mode(handle)[1]:
                    if self._switch_needs_reset(handle):
                        raise self._mig_mode_off(placement)
                    # The first MIG device of a partitionable GPU: MIG mode on, at once (Hopper+).
                    # Prepare wrote its "creating" entry first, so a kill -9 from here on leaves an
                    # entry whose release destroys what is there and switches the mode back off.
                    self._set_mig_mode(handle, placement.parent_uuid, enable=True)
                profile = self._gi_profile(handle, placement)
                where = nvml.c_nvmlGpuInstancePlacement_t()
                where.start = placement.start
                where.size = self._placement_size(handle, placement)
                # The C signature takes `const nvmlGpuInstancePlacement_t *`, and pynvml declares no
                # argtypes: the structure must go by reference, or NVML reads its bytes as an address.
                gi_handle = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                    handle, int(profile.id), ctypes.byref(where)
                )
            except nvml.NVMLError as err:
                reason = (
                    MIG_PLACEMENT_TAKEN if _is(nvml, err, "NVML_ERROR_INSUFFICIENT_RESOURCES") else MIG_ERROR
                )
                raise MigOperationError(
                    reason,
                    f"NVML: creating GPU instance {placement.profile}@"
                    f"{placement.start} on {placement.parent_uuid} failed: {err}",
                ) from None
            try:
                ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi_handle,
                    int(getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{int(profile.sliceCount)}_SLICE")),
                    nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
                nvml.nvmlGpuInstanceCreateComputeInstance(gi_handle, int(ci_profile.id))
                created = self._created(placement, gi_handle)
                if len(created.cap_nodes) != 2:
                    raise MigOperationError(
                        MIG_ERROR,
                        f"the nvidia-caps access files of GPU instance {created.gpu_instance_id} are missing "
                        f"under {self._proc_root}/driver/nvidia/capabilities: a container could not use it",
                    )
                return created
            except (nvml.NVMLError, AttributeError, MigOperationError) as err:
                # Never leave a half-made MIG device behind: nobody could use it, and it blocks the slices.
                self._undo_create(gi_handle)
                raise MigOperationError(
                    MIG_ERROR, f"NVML: creating the compute instance on {placement.parent_uuid} failed: {err}"
                ) from None

    def _undo_create(self, gi_handle: Any) -> None:
        nvml = self._nvml
        try:
            with contextlib.suppress(nvml.NVMLError_NotFound):
                nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi_handle, 0))
            nvml.nvmlGpuInstanceDestroy(gi_handle)
        except nvml.NVMLError as undo:
            log.error("cannot destroy half-created GPU instance", extra={"error": str(undo)})

    def mig_find(self, placement: MigPlacement) -> CreatedMig | None:
        nvml = self._nvml
        try:
            handle = self._mig_parent(placement, require_mig_mode=False)
            # Instances first: with MIG off there are none, and NVML may not even list the
            # profiles then (nvml.h: NOT_SUPPORTED without MIG mode), which is no error here.
            instances = self._gpu_instances(handle)
            if not instances:
                return None
            profile_id = int(self._gi_profile(handle, placement).id)
            for gi_handle in instances:
                info = nvml.nvmlGpuInstanceGetInfo(gi_handle)
                if int(info.profileId) == profile_id and int(info.placement.start) == placement.start:
                    return self._created(placement, gi_handle, bare_ok=True)
        except nvml.NVMLError as err:
            raise MigOperationError(MIG_ERROR, f"NVML: reading MIG instances failed: {err}") from None
        return None

    def mig_destroy(self, placement: MigPlacement, gpu_instance_id: int | None) -> bool:
        nvml = self._nvml
        with self._mig_lock(placement.parent_uuid):
            found = self.mig_find(placement)
            if found is None or (gpu_instance_id is not None and found.gpu_instance_id != gpu_instance_id):
                return True  # gone already, or someone else's instance now sits there: not ours
            try:
                handle = self._mig_parent(placement, require_mig_mode=False)
                gi_handle = nvml.nvmlDeviceGetGpuInstanceById(handle, found.gpu_instance_id)
                if found.compute_instance_id >= 0:
                    # A partial cleanup before (CI gone, GI refused) leaves no CI: go on to the GI.
                    with contextlib.suppress(nvml.NVMLError_NotFound):
                        ci_handle = nvml.nvmlGpuInstanceGetComputeInstanceById(
                            gi_handle, found.compute_instance_id
                        )
                        nvml.nvmlComputeInstanceDestroy(ci_handle)
                nvml.nvmlGpuInstanceDestroy(gi_handle)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_NotFound):
                return True  # MIG mode went off (or the instance went) meanwhile: nothing is left
            except nvml.NVMLError as err:
                raise MigOperationError(
                    MIG_ERROR,
                    f"NVML: destroying GPU instance {found.gpu_instance_id} on {placement.parent_uuid} "
                    f"failed (processes still running on it?): {err}",
                ) from None
            return True

    def mig_release_mode(self, parent_uuid: str) -> None:
        nvml = self._nvml
        with self._mig_lock(parent_uuid):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
                if not self._mig_mode(handle)[1] or self._switch_needs_reset(handle):
                    return  # off already, or an Ampere: its mode stays as the admin set it
                if self._gpu_instances(handle):
                    return  # MIG devices are still on it (ours or anyone's)
                self._set_mig_mode(handle, parent_uuid, enable=False)
            except (nvml.NVMLError, MigOperationError) as err:
                # Not fatal to the unprepare: the whole GPU's next prepare switches it off.
                log.warning("cannot switch MIG mode off", extra={"gpu": parent_uuid, "error": str(err)})

    def mig_whole_gpu(self, parent_uuid: str) -> None:
        nvml = self._nvml
        with self._mig_lock(parent_uuid):
            try:
                handle = nvml.nvmlDeviceGetHandleByUUID(parent_uuid)
                if not self._mig_mode(handle)[1]:
                    return
                if self._switch_needs_reset(handle):
                    raise MigOperationError(
                        MIG_MODE_ENABLED,
                        f"GPU {parent_uuid} is in MIG mode and cannot leave it without a reset: "
                        "the whole GPU cannot be used",
                    )
                instances = self._gpu_instances(handle)
                if instances:
                    ids = sorted(int(nvml.nvmlGpuInstanceGetInfo(gi).id) for gi in instances)
                    raise MigOperationError(
                        MIG_MODE_ENABLED,
                        f"GPU {parent_uuid} is in MIG mode with GPU instances {ids}: the whole GPU cannot "
                        "be used until they are destroyed",
                    )
                self._set_mig_mode(handle, parent_uuid, enable=False)
            except nvml.NVMLError as err:
                raise MigOperationError(
                    MIG_ERROR, f"NVML: checking MIG mode of {parent_uuid} failed: {err}"
                ) from None

    def _set_mig_mode(self, handle: Any, uuid: str, *, enable: bool) -> None:
        """Switch MIG mode and check it took effect now, not just became pending."""
        nvml = self._nvml
        want = nvml.NVML_DEVICE_MIG_ENABLE if enable else nvml.NVML_DEVICE_MIG_DISABLE
        word = "on" if enable else "off"
        reason = MIG_MODE_DISABLED if enable else MIG_MODE_ENABLED
        try:
            # pynvml returns the activation status; the call's own result only says it was accepted.
            activation = int(nvml.nvmlDeviceSetMigMode(handle, want))
            current, pending = (int(m) for m in nvml.nvmlDeviceGetMigMode(handle))
        except nvml.NVMLError as err:
            raise MigOperationError(
                reason, f"NVML: switching MIG mode {word} on GPU {uuid} failed: {err}"
            ) from None
        if current != want:
            if pending == want:
                # Left pending it would flip at the next reset, behind everyone's back.
                try:
                    nvml.nvmlDeviceSetMigMode(handle, current)
                except nvml.NVMLError as err:
                    log.error("cannot withdraw pending MIG mode", extra={"gpu": uuid, "error": str(err)})
            raise MigOperationError(
                reason,
                f"GPU {uuid}: MIG mode did not switch {word} ({_return_text(nvml, activation)}); "
                "stop the processes on it, or it needs a reset",
            )
        log.info("MIG mode switched", extra={"mig_mode": word, "gpu": uuid})

    def _switch_needs_reset(self, handle: Any) -> bool:
        return int(self._nvml.nvmlDeviceGetArchitecture(handle)) < _ARCH_HOPPER

    def _mig_lock(self, uuid: str) -> threading.Lock:
        with self._mig_locks_guard:
            return self._mig_locks.setdefault(uuid, threading.Lock())

    @staticmethod
    def _mig_mode_off(placement: MigPlacement) -> MigOperationError:
        return MigOperationError(
            MIG_MODE_DISABLED,
            f"GPU {placement.parent_uuid} has MIG mode off and cannot switch it without a reset; enable it "
            "(nvidia-smi -i <gpu> -mig 1, then reset the GPU) before MIG devices can be created",
        )

    def _mig_parent(self, placement: MigPlacement, *, require_mig_mode: bool = True) -> Any:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByUUID(placement.parent_uuid)
        if require_mig_mode and not self._mig_mode(handle)[1]:
            raise MigOperationError(
                MIG_MODE_DISABLED,
                f"GPU {placement.parent_uuid} has MIG mode off; enable it (nvidia-smi -i <gpu> -mig 1) "
                "before MIG devices can be created",
            )
        return handle

    def _gi_profile(self, handle: Any, placement: MigPlacement) -> Any:
        nvml = self._nvml
        for profile_index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
            except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
                continue
            # By NVML's ID where the device name carries it: names alone may differ only in a suffix.
            if placement.profile_id is not None:
                if int(info.id) == placement.profile_id:
                    return info
            elif _text(info.name).removeprefix("MIG ").strip() == placement.profile:
                return info
        raise MigOperationError(
            MIG_ERROR, f"GPU {placement.parent_uuid} has no MIG profile {placement.profile}"
        )

    def _placement_size(self, handle: Any, placement: MigPlacement) -> int:
        profile = self._gi_profile(handle, placement)
        for start, size in self._placements(handle, int(profile.id), int(profile.instanceCount)):
            if start == placement.start:
                return size
        raise MigOperationError(
            MIG_ERROR, f"MIG profile {placement.profile} cannot be placed at slice {placement.start}"
        )

    def _gpu_instances(self, handle: Any) -> list[Any]:
        nvml = self._nvml
        found = []
        for gi in range(_MAX_GPU_INSTANCE_ID):
            try:
                found.append(nvml.nvmlDeviceGetGpuInstanceById(handle, gi))
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue
            except nvml.NVMLError_NotSupported:
                # nvml.h: MIG mode is off, so there are no GPU instances at all (not an error:
                # an unprepare after MIG mode went off must find its device gone).
                return []
        return found

    def _created(self, placement: MigPlacement, gi_handle: Any, *, bare_ok: bool = False) -> CreatedMig:
        """The MIG device of a GPU instance: its full compute instance (ID 0), UUID and caps nodes."""
        nvml = self._nvml
        gi = int(nvml.nvmlGpuInstanceGetInfo(gi_handle).id)
        try:
            ci_handle = nvml.nvmlGpuInstanceGetComputeInstanceById(gi_handle, 0)
        except nvml.NVMLError_NotFound:
            if not bare_ok:
                raise
            # A GPU instance without compute instance (a crash between the two creates).
            return CreatedMig(gi, -1, "", self._mig_caps(placement.parent_minor, gi, -1))
        info = nvml.nvmlComputeInstanceGetInfo(ci_handle)
        ci = int(info.id)
        uuid = _text(nvml.nvmlDeviceGetUUID(info.device))
        return CreatedMig(gi, ci, uuid, self._mig_caps(placement.parent_minor, gi, ci))

    # --- health -----------------------------------------------------------------------------------------

    def monitor_health(
        self,
        tracker: HealthTracker,
        stop: threading.Event,
        wait_ms: int = 1000,
        rediscover: Callable[[], None] | None = None,
    ) -> None:
        """Block until `stop`, turning NVML events into tracker reports.

        XIDs and double-bit ECC errors are faults (by the tracker's policy); a GPU
        that became unavailable is lost; a recovery action of "none" means it is
        usable again. A MIG layout change, a lost GPU and XID 79 (fallen off the
        bus) also call `rediscover()`, so the slices follow at once instead of at
        the next periodic re-discovery. GPUs found later are registered too.
        """
        nvml = self._nvml
        self.attach_health(tracker)
        event_set = nvml.nvmlEventSetCreate()
        registered: set[str] = set()
        seen_generation = -1
        try:
            while not stop.is_set():
                if seen_generation != self._generation:
                    seen_generation = self._generation
                    self._register_events(event_set, registered)
                try:
                    data = nvml.nvmlEventSetWait_v2(event_set, wait_ms)
                except nvml.NVMLError_Timeout:
                    continue
                except nvml.NVMLError as err:
                    log.error("waiting for NVML events failed", extra={"error": str(err)})
                    stop.wait(5)
                    continue
                self.handle_event(tracker, data, rediscover)
        finally:
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as err:
                log.debug("freeing NVML event set failed", extra={"error": str(err)})

    def _register_events(self, event_set: Any, registered: set[str]) -> None:
        nvml = self._nvml
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        for name in (*_CHANGE_EVENTS, _RECOVERY_EVENT):
            wanted |= int(getattr(nvml, name, 0))
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
                if uuid in registered:
                    continue
                supported = int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, event_set)
                registered.add(uuid)
            except nvml.NVMLError as err:
                log.warning("GPU health not monitored", extra={"index": index, "error": str(err)})

    def handle_event(
        self, tracker: HealthTracker, data: Any, rediscover: Callable[[], None] | None = None
    ) -> None:
        """Route one NVML event (c_nvmlEventData_t) to the affected devices."""
        nvml = self._nvml
        wake = rediscover or (lambda: None)
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError as err:
            # Most likely the GPU is lost: re-discovery finds out which and taints it.
            log.error("NVML event for an unreadable device", extra={"error": str(err)})
            wake()
            return
        event_type = int(data.eventType)
        if event_type & int(getattr(nvml, "nvmlEventMigConfigChange", 0)):
            log.info("MIG layout changed", extra={"gpu": uuid})
            wake()
        names = self._devices_for(uuid, int(data.gpuInstanceId))
        if not names:
            return
        if event_type & nvml.nvmlEventTypeXidCriticalError:
            xid = int(data.eventData)
            for listener in self._xid_listeners:
                listener(names, xid)
            effect = tracker.policy.effect_for_xid(xid)
            if effect is None:
                log.info("ignoring application XID", extra={"gpu": uuid, "xid": xid})
                return
            tracker.report_unhealthy(names, effect, f"xid-{xid}", f"XID {xid} on {uuid}")
            if xid == XID_FALLEN_OFF_BUS:
                wake()
        elif event_type & nvml.nvmlEventTypeDoubleBitEccError:
            effect = tracker.policy.fatal_effect
            tracker.report_unhealthy(names, effect, "ecc-double-bit", f"double-bit ECC error on {uuid}")
        elif event_type & int(getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0)):
            tracker.report_unhealthy(
                names, tracker.policy.fatal_effect, GPU_LOST_REASON, f"GPU {uuid} became unavailable"
            )
            wake()
        elif event_type & int(getattr(nvml, _RECOVERY_EVENT, 0)):
            action = int(data.eventData)
            if action == int(getattr(nvml, "NVML_GPU_RECOVERY_ACTION_NONE", 0)):
                tracker.report_recovered(names, f"NVML: GPU {uuid} needs no recovery action")
            else:
                log.warning("GPU needs a recovery action", extra={"gpu": uuid, "action": action})

    def _devices_for(self, uuid: str, gpu_instance_id: int) -> list[str]:
        with self._lock:
            if gpu_instance_id not in (_ALL_GPU_INSTANCES, 0):
                name = self._by_instance.get((uuid, gpu_instance_id))
                if name is not None:
                    return [name]
            return list(self._by_parent.get(uuid, []))


def _gi_of(device: Device, gpus: list[GpuInfo]) -> int | None:
    for gpu in gpus:
        for instance in gpu.mig_instances:
            if instance.uuid and instance.uuid == device.uuid:
                return instance.gpu_instance_id
    return None


def _is(nvml: Any, err: Any, code_name: str) -> bool:
    return getattr(err, "value", None) == getattr(nvml, code_name, object())


def _return_text(nvml: Any, code: int) -> str:
    """An nvmlReturn_t as NVML words it (an activation status is one, not raised by pynvml)."""
    try:
        return str(nvml.NVMLError(code))
    except Exception:  # an unknown code: the number says enough
        return f"NVML return {code}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
