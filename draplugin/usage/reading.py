"""What one sampling pass reads from a device, as plain values shared by the NVML and fake sources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from draplugin.devices.model import Device


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """One process with a context on the device. None: the driver does not tell (MIG without privileges,
    a process that started after the utilization window)."""

    pid: int
    sm_ratio: float | None = None
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceReading:
    """Every value is None when its call failed or the device does not support it."""

    gpu_ratio: float | None = None
    memory_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: float | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    # Reason name → active; empty when unknown.
    throttle: dict[str, bool] = field(default_factory=dict)
    processes: tuple[ProcessUsage, ...] = ()
    # Reasons (NVML error names) of the calls that failed, one entry per failed call.
    errors: tuple[str, ...] = ()


class UsageSource(Protocol):
    """Reads one device. Called on that device's own worker thread; may block or raise."""

    def read(self, device: Device) -> DeviceReading: ...


def device_model(device: Device) -> str:
    """The `model` label: the product name NVML reports."""
    value = device.attributes.get("productName", "")
    return value if isinstance(value, str) else str(value)
