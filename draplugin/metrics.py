"""Prometheus metrics for prepare and unprepare, and the endpoint that serves them.

Labels are bounded sets (operation, result, error reason); claim names and
UIDs never become labels, so the series count does not grow with the cluster.

The endpoint (`serve_metrics`) binds one address (the chart gives the pod's
IP: under host networking the node's, where scrapers connect), and sets
SO_REUSEPORT: during a rolling update the new plugin pod binds the node port
the old one still serves, as both pods' gRPC health listeners do (gRPC sets
it by default), instead of failing on "Address already in use". While both
run, the kernel hands each scrape to one of them; the kernel lets only
sockets of the same user share the port.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dracommon.buildinfo import build_labels

# No `<counter>_created` series: a second series per counter and histogram child that
# dashboards never use (process-wide; prometheus_client reads it at each scrape).
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

OPERATIONS = ("prepare", "unprepare")
# Seconds; prepare is normally a few milliseconds, the tail covers a slow API server.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class _Tracked:
    """One operation's series, as `ClaimMetrics.track` updates them."""

    in_flight: Gauge
    duration: Histogram
    success: Counter
    error: Counter


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
        # Which build each node runs, for dashboards and alerts to join on.
        self.build_info = Gauge(
            "draplugin_build_info",
            "Always 1, labelled with the running build: the package version and the Python version.",
            ("version", "python_version"),
            registry=registry,
        )
        self.build_info.labels(**build_labels()).set(1)
        # Pre-create the series so dashboards show zeros rather than gaps. `track` keeps the
        # children: `labels()` checks and joins its label values each call, a few microseconds
        # three times per claim on the event loop that serves the kubelet.
        self._tracked = {
            operation: _Tracked(
                in_flight=self.in_flight.labels(operation),
                duration=self.duration.labels(operation),
                success=self.operations.labels(operation, "success"),
                error=self.operations.labels(operation, "error"),
            )
            for operation in OPERATIONS
        }

    @contextmanager
    def track(self, operation: str) -> Iterator[None]:
        """Count, time and gauge one operation; an exception counts as an error and propagates."""
        series = self._tracked[operation]
        series.in_flight.inc()
        start = time.perf_counter()
        outcome = series.error
        try:
            yield
            outcome = series.success
        finally:
            series.in_flight.dec()
            series.duration.observe(time.perf_counter() - start)
            outcome.inc()

    def error(self, operation: str, reason: str) -> None:
        self.errors.labels(operation, reason).inc()


JOIN_TIMEOUT_S: Final = 5.0


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


class _SharedPortServer(ThreadingWSGIServer):
    allow_reuse_port = True  # socketserver sets SO_REUSEPORT before bind (module docstring)


class MetricsEndpoint:
    """`/metrics` on `host:port` in a background thread, until `close`."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry = REGISTRY) -> None:
        server_class = type(
            "_Server",
            (_SharedPortServer,),
            {
                "address_family": socket.AF_INET6
                if ipaddress.ip_address(host).version == 6
                else socket.AF_INET
            },
        )
        app = make_wsgi_app(registry)
        self._server: WSGIServer = make_server(host, port, app, server_class, handler_class=_Quiet)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self._closed = False

    def close(self) -> None:
        """Stop serving and release the port; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=JOIN_TIMEOUT_S)


def serve_metrics(host: str, port: int, registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint:
    """Serve `registry` on `host:port` (0: any free port); OSError when the address cannot be bound."""
    return MetricsEndpoint(host, port, registry)
