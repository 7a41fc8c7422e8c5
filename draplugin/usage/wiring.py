"""The usage sampler for `draplugin run`: source by backend, holders from prepare's checkpoint, the exporter.

Built by the node daemon when `--usage-sample-interval` is not 0. The
collector is registered on the plugin's Prometheus registry (the one
`--metrics-port` serves) and removed again when the sampler stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from draplugin.checkpoint import ClaimRecord
from draplugin.config import Settings
from draplugin.devices.fake import FakeBackend
from draplugin.devices.health import HealthTracker
from draplugin.devices.model import DeviceBackend
from draplugin.usage.attribution import pod_process
from draplugin.usage.exporter import UsageCollector
from draplugin.usage.fakesource import FAKE_PROCESS_FILE_NAME, FakeUsageSource
from draplugin.usage.holders import HolderDirectory, JsonGetter
from draplugin.usage.idle import IdleEvents, IdleTracker
from draplugin.usage.nvmlsource import NvmlUsageSource
from draplugin.usage.reading import UsageSource
from draplugin.usage.sampler import SampleMetrics, UsageSampler, default_sample_metrics
from draplugin.usage.xids import XidCounter

log = logging.getLogger(__name__)


class UsageUnavailable(RuntimeError):
    """The backend offers no way to read usage."""


def usage_source(settings: Settings, backend: DeviceBackend) -> UsageSource:
    if isinstance(backend, FakeBackend):
        return FakeUsageSource(backend, settings.state_dir / FAKE_PROCESS_FILE_NAME)
    nvml = getattr(backend, "nvml", None)
    if nvml is None:
        raise UsageUnavailable(f"the {backend.name} backend has no usage source")
    return NvmlUsageSource(nvml)


class UsageService:
    """The sampler and its collector, started and stopped with the node daemon."""

    def __init__(self, sampler: UsageSampler, registry: CollectorRegistry | None) -> None:
        self.sampler = sampler
        self.collector = UsageCollector(lambda: sampler.latest)
        self._registry = registry

    def start(self) -> None:
        if self._registry is not None:
            self._registry.register(self.collector)
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()
        if self._registry is not None:
            self._registry.unregister(self.collector)


def build_usage(
    settings: Settings,
    backend: DeviceBackend,
    *,
    records: Callable[[], Iterable[ClaimRecord]],
    tracker: HealthTracker,
    api: JsonGetter | None,
    events: IdleEvents | None,
    registry: CollectorRegistry | None = REGISTRY,
    metrics: SampleMetrics | None = None,
) -> UsageService | None:
    """The usage service for these settings; None when sampling is off or the backend cannot do it."""
    if settings.usage_sample_interval_s <= 0:
        return None
    try:
        source = usage_source(settings, backend)
    except UsageUnavailable as err:
        log.warning("usage metrics off", extra={"error": str(err)})
        return None
    xids = XidCounter()
    add_listener: Any = getattr(backend, "add_xid_listener", None)
    if callable(add_listener):
        add_listener(xids.record)
    else:
        xids.follow(tracker)
    sampler = UsageSampler(
        node=settings.node_name,
        devices=backend.discover,
        source=source,
        holders=HolderDirectory(records, api),
        locate=partial(pod_process, settings.usage_proc_root),
        idle=IdleTracker(settings.idle_threshold_percent / 100.0, settings.idle_after_s, events),
        interval_s=settings.usage_sample_interval_s,
        metrics=metrics or (default_sample_metrics() if registry is REGISTRY else SampleMetrics(registry)),
        xids=xids,
    )
    return UsageService(sampler, registry)
