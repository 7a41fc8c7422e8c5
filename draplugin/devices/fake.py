"""Fake GPUs for laptops, CI and demos, described by a YAML file or by flags.

Output is deterministic per node name: UUIDs are derived from the node name
and the GPU index, so restarts publish identical slices (no generation bump)
and two fake nodes never share a UUID. Attributes follow the same schema as
NVML (`draplugin.devices.schema`), so DeviceClasses work on both.

Device nodes: a fake GPU has no character device of its own. With
`device_dir` set (`draplugin run` sets it: `--fake-device-dir`, default
`<state-dir>/fake-dev`), the backend creates real character devices there,
one per name an NVIDIA GPU has (`nvidia0`, `nvidia1`, ..., `nvidiactl`,
`nvidia-uvm`, `nvidia-uvm-tools`), with the device number of `/dev/null`
(1:3), so they are harmless to open, read and write. Devices then name them at
their NVIDIA paths (`/dev/nvidia0`) with `host_dev_dir` pointing at the
directory: the CDI spec injects `<device_dir>/nvidia0` as `/dev/nvidia0`, and
the container runtime finds a real node to inject. Creating them needs
CAP_MKNOD (root), like the plugin's other work on a node. Without
`device_dir`, each fake device references `/dev/null`, which exists on every
host and inside every container (previews such as `draplugin devices`, unit
tests); with `dev_root`, NVIDIA-shaped paths under that directory, for tests
that check the shape of generated CDI specs (not created).

File format (all keys optional except `gpus`):

    driverVersion: "580.65.06"
    cudaDriverVersion: "13.0"
    partitionable: false          # publish MIG profiles with shared counters
    gpusPerPcieRoot: 1            # GPUs behind one PCIe root complex (see below)
    gpus:
      - model: A100-SXM4-40GB     # a key of MODELS
        count: 2
        mig: [3g.20gb, 2g.10gb]   # static MIG layout, placed first-fit;
                                  # or [{profile: 1g.5gb, start: 6}, ...]
      - model: L4
        memory: 24Gi              # override the model's memory
        usage: idle               # how busy it looks (draplugin.devices.fakeusage)
        numaNode: 1               # resource.kubernetes.io/numaNode of these GPUs (absent: none)

PCIe topology: GPU `i` sits on bus `0x18 + 0x10*i`. `gpusPerPcieRoot: N`
puts GPUs `0..N-1` behind one root complex, `N..2N-1` behind the next, and so
on (in file order, across entries), the way servers with PCIe switches pair
their GPUs; the root is named after the first GPU of its group. The default
of 1 gives every GPU its own root: it keeps the `pcieRoot` attribute (and so
the published slices) of existing fake nodes unchanged, and flags-only fake
nodes (`--fake-gpus`) keep it too.

Size: the fake backend mirrors the NVML one in one file, inventory parsing included.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from draplugin.devices.fakeusage import FakeUsage, default_usage, parse_usage
from draplugin.devices.model import CounterSet, Device, Version
from draplugin.devices.naming import DeviceNaming
from draplugin.devices.schema import (
    MAX_NUMA_NODES,
    NVIDIA_CONTROL_NODES,
    GpuInfo,
    MigInstance,
    MigProfile,
    SystemInfo,
    build_devices,
)
from draplugin.devices.shared import SharedGpus

log = logging.getLogger(__name__)

MiB = 1 << 20
GiB = 1 << 30

DEFAULT_DRIVER_VERSION = "580.65.06"
DEFAULT_CUDA_DRIVER_VERSION = "13.0"
DEFAULT_MODEL = "A100-SXM4-40GB"


class FakeConfigError(ValueError):
    """The fake GPU description is invalid; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Properties of a GPU model as NVML reports them (memory is NVML's total, in bytes)."""

    product_name: str
    brand: str
    architecture: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    mig_profiles: tuple[MigProfile, ...] = ()


def _profiles(
    rows: Sequence[tuple[str, int, int, int, int, int, int, int, tuple[int, ...]]],
) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(
            name=name,
            memory_slices=slices,
            memory_bytes=mem_mib * MiB,
            multiprocessors=sms,
            copy_engines=ce,
            decoders=dec,
            encoders=0,
            jpeg_engines=jpeg,
            ofa_engines=ofa,
            placements=starts,
        )
        for name, slices, mem_mib, sms, ce, dec, jpeg, ofa, starts in rows
    )


