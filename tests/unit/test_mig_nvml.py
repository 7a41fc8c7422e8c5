"""Dynamic MIG through NVML on the C-ABI NVML double (go-nvml's H100 and A100, in pytest's process):
create at a placement, conflicts, undo, destroy."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from draplugin.devices.schema import DeviceNodeSpec
from tests import nvmldouble
from tests.nvmldouble import GI_PROFILE_1_SLICE, GI_PROFILE_3_SLICE, Gpu, MigDevice, NvmlDouble

# GPU 0 in MIG mode with someone's 3g.40gb at slices 0..2 (GI 1) and 1g.10gb at slice 6 (GI 13).
STATIC = Gpu(
    index=0, mig_mode=1, mig_devices=(MigDevice(GI_PROFILE_3_SLICE, 0), MigDevice(GI_PROFILE_1_SLICE, 6))
)
EXISTING = [(1, 0), (13, 6)]  # (GI, start) of those two


def write_caps(proc: Path, gi: int, ci: int = 0, minor: int = 0) -> tuple[str, str]:
    """The /proc access files the driver creates with a GPU/compute instance (for tests still on
    the Python fake, test_gpucheck.py; the double writes its own)."""
    base = proc / f"driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
    (base / f"ci{ci}").mkdir(parents=True, exist_ok=True)
    (base / "access").write_text(f"DeviceFileMinor: {100 + gi}\n")
    (base / f"ci{ci}" / "access").write_text(f"DeviceFileMinor: {200 + gi}\n")
    return (f"/dev/nvidia-caps/nvidia-cap{100 + gi}", f"/dev/nvidia-caps/nvidia-cap{200 + gi}")


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


def make(
    request: pytest.FixtureRequest,
    nvml_double: Callable[..., NvmlDouble],
    machine: str = "dgxh100",
    **options: Any,
) -> tuple[NvmlDouble, NvmlBackend, str]:
    double = nvml_double(machine, gpus=1, overrides=[options.pop("gpu", STATIC)])
    backend: NvmlBackend = nvmldouble.plugin_backend(double, request, partitionable=True, **options)
    parent = next(d.uuid if d.kind == "gpu" else d.parent_uuid for d in backend.discover())
    assert parent is not None
    return double, backend, parent


def instances(double: NvmlDouble) -> list[tuple[int, int]]:
    (state,) = double.state().values()
    return sorted((int(gi["id"]), int(gi["start"])) for gi in state["gpuInstances"])


def caps_of(double: NvmlDouble, gi: int, ci: int = 0) -> tuple[DeviceNodeSpec, ...]:
    """The nvidia-caps nodes the double's /proc gives this instance (driver formats)."""
    assert double.proc_root is not None
    base = double.proc_root / f"driver/nvidia/capabilities/gpu0/mig/gi{gi}"
    nodes = []
    for access in (base / "access", base / f"ci{ci}" / "access"):
        minor = int(access.read_text().split("DeviceFileMinor:")[1].split()[0])
        nodes.append(DeviceNodeSpec(f"/dev/nvidia-caps/nvidia-cap{minor}", 235, minor, 0o444))
    return tuple(nodes)


