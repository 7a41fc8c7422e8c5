"""The NVML double's per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1 / GetMemoryLimits_v1),
through the real pynvml: what nvml.h documents for them, every set recorded, NOT_SUPPORTED where
configured and on MIG handles, and a limit dropped once its cgroup directory is gone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import nvmldouble
from tests.nvmldouble import Gpu, MemoryLimitCall, MigDevice, NvmlDouble

MiB = 1 << 20
H100_MEMORY = 81920 * MiB  # go-nvml's mock H100 (pkg/nvml/mock/gpus/h100.go)
LIMIT_MAX = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


def _set(nvml: Any, handle: Any, cgroup: Path | str, soft: int, hard: int) -> None:
    limits = nvml.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace, limits.softLimit, limits.hardLimit = str(cgroup).encode(), soft, hard
    nvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)


def _get(nvml: Any, handle: Any, cgroup: Path | str) -> tuple[int, int]:
    limits = nvml.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = str(cgroup).encode()
    nvml.nvmlDeviceGetMemoryLimits_v1(handle, limits)
    return int(limits.softLimit), int(limits.hardLimit)


def test_set_get_clear_and_every_set_recorded(nvml_double: Callable[..., NvmlDouble], tmp_path: Path) -> None:
    double = nvml_double("dgxh100", gpus=2)
    cgroup = tmp_path / "kubepods" / "pod-a"
    cgroup.mkdir(parents=True)
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(1)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        with pytest.raises(nvml.NVMLError_NotFound):
            _get(nvml, handle, cgroup)
        _set(nvml, handle, cgroup, 2048 * MiB, 4096 * MiB)
        assert _get(nvml, handle, cgroup) == (2048 * MiB, 4096 * MiB)
        # "the softLimit exceeds the hardLimit, or a limit exceeds total device memory".
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            _set(nvml, handle, cgroup, 8 * MiB, 4 * MiB)
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            _set(nvml, handle, cgroup, 0, H100_MEMORY + MiB)
        with pytest.raises(nvml.NVMLError_OperatingSystem):  # "if the cgroup path cannot be opened"
            _set(nvml, handle, tmp_path / "absent", 0, MiB)
        assert _get(nvml, handle, cgroup) == (2048 * MiB, 4096 * MiB)
        # "To clear the limits, set softLimit to 0, and hardLimit to NVML_DEVICE_MEMORY_LIMIT_MAX".
        _set(nvml, handle, cgroup, 0, LIMIT_MAX)
        with pytest.raises(nvml.NVMLError_NotFound):
            _get(nvml, handle, cgroup)
    ok, invalid, os_error = 0, 2, 17  # NVML_SUCCESS, NVML_ERROR_INVALID_ARGUMENT, ..._OPERATING_SYSTEM
    assert double.memory_limit_calls() == [
        MemoryLimitCall(uuid, str(cgroup), 2048 * MiB, 4096 * MiB, ok),
        MemoryLimitCall(uuid, str(cgroup), 8 * MiB, 4 * MiB, invalid),
        MemoryLimitCall(uuid, str(cgroup), 0, H100_MEMORY + MiB, invalid),
        MemoryLimitCall(uuid, str(tmp_path / "absent"), 0, MiB, os_error),
        MemoryLimitCall(uuid, str(cgroup), 0, LIMIT_MAX, ok),
    ]


def test_a_limit_goes_with_its_cgroup(nvml_double: Callable[..., NvmlDouble], tmp_path: Path) -> None:
    double = nvml_double("dgxh100", gpus=1)
    kept, removed = tmp_path / "kept", tmp_path / "removed"
    kept.mkdir()
    removed.mkdir()
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        uuid = nvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        _set(nvml, handle, kept, 0, 1024 * MiB)
        _set(nvml, handle, removed, 0, 2048 * MiB)
    assert double.memory_limits() == {
        (uuid, str(kept)): (0, 1024 * MiB),
        (uuid, str(removed)): (0, 2048 * MiB),
    }
    removed.rmdir()
    assert double.memory_limits() == {(uuid, str(kept)): (0, 1024 * MiB)}
    # The state no longer holds it either: a new cgroup of the same path starts without a limit.
    removed.mkdir()
    assert double.memory_limits() == {(uuid, str(kept)): (0, 1024 * MiB)}
    with double.pynvml() as nvml, pytest.raises(nvml.NVMLError_NotFound):
        _get(nvml, nvml.nvmlDeviceGetHandleByIndex(0), removed)


def test_not_supported_where_configured_and_on_mig_handles(
    nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    double = nvml_double(
        "dgxh100",
        gpus=2,
        overrides=[
            Gpu(index=0, memory_limits=False),
            Gpu(index=1, mig_mode=1, mig_devices=(MigDevice(gi_profile_id=0, start=0),)),
        ],
    )
    with double.pynvml() as nvml:
        old = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(nvml.NVMLError_NotSupported):
            _get(nvml, old, tmp_path)
        with pytest.raises(nvml.NVMLError_NotSupported):
            _set(nvml, old, tmp_path, 0, MiB)
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(nvml.nvmlDeviceGetHandleByIndex(1), 0)
        with pytest.raises(nvml.NVMLError_NotSupported):  # "@note MIG handles are not supported"
            _get(nvml, mig, tmp_path)
        with pytest.raises(nvml.NVMLError_NotSupported):
            _set(nvml, mig, tmp_path, 0, MiB)
    not_supported = 3
    assert [(c.cgroup, c.result) for c in double.memory_limit_calls()] == [(str(tmp_path), not_supported)]
