"""The kubelet protocol layer's Prometheus metrics, made on first use rather than at import.

Importing prometheus_client (with the exposition's http.server, wsgiref and email) is ~15 ms
of `python -X importtime`, and the plugin server is imported before its sockets exist; no
metric is needed to answer the kubelet's first calls. `draplugin run` makes them all once
its sockets are up (`kubelet_metrics()` from `cli.serve_service`, before the metrics endpoint
opens), so a scrape shows the same series as before, and any use makes them too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram


@dataclass(frozen=True, slots=True)
class KubeletMetrics:
    """The protocol layer's series: claim answers, request times, registration, health streams."""

    # Per-claim answers as the kubelet sees them (including requests rejected before reaching
    # the driver); the driver's own operation metrics live in draplugin.metrics.
    claim_results: Counter
    request_seconds: Histogram
    registration_notifications: Counter
    health_streams: Counter


_made: KubeletMetrics | None = None
_lock = threading.Lock()


def kubelet_metrics() -> KubeletMetrics:
    """The metrics on the default registry, made once per process."""
    global _made
    if _made is not None:
        return _made
    with _lock:
        if _made is None:
            from prometheus_client import Counter, Histogram

            _made = KubeletMetrics(
                claim_results=Counter(
                    "draplugin_kubelet_claim_results",
                    "Per-claim prepare/unprepare answers sent to the kubelet, by result.",
                    ["operation", "result"],
                ),
                request_seconds=Histogram(
                    "draplugin_kubelet_request_seconds",
                    "Duration of NodePrepareResources/NodeUnprepareResources calls.",
                    ["operation", "api_version"],
                ),
                registration_notifications=Counter(
                    "draplugin_kubelet_registration_notifications",
                    "NotifyRegistrationStatus calls from the kubelet, by outcome.",
                    ["registered"],
                ),
                health_streams=Counter(
                    "draplugin_kubelet_health_streams",
                    "Device health streams the kubelet opened, by DRAResourceHealth service version.",
                    ["version"],
                ),
            )
        return _made
