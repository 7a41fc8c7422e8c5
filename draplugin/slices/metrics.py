"""Prometheus counters of the slice publisher: writes by operation, reconcile passes by result."""

from __future__ import annotations

import threading

from prometheus_client import REGISTRY, CollectorRegistry, Counter


class SliceMetrics:
    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.writes = Counter(
            "draplugin_resourceslice_writes_total",
            "ResourceSlice writes sent to the API server, by operation.",
            ("operation",),
            registry=registry,
        )
        self.syncs = Counter(
            "draplugin_resourceslice_syncs_total",
            "ResourceSlice reconcile passes, by result.",
            ("result",),
            registry=registry,
        )


_default_metrics: SliceMetrics | None = None
_metrics_lock = threading.Lock()


def default_metrics() -> SliceMetrics:
    global _default_metrics
    with _metrics_lock:
        if _default_metrics is None:
            _default_metrics = SliceMetrics()
        return _default_metrics
