"""Prometheus metrics for prepare and unprepare.

Labels are bounded sets (operation, result, error reason); claim names and
UIDs never become labels, so the series count does not grow with the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

OPERATIONS = ("prepare", "unprepare")
# Seconds; prepare is normally a few milliseconds, the tail covers a slow API server.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ClaimMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.operations = Counter(
            "draplugin_claim_operations_total",
            "Prepare and unprepare calls handled, by outcome.",
            ("operation", "result"),
            registry=registry,
        )
        self.errors = Counter(
            "draplugin_claim_operation_errors_total",
            "Failed prepare and unprepare calls, by reason.",
            ("operation", "reason"),
            registry=registry,
        )
        self.duration = Histogram(
            "draplugin_claim_operation_duration_seconds",
            "Time to prepare or unprepare one claim.",
            ("operation",),
            buckets=_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "draplugin_claim_operations_in_flight",
            "Prepare and unprepare calls in progress.",
            ("operation",),
            registry=registry,
        )
        self.prepared_claims = Gauge(
            "draplugin_prepared_claims",
            "Claims recorded in the checkpoint (prepared or being prepared).",
            registry=registry,
        )
        # Pre-create the series so dashboards show zeros rather than gaps.
        for operation in OPERATIONS:
            self.in_flight.labels(operation)
            self.duration.labels(operation)
            for result in ("success", "error"):
                self.operations.labels(operation, result)

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        """Count, time and gauge one operation; an exception counts as an error and propagates."""
        gauge = self.in_flight.labels(operation)
        gauge.inc()
        start = time.perf_counter()
        result = "error"
        try:
            yield
            result = "success"
        finally:
            gauge.dec()
            self.duration.labels(operation).observe(time.perf_counter() - start)
            self.operations.labels(operation, result).inc()

    def error(self, operation: str, reason: str) -> None:
        self.errors.labels(operation, reason).inc()
