"""Neither daemon exposes `_created` series: one more series per counter and histogram child
that no dashboard or rule reads (prometheus_client's `disable_created_metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from controller.run.metrics import ControllerMetrics
from draplugin.metrics import ClaimMetrics


def _scrape(registry: CollectorRegistry) -> list[str]:
    # generate_latest is what both endpoints answer /metrics with.
    return generate_latest(registry).decode().splitlines()


def test_the_plugin_metrics_have_no_created_series() -> None:
    registry = CollectorRegistry()
    metrics = ClaimMetrics(registry)
    with metrics.track("prepare"):
        pass
    lines = _scrape(registry)
    assert any(line.startswith("draplugin_claim_operations_total{") for line in lines)
    assert [line for line in lines if "_created" in line] == []


def test_the_controller_metrics_have_no_created_series() -> None:
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    lines = _scrape(registry)
    assert any(line.startswith("# TYPE ") for line in lines)
    assert [line for line in lines if "_created" in line] == []
