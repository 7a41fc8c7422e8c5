"""Usage of fake GPUs: deterministic waves from the fake GPU file, and processes from a file.

Utilization is a function of the device's index and the wall clock only
(`draplugin.devices.fakeusage`), so numbers move in `make demo` and a test
can predict them; a GPU with `usage: idle` stays at 0%.

Fake GPUs run no processes, so NVML's per-process data comes from a YAML file
(`<state-dir>/fake-processes.yaml` in `draplugin run`), read again whenever it
changes. A test writes the PIDs of real container processes there to have a
device split between the pods that run them:

    gpu-0:
      - {pid: 4242, smPercent: 30, memory: 2Gi}
      - {pid: 4343, smPercent: 10, memory: 512Mi}

A device listed in the file reports what its processes add up to (SM capped
at 100%); the others follow their wave and report no processes. A MIG device
reports only its memory and its processes' memory, as NVML does: no
utilization, power, temperature or ECC (`_mig_reading`), and on its first
read the same NotSupported errors the NVML source records once. A file that
does not parse is logged and its last good content kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from dracommon.quantity import QuantityError, parse_quantity
from draplugin.devices.fake import FakeBackend
from draplugin.devices.fakeusage import FakeUsage
from draplugin.devices.model import Device
from draplugin.devices.schema import KIND_GPU
from draplugin.usage.reading import DeviceReading, ProcessUsage

log = logging.getLogger(__name__)

FAKE_PROCESS_FILE_NAME = "fake-processes.yaml"
# A fake GPU's power and temperature follow its SM load between these figures.
IDLE_WATTS, BUSY_WATTS = 60.0, 400.0
IDLE_CELSIUS, BUSY_CELSIUS = 32.0, 78.0


class FakeProcessFileError(ValueError):
    """The fake process file is not a mapping of device name to a list of processes."""


def parse_processes(data: Any) -> dict[str, tuple[ProcessUsage, ...]]:
    """`{device: [{pid, smPercent, memory}]}`; raises FakeProcessFileError naming the entry."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FakeProcessFileError("top level must map device names to lists of processes")
    out: dict[str, tuple[ProcessUsage, ...]] = {}
    for device, entries in data.items():
        if not isinstance(device, str) or not isinstance(entries, list):
            raise FakeProcessFileError(f"{device!r}: want `device-name: [{{pid, smPercent, memory}}]`")
        out[device] = tuple(_process(f"{device}[{i}]", entry) for i, entry in enumerate(entries))
    return out


def _process(where: str, entry: Any) -> ProcessUsage:
    if not isinstance(entry, dict) or set(entry) - {"pid", "smPercent", "memory"}:
        raise FakeProcessFileError(f"{where}: want a mapping of pid, smPercent and memory")
    pid = entry.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise FakeProcessFileError(f"{where}.pid: must be a positive integer, got {pid!r}")
    sm = entry.get("smPercent", 0)
    if isinstance(sm, bool) or not isinstance(sm, int | float) or not 0 <= sm <= 100:
        raise FakeProcessFileError(f"{where}.smPercent: must be a number from 0 to 100, got {sm!r}")
    memory_raw = entry.get("memory", 0)
    try:
        memory = parse_quantity(str(memory_raw)).value()
    except QuantityError as err:
        raise FakeProcessFileError(f"{where}.memory: {memory_raw!r}: {err}") from None
    if memory < 0:
        raise FakeProcessFileError(f"{where}.memory: must not be negative")
    return ProcessUsage(pid, float(sm) / 100.0, memory)


def _phase(device: Device) -> float:
    """GPUs spread evenly around the wave by index (MIG devices have no utilization to spread)."""
    return (device.index / 8.0) % 1.0


def _memory_total(device: Device) -> int:
    raw = device.capacity.get("memory")
    return parse_quantity(raw).value() if raw else 0


# The calls NvmlUsageSource makes that NVML does not support on a MIG device, each recorded once as
# NotSupported and never tried again (draplugin.usage.nvmlsource): the fake records the same.
MIG_UNSUPPORTED_CALLS = ("utilization", "power", "temperature", "ecc", "throttle", "process_utilization")


def _mig_reading(
    device: Device, total: int, processes: tuple[ProcessUsage, ...], usage: FakeUsage, first: bool
) -> DeviceReading:
    """What NVML gives for a MIG device: its memory and its processes' memory, nothing more.

    Utilization (device and per process), power, temperature, ECC and clock-event reasons take
    whole-GPU handles only and answer NotSupported on a MIG-enabled GPU (nvml.h; the NVML
    double in tests/cluster/nvmldouble does the same), so a fake MIG device reports none of
    them: a dashboard tried on fake GPUs shows what it will show on real ones.
    """
    if processes:
        used = min(total, sum(p.memory_bytes or 0 for p in processes))
        processes = tuple(ProcessUsage(p.pid, None, p.memory_bytes) for p in processes)
    else:
        used = int(total * usage.memory_ratio())
    errors = ("NotSupported",) * len(MIG_UNSUPPORTED_CALLS) if first else ()
    return DeviceReading(memory_used_bytes=used, memory_total_bytes=total, processes=processes, errors=errors)


class FakeUsageSource:
    """`UsageSource` for the fake backend."""

    def __init__(
        self,
        backend: FakeBackend,
        process_file: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._file = process_file
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] | None = None
        self._processes: Mapping[str, tuple[ProcessUsage, ...]] = {}
        self._mig_seen: set[str] = set()  # MIG devices whose unsupported calls were reported

    def processes(self) -> Mapping[str, tuple[ProcessUsage, ...]]:
        """The file's processes per device, read again when its mtime or size changed."""
        path = self._file
        if path is None:
            return {}
        with self._lock:
            try:
                info = path.stat()
            except OSError:
                self._stamp, self._processes = None, {}
                return self._processes
            stamp = (info.st_mtime, info.st_size)
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._processes = parse_processes(yaml.safe_load(path.read_text(encoding="utf-8")))
                except (OSError, yaml.YAMLError, FakeProcessFileError) as err:
                    log.error(
                        "fake process file unusable, keeping the last one",
                        extra={"path": str(path), "error": str(err)},
                    )
            return self._processes

    def read(self, device: Device) -> DeviceReading:
        total = _memory_total(device)
        processes = self.processes().get(device.name, ())
        if device.kind != KIND_GPU:
            with self._lock:
                first = device.uuid not in self._mig_seen
                self._mig_seen.add(device.uuid)
            return _mig_reading(device, total, processes, self._backend.usage_of(device.index), first)
        if processes:
            sm = min(1.0, sum(p.sm_ratio or 0.0 for p in processes))
            used = min(total, sum(p.memory_bytes or 0 for p in processes))
        else:
            usage = self._backend.usage_of(device.index)
            sm = usage.sm_ratio(_phase(device), self._clock())
            used = int(total * usage.memory_ratio())
        return DeviceReading(
            gpu_ratio=sm,
            # A memory-bound share of the SM load: real GPUs show the two moving together.
            memory_ratio=round(sm * 0.6, 4),
            memory_used_bytes=used,
            memory_total_bytes=total,
            power_watts=round(IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * sm, 1),
            temperature_celsius=round(IDLE_CELSIUS + (BUSY_CELSIUS - IDLE_CELSIUS) * sm, 1),
            ecc_corrected=0,
            ecc_uncorrected=0,
            throttle={"gpu_idle": sm < 0.01},
            processes=processes,
        )
