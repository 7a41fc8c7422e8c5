"""The sampling loop: every interval, read every device, attribute, split, track idleness, publish a snapshot.

It runs on a thread of its own and never touches prepare's event loop, so a
slow pass never delays a prepare. Each device is read on a worker thread of
its own with a deadline: a device whose NVML calls hang (a GPU falling off
the bus can block for seconds) misses the pass with a `Timeout` error and is
skipped (`StillHung`) until its stuck call returns, while the other devices
are read on time. A read that raises costs that device's figures for the
pass, nothing else. The exporter serves the latest snapshot; a claim that was
unprepared is absent from the next one, so its series disappear.
"""

from __future__ import annotations

import logging
import queue
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


class _DeviceWorker:
    """One daemon thread per device. Not a ThreadPoolExecutor: its threads are joined at interpreter
    exit, and a call hung in the driver would then keep the plugin from ever exiting."""

    def __init__(self, name: str, read: Callable[[Device], DeviceReading]) -> None:
        self._read = read
        self._jobs: queue.SimpleQueue[tuple[Device, Future[DeviceReading]] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"usage-{name}", daemon=True).start()

    def submit(self, device: Device) -> Future[DeviceReading]:
        future: Future[DeviceReading] = Future()
        self._jobs.put((device, future))
        return future

    def close(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            device, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._read(device))
            except BaseException as err:  # reported by the pass that waits for it
                future.set_exception(err)


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
        self._workers: dict[str, _DeviceWorker] = {}
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
        for device in devices:
            pending = self._pending.get(device.uuid)
            if pending is not None and not pending.done():
                self._error(device.name, names.REASON_BUSY)
                continue
            worker = self._workers.get(device.uuid)
            if worker is None:
                worker = _DeviceWorker(device.name, self._source.read)
                self._workers[device.uuid] = worker
            future = worker.submit(device)
            self._pending[device.uuid] = future
            started[device.name] = future
        wait_futures(list(started.values()), timeout=self._timeout_s)
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

    def _forget_gone(self, uuids: set[str]) -> None:
        for uuid in set(self._workers) - uuids:
            self._workers.pop(uuid).close()
            self._pending.pop(uuid, None)

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
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        self._pending.clear()
