"""Re-discovery: the node's devices are read again while the plugin runs, and everyone hears of it.

A MIG layout change, a GPU that falls off the bus or comes back after a reset
changes the devices under a running plugin. `DeviceWatcher` calls the
backend's `refresh()` every `--rediscover-interval` (and at once when woken:
the NVML event monitor wakes it on events that signal a change), then tells
its listeners which device names came and went. The node daemon's listeners
republish the slices (the publisher writes only what changed) and hand the new
devices to prepare. A device that comes back counts as recovered for the
health tracker (`--health-recovery=on-reset`); the tracker's `after:` expiry is
ticked here too, so one thread owns the clock.

Backends without `refresh()` (a fixed inventory) are never re-read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from draplugin.devices.health import HealthTracker
from draplugin.devices.model import Device, DeviceBackend

log = logging.getLogger(__name__)

# How often the tracker's quiet periods are checked; independent of the re-discovery interval.
TICK_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class DeviceChange:
    """One re-discovery's outcome: the full new list, and the names that came and went."""

    devices: tuple[Device, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]


ChangeListener = Callable[[DeviceChange], None]


class DeviceWatcher:
    """Runs `backend.refresh()` periodically and on `wake()`; reports changes to listeners."""

    def __init__(
        self,
        backend: DeviceBackend,
        tracker: HealthTracker,
        *,
        interval_s: float,
        tick_s: float = TICK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._tracker = tracker
        self._interval_s = interval_s
        self._tick_s = tick_s
        self._clock = clock
        self._wake = threading.Event()
        self._listeners: list[ChangeListener] = []
        self._devices = tuple(backend.discover())
        refresh = getattr(backend, "refresh", None)
        self._refresh: Callable[[], object] | None = refresh if callable(refresh) else None

    @property
    def can_refresh(self) -> bool:
        return self._refresh is not None

    def add_listener(self, listener: ChangeListener) -> None:
        """`listener(change)` runs on the watcher's thread after devices changed."""
        self._listeners.append(listener)

    def wake(self) -> None:
        """Re-discover now (an NVML event said the devices changed). Safe from any thread."""
        self._wake.set()

    def check(self) -> DeviceChange | None:
        """Re-discover once; the change, or None when the devices are the same."""
        if self._refresh is None:
            return None
        try:
            self._refresh()
        except Exception as err:  # a backend failing mid-run must not end the watch; try again later
            log.error("device re-discovery failed, keeping the last devices", extra={"error": str(err)})
            return None
        devices = tuple(self._backend.discover())
        # Attribute changes without a name change (a driver upgrade's version) count too.
        if devices == self._devices:
            return None
        before = {d.name for d in self._devices}
        after = {d.name for d in devices}
        change = DeviceChange(
            devices=devices,
            added=tuple(d.name for d in devices if d.name not in before),
            removed=tuple(d.name for d in self._devices if d.name not in after),
        )
        self._devices = devices
        log.info(
            "devices changed",
            extra={
                "devices": len(devices),
                "added": ",".join(change.added) or "-",
                "removed": ",".join(change.removed) or "-",
            },
        )
        if change.added:
            # A device that disappeared and came back was reset or re-seated: its old fault is stale.
            self._tracker.report_recovered(change.added, "device reappeared")
        for listener in list(self._listeners):
            try:
                listener(change)
            except Exception:
                log.exception("device change listener failed")
        return change

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: re-discover every interval (0: only when woken) and tick health expiry."""
        due = self._clock() + self._interval_s
        while not stop.is_set():
            woken = self._wake.wait(self._tick_s)
            if stop.is_set():
                return
            self._tracker.expire()
            now = self._clock()
            if woken or (self._interval_s > 0 and now >= due):
                self._wake.clear()
                self.check()
                due = now + self._interval_s
