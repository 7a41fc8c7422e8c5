"""NVML reads for usage: every figure from its own call, per-process samples, unsupported calls."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from draplugin.devices.model import Device
from draplugin.usage.nvmlsource import NvmlUsageSource
from draplugin.usage.reading import ProcessUsage

GiB = 1 << 30


class FakeNvml:
    """The pynvml calls the usage source makes, with pynvml's own errors and constants."""

    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlClocksThrottleReasonGpuIdle = pynvml.nvmlClocksThrottleReasonGpuIdle
    nvmlClocksThrottleReasonSwPowerCap = pynvml.nvmlClocksThrottleReasonSwPowerCap

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.calls: list[str] = []
        self.samples: list[Any] = []
        self.since: list[int] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise pynvml.NVMLError(self.fail[name])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self._call("handle")
        return f"handle-{uuid}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> Any:
        self._call("utilization")
        return SimpleNamespace(gpu=42, memory=17)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Any:
        self._call("memory")
        return SimpleNamespace(total=80 * GiB, used=12 * GiB, free=68 * GiB)

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        self._call("power")
        return 312_500

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        self._call("temperature")
        return 64

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:
        self._call("ecc")
        return 5 if kind == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else 1

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:
        self._call("throttle")
        return int(pynvml.nvmlClocksThrottleReasonSwPowerCap)

    def nvmlDeviceGetProcessUtilization(self, handle: str, since: int) -> list[Any]:
        self._call("process_utilization")
        self.since.append(since)
        return self.samples

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        self._call("processes")
        return [SimpleNamespace(pid=10, usedGpuMemory=4 * GiB), SimpleNamespace(pid=30, usedGpuMemory=None)]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: str) -> list[Any]:
        self._call("mps_processes")
        return [SimpleNamespace(pid=20, usedGpuMemory=GiB)]


DEVICE = Device(name="gpu-0", kind="gpu", uuid="GPU-0000", index=0, minor=0)


def sample(pid: int, sm: int, ts: int) -> Any:
    return SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, timeStamp=ts)


def test_every_figure_and_per_process_samples() -> None:
    nvml = FakeNvml()
    nvml.samples = [sample(10, 30, 100), sample(10, 50, 200), sample(20, 10, 150)]
    reading = NvmlUsageSource(nvml).read(DEVICE)
    assert (reading.gpu_ratio, reading.memory_ratio) == (0.42, 0.17)
    assert (reading.memory_used_bytes, reading.memory_total_bytes) == (12 * GiB, 80 * GiB)
    assert (reading.power_watts, reading.temperature_celsius) == (312.5, 64.0)
    assert (reading.ecc_corrected, reading.ecc_uncorrected) == (5, 1)
    assert reading.throttle == {"gpu_idle": False, "sw_power_cap": True}
    by_pid = {p.pid: p for p in reading.processes}
    assert sorted(by_pid) == [10, 20, 30]
    assert (
        by_pid[10].sm_ratio == pytest.approx(0.4) and by_pid[10].memory_bytes == 4 * GiB
    )  # mean of 2 samples
    assert by_pid[20].sm_ratio == pytest.approx(0.1) and by_pid[20].memory_bytes == GiB  # an MPS client
    assert by_pid[30] == ProcessUsage(30, None, None)  # listed, but no sample and no memory figure
    assert reading.errors == ()


def test_samples_are_asked_for_since_the_newest_one_seen() -> None:
    nvml = FakeNvml()
    source = NvmlUsageSource(nvml)
    nvml.samples = [sample(10, 30, 100), sample(10, 50, 200)]
    source.read(DEVICE)
    nvml.samples = []
    source.read(DEVICE)
    assert nvml.since == [0, 200]


def test_no_samples_in_the_window_is_not_an_error() -> None:
    nvml = FakeNvml()
    nvml.fail["process_utilization"] = pynvml.NVML_ERROR_NOT_FOUND
    reading = NvmlUsageSource(nvml).read(DEVICE)
    assert reading.errors == ()
    assert all(p.sm_ratio is None for p in reading.processes)


def test_a_failed_call_costs_only_its_figure_and_unsupported_is_not_asked_again() -> None:
    nvml = FakeNvml()
    nvml.fail["utilization"] = pynvml.NVML_ERROR_NOT_SUPPORTED  # a MIG device
    nvml.fail["power"] = pynvml.NVML_ERROR_UNKNOWN
    source = NvmlUsageSource(nvml)
    reading = source.read(DEVICE)
    assert reading.gpu_ratio is None and reading.power_watts is None
    assert reading.memory_used_bytes == 12 * GiB and reading.temperature_celsius == 64.0
    assert reading.errors == ("NotSupported", "Unknown")
    nvml.calls.clear()
    assert source.read(DEVICE).errors == ("Unknown",)
    assert "utilization" not in nvml.calls and "power" in nvml.calls


def test_a_lost_gpu_drops_its_handle_so_the_next_pass_looks_it_up_again() -> None:
    nvml = FakeNvml()
    nvml.fail["memory"] = pynvml.NVML_ERROR_GPU_IS_LOST
    source = NvmlUsageSource(nvml)
    source.read(DEVICE)
    source.read(DEVICE)
    assert nvml.calls.count("handle") == 2


def test_a_device_nvml_cannot_find_raises_for_the_sampler_to_count() -> None:
    nvml = FakeNvml()
    nvml.fail["handle"] = pynvml.NVML_ERROR_NOT_FOUND
    with pytest.raises(pynvml.NVMLError):
        NvmlUsageSource(nvml).read(DEVICE)