# MIG profile tables, one row per profile:
# (name, memory slices, memory MiB, SMs, copy engines, decoders, jpeg, ofa, placement starts).
# Realistic figures for demos and tests, not an authoritative hardware database.
_A100_40 = _profiles(
    [
        ("1g.5gb", 1, 4864, 14, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        ("2g.10gb", 2, 9856, 28, 2, 1, 0, 0, (0, 2, 4)),
        ("3g.20gb", 4, 19968, 42, 3, 2, 0, 0, (0, 4)),
        ("4g.20gb", 4, 19968, 56, 4, 2, 0, 0, (0,)),
        ("7g.40gb", 8, 40192, 98, 7, 5, 1, 1, (0,)),
    ],
)
_A100_80 = _profiles(
    [
        ("1g.10gb", 1, 9728, 14, 1, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, 19968, 14, 1, 1, 0, 0, (0, 2, 4, 6)),
        ("2g.20gb", 2, 19968, 28, 2, 1, 0, 0, (0, 2, 4)),
        ("3g.40gb", 4, 40192, 42, 3, 2, 0, 0, (0, 4)),
        ("4g.40gb", 4, 40192, 56, 4, 2, 0, 0, (0,)),
        ("7g.80gb", 8, 80896, 98, 7, 5, 1, 1, (0,)),
    ],
)
_H100_80 = _profiles(
    [
        ("1g.10gb", 1, 9984, 16, 1, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.20gb", 2, 19968, 26, 1, 1, 1, 0, (0, 2, 4, 6)),
        ("2g.20gb", 2, 19968, 32, 2, 2, 2, 0, (0, 2, 4)),
        ("3g.40gb", 4, 40192, 60, 3, 3, 3, 0, (0, 4)),
        ("4g.40gb", 4, 40192, 64, 4, 4, 4, 0, (0,)),
        ("7g.80gb", 8, 80896, 132, 8, 7, 7, 1, (0,)),
    ],
)
_H200 = _profiles(
    [
        ("1g.18gb", 1, 16384, 16, 1, 1, 1, 0, (0, 1, 2, 3, 4, 5, 6)),
        ("1g.35gb", 2, 32768, 26, 1, 1, 1, 0, (0, 2, 4, 6)),
        ("2g.35gb", 2, 32768, 32, 2, 2, 2, 0, (0, 2, 4)),
        ("3g.71gb", 4, 65536, 60, 3, 3, 3, 0, (0, 4)),
        ("4g.71gb", 4, 65536, 64, 4, 4, 4, 0, (0,)),
        ("7g.141gb", 8, 137216, 132, 8, 7, 7, 1, (0,)),
    ],
)

MODELS: Mapping[str, GpuModel] = {
    "A100-SXM4-40GB": GpuModel(
        "NVIDIA A100-SXM4-40GB", "Nvidia", "Ampere", (8, 0), 40960 * MiB, 108, _A100_40
    ),
    "A100-SXM4-80GB": GpuModel(
        "NVIDIA A100-SXM4-80GB", "Nvidia", "Ampere", (8, 0), 81920 * MiB, 108, _A100_80
    ),
    "H100-80GB-HBM3": GpuModel(
        "NVIDIA H100 80GB HBM3", "Nvidia", "Hopper", (9, 0), 81559 * MiB, 132, _H100_80
    ),
    "H200": GpuModel("NVIDIA H200", "Nvidia", "Hopper", (9, 0), 143771 * MiB, 132, _H200),
    "L4": GpuModel("NVIDIA L4", "Nvidia", "Ada Lovelace", (8, 9), 23034 * MiB, 58),
    "L40S": GpuModel("NVIDIA L40S", "Nvidia", "Ada Lovelace", (8, 9), 46068 * MiB, 142),
    "T4": GpuModel("Tesla T4", "Tesla", "Turing", (7, 5), 15360 * MiB, 40),
    "A10G": GpuModel("NVIDIA A10G", "Nvidia", "Ampere", (8, 6), 23028 * MiB, 80),
}


@dataclass(frozen=True, slots=True)
class FakeGpuSpec:
    """One group of identical fake GPUs."""

    model: str = DEFAULT_MODEL
    count: int = 1
    memory_bytes: int | None = None
    # Static MIG layout: (profile name, placement start or None for first-fit).
    mig: tuple[tuple[str, int | None], ...] = ()
    # The utilization the usage sampler reports; None: the default wave of the GPU's index.
    usage: FakeUsage | None = None
    # NUMA node of these GPUs; None: no affinity, so no numaNode attribute (as on most VMs).
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class FakeConfig:
    gpus: tuple[FakeGpuSpec, ...] = (FakeGpuSpec(),)
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: str = DEFAULT_CUDA_DRIVER_VERSION
    partitionable: bool = False
    gpus_per_pcie_root: int = 1


class FakeBackend:
    """Devices from a `FakeConfig`.

    With `config_file` (the file `config` was read from), `refresh()` reads it
    again when it changed, so tests and demos can make GPUs or MIG devices
    appear and disappear the way a real node's do. A file that no longer
    parses is logged and the last devices stay.
    """

    def __init__(
        self,
        node_name: str,
        config: FakeConfig,
        *,
        dev_root: str | None = None,
        device_dir: Path | None = None,
        config_file: Path | None = None,
        force_partitionable: bool = False,
        shared_gpus: SharedGpus = SharedGpus.OFF,
        naming: DeviceNaming = DeviceNaming.DRAPLUGIN,
    ) -> None:
        if not node_name:
            raise FakeConfigError("fake backend: a node name is required (UUIDs are derived from it)")
        if dev_root is not None and device_dir is not None:
            raise FakeConfigError(
                "fake backend: dev_root (paths only) and device_dir (real nodes) exclude each other"
            )
        self._node_name = node_name
        self._dev_root = "/dev" if device_dir is not None else dev_root
        self._device_dir = device_dir
        self._config_file = config_file
        self._force_partitionable = force_partitionable
        self._shared_gpus = shared_gpus
        self._naming = naming
        self._stamp = _file_stamp(config_file)
        # Validate eagerly so bad input fails at start-up, not on first publish.
        self._devices, self._counter_sets = self._build(config)
        self._config = config

    def _build(self, config: FakeConfig) -> tuple[list[Device], list[CounterSet]]:
        system = SystemInfo(config.driver_version, config.cuda_driver_version)
        gpus = self._build_gpus(config)
        devices, counter_sets = build_devices(
            system, gpus, partitionable=config.partitionable, shared=self._shared_gpus, naming=self._naming
        )
        if self._device_dir is not None:
            make_device_nodes(self._device_dir, sorted({n for d in devices for n in d.device_nodes}))
            devices = [replace(d, host_dev_dir=str(self._device_dir)) for d in devices]
        return devices, counter_sets

    def refresh(self) -> bool:
        """Re-read the config file if it changed; True if the devices changed."""
        if self._config_file is None:
            return False
        stamp = _file_stamp(self._config_file)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            config = load_config(self._config_file)
            if self._force_partitionable:
                config = replace(config, partitionable=True)
            devices, counter_sets = self._build(config)
        except ValueError as err:  # FakeConfigError, or devices that do not validate
            log.error("fake GPU file unusable, keeping the last devices", extra={"error": str(err)})
            return False
        changed = devices != self._devices or counter_sets != self._counter_sets
        # One assignment: a concurrent discover() sees the old or the new list, never a mix.
        self._devices, self._counter_sets = devices, counter_sets
        self._config = config
        if changed:
            log.info("fake GPU file re-read", extra={"path": str(self._config_file), "devices": len(devices)})
        return changed

    @property
    def name(self) -> str:
        return "fake"

    @property
    def node_name(self) -> str:
        return self._node_name

    def discover(self) -> list[Device]:
        return list(self._devices)

    def shared_counters(self) -> list[CounterSet]:
        return list(self._counter_sets)

    def usage_of(self, gpu_index: int) -> FakeUsage:
        """How busy fake GPU `gpu_index` looks (its entry's `usage`, else its default wave)."""
        first = 0
        for spec in self._config.gpus:
            if first <= gpu_index < first + spec.count:
                return spec.usage if spec.usage is not None else default_usage(gpu_index)
            first += spec.count
        return default_usage(gpu_index)

    # --- construction -------------------------------------------------------------------------------

    def _build_gpus(self, config: FakeConfig) -> list[GpuInfo]:
        gpus: list[GpuInfo] = []
        index = 0
        for spec in config.gpus:
            model = MODELS[spec.model]
            for _ in range(spec.count):
                gpus.append(self._gpu(index, model, spec, config.gpus_per_pcie_root))
                index += 1
        return gpus

    def _gpu(self, index: int, model: GpuModel, spec: FakeGpuSpec, gpus_per_root: int) -> GpuInfo:
        gpu_uuid = "GPU-" + _stable_uuid(self._node_name, "gpu", str(index))
        pci_bus_id = _pci_bus_id(index)
        # GPUs of one group share the root of the group's first GPU (the bus just above it).
        first = index - index % gpus_per_root
        first_bus_id = _pci_bus_id(first)
        pcie_root = f"pci{first_bus_id[:4]}:{(_pci_bus(first) - 1) & 0xFF:02x}"
        memory = spec.memory_bytes if spec.memory_bytes is not None else model.memory_bytes
        instances = tuple(
            MigInstance(
                profile=profile,
                placement_start=start,
                uuid="MIG-" + _stable_uuid(self._node_name, "mig", str(index), profile.name, str(start)),
                gpu_instance_id=i + 1,
                compute_instance_id=0,
            )
            for i, (profile, start) in enumerate(_place_mig(spec, model))
        )
        return GpuInfo(
            index=index,
            minor=index,
            uuid=gpu_uuid,
            product_name=model.product_name,
            brand=model.brand,
            architecture=model.architecture,
            cuda_compute_capability=model.compute_capability,
            memory_bytes=memory,
            pci_bus_id=pci_bus_id,
            pcie_root=pcie_root,
            device_nodes=self._device_nodes(index),
            mig_enabled=bool(spec.mig),
            mig_profiles=model.mig_profiles,
            mig_instances=instances,
            multiprocessors=model.multiprocessors,
            numa_node=spec.numa_node,
        )

    def _device_nodes(self, minor: int) -> tuple[str, ...]:
        if self._dev_root is None:
            return ("/dev/null",)
        root = self._dev_root.rstrip("/")
        return (f"{root}/nvidia{minor}", *(root + p.removeprefix("/dev") for p in NVIDIA_CONTROL_NODES))


def _file_stamp(path: Path | None) -> tuple[float, int] | None:
    if path is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime, info.st_size)


# The device number of /dev/null: opening, reading and writing it is harmless.
NULL_DEVICE = os.makedev(1, 3)


def make_device_nodes(directory: Path, container_paths: Sequence[str]) -> None:
    """Character devices (1:3, mode 0666) in `directory` for each `/dev/<name>` path; an existing
    node of the right kind is kept, anything else in its place is replaced."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for path in container_paths:
            node = directory / path.removeprefix("/dev/")
            try:
                info = node.lstat()
                if stat.S_ISCHR(info.st_mode) and info.st_rdev == NULL_DEVICE:
                    continue
                node.unlink()
            except FileNotFoundError:
                pass
            node.parent.mkdir(parents=True, exist_ok=True)
            os.mknod(node, stat.S_IFCHR | 0o666, NULL_DEVICE)
            os.chmod(node, 0o666)  # mknod applies the umask
    except OSError as err:
        raise FakeConfigError(
            f"fake backend: cannot create device nodes in {directory}: {err.strerror or err} "
            "(creating device nodes needs root / CAP_MKNOD)"
        ) from err


def _pci_bus(index: int) -> int:
    return 0x18 + 0x10 * index


def _pci_bus_id(index: int) -> str:
    """Sixteen buses per GPU; past the 15th GPU the bus number wraps into the next PCI domain."""
    bus = _pci_bus(index)
    domain = 0 if index < 15 else index // 15
    return f"{domain:04x}:{bus & 0xFF:02x}:00.0"


def _stable_uuid(*parts: str) -> str:
    digest = hashlib.sha256("\x00".join(("draplugin-fake", *parts)).encode()).digest()
    return str(uuidlib.UUID(bytes=digest[:16], version=4))


def _place_mig(spec: FakeGpuSpec, model: GpuModel) -> list[tuple[MigProfile, int]]:
    """Place the requested MIG devices: explicit starts as given, the rest first-fit; no overlaps."""
    by_name = {p.name: p for p in model.mig_profiles}
    used: set[int] = set()
    placed: list[tuple[MigProfile, int]] = []
    for profile_name, start in spec.mig:
        profile = by_name.get(profile_name)
        if profile is None:
            known = ", ".join(by_name) or "none (model has no MIG)"
            raise FakeConfigError(f"model {spec.model}: unknown MIG profile {profile_name!r}; known: {known}")
        candidates = profile.placements if start is None else (start,)
        if start is not None and start not in profile.placements:
            raise FakeConfigError(
                f"model {spec.model}: MIG profile {profile_name} cannot start at {start}; "
                f"valid starts: {list(profile.placements)}"
            )
        for candidate in candidates:
            slots = set(range(candidate, candidate + profile.memory_slices))
            if not slots & used:
                used |= slots
                placed.append((profile, candidate))
                break
        else:
            raise FakeConfigError(f"model {spec.model}: no free placement for MIG profile {profile_name}")
    return placed


# --- parsing ------------------------------------------------------------------------------------------


def config_from_flags(gpus: int, model: str = DEFAULT_MODEL, *, partitionable: bool = False) -> FakeConfig:
    if gpus < 0:
        raise FakeConfigError(f"--fake-gpus must be ≥0, got {gpus}")
    _check_model(model, "--fake-model")
    return FakeConfig(gpus=(FakeGpuSpec(model=model, count=gpus),), partitionable=partitionable)


def load_config(path: str | Path) -> FakeConfig:
    """Read and validate a fake GPU file; any problem raises `FakeConfigError` naming the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise FakeConfigError(f"{path}: cannot read fake GPU file: {err.strerror or err}") from err
    except yaml.YAMLError as err:
        raise FakeConfigError(f"{path}: not valid YAML: {err}") from err
    try:
        return parse_config(data)
    except FakeConfigError as err:
        raise FakeConfigError(f"{path}: {err}") from err


def parse_config(data: Any) -> FakeConfig:
    if not isinstance(data, dict):
        raise FakeConfigError("top level must be a mapping with a 'gpus' list")
    unknown = set(data) - {"gpus", "driverVersion", "cudaDriverVersion", "partitionable", "gpusPerPcieRoot"}
    if unknown:
        raise FakeConfigError(f"unknown keys: {', '.join(sorted(map(str, unknown)))}")
    raw_gpus = data.get("gpus")
    if not isinstance(raw_gpus, list):
        raise FakeConfigError("'gpus' must be a list")
    specs = tuple(_parse_gpu(i, entry) for i, entry in enumerate(raw_gpus))
    partitionable = data.get("partitionable", False)
    if not isinstance(partitionable, bool):
        raise FakeConfigError("'partitionable' must be true or false")
    per_root = data.get("gpusPerPcieRoot", 1)
    if not isinstance(per_root, int) or isinstance(per_root, bool) or per_root < 1:
        raise FakeConfigError(f"'gpusPerPcieRoot' must be an integer ≥1, got {per_root!r}")
    config = FakeConfig(
        gpus=specs,
        driver_version=_version_text(data, "driverVersion", DEFAULT_DRIVER_VERSION),
        cuda_driver_version=_version_text(data, "cudaDriverVersion", DEFAULT_CUDA_DRIVER_VERSION),
        partitionable=partitionable,
        gpus_per_pcie_root=per_root,
    )
    for spec in specs:  # placement errors surface now, with the entry's model named
        _place_mig(spec, MODELS[spec.model])
    return config


def _version_text(data: Mapping[str, Any], key: str, default: str) -> str:
    value = data.get(key, default)
    if not isinstance(value, str | int | float):
        raise FakeConfigError(f"'{key}' must be a version string")
    try:
        Version.coerce(str(value))
    except ValueError as err:
        raise FakeConfigError(f"'{key}': {err}") from err
    return str(value)


def _parse_gpu(i: int, entry: Any) -> FakeGpuSpec:
    where = f"gpus[{i}]"
    if not isinstance(entry, dict):
        raise FakeConfigError(f"{where}: must be a mapping")
    unknown = set(entry) - {"model", "count", "memory", "mig", "usage", "numaNode"}
    if unknown:
        raise FakeConfigError(f"{where}: unknown keys: {', '.join(sorted(map(str, unknown)))}")
    model = entry.get("model", DEFAULT_MODEL)
    _check_model(model, f"{where}.model")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise FakeConfigError(f"{where}.count: must be an integer ≥0")
    memory = entry.get("memory")
    memory_bytes = _parse_bytes(f"{where}.memory", memory) if memory is not None else None
    mig_raw = entry.get("mig", [])
    if not isinstance(mig_raw, list):
        raise FakeConfigError(f"{where}.mig: must be a list of profiles")
    mig: list[tuple[str, int | None]] = []
    for j, item in enumerate(mig_raw):
        if isinstance(item, str):
            mig.append((item, None))
        elif (
            isinstance(item, dict)
            and isinstance(item.get("profile"), str)
            and set(item) <= {"profile", "start"}
        ):
            start = item.get("start")
            if start is not None and (not isinstance(start, int) or isinstance(start, bool)):
                raise FakeConfigError(f"{where}.mig[{j}].start: must be an integer")
            mig.append((item["profile"], start))
        else:
            raise FakeConfigError(f"{where}.mig[{j}]: must be a profile name or {{profile, start}}")
    if mig and not MODELS[model].mig_profiles:
        raise FakeConfigError(f"{where}: model {model} does not support MIG")
    try:
        usage = parse_usage(f"{where}.usage", entry["usage"]) if "usage" in entry else None
    except ValueError as err:
        raise FakeConfigError(str(err)) from None
    numa_node = entry.get("numaNode")
    if numa_node is not None and (
        not isinstance(numa_node, int) or isinstance(numa_node, bool) or not 0 <= numa_node < MAX_NUMA_NODES
    ):
        raise FakeConfigError(
            f"{where}.numaNode: must be an integer from 0 to {MAX_NUMA_NODES - 1}, got {numa_node!r}"
        )
    return FakeGpuSpec(
        model=model, count=count, memory_bytes=memory_bytes, mig=tuple(mig), usage=usage, numa_node=numa_node
    )


def _check_model(model: Any, where: str) -> None:
    if not isinstance(model, str) or model not in MODELS:
        raise FakeConfigError(f"{where}: unknown model {model!r}; known: {', '.join(MODELS)}")


_MIG_KEYS = {"profile", "start"}
_BYTE_SUFFIXES = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "": 1}


def _parse_bytes(where: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        for suffix, factor in _BYTE_SUFFIXES.items():
            number = value[: len(value) - len(suffix)] if suffix else value
            if (not suffix or value.endswith(suffix)) and number.isdigit() and int(number) > 0:
                return int(number) * factor
    raise FakeConfigError(f"{where}: {value!r} is not a positive byte quantity (e.g. 40Gi, 81559Mi)")
