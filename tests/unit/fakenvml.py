"""A fake NVML module, only for what the C-ABI NVML double cannot model (docs/architecture.md,
"Where tests still use the Python NVML fake, and why"): a GPU without MIG support (the A10G),
Blackwell's -me profiles, INVALID_ARGUMENT for an empty MIG slot, NVML_ERROR_UNKNOWN on a GPU.

It offers the `pynvml` functions the adapter and `make gpu-check` call, driven by plain data
(GPUs, MIG profiles with placements, MIG devices, a per-GPU error). Constants, ctypes structures
and `NVMLError_*` classes are pynvml's own (attribute fall-through), so the adapter's ctypes
out-array code and its error handling run for real.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass
class FakeProfile:
    """A GPU instance profile: `index` is NVML's profile enum (0 = 1 slice), `id` its profile id."""

    index: int
    id: int
    name: str  # as NVML reports it: "MIG 1g.10gb"
    slice_count: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int = 1
    decoders: int = 0
    encoders: int = 0
    jpegs: int = 0
    ofas: int = 0
    placements: tuple[tuple[int, int], ...] = ()  # (start, size)


@dataclass
class FakeMig:
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    start: int
    size: int


@dataclass
class FakeGpu:
    uuid: str
    name: str
    minor: int
    bus_id: str  # NVML form, 8-digit domain
    memory_bytes: int
    architecture: int = pynvml.NVML_DEVICE_ARCH_HOPPER
    brand: int = pynvml.NVML_BRAND_NVIDIA
    compute_capability: tuple[int, int] = (9, 0)
    mig_mode: tuple[int, int] | None = None  # None: MIG not supported
    profiles: list[FakeProfile] = field(default_factory=list)
    migs: list[FakeMig | None] = field(default_factory=list)  # None = hole at that MIG index
    # An NVML error code every per-device read of this GPU answers (GPU_IS_LOST: it fell off the bus).
    error: int | None = None


