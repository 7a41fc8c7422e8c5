"""NVML reads for usage on the C-ABI NVML double (go-nvml's H100), through the real pynvml: every
figure from its own call, per-process samples, unsupported calls, MIG mode, lost GPUs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest

from draplugin.devices.model import Device
from draplugin.usage.nvmlsource import NvmlUsageSource
from draplugin.usage.reading import ProcessUsage
from tests import nvmldouble
from tests.nvmldouble import Gpu, NvmlDouble, Process

GiB = 1 << 30

# GPU 0's telemetry and processes: pid 10 a plain CUDA process, 20 an MPS client, 30 listed but idle
# (no utilization, so NVML has no sample of it).
BUSY = Gpu(
    index=0,
    gpu_utilization=42,
    memory_utilization=17,
    power_milliwatts=312_500,
    temperature_celsius=64,
    ecc_corrected=5,
    ecc_uncorrected=1,
    throttle_reasons=int(pynvml.nvmlClocksThrottleReasonSwPowerCap),
    processes=(
        Process(10, used_memory=4 * GiB, sm_util=30, mem_util=5),
        Process(20, used_memory=GiB, mps=True, sm_util=10, mem_util=1),
        Process(30),
    ),
)


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


@pytest.fixture
def on_double(nvml_double: Callable[..., NvmlDouble]) -> Iterator[tuple[NvmlDouble, ModuleType, Device]]:
    """One H100 running BUSY's processes, pynvml initialised on it, and the plugin's device for it."""
    double = nvml_double("dgxh100", gpus=1, overrides=[BUSY])
    with double.pynvml() as nvml:
        uuid = str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0)))
        yield double, nvml, Device(name="gpu-0", kind="gpu", uuid=uuid, index=0, minor=0)


def total_memory(nvml: ModuleType, uuid: str) -> int:
    return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByUUID(uuid)).total)


def test_every_figure_and_per_process_samples(on_double: tuple[NvmlDouble, ModuleType, Device]) -> None:
    _, nvml, device = on_double
    reading = NvmlUsageSource(nvml).read(device)
    assert (reading.gpu_ratio, reading.memory_ratio) == (0.42, 0.17)
    assert reading.memory_used_bytes == 5 * GiB  # the processes' framebuffer memory
    assert reading.memory_total_bytes == total_memory(nvml, device.uuid) > 5 * GiB
    assert (reading.power_watts, reading.temperature_celsius) == (312.5, 64.0)
    assert (reading.ecc_corrected, reading.ecc_uncorrected) == (5, 1)
    assert reading.throttle["sw_power_cap"] is True
    assert not any(v for k, v in reading.throttle.items() if k != "sw_power_cap")
    by_pid = {p.pid: p for p in reading.processes}
    assert sorted(by_pid) == [10, 20, 30]
    assert by_pid[10].sm_ratio == pytest.approx(0.3) and by_pid[10].memory_bytes == 4 * GiB
    assert by_pid[20].sm_ratio == pytest.approx(0.1) and by_pid[20].memory_bytes == GiB  # an MPS client
    assert by_pid[30] == ProcessUsage(30, None, 0)  # listed, but idle: no sample
    assert reading.errors == ()


def test_several_samples_of_one_process_are_averaged(
    on_double: tuple[NvmlDouble, ModuleType, Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The double samples each process once per call; a driver keeps a buffer of samples per process,
    # so a second, later sample of pid 10 is added to the double's own answer here.
    _, nvml, device = on_double
    real = pynvml.nvmlDeviceGetProcessUtilization

    def two_of_pid_10(handle: Any, since: int) -> list[Any]:
        samples = list(real(handle, since))
        later = pynvml.c_nvmlProcessUtilizationSample_t()
        later.pid, later.smUtil, later.memUtil = 10, 50, 0
        later.timeStamp = max(int(s.timeStamp) for s in samples) + 1
        return [*samples, later]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", two_of_pid_10)
    by_pid = {p.pid: p for p in NvmlUsageSource(nvml).read(device).processes}
    assert by_pid[10].sm_ratio == pytest.approx(0.4)  # (30 + 50) / 2
    assert by_pid[20].sm_ratio == pytest.approx(0.1)


def test_samples_are_asked_for_since_the_newest_one_seen(
    on_double: tuple[NvmlDouble, ModuleType, Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, nvml, device = on_double
    real = pynvml.nvmlDeviceGetProcessUtilization
    asked: list[int] = []
    answered: list[int] = []

    def recording(handle: Any, since: int) -> list[Any]:
        asked.append(since)
        samples = list(real(handle, since))
        answered.append(max(int(s.timeStamp) for s in samples))
        return samples

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", recording)
    source = NvmlUsageSource(nvml)
    source.read(device)
    source.read(device)
    assert asked == [0, answered[0]]
    assert answered[1] > answered[0]  # the double's clock moved on: a new sample, not the old one


def test_no_samples_in_the_window_is_not_an_error(nvml_double: Callable[..., NvmlDouble]) -> None:
    # Only an idle process: NVML finds no sample newer than lastSeenTimeStamp and answers NOT_FOUND.
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, processes=(Process(30, GiB),))])
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetProcessUtilization(handle, 0)
        device = Device(name="gpu-0", kind="gpu", uuid=str(nvml.nvmlDeviceGetUUID(handle)), index=0, minor=0)
        reading = NvmlUsageSource(nvml).read(device)
    assert reading.errors == ()
    assert reading.processes == (ProcessUsage(30, None, GiB),)


def test_zero_samples_reported_as_success_is_not_an_error(
    on_double: tuple[NvmlDouble, ModuleType, Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A driver answering SUCCESS with no samples to pynvml's size query makes pynvml raise
    # NVMLError(NVML_SUCCESS); the double answers NOT_FOUND as nvml.h documents, so it is raised here.
    _, nvml, device = on_double

    def success(handle: Any, since: int) -> list[Any]:
        raise pynvml.NVMLError(pynvml.NVML_SUCCESS)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", success)
    reading = NvmlUsageSource(nvml).read(device)
    assert reading.errors == ()
    assert all(p.sm_ratio is None for p in reading.processes)


def test_a_failed_call_costs_only_its_figure_and_unsupported_is_not_asked_again(
    nvml_double: Callable[..., NvmlDouble], monkeypatch: pytest.MonkeyPatch
) -> None:
    # MIG mode on: NVML answers NOT_SUPPORTED for device and process utilization. The power reading
    # failing with UNKNOWN is raised from pynvml's function on top of the double (it has no such fault).
    double = nvml_double("dgxh100", gpus=1, overrides=[dataclasses.replace(BUSY, mig_mode=1)])
    calls: list[str] = []
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"):
        real = getattr(pynvml, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(pynvml, name, counted)

    def unknown(handle: Any) -> int:
        calls.append("nvmlDeviceGetPowerUsage")
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", unknown)
    with double.pynvml() as nvml:
        uuid = str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(0)))
        device = Device(name="gpu-0", kind="gpu", uuid=uuid, index=0, minor=0)
        source = NvmlUsageSource(nvml)
        reading = source.read(device)
        assert reading.gpu_ratio is None and reading.power_watts is None
        assert reading.memory_used_bytes == 5 * GiB and reading.temperature_celsius == 64.0
        assert reading.errors == ("NotSupported", "Unknown", "NotSupported")
        assert {p.pid: p.sm_ratio for p in reading.processes} == {10: None, 20: None, 30: None}
        calls.clear()
        assert source.read(device).errors == ("Unknown",)
    assert calls == ["nvmlDeviceGetPowerUsage"]  # neither utilization asked again


def test_utilization_is_read_again_once_mig_mode_is_switched_off(
    nvml_double: Callable[..., NvmlDouble],
) -> None:
    """NOT_SUPPORTED for utilization holds only while MIG mode is on: the plugin switches it off
    for a whole-GPU claim (partitionable MIG), and the GPU's utilization is then read again."""
    double = nvml_double("dgxh100", gpus=1, overrides=[dataclasses.replace(BUSY, mig_mode=1)])
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        device = Device(name="gpu-0", kind="gpu", uuid=str(nvml.nvmlDeviceGetUUID(handle)), index=0, minor=0)
        source = NvmlUsageSource(nvml)
        assert source.read(device).gpu_ratio is None
        # The driver switches MIG mode only with no process on the GPU: the claim's pod starts after.
        double.override(0, processes=())
        nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE)  # Hopper: at once
        assert nvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_DISABLE
        double.override(0, processes=BUSY.processes)
        reading = source.read(device)
        assert (reading.gpu_ratio, reading.memory_ratio) == (0.42, 0.17)
        assert reading.errors == ()
        assert {p.pid: p.sm_ratio for p in reading.processes}[10] == pytest.approx(0.3)
        double.override(0, processes=())
        nvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
        assert source.read(device).errors == ("NotSupported", "NotSupported")  # unsupported again
        assert source.read(device).errors == ()  # and not asked again while MIG stays on


