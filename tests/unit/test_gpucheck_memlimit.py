"""gpu-check's memory limit rows on the NVML double: set and read back on a scratch cgroup, the
allocation row skipped without the driver's libcuda, NOT_SUPPORTED a skipped row that names it.
The double holds limits, it does not refuse allocations: the allocation row needs a GPU."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from draplugin.devices.model import Device
from draplugin.gpucheck.memlimit import memory_limit_rows
from draplugin.gpucheck.table import OK, SKIPPED
from tests import nvmldouble
from tests.nvmldouble import Gpu, NvmlDouble

CGROUP2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n"


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


@pytest.fixture
def v2_root() -> Path:
    """A cgroup v2 hierarchy this process can make directories in (a hybrid host's is /unified)."""
    if os.geteuid() != 0:
        pytest.fail("the memory limit rows make cgroups: run as root")
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.procs").exists() and (root / "cgroup.controllers").exists():
            return root
    pytest.fail("no cgroup v2 hierarchy here")


def _gpu(double: NvmlDouble, request: pytest.FixtureRequest) -> tuple[object, Device]:
    backend = nvmldouble.plugin_backend(double, request)
    (gpu,) = [d for d in backend.discover() if d.kind == "gpu"]
    return backend.nvml, gpu


def test_set_read_back_and_cleared(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, v2_root: Path, tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    nvml, gpu = _gpu(double, request)
    mounts = tmp_path / "mounts"
    mounts.write_text(CGROUP2_MOUNTS)
    rows = memory_limit_rows(nvml, gpu, cgroup_root=str(v2_root), mounts_file=str(mounts))
    assert [(r.check, r.ours, r.status) for r in rows] == [
        ("memory limit read back", "1024/1024 MiB", OK),
        ("memory limit allocation", "no libcuda.so.1 to allocate with", SKIPPED),
    ]
    # Cleared and the scratch cgroup gone: the double holds no limit afterwards.
    assert not list(v2_root.glob("draplugin-gpu-check-*"))
    assert double.memory_limits() == {}
    assert [c.hard for c in double.memory_limit_calls()] == [1024 << 20, 0xFFFFFFFFFFFFFFFF]


def test_not_supported_is_a_skipped_row_naming_it(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, v2_root: Path, tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, memory_limits=False)])
    nvml, gpu = _gpu(double, request)
    mounts = tmp_path / "mounts"
    mounts.write_text(CGROUP2_MOUNTS)
    (row,) = memory_limit_rows(nvml, gpu, cgroup_root=str(v2_root), mounts_file=str(mounts))
    assert (row.check, row.status) == ("memory limit set", SKIPPED)
    assert "Not Supported" in row.ours


def test_cgroup_v1_is_a_skipped_row(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    nvml, gpu = _gpu(nvml_double("dgxh100", gpus=1), request)
    mounts = tmp_path / "mounts"
    mounts.write_text("tmpfs /sys/fs/cgroup tmpfs rw 0 0\n")
    (row,) = memory_limit_rows(nvml, gpu, mounts_file=str(mounts))
    assert row.status == SKIPPED and "not cgroup v2" in row.ours