def test_create_makes_gpu_and_compute_instance_at_the_placement(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double, backend, parent = make(request, nvml_double)
    at = MigPlacement(parent, 0, "1g.10gb", 4)
    backend.mig_check_free(at)
    created = backend.mig_create(at)
    assert created.gpu_instance_id == 11 and created.compute_instance_id == 0  # the double's GI tree
    assert created.uuid.startswith("MIG-") and created.cap_nodes == caps_of(double, 11)
    assert instances(double) == sorted([*EXISTING, (11, 4)])
    assert backend.mig_find(at) == created
    assert backend.mig_find(MigPlacement(parent, 0, "1g.10gb", 5)) is None


def test_an_a100_in_mig_mode_creates_and_destroys_at_a_placement(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """Ampere too (go-nvml's A100 40GB model, MIG mode on, no instances yet): the plugin's create
    makes the GPU and compute instance where the placement says, destroy removes exactly it."""
    double, backend, parent = make(request, nvml_double, "dgxa100", gpu=Gpu(index=0, mig_mode=1))
    at = MigPlacement(parent, 0, "1g.5gb", 2)
    backend.mig_check_free(at)
    created = backend.mig_create(at)
    assert created.uuid.startswith("MIG-") and created.cap_nodes == caps_of(double, created.gpu_instance_id)
    assert instances(double) == [(created.gpu_instance_id, 2)]
    assert backend.mig_find(at) == created
    assert backend.mig_destroy(at, created.gpu_instance_id)
    assert instances(double) == [] and backend.mig_find(at) is None


def test_a_placement_taken_outside_the_plugin_is_refused_by_name(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double, backend, parent = make(request, nvml_double)
    with pytest.raises(MigOperationError) as err:
        backend.mig_check_free(MigPlacement(parent, 0, "1g.10gb", 1))  # inside the 3g.40gb at 0..2
    assert err.value.reason == MIG_PLACEMENT_TAKEN and "existing GPU instance 1" in str(err.value)
    with pytest.raises(MigOperationError) as err:
        backend.mig_create(MigPlacement(parent, 0, "1g.10gb", 6))  # NVML refuses: INSUFFICIENT_RESOURCES
    assert err.value.reason == MIG_PLACEMENT_TAKEN
    assert instances(double) == EXISTING


def test_mig_mode_off_on_a_gpu_that_needs_a_reset_to_switch_is_its_own_error(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """An A100 (switching MIG mode takes a GPU reset) with MIG mode off."""
    _, backend, parent = make(request, nvml_double, "dgxa100", gpu=Gpu(index=0))
    with pytest.raises(MigOperationError) as err:
        backend.mig_check_free(MigPlacement(parent, 0, "1g.5gb", 0))
    assert err.value.reason == MIG_MODE_DISABLED and "nvidia-smi -i <gpu> -mig 1" in str(err.value)


def test_a_failed_compute_instance_leaves_no_gpu_instance_behind(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], monkeypatch: pytest.MonkeyPatch
) -> None:
    double, backend, parent = make(request, nvml_double)

    def fails(*args: object) -> None:  # the double has no way to fail one create: pynvml's does
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlGpuInstanceCreateComputeInstance", fails)
    with pytest.raises(MigOperationError) as err:
        backend.mig_create(MigPlacement(parent, 0, "1g.10gb", 4))
    assert err.value.reason == MIG_ERROR
    assert instances(double) == EXISTING


def test_missing_caps_files_undo_the_create(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    (tmp_path / "empty-proc").mkdir()  # no /proc access files: unusable in a container
    double, backend, parent = make(request, nvml_double, proc_root=str(tmp_path / "empty-proc"))
    with pytest.raises(MigOperationError, match="nvidia-caps access files"):
        backend.mig_create(MigPlacement(parent, 0, "1g.10gb", 4))
    assert instances(double) == EXISTING


def test_destroy_removes_exactly_the_instance_it_names(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double, backend, parent = make(request, nvml_double)
    created = backend.mig_create(MigPlacement(parent, 0, "1g.10gb", 4))
    # Someone else's instance sits at 3g.40gb@0 (GI 1): a destroy naming another GI leaves it alone.
    assert backend.mig_destroy(MigPlacement(parent, 0, "3g.40gb", 0), gpu_instance_id=7)
    assert backend.mig_destroy(MigPlacement(parent, 0, "1g.10gb", 4), created.gpu_instance_id)
    assert instances(double) == EXISTING
    assert backend.mig_find(MigPlacement(parent, 0, "1g.10gb", 4)) is None


def test_a_bare_gpu_instance_is_found_and_destroyed(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """A crash between the GPU instance and the compute instance: found by placement, destroyed."""
    double, backend, parent = make(request, nvml_double)
    with double.pynvml() as nvml:
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = 5, 1
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            nvml.nvmlDeviceGetHandleByIndex(0), GI_PROFILE_1_SLICE, ctypes.byref(placement)
        )
    found = backend.mig_find(MigPlacement(parent, 0, "1g.10gb", 5))
    assert found is not None and found.compute_instance_id == -1
    assert backend.mig_destroy(MigPlacement(parent, 0, "1g.10gb", 5), None)
    assert backend.mig_find(MigPlacement(parent, 0, "1g.10gb", 5)) is None
    assert instances(double) == EXISTING


def test_nvml_errors_on_destroy_are_mig_errors(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, backend, parent = make(request, nvml_double)
    created = backend.mig_create(MigPlacement(parent, 0, "1g.10gb", 4))

    def in_use(*args: object) -> None:  # processes on it: the double models none on an instance
        raise pynvml.NVMLError(pynvml.NVML_ERROR_IN_USE)

    monkeypatch.setattr(pynvml, "nvmlComputeInstanceDestroy", in_use)
    with pytest.raises(MigOperationError, match="processes still running"):
        backend.mig_destroy(MigPlacement(parent, 0, "1g.10gb", 4), created.gpu_instance_id)