def test_a_lost_gpu_drops_its_handle_so_the_next_pass_looks_it_up_again(
    on_double: tuple[NvmlDouble, ModuleType, Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    double, nvml, device = on_double
    real = pynvml.nvmlDeviceGetHandleByUUID
    lookups: list[str] = []

    def looked_up(uuid: Any) -> Any:
        lookups.append(str(uuid))
        return real(uuid)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", looked_up)
    source = NvmlUsageSource(nvml)
    assert source.read(device).errors == ()
    source.read(device)
    assert len(lookups) == 1  # a working handle is kept
    double.mark_lost(0)
    assert "GpuIsLost" in source.read(device).errors
    double.mark_lost(0, False)
    assert source.read(device).errors == ()
    assert len(lookups) == 2


def test_a_device_nvml_cannot_find_raises_for_the_sampler_to_count(
    on_double: tuple[NvmlDouble, ModuleType, Device],
) -> None:
    _, nvml, device = on_double
    gone = Device(name="gpu-9", kind="gpu", uuid="GPU-00000000-0000-0000-0000-000000000009", index=9, minor=9)
    with pytest.raises(pynvml.NVMLError_NotFound):
        NvmlUsageSource(nvml).read(gone)
    on_double[0].mark_lost(0)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # the double's handle lookup of a lost GPU
        NvmlUsageSource(nvml).read(device)
