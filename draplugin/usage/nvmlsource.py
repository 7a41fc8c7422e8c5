"""Usage of real GPUs from NVML: one handle per device UUID (GPU or MIG), read on the sampler's threads.

Each value comes from its own call and a failed call costs only that value:
its reason (the NVML error name, e.g. `NotSupported`, `GpuIsLost`) goes into
the reading's errors. A call that a device does not support is not tried
again on that device (MIG devices have no utilization, power or temperature
of their own; NVML answers NotSupported every time), so the error counter
counts it once instead of on every pass. A whole GPU's NotSupported for
utilization holds only while its MIG mode is on (nvml.h: "On MIG-enabled GPUs,
querying ... is not currently supported"), and the plugin switches MIG mode
at prepare: a GPU whose MIG mode changed has its unsupported calls tried again.

Per-process figures: `nvmlDeviceGetProcessUtilization` returns the SM samples
of each process since the last timestamp we asked for (kept per device), and
the running compute processes (plain and MPS) give each process's framebuffer
memory. A process NVML lists with no sample in the window has no SM figure.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from draplugin.devices.model import Device
from draplugin.usage.reading import DeviceReading, ProcessUsage

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML clock event reasons worth a series: each is one bit of the current-reasons mask.
THROTTLE_REASONS = {
    "gpu_idle": "nvmlClocksThrottleReasonGpuIdle",
    "sw_power_cap": "nvmlClocksThrottleReasonSwPowerCap",
    "hw_slowdown": "nvmlClocksThrottleReasonHwSlowdown",
    "sync_boost": "nvmlClocksThrottleReasonSyncBoost",
    "sw_thermal_slowdown": "nvmlClocksThrottleReasonSwThermalSlowdown",
    "hw_thermal_slowdown": "nvmlClocksThrottleReasonHwThermalSlowdown",
    "hw_power_brake_slowdown": "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
}


def error_reason(nvml: Any, err: BaseException) -> str:
    """`NVMLError_NotSupported` → `NotSupported`: a bounded label value."""
    name = type(err).__name__
    return name.removeprefix("NVMLError_") if name.startswith("NVMLError_") else name


class NvmlUsageSource:
    """`UsageSource` for NVML. `nvml` is the pynvml module (initialised by the NVML backend)."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._handles: dict[str, Any] = {}
        self._last_seen_us: dict[str, int] = {}
        self._unsupported: defaultdict[str, set[str]] = defaultdict(set)
        self._mig_mode: dict[str, int | None] = {}
        self._lock = threading.Lock()

    def read(self, device: Device) -> DeviceReading:
        nvml = self._nvml
        errors: list[str] = []
        handle = self._handle(device.uuid)
        if device.parent_uuid is None:
            self._forget_unsupported_on_mig_switch(device.uuid, handle)
        unsupported = self._unsupported[device.uuid]

        def call(what: str, fn: Callable[[], T]) -> T | None:
            if what in unsupported:
                return None
            try:
                return fn()
            except nvml.NVMLError as err:
                reason = error_reason(nvml, err)
                if reason == "NotSupported":
                    unsupported.add(what)
                errors.append(reason)
                if reason in ("GpuIsLost", "Uninitialized", "InvalidArgument"):
                    with self._lock:  # the handle may be stale: look it up again next pass
                        self._handles.pop(device.uuid, None)
                return None

        rates = call("utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        memory = call("memory", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = call("power", lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        temperature = call(
            "temperature", lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        )
        corrected = call("ecc", lambda: self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED))
        uncorrected = call("ecc", lambda: self._ecc(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))
        mask = call("throttle", lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
        samples = call("process_utilization", lambda: self._process_samples(device.uuid, handle))
        running = call("processes", lambda: self._running(handle))
        return DeviceReading(
            gpu_ratio=rates.gpu / 100.0 if rates is not None else None,
            memory_ratio=rates.memory / 100.0 if rates is not None else None,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            power_watts=power_mw / 1000.0 if power_mw is not None else None,
            temperature_celsius=float(temperature) if temperature is not None else None,
            ecc_corrected=corrected,
            ecc_uncorrected=uncorrected,
            throttle=self._throttle(mask) if mask is not None else {},
            processes=_merge_processes(running or {}, samples or {}),
            errors=tuple(errors),
        )

    def _handle(self, uuid: str) -> Any:
        with self._lock:
            handle = self._handles.get(uuid)
        if handle is None:
            handle = self._nvml.nvmlDeviceGetHandleByUUID(uuid)  # raises: the whole reading fails
            with self._lock:
                self._handles[uuid] = handle
        return handle

    def _forget_unsupported_on_mig_switch(self, uuid: str, handle: Any) -> None:
        nvml = self._nvml
        try:
            mode: int | None = int(nvml.nvmlDeviceGetMigMode(handle)[0])
        except nvml.NVMLError:
            mode = None  # no MIG on this GPU (or it is lost: its own reads say so)
        if uuid in self._mig_mode and self._mig_mode[uuid] != mode:
            self._unsupported.pop(uuid, None)
        self._mig_mode[uuid] = mode

    def _ecc(self, handle: Any, kind: int) -> int:
        nvml = self._nvml
        return int(nvml.nvmlDeviceGetTotalEccErrors(handle, kind, nvml.NVML_VOLATILE_ECC))

    def _throttle(self, mask: int) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for reason, constant in THROTTLE_REASONS.items():
            bit = getattr(self._nvml, constant, None)
            if isinstance(bit, int):
                out[reason] = bool(int(mask) & bit)
        return out

    def _process_samples(self, uuid: str, handle: Any) -> dict[int, float]:
        """Mean SM fraction per PID over the samples since the last call on this device."""
        nvml = self._nvml
        since = self._last_seen_us.get(uuid, 0)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except nvml.NVMLError as err:
            # No process ran a kernel in the window: not an error. pynvml raises NVMLError(SUCCESS)
            # when NVML reports zero samples without asking for a buffer.
            if error_reason(nvml, err) == "NotFound" or getattr(err, "value", None) == 0:
                return {}
            raise
        sums: defaultdict[int, list[float]] = defaultdict(list)
        newest = since
        for sample in samples:
            sums[int(sample.pid)].append(float(sample.smUtil) / 100.0)
            newest = max(newest, int(sample.timeStamp))
        self._last_seen_us[uuid] = newest
        return {pid: sum(values) / len(values) for pid, values in sums.items()}

    def _running(self, handle: Any) -> dict[int, int | None]:
        """PID → framebuffer bytes of compute processes, plain and under MPS (None: not reported)."""
        nvml = self._nvml
        out: dict[int, int | None] = {}
        listings = [nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        # No MPS on this device, or a driver without the call: the plain list is all there is.
        with contextlib.suppress(nvml.NVMLError):
            listings.append(nvml.nvmlDeviceGetMPSComputeRunningProcesses(handle))
        for listing in listings:
            for process in listing:
                used = getattr(process, "usedGpuMemory", None)
                out[int(process.pid)] = int(used) if isinstance(used, int) else None
        return out


def _merge_processes(running: dict[int, int | None], samples: dict[int, float]) -> tuple[ProcessUsage, ...]:
    pids = sorted(set(running) | set(samples))
    return tuple(ProcessUsage(pid, samples.get(pid), running.get(pid)) for pid in pids)