class FakeNvml:
    """Stands in for the `pynvml` module."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "580.65.06",
        cuda_version: int = 13000,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.initialized = False
        self.nvmlLib: Any = None
        self.mig_serial = 0

    def __getattr__(self, name: str) -> Any:
        # Constants, structures and error classes come from the real binding.
        return getattr(pynvml, name)

    def _gpu_error(self, handle: FakeGpu | FakeMig) -> None:
        if isinstance(handle, FakeGpu) and handle.error is not None:
            raise pynvml.NVMLError(handle.error)

    # --- system ---
    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda_version

    # --- devices ---
    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index]

    def nvmlDeviceGetIndex(self, gpu: FakeGpu) -> int:
        return self.gpus.index(gpu)

    def nvmlDeviceGetUUID(self, handle: FakeGpu | FakeMig) -> str:
        self._gpu_error(handle)
        return handle.uuid

    def nvmlDeviceGetName(self, gpu: FakeGpu) -> str:
        return gpu.name

    def nvmlDeviceGetBrand(self, gpu: FakeGpu) -> int:
        return gpu.brand

    def nvmlDeviceGetArchitecture(self, gpu: FakeGpu) -> int:
        return gpu.architecture

    def nvmlDeviceGetCudaComputeCapability(self, gpu: FakeGpu) -> tuple[int, int]:
        return gpu.compute_capability

    def nvmlDeviceGetMinorNumber(self, gpu: FakeGpu) -> int:
        self._gpu_error(gpu)
        return gpu.minor

    def nvmlDeviceGetMemoryInfo(self, gpu: FakeGpu) -> Any:
        info = pynvml.c_nvmlMemory_t()
        info.total = gpu.memory_bytes
        return info

    def nvmlDeviceGetPciInfo(self, gpu: FakeGpu) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        return info

    # --- MIG ---
    def nvmlDeviceGetMigMode(self, gpu: FakeGpu) -> list[int]:
        if gpu.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(gpu.mig_mode)

    def nvmlDeviceSetMigMode(self, gpu: FakeGpu, mode: int) -> int:
        """Hopper and later switch at once; Ampere only sets the pending mode (a reset activates it)."""
        if gpu.mig_mode is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if gpu.architecture >= pynvml.NVML_DEVICE_ARCH_HOPPER:
            gpu.mig_mode = (mode, mode)
            return int(pynvml.NVML_SUCCESS)
        gpu.mig_mode = (gpu.mig_mode[0], mode)
        return int(pynvml.NVML_ERROR_RESET_REQUIRED)

    def nvmlDeviceGetGpuInstanceProfileInfo(self, gpu: FakeGpu, index: int, version: int = 2) -> Any:
        for p in gpu.profiles:
            if p.index == index:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.id = p.id
                info.sliceCount = p.slice_count
                info.instanceCount = len(p.placements)
                info.multiprocessorCount = p.multiprocessors
                info.copyEngineCount = p.copy_engines
                info.decoderCount = p.decoders
                info.encoderCount = p.encoders
                info.jpegCount = p.jpegs
                info.ofaCount = p.ofas
                info.memorySizeMB = p.memory_mib
                info.name = p.name.encode()
                return info
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, gpu: FakeGpu, profile_id: int, placements: Any, count_ref: Any
    ) -> int:
        count = count_ref._obj
        profile = next(p for p in gpu.profiles if p.id == profile_id)
        if len(profile.placements) > count.value:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, (start, size) in enumerate(profile.placements):
            placements[i].start = start
            placements[i].size = size
        count.value = len(profile.placements)
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetMaxMigDeviceCount(self, gpu: FakeGpu) -> int:
        return 7 if gpu.mig_mode is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, gpu: FakeGpu, index: int) -> FakeMig:
        mig = gpu.migs[index] if index < len(gpu.migs) else None
        if mig is None or mig.compute_instance_id < 0:  # a GPU instance is a MIG device once it has a CI
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return mig

    def nvmlDeviceGetGpuInstanceId(self, mig: FakeMig) -> int:
        return mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, mig: FakeMig) -> int:
        return mig.compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, gpu: FakeGpu, gi: int) -> FakeMig:
        if gpu.mig_mode is not None and gpu.mig_mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)  # nvml.h: MIG mode is off
        for mig in gpu.migs:
            if mig is not None and mig.gpu_instance_id == gi:
                return mig
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetInfo(self, mig: FakeMig) -> Any:
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = mig.gpu_instance_id
        info.profileId = mig.profile_id
        info.placement.start = mig.start
        info.placement.size = mig.size
        return info

    # --- dynamic MIG: create and destroy instances as the driver does (placement conflicts included) ---
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == text:
                return gpu
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, gpu: FakeGpu, profile_id: int, placement_ref: Any
    ) -> FakeMig:
        # The C signature takes `const nvmlGpuInstancePlacement_t *`: only a reference will do.
        if not hasattr(placement_ref, "_obj"):
            raise TypeError("nvmlDeviceCreateGpuInstanceWithPlacement wants ctypes.byref(placement)")
        placement = placement_ref._obj
        if gpu.mig_mode is None or gpu.mig_mode[0] != pynvml.NVML_DEVICE_MIG_ENABLE:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        profile = next((p for p in gpu.profiles if p.id == profile_id), None)
        if profile is None or (int(placement.start), int(placement.size)) not in profile.placements:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        start, size = int(placement.start), int(placement.size)
        for mig in gpu.migs:
            if mig is not None and mig.start < start + size and start < mig.start + mig.size:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        used = {m.gpu_instance_id for m in gpu.migs if m is not None}
        gi = next(n for n in range(1, 32) if n not in used)
        self.mig_serial += 1
        mig = FakeMig(f"MIG-ffffffff-0000-0000-0000-{self.mig_serial:012d}", gi, -1, profile_id, start, size)
        holes = [i for i, m in enumerate(gpu.migs) if m is None]
        if holes:
            gpu.migs[holes[0]] = mig
        else:
            gpu.migs.append(mig)
        return mig

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: FakeMig, profile: int, eng_profile: int, version: int = 2
    ) -> Any:
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gi: FakeMig, profile_id: int) -> FakeMig:
        if gi.compute_instance_id >= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi.compute_instance_id = 0
        return gi

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: FakeMig, ci: int) -> FakeMig:
        if gi.compute_instance_id < 0 or gi.compute_instance_id != ci:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gi

    def nvmlComputeInstanceGetInfo(self, ci: FakeMig) -> Any:
        return FakeComputeInstanceInfo(device=ci, id=ci.compute_instance_id)

    def nvmlComputeInstanceDestroy(self, ci: FakeMig) -> None:
        ci.compute_instance_id = -1

    def nvmlGpuInstanceDestroy(self, gi: FakeMig) -> None:
        if gi.compute_instance_id >= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)  # the driver refuses while a CI exists
        for gpu in self.gpus:
            for i, mig in enumerate(gpu.migs):
                if mig is gi:
                    gpu.migs[i] = None


@dataclass
class FakeComputeInstanceInfo:
    """The fields of c_nvmlComputeInstanceInfo_t the adapter reads, holding a fake MIG device handle."""

    device: FakeMig
    id: int
    profileId: int = 0xFFFFFFFF  # matches no compute instance profile: the full GPU instance


def h100_with_mig(uuid: str = "GPU-11111111-2222-3333-4444-555555555555", minor: int = 0) -> FakeGpu:
    """An H100 in MIG mode with 1g.10gb, 3g.40gb and 7g.80gb profiles and two MIG devices, a hole between."""
    profiles = [
        FakeProfile(0, 19, "MIG 1g.10gb", 1, 9984, 16, 1, 1, 0, 1, 0, tuple((s, 1) for s in range(7))),
        FakeProfile(2, 9, "MIG 3g.40gb", 3, 40192, 60, 3, 3, 0, 3, 0, ((0, 4), (4, 4))),
        FakeProfile(4, 0, "MIG 7g.80gb", 7, 80896, 132, 8, 7, 0, 7, 1, ((0, 8),)),
    ]
    migs: list[FakeMig | None] = [
        FakeMig("MIG-aaaaaaaa-0000-0000-0000-000000000001", 2, 0, 9, 0, 4),
        None,
        FakeMig("MIG-aaaaaaaa-0000-0000-0000-000000000002", 9, 0, 19, 6, 1),
    ]
    return FakeGpu(
        uuid=uuid,
        name="NVIDIA H100 80GB HBM3",
        minor=minor,
        bus_id="00000000:18:00.0",
        memory_bytes=81559 << 20,
        mig_mode=(pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE),
        profiles=profiles,
        migs=migs,
    )


def a10g(uuid: str = "GPU-99999999-0000-0000-0000-000000000000", minor: int = 1) -> FakeGpu:
    """An A10G: no MIG support at all."""
    return FakeGpu(
        uuid=uuid,
        name="NVIDIA A10G",
        minor=minor,
        bus_id="00000000:3B:00.0",
        memory_bytes=23028 << 20,
        architecture=pynvml.NVML_DEVICE_ARCH_AMPERE,
        compute_capability=(8, 6),
    )
