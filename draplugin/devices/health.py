"""Device health: NVML events (or injected faults) → device taints and the kubelet health stream.

A backend's monitor calls `HealthTracker.report_unhealthy` with device names;
the tracker keeps the state, adds a taint to those devices when the slice
publisher renders them, tells listeners (the publisher republishes), and
feeds `HealthReporter.watch_health`, the `HealthSource` the kubelet's DRA
health service streams from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from dracommon.drivername import annotation_key
from draplugin.devices.model import Device, DeviceBackend, DeviceTaint, TaintEffect
from draplugin.kubelet.interface import DeviceHealth, HealthStatus

log = logging.getLogger(__name__)

UNHEALTHY_TAINT = "unhealthy"

# XIDs caused by applications (bad kernels, MMU faults from user code, resets they asked for):
# they say nothing about the GPU, so they do not taint it.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# XIDs after which running work is lost or the GPU is gone: double-bit ECC (48), row-remap
# failure (64), NVLink (74), fallen off the bus (79), uncontained ECC (94, 95), GSP errors
# (119, 120), unrecovered ECC (140). Pods on such a device are evicted (NoExecute).
FATAL_XIDS = frozenset({48, 64, 74, 79, 94, 95, 119, 120, 140})


def effect_for_xid(xid: int) -> TaintEffect | None:
    """None: ignore (application error); NoExecute: fatal; NoSchedule: anything else critical."""
    if xid in APPLICATION_XIDS:
        return None
    return "NoExecute" if xid in FATAL_XIDS else "NoSchedule"


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a device is unhealthy."""

    effect: TaintEffect
    reason: str  # a label value: "xid-79", "ecc-double-bit", "gpu-lost"
    message: str
    since_unix: int


class HealthTracker:
    """Thread-safe per-device health state; monitors write, the publisher and kubelet stream read."""

    def __init__(self, driver_name: str) -> None:
        # In the driver's own prefix, like every key it owns: `<driver>/unhealthy`.
        self._taint_key = annotation_key(driver_name, UNHEALTHY_TAINT)
        self._lock = threading.Lock()
        self._faults: dict[str, Fault] = {}
        self._listeners: list[Callable[[], None]] = []

    @property
    def taint_key(self) -> str:
        return self._taint_key

    def add_listener(self, listener: Callable[[], None]) -> None:
        """`listener()` runs (on the reporting thread) after every health change."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        """Stop calling `listener`; removing one that is not registered is a no-op."""
        with self._lock, contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def listener_count(self) -> int:
        with self._lock:
            return len(self._listeners)

    def report_unhealthy(
        self, device_names: Iterable[str], effect: TaintEffect, reason: str, message: str
    ) -> bool:
        """Mark devices unhealthy; a stronger effect replaces a weaker one. True if anything changed."""
        now = int(time.time())
        changed = False
        with self._lock:
            for name in device_names:
                current = self._faults.get(name)
                if current is not None and _severity(current.effect) >= _severity(effect):
                    continue
                self._faults[name] = Fault(effect, reason, message, now)
                changed = True
                log.warning(
                    "device unhealthy device=%s effect=%s reason=%s msg=%r", name, effect, reason, message
                )
            listeners = list(self._listeners) if changed else []
        for listener in listeners:
            listener()
        return changed

    def report_healthy(self, device_names: Iterable[str]) -> bool:
        with self._lock:
            removed = [name for name in device_names if self._faults.pop(name, None) is not None]
            listeners = list(self._listeners) if removed else []
        for name in removed:
            log.info("device healthy again device=%s", name)
        for listener in listeners:
            listener()
        return bool(removed)

    def faults(self) -> dict[str, Fault]:
        with self._lock:
            return dict(self._faults)

    def apply(self, devices: Sequence[Device]) -> list[Device]:
        """The devices with our unhealthy taint added where a fault is known."""
        faults = self.faults()
        if not faults:
            return list(devices)
        out: list[Device] = []
        for device in devices:
            fault = faults.get(device.name)
            if fault is None:
                out.append(device)
                continue
            taint = DeviceTaint(key=self._taint_key, value=fault.reason, effect=fault.effect)
            others = tuple(t for t in device.taints if t.key != self._taint_key)
            out.append(replace(device, taints=(*others, taint)))
        return out

    def device_health(self, pool_name: str, devices: Sequence[Device]) -> list[DeviceHealth]:
        faults = self.faults()
        now = int(time.time())
        result: list[DeviceHealth] = []
        for device in devices:
            fault = faults.get(device.name)
            if fault is None:
                result.append(DeviceHealth(pool_name, device.name, HealthStatus.HEALTHY, now))
            else:
                result.append(
                    DeviceHealth(
                        pool_name, device.name, HealthStatus.UNHEALTHY, fault.since_unix, fault.message
                    )
                )
        return result


class HealthReporter:
    """`HealthSource` for the kubelet DRA health service, backed by a tracker and a backend."""

    def __init__(self, tracker: HealthTracker, backend: DeviceBackend, pool_name: str) -> None:
        self._tracker = tracker
        self._backend = backend
        self._pool_name = pool_name

    async def watch_health(self) -> AsyncGenerator[Sequence[DeviceHealth], None]:
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(changed.set)

        self._tracker.add_listener(wake)
        # The kubelet opens a new stream on every reconnect; a listener left behind by a
        # closed one would pin its event loop and grow the list without bound.
        try:
            while True:
                changed.clear()
                yield self._tracker.device_health(self._pool_name, self._backend.discover())
                await changed.wait()
        finally:
            self._tracker.remove_listener(wake)


def _severity(effect: TaintEffect) -> int:
    return {"None": 0, "NoSchedule": 1, "NoExecute": 2}[effect]


class FaultFile:
    """Injected faults for the fake backend: a YAML mapping `device-name: xid` (or `device: {xid: N}`).

    `poll()` re-reads the file when it changed and makes the tracker match it:
    devices listed are unhealthy with the XID's effect, devices no longer
    listed become healthy. A bad file is logged and ignored (the daemon keeps
    its last state) rather than crashing.
    """

    def __init__(self, path: str | Path, tracker: HealthTracker) -> None:
        self._path = Path(path)
        self._tracker = tracker
        self._stamp: tuple[float, int] | None = None
        self._listed: set[str] = set()

    def poll(self) -> None:
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            stamp = None
        else:
            stamp = (stat.st_mtime, stat.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            wanted = self._read() if stamp is not None else {}
        except (OSError, ValueError, yaml.YAMLError) as err:
            log.error("ignoring fault file path=%s error=%s", self._path, err)
            return
        self._tracker.report_healthy(self._listed - set(wanted))
        for name, xid in wanted.items():
            effect = effect_for_xid(xid) or "NoSchedule"
            self._tracker.report_unhealthy([name], effect, f"xid-{xid}", f"injected XID {xid}")
        self._listed = set(wanted)

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        while not stop.wait(interval):
            self.poll()

    def _read(self) -> dict[str, int]:
        data = yaml.safe_load(self._path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError("fault file must be a mapping of device name to XID")
        out: dict[str, int] = {}
        for name, value in data.items():
            xid = value.get("xid") if isinstance(value, dict) else value
            if not isinstance(name, str) or not isinstance(xid, int) or isinstance(xid, bool):
                raise ValueError(f"entry {name!r}: want `device-name: <xid int>`")
            out[name] = xid
        return out
