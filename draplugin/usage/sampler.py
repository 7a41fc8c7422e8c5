"""The sampling loop: every interval, read every device, attribute, split, track idleness, publish a snapshot.

It runs on a thread of its own and never touches prepare's event loop, so a
slow pass never delays a prepare. Devices are read on a few worker threads
(`draplugin.usage.readpool`: one, and one more for each read still queued
behind a stuck one) with a deadline: a device whose NVML calls hang (a GPU
falling off the bus can block for seconds) misses the pass with a `Timeout`
error and is skipped (`StillHung`) until its stuck call returns, while the
other devices are read on time. A read that raises costs that device's figures for the
pass, nothing else. The exporter serves the latest snapshot; a claim that was
unprepared is absent from the next one, so its series disappear.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from dracommon import usagenames as names
from draplugin.devices.model import Device
from draplugin.usage.attribution import PodProcess
from draplugin.usage.holders import HolderDirectory
from draplugin.usage.idle import ClaimIdleness, IdleTracker
from draplugin.usage.reading import DeviceReading, UsageSource, device_model
from draplugin.usage.readpool import ReadPool
from draplugin.usage.split import DeviceSplit, split_device
from draplugin.usage.xids import XidCounter

log = logging.getLogger(__name__)

# A pass waits this long for a device at most, unless the interval is shorter.
DEFAULT_DEVICE_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    name: str
    uuid: str
    model: str
    reading: DeviceReading | None  # None: the read failed or timed out this pass
    split: DeviceSplit


@dataclass(frozen=True, slots=True)
class Snapshot:
    node: str
    taken_at: float
    devices: tuple[DeviceUsage, ...]
    claims: tuple[ClaimIdleness, ...]
    xids: dict[str, dict[int, int]]


class SampleMetrics:
    """The sampler's own counters, named in `names`."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.duration = Histogram(
            names.SAMPLE_DURATION.name,
            names.SAMPLE_DURATION.help,
            buckets=names.SAMPLE_DURATION_BUCKETS,
            registry=registry,
        )
        self.errors = Counter(
            names.SAMPLE_ERRORS.name, names.SAMPLE_ERRORS.help, names.SAMPLE_ERRORS.labels, registry=registry
        )


_default_metrics: SampleMetrics | None = None
_metrics_lock = threading.Lock()


def default_sample_metrics() -> SampleMetrics:
    """The sampler's metrics on the default registry, made once per process (a second registration
    of the same names would raise)."""
    global _default_metrics
    with _metrics_lock:
        if _default_metrics is None:
            _default_metrics = SampleMetrics()
        return _default_metrics


class UsageSampler:
    def __init__(
        self,
        *,
        node: str,
        devices: Callable[[], Sequence[Device]],
        source: UsageSource,
        holders: HolderDirectory,
        locate: Callable[[int], PodProcess | None],
        idle: IdleTracker,
        interval_s: float,
        metrics: SampleMetrics,
        xids: XidCounter | None = None,
        device_timeout_s: float = DEFAULT_DEVICE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self._devices = devices
        self._source = source
        self._holders = holders
        self._locate = locate
        self._idle = idle
        self.interval_s = interval_s
        self._metrics = metrics
        self._xids = xids or XidCounter()
        self._timeout_s = min(device_timeout_s, interval_s) if interval_s > 0 else device_timeout_s
        self._clock = clock
        self._pool: ReadPool[Device, DeviceReading] | None = None
        self._pending: dict[str, Future[DeviceReading]] = {}
        self._latest: Snapshot | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def latest(self) -> Snapshot | None:
        return self._latest

    # --- one pass ---------------------------------------------------------------------------------

    def sample_once(self) -> Snapshot:
        started = time.perf_counter()
        devices = [d for d in self._devices() if d.uuid]  # a MIG placement not created yet has no UUID
        readings = self._read_all(devices)
        holders = self._holders.holders()
        usages: list[DeviceUsage] = []
        unknown_pods: set[str] = set()
        unknown_containers: set[str] = set()
        ratios: dict[tuple[str, str], float | None] = {}
        for device in devices:
            reading = readings.get(device.name)
            split = split_device(device.name, reading or DeviceReading(), holders, self._locate)
            unknown_pods |= split.unknown_pods
            unknown_containers |= split.unknown_containers
            for share in split.holders:
                key = (share.claim_uid, device.name)
                if share.gpu_ratio is None:
                    ratios.setdefault(key, None)
                else:
                    ratios[key] = (ratios.get(key) or 0.0) + share.gpu_ratio
            usages.append(DeviceUsage(device.name, device.uuid, device_model(device), reading, split))
        if unknown_pods or unknown_containers:
            self._holders.refresh_missing(holders, unknown_pods, unknown_containers)
        models = {d.name: device_model(d) for d in devices}
        claims = self._idle.update(self._clock(), holders, ratios, models)
        snapshot = Snapshot(self.node, time.time(), tuple(usages), tuple(claims), self._xids.counts())
        self._latest = snapshot
        self._metrics.duration.observe(time.perf_counter() - started)
        return snapshot

    def _read_all(self, devices: Sequence[Device]) -> dict[str, DeviceReading]:
        started: dict[str, Future[DeviceReading]] = {}
        if self._pool is None:
            self._pool = ReadPool(self._source.read, name="usage-read")
        for device in devices:
            pending = self._pending.get(device.uuid)
            if pending is not None and not pending.done():
                self._error(device.name, names.REASON_BUSY)
                continue
            future = self._pool.submit(device)
            self._pending[device.uuid] = future
            started[device.name] = future
        self._wait(self._pool, list(started.values()))
        readings: dict[str, DeviceReading] = {}
        for name, future in started.items():
            if not future.done():
                log.warning("usage read timed out", extra={"device": name, "after_s": self._timeout_s})
                self._error(name, names.REASON_TIMEOUT)
                continue
            error = future.exception()
            if error is not None:
                reason = type(error).__name__.removeprefix("NVMLError_")
                log.warning("usage read failed", extra={"device": name, "error": str(error)})
                self._error(name, reason)
                continue
            reading = future.result()
            for reason in reading.errors:
                self._error(name, reason)
            readings[name] = reading
        self._forget_gone({d.uuid for d in devices})
        return readings

    def _wait(self, pool: ReadPool[Device, DeviceReading], futures: list[Future[DeviceReading]]) -> None:
        """Until every read is done or the deadline passed, looking every `stall_s` for reads
        queued behind stuck ones (the pool then gives them threads of their own)."""
        deadline = time.monotonic() + self._timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            _, running = wait_futures(futures, timeout=min(remaining, pool.stall_s))
            if not running:
                return
            pool.rescue()

    def _forget_gone(self, uuids: set[str]) -> None:
        for uuid in set(self._pending) - uuids:
            self._pending.pop(uuid)

    def _error(self, device: str, reason: str) -> None:
        self._metrics.errors.labels(device, reason).inc()

    # --- the loop ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Sample every interval until `stop` is set; a pass that raises is logged and the loop goes on."""
        while not stop.is_set():
            began = self._clock()
            try:
                self.sample_once()
            except Exception:
                log.exception("usage sampling pass failed")
            stop.wait(max(0.0, self.interval_s - (self._clock() - began)))

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, args=(self._stop,), name="usage-sampler", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        self._pending.clear()
