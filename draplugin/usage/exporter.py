"""The usage series, built at scrape time from the sampler's latest snapshot.

A custom collector rather than long-lived Gauges: a series exists exactly
while the snapshot has it, so the series of an unprepared claim (or a vanished
device) disappear with the next pass, with no bookkeeping of what to remove.
A value the device did not give (a call that failed or is not supported)
is left out rather than exported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dracommon import usagenames as names
from dracommon.usagenames import MetricName
from draplugin.usage.sampler import Snapshot


def _gauge(metric: MetricName) -> GaugeMetricFamily:
    return GaugeMetricFamily(metric.name, metric.help, labels=list(metric.labels))


def _counter(metric: MetricName) -> CounterMetricFamily:
    return CounterMetricFamily(metric.name, metric.help, labels=list(metric.labels))


class UsageCollector(Collector):
    def __init__(self, latest: Callable[[], Snapshot | None]) -> None:
        self._latest = latest

    def describe(self) -> list[Metric]:
        # Registration would otherwise call collect() to learn the names: the snapshot may not exist yet.
        return []

    def collect(self) -> Iterator[Metric]:
        snapshot = self._latest()
        if snapshot is None:
            return
        gauges = {
            m: _gauge(m)
            for m in (
                names.DEVICE_GPU_UTILIZATION,
                names.DEVICE_MEMORY_UTILIZATION,
                names.DEVICE_MEMORY_USED,
                names.DEVICE_MEMORY_TOTAL,
                names.DEVICE_POWER,
                names.DEVICE_TEMPERATURE,
                names.DEVICE_THROTTLE,
                names.CLAIM_GPU_UTILIZATION,
                names.CLAIM_MEMORY_USED,
                names.DEVICE_UNATTRIBUTED_GPU_UTILIZATION,
                names.DEVICE_UNATTRIBUTED_MEMORY_USED,
                names.CLAIM_IDLE_SECONDS,
                names.CLAIM_IDLE,
            )
        }
        ecc, xid = _counter(names.DEVICE_ECC_ERRORS), _counter(names.DEVICE_XID_ERRORS)

        def put(metric: MetricName, labels: list[str], value: float | None) -> None:
            if value is not None:
                gauges[metric].add_metric(labels, float(value))

        for device in snapshot.devices:
            labels = [snapshot.node, device.name, device.uuid, device.model]
            reading = device.reading
            if reading is not None:
                put(names.DEVICE_GPU_UTILIZATION, labels, reading.gpu_ratio)
                put(names.DEVICE_MEMORY_UTILIZATION, labels, reading.memory_ratio)
                put(names.DEVICE_MEMORY_USED, labels, reading.memory_used_bytes)
                put(names.DEVICE_MEMORY_TOTAL, labels, reading.memory_total_bytes)
                put(names.DEVICE_POWER, labels, reading.power_watts)
                put(names.DEVICE_TEMPERATURE, labels, reading.temperature_celsius)
                for reason, active in sorted(reading.throttle.items()):
                    put(names.DEVICE_THROTTLE, [*labels, reason], 1.0 if active else 0.0)
                if reading.ecc_corrected is not None:
                    ecc.add_metric([*labels, "corrected"], reading.ecc_corrected)
                if reading.ecc_uncorrected is not None:
                    ecc.add_metric([*labels, "uncorrected"], reading.ecc_uncorrected)
                put(names.DEVICE_UNATTRIBUTED_GPU_UTILIZATION, labels, device.split.unattributed_gpu_ratio)
                put(names.DEVICE_UNATTRIBUTED_MEMORY_USED, labels, device.split.unattributed_memory_bytes)
            for share in device.split.holders:
                holder = [*labels, share.namespace, share.claim, share.pod, share.container]
                put(names.CLAIM_GPU_UTILIZATION, holder, share.gpu_ratio)
                put(names.CLAIM_MEMORY_USED, holder, share.memory_bytes)
            for code, count in sorted(snapshot.xids.get(device.name, {}).items()):
                xid.add_metric([*labels, str(code)], count)
        for claim in snapshot.claims:
            labels = [snapshot.node, claim.namespace, claim.claim]
            put(names.CLAIM_IDLE_SECONDS, labels, claim.idle_seconds)
            put(names.CLAIM_IDLE, labels, 1.0 if claim.idle else 0.0)
        yield from gauges.values()
        yield ecc
        yield xid
