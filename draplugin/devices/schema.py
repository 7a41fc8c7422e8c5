"""The published attribute schema, shared by every backend.

Backends only describe hardware (`GpuInfo`, `MigProfile`, `MigInstance`);
this module turns that description into `Device`s. One schema for NVML and
the fake backend means a DeviceClass or selector written against fake GPUs
works unchanged on real ones. Attribute names follow NVIDIA's own DRA driver
(`type`, `uuid`, `productName`, `brand`, `architecture`, `cudaComputeCapability`,
`driverVersion`, `cudaDriverVersion`, MIG: `parentUUID`, `profile`), so selectors
carry over, plus the standard `resource.kubernetes.io/pciBusID`, `pcieRoot` and
`numaNode` (scalar int form, which upstream accepts on every release without a
gate; omitted for a GPU with no NUMA affinity, since a shared -1 would make
`matchAttribute` pair every NUMA-less device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from draplugin.devices.model import (
    STANDARD_DOMAIN,
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    Version,
    format_bytes,
)
from draplugin.devices.naming import DeviceNaming, gpu_name, mig_name
from draplugin.devices.shared import SharedGpus, share

KIND_GPU = "gpu"
KIND_MIG = "mig"

PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"
# Upstream's bound (deviceattribute.maxNUMANodes: Linux's MAX_NUMNODES at its largest).
MAX_NUMA_NODES = 1024

# Control nodes every CUDA container needs next to its /dev/nvidiaN. They are node-wide: the CDI
# spec writes them once, for the whole claim (`draplugin.prepare.plan`), never per device.
NVIDIA_CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class DeviceNodeSpec(str):
    """A device node's path in the container that also knows its character device numbers.

    A `str` (the path), so every place that only needs the path (the fake
    backend's node files, `Device.device_nodes`, comparisons) keeps working; the
    CDI spec writes `type: c`, `major`, `minor` and `fileMode` from it, so the
    runtime makes the node without a host file to stat. That is what a MIG
    access node made in the plugin's own container needs (it exists in no
    host `/dev`). Equality is the path's: one node, one path.
    """

    major: int
    minor: int
    file_mode: int | None

    def __new__(cls, path: str, major: int, minor: int, file_mode: int | None = None) -> DeviceNodeSpec:
        node = super().__new__(cls, path)
        node.major, node.minor, node.file_mode = major, minor, file_mode
        return node

    def __repr__(self) -> str:
        mode = f", file_mode=0o{self.file_mode:o}" if self.file_mode is not None else ""
        return f"DeviceNodeSpec({str(self)!r}, major={self.major}, minor={self.minor}{mode})"

    def __reduce__(self) -> tuple[type[DeviceNodeSpec], tuple[str, int, int, int | None]]:
        return (DeviceNodeSpec, (str(self), self.major, self.minor, self.file_mode))


# Counter names are DNS labels, hence not the camelCase capacity names.
_COUNTER_FOR_CAPACITY = {
    "multiprocessors": "multiprocessors",
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
    "memory": "memory",
}


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A GPU instance profile of one GPU model ("1g.10gb"), with where it may be placed.

    `placements` are start positions in memory-slice units; each occupies
    `memory_slices` consecutive slices.
    """

    name: str
    memory_slices: int
    memory_bytes: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[int, ...]
    # NVML's GPU instance profile ID; None for fake profiles. NVML's IDs are part of the device
    # name: two profiles may differ only in a suffix that a DNS label cannot keep apart
    # (Blackwell's "1g.24gb+me" and "1g.24gb-me").
    profile_id: int | None = None
    # NVML's compute slice count of the GPU instance (sliceCount); 0 when unknown. A compute
    # instance with fewer slices is a part of its GPU instance, a device of its own.
    compute_slices: int = 0

    def capacity(self) -> dict[str, int]:
        return {
            "multiprocessors": self.multiprocessors,
            "copyEngines": self.copy_engines,
            "decoders": self.decoders,
            "encoders": self.encoders,
            "jpegEngines": self.jpeg_engines,
            "ofaEngines": self.ofa_engines,
            "memory": self.memory_bytes,
        }


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device that exists now (static MIG)."""

    profile: MigProfile
    placement_start: int
    uuid: str
    gpu_instance_id: int = 0
    compute_instance_id: int = 0
    # Extra nodes (the nvidia-caps access files) on top of the parent's.
    device_nodes: tuple[str, ...] = ()
    # Where a compute instance that is only a part of its GPU instance starts (in compute slices);
    # None: it spans the whole GPU instance. Several parts of one GPU instance are several devices.
    compute_slice_start: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """What discovery learned about one physical GPU."""

    index: int
    minor: int
    uuid: str
    product_name: str
    brand: str
    architecture: str
    cuda_compute_capability: tuple[int, int]
    # None: NVML has no memory info (unified-memory parts such as GB10 answer NOT_SUPPORTED); the
    # GPU is published without a memory capacity, as NVIDIA's driver does.
    memory_bytes: int | None
    pci_bus_id: str
    pcie_root: str | None
    device_nodes: tuple[str, ...]
    mig_enabled: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    # Totals of the whole GPU, used as counter-set sizes in partitionable mode.
    multiprocessors: int = 0
    memory_slice_count: int = 8
    engines: dict[str, int] = field(default_factory=dict, hash=False)
    # The NUMA node the GPU is attached to; None when the platform reports no affinity.
    numa_node: int | None = None
    # Turning MIG mode on or off takes a GPU reset (Ampere): in partitionable mode such a GPU
    # offers either its MIG devices (MIG on) or itself (MIG off), never both. Hopper and later
    # switch at once, so they offer both and prepare switches the mode.
    mig_switch_needs_reset: bool = False
    # NVML's memory addressing mode on coherent-memory systems ("HMM", "ATS", "None"); None: the
    # platform has none. Published as NVIDIA's driver does (`addressingMode`).
    addressing_mode: str | None = None


@dataclass(frozen=True, slots=True)
class SystemInfo:
    driver_version: str
    cuda_driver_version: str


def gpu_device_name(index: int) -> str:
    """Our name of a whole GPU (`draplugin.devices.naming` has both schemes)."""
    return gpu_name(DeviceNaming.DRAPLUGIN, index, index)


def mig_device_name(
    gpu_index: int,
    profile: str,
    placement_start: int,
    profile_id: int | None = None,
    compute_slice_start: int | None = None,
) -> str:
    """`gpu-0-mig-1g10gb-19-0`: parent index, profile without dots, NVML's profile ID, placement start.

    All stable across reboots. The profile ID keeps apart profiles whose names differ only in
    characters a DNS label drops ("1g.24gb+me", "1g.24gb-me": both `1g24gb-me`), as in NVIDIA's
    driver; fake profiles have none (`gpu-0-mig-1g5gb-0`). A compute instance that is one part of
    its GPU instance ("1c.3g.40gb") adds where it starts in the GPU instance.
    """
    return mig_name(
        DeviceNaming.DRAPLUGIN,
        gpu_index=gpu_index,
        gpu_minor=gpu_index,
        profile=profile,
        placement_start=placement_start,
        profile_id=profile_id,
        compute_slice_start=compute_slice_start,
    )


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-counters"


def build_devices(
    system: SystemInfo,
    gpus: Sequence[GpuInfo],
    *,
    partitionable: bool = False,
    shared: SharedGpus = SharedGpus.OFF,
    naming: DeviceNaming = DeviceNaming.DRAPLUGIN,
) -> tuple[list[Device], list[CounterSet]]:
    """All devices of the node in a stable order (GPU index, then MIG placement), plus counter sets.

    - MIG disabled: the GPU itself.
    - Static MIG (MIG enabled, not partitionable): each existing MIG device; the
      parent GPU is not allocatable as a whole.
    - Partitionable (MIG-capable GPUs): every possible profile placement and,
      where it is usable, the whole GPU, all drawing from one counter set per
      GPU, so the scheduler never hands out overlapping pieces. Prepare switches
      MIG mode on for the first MIG device and off after the last. A GPU that
      needs a reset to switch (Ampere) offers only what its current mode
      serves: its MIG placements with MIG on, itself with MIG off (a whole GPU
      in MIG mode cannot run CUDA; a MIG device cannot be made with MIG off).
    - `shared` (not off): each whole GPU that is not partitionable is published
      for several claims at once, with consumable memory (and compute)
      (`draplugin.devices.shared`).
    - `naming`: the device name scheme (`draplugin.devices.naming`); attributes are the same in both.
    """
    devices: list[Device] = []
    counter_sets: list[CounterSet] = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        common = _common_attributes(system, gpu)
        if partitionable and gpu.mig_profiles and (gpu.mig_enabled or not gpu.mig_switch_needs_reset):
            counters = _gpu_counters(gpu)
            counter_sets.append(CounterSet(counter_set_name(gpu.index), counters))
            if not gpu.mig_enabled or not gpu.mig_switch_needs_reset:
                devices.append(_gpu_device(gpu, common, naming, consumes=dict(counters)))
            for profile in gpu.mig_profiles:
                for start in profile.placements:
                    devices.append(_abstract_mig_device(gpu, common, naming, profile, start))
        elif gpu.mig_enabled:
            ordered = sorted(
                gpu.mig_instances,
                key=lambda m: (m.placement_start, m.compute_slice_start or 0, m.profile.name),
            )
            for instance in ordered:
                devices.append(_mig_device(gpu, common, naming, instance))
        else:
            whole = _gpu_device(gpu, common, naming, consumes=None)
            devices.append(share(whole, gpu.memory_bytes, shared) if gpu.memory_bytes is not None else whole)
    return devices, counter_sets


def _common_attributes(system: SystemInfo, gpu: GpuInfo) -> dict[str, AttributeValue]:
    major, minor = gpu.cuda_compute_capability
    attrs: dict[str, AttributeValue] = {
        "productName": gpu.product_name,
        "brand": gpu.brand,
        "architecture": gpu.architecture,
        "cudaComputeCapability": Version.coerce(f"{major}.{minor}"),
        "driverVersion": Version.coerce(system.driver_version),
        "cudaDriverVersion": Version.coerce(system.cuda_driver_version),
        "index": gpu.index,
        "minor": gpu.minor,
        PCI_BUS_ID: gpu.pci_bus_id,
    }
    if gpu.pcie_root:
        attrs[PCIE_ROOT] = gpu.pcie_root
    if gpu.numa_node is not None:
        attrs[NUMA_NODE] = gpu.numa_node
    if gpu.addressing_mode:
        attrs["addressingMode"] = gpu.addressing_mode
    return attrs


def _gpu_device(
    gpu: GpuInfo, common: dict[str, AttributeValue], naming: DeviceNaming, consumes: dict[str, str] | None
) -> Device:
    attrs: dict[str, AttributeValue] = {"type": KIND_GPU, "uuid": gpu.uuid, **common}
    return Device(
        name=gpu_name(naming, gpu.index, gpu.minor),
        kind=KIND_GPU,
        uuid=gpu.uuid,
        index=gpu.index,
        minor=gpu.minor,
        attributes=attrs,
        capacity={"memory": format_bytes(gpu.memory_bytes)} if gpu.memory_bytes is not None else {},
        device_nodes=gpu.device_nodes,
        consumes_counters=(
            (CounterConsumption(counter_set_name(gpu.index), consumes),) if consumes is not None else ()
        ),
    )


def _mig_attributes(
    gpu: GpuInfo, common: dict[str, AttributeValue], profile: MigProfile, uuid: str
) -> dict[str, AttributeValue]:
    attrs: dict[str, AttributeValue] = {"type": KIND_MIG, "parentUUID": gpu.uuid, "profile": profile.name}
    if uuid:
        attrs["uuid"] = uuid
    attrs.update(common)
    return attrs


def _mig_capacity(profile: MigProfile) -> dict[str, str]:
    return {
        key: (format_bytes(value) if key == "memory" else str(value))
        for key, value in profile.capacity().items()
    }


def _mig_device(
    gpu: GpuInfo, common: dict[str, AttributeValue], naming: DeviceNaming, instance: MigInstance
) -> Device:
    profile = instance.profile
    return Device(
        name=mig_name(
            naming,
            gpu_index=gpu.index,
            gpu_minor=gpu.minor,
            profile=profile.name,
            placement_start=instance.placement_start,
            profile_id=profile.profile_id,
            compute_slice_start=instance.compute_slice_start,
        ),
        kind=KIND_MIG,
        uuid=instance.uuid,
        index=gpu.index,
        minor=gpu.minor,
        parent_uuid=gpu.uuid,
        attributes=_mig_attributes(gpu, common, profile, instance.uuid),
        capacity=_mig_capacity(profile),
        device_nodes=gpu.device_nodes + instance.device_nodes,
    )


def _abstract_mig_device(
    gpu: GpuInfo, common: dict[str, AttributeValue], naming: DeviceNaming, profile: MigProfile, start: int
) -> Device:
    """A MIG device that would be created at prepare time; it has no UUID yet."""
    consumes = {_COUNTER_FOR_CAPACITY[k]: c for k, c in _mig_capacity(profile).items()}
    for slot in range(start, start + profile.memory_slices):
        consumes[f"memory-slice-{slot}"] = "1"
    return Device(
        name=mig_name(
            naming,
            gpu_index=gpu.index,
            gpu_minor=gpu.minor,
            profile=profile.name,
            placement_start=start,
            profile_id=profile.profile_id,
        ),
        kind=KIND_MIG,
        uuid="",
        index=gpu.index,
        minor=gpu.minor,
        parent_uuid=gpu.uuid,
        attributes=_mig_attributes(gpu, common, profile, ""),
        capacity=_mig_capacity(profile),
        device_nodes=gpu.device_nodes,
        consumes_counters=(CounterConsumption(counter_set_name(gpu.index), consumes),),
    )


def _gpu_counters(gpu: GpuInfo) -> dict[str, str]:
    """The whole GPU as counters: every engine kind, memory, and one counter per memory slice."""
    largest = max(gpu.mig_profiles, key=lambda p: p.memory_slices)
    counters = {
        "multiprocessors": str(gpu.multiprocessors or largest.multiprocessors),
        "copy-engines": str(gpu.engines.get("copyEngines", largest.copy_engines)),
        "decoders": str(gpu.engines.get("decoders", largest.decoders)),
        "encoders": str(gpu.engines.get("encoders", largest.encoders)),
        "jpeg-engines": str(gpu.engines.get("jpegEngines", largest.jpeg_engines)),
        "ofa-engines": str(gpu.engines.get("ofaEngines", largest.ofa_engines)),
        "memory": format_bytes(gpu.memory_bytes if gpu.memory_bytes is not None else largest.memory_bytes),
    }
    for slot in range(gpu.memory_slice_count):
        counters[f"memory-slice-{slot}"] = "1"
    return counters
