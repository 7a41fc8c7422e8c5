"""Prometheus metrics of the controller daemon, and the HTTP endpoint that serves them
together with `/healthz` (the liveness probe).

Labels are small fixed sets (result, reason, resource); claim names never
become labels, so the series count does not grow with the cluster.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from dracommon.buildinfo import build_labels

# No `<counter>_created` series: a second series per counter and histogram child that
# dashboards never use (process-wide; prometheus_client reads it at each scrape).
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

log = logging.getLogger(__name__)

RECONCILE_RESULTS = ("success", "error", "skipped-not-leader")
ALLOCATION_RESULTS = ("allocated", "unschedulable", "error", "conflict", "invalid")
DEALLOCATION_REASONS = ("released", "double-allocation")
CACHED_RESOURCES = ("deviceclasses", "resourceslices", "resourceclaims", "pods")


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.reconciles = Counter(
            "dra_controller_reconciles_total",
            "Reconcile passes, by result.",
            ("result",),
            registry=registry,
        )
        self.reconcile_duration = Histogram(
            "dra_controller_reconcile_duration_seconds",
            "Time of one reconcile pass over all claims.",
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
            registry=registry,
        )
        self.allocation_attempts = Counter(
            "dra_controller_allocation_attempts_total",
            "Pre-allocation attempts of annotated claims, by result.",
            ("result",),
            registry=registry,
        )
        self.deallocations = Counter(
            "dra_controller_deallocations_total",
            "Allocations this controller cleared, by reason.",
            ("reason",),
            registry=registry,
        )
        self.double_allocations = Counter(
            "dra_controller_double_allocations_total",
            "Devices found allocated to two claims at once (one of them ours).",
            registry=registry,
        )
        self.events = Counter(
            "dra_controller_events_total",
            "Kubernetes Events posted, by reason.",
            ("reason",),
            registry=registry,
        )
        self.leader = Gauge(
            "dra_controller_leader",
            "1 while this replica holds the leader lease and reconciles, else 0.",
            registry=registry,
        )
        self.cache_objects = Gauge(
            "dra_controller_cache_objects",
            "Objects held in the watch caches, by resource.",
            ("resource",),
            registry=registry,
        )
        self.cache_relists = Counter(
            "dra_controller_cache_relists_total",
            "Full lists made by the watch caches (start-up, 410 Gone, watch errors), by resource.",
            ("resource",),
            registry=registry,
        )
        # Which build each replica runs, for dashboards and alerts to join on.
        self.build_info = Gauge(
            "dra_controller_build_info",
            "Always 1, labelled with the running build: the package version and the Python version.",
            ("version", "python_version"),
            registry=registry,
        )
        self.build_info.labels(**build_labels()).set(1)
        # Pre-create the series so dashboards show zeros rather than gaps.
        for result in RECONCILE_RESULTS:
            self.reconciles.labels(result)
        for result in ALLOCATION_RESULTS:
            self.allocation_attempts.labels(result)
        for reason in DEALLOCATION_REASONS:
            self.deallocations.labels(reason)
        for resource in CACHED_RESOURCES:
            self.cache_objects.labels(resource)
            self.cache_relists.labels(resource)
        self.events.labels("CannotAllocate")


class MetricsServer:
    """`/metrics` (Prometheus text format) and `/healthz` on one port, in a background thread."""

    def __init__(
        self, port: int, registry: CollectorRegistry, healthy: Callable[[], str | None], host: str = ""
    ) -> None:
        """`healthy()` returns None when healthy, else the reason (served with status 503)."""
        handler = _handler_class(registry, healthy)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving metrics and health", extra={"port": self.port})

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _handler_class(
    registry: CollectorRegistry, healthy: Callable[[], str | None]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path in ("/healthz", "/livez"):
                problem = healthy()
                if problem is None:
                    self._reply(200, b"ok\n", "text/plain")
                else:
                    self._reply(503, f"unhealthy: {problem}\n".encode(), "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            # Probes every few seconds would drown the log.
            pass

    return Handler
