"""Discovery of shared GPUs on the NVML double: each says whether its shares' memory is limited by the
driver's per-cgroup limit (`sharedMemoryLimit`), and one whose limit cannot be set is published whole
(`--unlimited-shares=skip`) or shared and marked `none` (`publish`), with a Node Event."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from draplugin.devices.model import Device
from draplugin.devices.shared import SharedGpus, UnlimitedShares
from tests import nvmldouble
from tests.nvmldouble import Gpu, NvmlDouble

CGROUP2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"
CGROUP1_MOUNTS = (
    "tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw 0 0\n"
)


class Events:
    """Collects what the backend posts as Node Events (draplugin.devices.nvml.NodeEventSink)."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None:
        self.posted.append((reason, note))


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


@pytest.fixture
def hook(tmp_path: Path) -> Path:
    path = tmp_path / "nvidia-cdi-hook"
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def _mounts(tmp_path: Path, text: str) -> str:
    path = tmp_path / "mounts"
    path.write_text(text)
    return str(path)


def _discover(
    double: NvmlDouble, request: pytest.FixtureRequest, **options: Any
) -> tuple[list[Device], Events]:
    backend = nvmldouble.plugin_backend(double, request, shared_gpus=SharedGpus.MEMORY, **options)
    events = Events()
    backend.attach_events(events)
    return [d for d in backend.discover() if d.kind == "gpu"], events


def _by_index(devices: list[Device]) -> dict[int, Device]:
    return {int(str(d.attributes["index"])): d for d in devices}


def test_skip_publishes_a_gpu_without_the_limit_whole(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, hook: Path, tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[Gpu(index=1, memory_limits=False)])
    devices, events = _discover(
        double, request, nvidia_cdi_hook_path=str(hook), mounts_file=_mounts(tmp_path, CGROUP2_MOUNTS)
    )
    gpus = _by_index(devices)
    assert gpus[0].allow_multiple_allocations and gpus[0].attributes["sharedMemoryLimit"] == "nvml-cgroup"
    assert not gpus[1].allow_multiple_allocations and not gpus[1].capacity_policies
    assert "sharedMemoryLimit" not in gpus[1].attributes
    (event,) = events.posted
    assert event[0] == "SharedGpuMemoryNotLimited"
    assert gpus[1].uuid in event[1] and "NOT_SUPPORTED" in event[1].upper().replace(" ", "_")
    assert "published whole" in event[1]


def test_publish_marks_a_gpu_without_the_limit(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, hook: Path, tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[Gpu(index=1, memory_limits=False)])
    devices, events = _discover(
        double,
        request,
        nvidia_cdi_hook_path=str(hook),
        mounts_file=_mounts(tmp_path, CGROUP2_MOUNTS),
        unlimited_shares=UnlimitedShares.PUBLISH,
    )
    gpus = _by_index(devices)
    assert gpus[0].attributes["sharedMemoryLimit"] == "nvml-cgroup"
    assert gpus[1].allow_multiple_allocations and gpus[1].attributes["sharedMemoryLimit"] == "none"
    assert [reason for reason, _ in events.posted] == ["SharedGpuMemoryNotLimited"]


@pytest.mark.parametrize(
    ("hook_present", "mounts", "problem"),
    [
        (False, CGROUP2_MOUNTS, "not an executable file"),
        (True, CGROUP1_MOUNTS, "not cgroup v2"),
    ],
)
def test_a_missing_hook_or_cgroup_v1_leaves_no_gpu_limited(
    nvml_double: Callable[..., NvmlDouble],
    request: pytest.FixtureRequest,
    tmp_path: Path,
    hook_present: bool,
    mounts: str,
    problem: str,
) -> None:
    hook = tmp_path / "nvidia-cdi-hook"
    if hook_present:
        hook.write_text("#!/bin/sh\n")
        hook.chmod(0o755)
    double = nvml_double("dgxh100", gpus=2)
    devices, events = _discover(
        double,
        request,
        nvidia_cdi_hook_path=str(hook),
        mounts_file=_mounts(tmp_path, mounts),
        unlimited_shares=UnlimitedShares.PUBLISH,
    )
    assert [d.attributes["sharedMemoryLimit"] for d in devices] == ["none", "none"]
    assert len(events.posted) == 2 and all(problem in note for _, note in events.posted)


def test_without_a_hook_path_no_share_is_published(
    nvml_double: Callable[..., NvmlDouble], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    devices, events = _discover(double, request, mounts_file=_mounts(tmp_path, CGROUP2_MOUNTS))
    assert [d.allow_multiple_allocations for d in devices] == [False]
    assert "--nvidia-cdi-hook-path" in events.posted[0][1]


def test_load_backend_passes_the_settings_to_the_nvml_backend(
    nvml_double: Callable[..., NvmlDouble], monkeypatch: pytest.MonkeyPatch, hook: Path, tmp_path: Path
) -> None:
    from draplugin.devices import load_backend
    from draplugin.devices.nvml import NvmlBackend

    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, memory_limits=False)])
    monkeypatch.setenv("NVML_DOUBLE_CONFIG", str(double.config_path))
    backend = load_backend(
        "nvml",
        "node-a",
        lib_path=str(double.lib_path),
        shared_gpus=SharedGpus.MEMORY,
        nvidia_cdi_hook_path=str(hook),
        unlimited_shares=UnlimitedShares.PUBLISH,
    )
    assert isinstance(backend, NvmlBackend)
    try:
        # publish: the GPU whose driver answers NOT_SUPPORTED is still shared, marked none.
        assert [d.attributes.get("sharedMemoryLimit") for d in backend.discover()] == ["none"]
    finally:
        backend.close()
