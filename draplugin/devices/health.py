"""Device health: NVML events (or injected faults) → device taints and the kubelet health stream.

A backend's monitor calls `HealthTracker.report_unhealthy` with device names;
the tracker keeps the state, adds a taint to those devices when the slice
publisher renders them, tells listeners (the publisher republishes), and
feeds `HealthReporter.watch_health`, the `HealthSource` the kubelet's DRA
health service streams from.

What counts as a fault, the taint's effect, and when a taint goes away again
are a `HealthPolicy` (settings `--health-*`): XIDs that applications cause are
ignored, fatal XIDs and a lost GPU taint with `--health-taint-effect`
(`NoSchedule` unless asked: `NoExecute` evicts running pods), and a fault
clears by `--health-recovery` (`on-reset`: when the device comes back after a
reset or falling off the bus; `after:<duration>`: also after that long without
a new fault; `never`: not until the plugin restarts).
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

from dracommon.drivername import annotation_key

# The policy lives on its own so that the settings check it without this module (the kubelet
# plugin's imports before its sockets); its names stay importable from here (__all__).
from draplugin.devices.healthpolicy import (
    DEFAULT_APPLICATION_XIDS,
    DEFAULT_FATAL_XIDS,
    DEFAULT_TAINT_EFFECT,
    TAINT_EFFECTS,
    HealthPolicy,
    Recovery,
    RecoveryMode,
    parse_xids,
)
from draplugin.devices.model import Device, DeviceBackend, DeviceTaint, TaintEffect
from draplugin.kubelet.interface import DeviceHealth, HealthStatus

__all__ = [
    "DEFAULT_APPLICATION_XIDS",
    "DEFAULT_FATAL_XIDS",
    "DEFAULT_TAINT_EFFECT",
    "GPU_LOST_REASON",
    "TAINT_EFFECTS",
    "UNHEALTHY_TAINT",
    "Fault",
    "FaultFile",
    "HealthPolicy",
    "HealthReporter",
    "HealthTracker",
    "Recovery",
    "RecoveryMode",
    "parse_xids",
]

log = logging.getLogger(__name__)

UNHEALTHY_TAINT = "unhealthy"
# The reason (taint value) of a GPU that NVML lost: GPU_IS_LOST, or a device that was
# present and now answers only UNKNOWN / NOT_FOUND.
GPU_LOST_REASON = "gpu-lost"


@dataclass(frozen=True, slots=True)
class Fault:
    """Why a device is unhealthy."""

    effect: TaintEffect
    reason: str  # a label value: "xid-79", "ecc-double-bit", "gpu-lost"
    message: str
    since_unix: int
    # Monotonic time of the latest report: `after:` recovery counts its quiet period from here.
    last_seen: float = 0.0


class HealthTracker:
    """Thread-safe per-device health state; monitors write, the publisher and kubelet stream read."""

    def __init__(
        self,
        driver_name: str,
        policy: HealthPolicy | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # In the driver's own prefix, like every key it owns: `<driver>/unhealthy`.
        self._taint_key = annotation_key(driver_name, UNHEALTHY_TAINT)
        self.policy = policy if policy is not None else HealthPolicy()
        self._clock = clock
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
        """Mark devices unhealthy; a stronger effect replaces a weaker one. True if anything changed.

        A repeat of a fault no stronger than the known one changes nothing visible, but
        restarts the quiet period of `after:` recovery.
        """
        now_unix, now = int(time.time()), self._clock()
        changed = False
        with self._lock:
            for name in device_names:
                current = self._faults.get(name)
                if current is not None and _severity(current.effect) >= _severity(effect):
                    self._faults[name] = replace(current, last_seen=now)
                    continue
                self._faults[name] = Fault(effect, reason, message, now_unix, now)
                changed = True
                log.warning(
                    "device unhealthy",
                    extra={"device": name, "effect": effect, "reason": reason, "detail": message},
                )
            listeners = list(self._listeners) if changed else []
        for listener in listeners:
            listener()
        return changed

    def report_healthy(self, device_names: Iterable[str]) -> bool:
        """Clear these devices' faults whatever the recovery policy (the fault source says so)."""
        return self._clear(device_names, "cleared by its source")

    def report_recovered(self, device_names: Iterable[str], why: str) -> bool:
        """The devices are back after a reset (or reappeared): cleared unless recovery is `never`."""
        if not self.policy.recovery.on_reset:
            names = [n for n in device_names if n in self.faults()]
            if names:
                log.info(
                    "device back, taint kept (--health-recovery=never)", extra={"devices": ",".join(names)}
                )
            return False
        return self._clear(device_names, why)

    def expire(self) -> bool:
        """Clear faults quiet for the `after:` period; a no-op for the other policies."""
        recovery = self.policy.recovery
        if recovery.mode != "after":
            return False
        deadline = self._clock() - recovery.quiet_s
        quiet = [name for name, fault in self.faults().items() if fault.last_seen <= deadline]
        return self._clear(quiet, f"no new fault for {recovery.quiet_s:g}s")

    def _clear(self, device_names: Iterable[str], why: str) -> bool:
        with self._lock:
            removed = [name for name in device_names if self._faults.pop(name, None) is not None]
            listeners = list(self._listeners) if removed else []
        for name in removed:
            log.info("device healthy again", extra={"device": name, "why": why})
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
        # Imported here: the GPU check imports this module on machines without PyYAML.
        import yaml

        try:
            wanted = self._read() if stamp is not None else {}
        except (OSError, ValueError, yaml.YAMLError) as err:
            log.error("ignoring fault file", extra={"path": str(self._path), "error": str(err)})
            return
        self._tracker.report_healthy(self._listed - set(wanted))
        for name, xid in wanted.items():
            effect = self._tracker.policy.effect_for_xid(xid) or "NoSchedule"
            self._tracker.report_unhealthy([name], effect, f"xid-{xid}", f"injected XID {xid}")
        self._listed = set(wanted)

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        while not stop.wait(interval):
            self.poll()

    def _read(self) -> dict[str, int]:
        import yaml

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
