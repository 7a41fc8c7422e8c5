"""Dynamic MIG through NVML (against the fake NVML): create at a placement, conflicts, undo, destroy."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from draplugin.devices.mig import (
    MIG_ERROR,
    MIG_MODE_DISABLED,
    MIG_PLACEMENT_TAKEN,
    MigOperationError,
    MigPlacement,
)
from draplugin.devices.nvml import NvmlBackend
from tests.unit.fakenvml import FakeGpu, FakeNvml, h100_with_mig

PARENT = "GPU-11111111-2222-3333-4444-555555555555"


def write_caps(proc: Path, gi: int, ci: int = 0, minor: int = 0) -> tuple[str, str]:
    """The /proc access files the driver creates with a GPU/compute instance."""
    base = proc / f"driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True, exist_ok=True)
    (base / "access").write_text(f"DeviceFileMinor: {100 + gi}\n")
    (base / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {200 + gi}\n")
    return (f"/dev/nvidia-caps/nvidia-cap{100 + gi}", f"/dev/nvidia-caps/nvidia-cap{200 + gi}")


def make(tmp_path: Path, gpu: FakeGpu | None = None) -> tuple[FakeNvml, NvmlBackend]:
    nvml = FakeNvml([gpu or h100_with_mig()])
    return nvml, NvmlBackend("node-a", nvml=nvml, partitionable=True, proc_root=str(tmp_path))


def at(profile: str, start: int) -> MigPlacement:
    return MigPlacement(PARENT, 0, profile, start)


def test_create_makes_gpu_and_compute_instance_at_the_placement(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)
    caps = write_caps(tmp_path, gi=1)  # GI IDs 2 and 9 are taken by the existing MIG devices
    backend.mig_check_free(at("1g.10gb", 4))
    created = backend.mig_create(at("1g.10gb", 4))
    assert created.gpu_instance_id == 1 and created.compute_instance_id == 0
    assert created.uuid.startswith("MIG-ffffffff") and created.cap_nodes == caps
    mig = next(m for m in nvml.gpus[0].migs if m is not None and m.gpu_instance_id == 1)
    assert (mig.start, mig.size, mig.profile_id, mig.compute_instance_id) == (4, 1, 19, 0)
    assert backend.mig_find(at("1g.10gb", 4)) == created
    assert backend.mig_find(at("1g.10gb", 5)) is None


def test_a_placement_taken_outside_the_plugin_is_refused_by_name(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)
    with pytest.raises(MigOperationError) as err:
        backend.mig_check_free(at("1g.10gb", 1))  # inside the existing 3g.40gb at slices 0..3
    assert err.value.reason == MIG_PLACEMENT_TAKEN and "existing GPU instance 2" in str(err.value)
    with pytest.raises(MigOperationError) as err:
        backend.mig_create(at("1g.10gb", 6))  # NVML itself refuses (INSUFFICIENT_RESOURCES)
    assert err.value.reason == MIG_PLACEMENT_TAKEN
    assert len([m for m in nvml.gpus[0].migs if m is not None]) == 2


def test_mig_mode_off_on_a_gpu_that_needs_a_reset_to_switch_is_its_own_error(tmp_path: Path) -> None:
    gpu = h100_with_mig()
    gpu.architecture = pynvml.NVML_DEVICE_ARCH_AMPERE  # switching MIG mode takes a GPU reset
    gpu.mig_mode = (pynvml.NVML_DEVICE_MIG_DISABLE, pynvml.NVML_DEVICE_MIG_DISABLE)
    gpu.migs = []
    _, backend = make(tmp_path, gpu)
    with pytest.raises(MigOperationError) as err:
        backend.mig_check_free(at("1g.10gb", 0))
    assert err.value.reason == MIG_MODE_DISABLED and "nvidia-smi -i <gpu> -mig 1" in str(err.value)


def test_a_failed_compute_instance_leaves_no_gpu_instance_behind(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)
    nvml.failing["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(MigOperationError) as err:
        backend.mig_create(at("1g.10gb", 4))
    assert err.value.reason == MIG_ERROR
    assert [m.gpu_instance_id for m in nvml.gpus[0].migs if m is not None] == [2, 9]


def test_missing_caps_files_undo_the_create(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)  # no /proc access files for the new GI: unusable in a container
    with pytest.raises(MigOperationError, match="nvidia-caps access files"):
        backend.mig_create(at("1g.10gb", 4))
    assert [m.gpu_instance_id for m in nvml.gpus[0].migs if m is not None] == [2, 9]


def test_destroy_removes_exactly_the_instance_it_names(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)
    write_caps(tmp_path, gi=1)
    created = backend.mig_create(at("1g.10gb", 4))
    # Someone else's instance sits at 3g.40gb@0 (GI 2): a destroy naming another GI leaves it alone.
    assert backend.mig_destroy(at("3g.40gb", 0), gpu_instance_id=7)
    assert backend.mig_destroy(at("1g.10gb", 4), created.gpu_instance_id)
    assert [m.gpu_instance_id for m in nvml.gpus[0].migs if m is not None] == [2, 9]
    assert backend.mig_find(at("1g.10gb", 4)) is None


def test_a_bare_gpu_instance_is_found_and_destroyed(tmp_path: Path) -> None:
    """A crash between the GPU instance and the compute instance: found by placement, destroyed."""
    nvml, backend = make(tmp_path)
    placement = pynvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = 5, 1
    nvml.nvmlDeviceCreateGpuInstanceWithPlacement(nvml.gpus[0], 19, ctypes.byref(placement))
    found = backend.mig_find(at("1g.10gb", 5))
    assert found is not None and found.compute_instance_id == -1
    assert backend.mig_destroy(at("1g.10gb", 5), None)
    assert backend.mig_find(at("1g.10gb", 5)) is None


def test_nvml_errors_on_destroy_are_mig_errors(tmp_path: Path) -> None:
    nvml, backend = make(tmp_path)
    write_caps(tmp_path, gi=1)
    created = backend.mig_create(at("1g.10gb", 4))
    nvml.failing["nvmlComputeInstanceDestroy"] = pynvml.NVML_ERROR_IN_USE
    with pytest.raises(MigOperationError, match="processes still running"):
        backend.mig_destroy(at("1g.10gb", 4), created.gpu_instance_id)
