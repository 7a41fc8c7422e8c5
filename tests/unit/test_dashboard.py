"""The Grafana dashboard asks only for metrics and labels the node plugin really exports.

Every PromQL expression in the dashboard (panel targets, and the metric of each `label_values`
variable) is parsed with promql-parser, the Prometheus parser's Rust port; every metric it
selects must be one the plugin exports (the usage metrics of dracommon/usagenames.py, the
claim operation metrics of draplugin/metrics.py, the slice publisher's of
draplugin/slices/metrics.py, histograms with their _bucket/_sum/_count series), and every
label it matches, groups by or joins on must be a label of the metrics the expression selects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import CollectorRegistry

from dracommon import usagenames as names
from draplugin.metrics import ClaimMetrics
from draplugin.slices.metrics import SliceMetrics

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = REPO_ROOT / "deploy" / "helm" / "draplugin" / "dashboards" / "draplugin-usage.json"
# Grafana's interval variables stand where PromQL wants a duration: parse with a real one instead.
GRAFANA_DURATIONS = re.compile(
    r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}"
)
LABEL_VALUES = re.compile(r"^label_values\((?:(?P<selector>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name the plugin serves, with its labels: histograms as their three series."""
    series: dict[str, frozenset[str]] = {}
    for metric in names.USAGE_METRICS:
        labels = frozenset(metric.labels)
        if metric.type == "histogram":
            series[f"{metric.name}_bucket"] = labels | {"le"}
            series[f"{metric.name}_sum"] = labels
            series[f"{metric.name}_count"] = labels
        else:
            series[metric.exposed] = labels
    # The operation and slice metrics as their own code registers them, each series exercised once.
    registry = CollectorRegistry()
    claims = ClaimMetrics(registry)
    claims.error("prepare", "any")
    claims.prepared_claims.set(0)
    slices = SliceMetrics(registry)
    slices.writes.labels("create").inc()
    slices.syncs.labels("success").inc()
    for family in registry.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            series[sample.name] = series.get(sample.name, frozenset()) | frozenset(sample.labels)
    return series


EXPORTED = exported_series()


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panel_queries(board: dict[str, Any]) -> Iterator[tuple[str, str]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
        for panel in panels:
            for target in panel.get("targets") or []:
                yield f"panel {panel['title']!r} target {target['refId']}", target["expr"]
            yield from walk(panel.get("panels") or [])

    yield from walk(board["panels"])


@dataclass
class Uses:
    """What one expression asks for: selectors (metric, labels matched) and grouping labels."""

    selectors: list[tuple[str, set[str]]] = field(default_factory=list)
    grouping: set[str] = field(default_factory=set)


def uses_of(expr: str) -> Uses:
    uses = Uses()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            labels = {m.name for m in node.matchers.matchers}
            labels |= {m.name for group in node.matchers.or_matchers for m in group}
            assert node.name, f"a selector without a metric name: {node}"
            uses.selectors.append((node.name, labels - {"__name__"}))
        elif isinstance(node, promql_parser.MatrixSelector):
            visit(node.vector_selector)
        elif isinstance(node, promql_parser.AggregateExpr):
            if node.modifier is not None:
                uses.grouping |= set(node.modifier.labels)
            visit(node.expr)
            if node.param is not None:
                visit(node.param)
        elif isinstance(node, promql_parser.BinaryExpr):
            modifier = node.modifier
            if modifier is not None:
                if modifier.matching is not None:
                    uses.grouping |= set(modifier.matching.labels)
                uses.grouping |= set(modifier.group_labels or ())  # group_left/group_right (labels)
            visit(node.lhs)
            visit(node.rhs)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                visit(arg)
        elif isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr | promql_parser.SubqueryExpr):
            visit(node.expr)
        elif not isinstance(node, promql_parser.NumberLiteral | promql_parser.StringLiteral):
            raise AssertionError(f"unhandled PromQL node {type(node).__name__}: {node}")

    visit(promql_parser.parse(GRAFANA_DURATIONS.sub("5m", expr)))
    return uses


def check(where: str, expr: str) -> Uses:
    try:
        uses = uses_of(expr)
    except ValueError as err:
        raise AssertionError(f"{where}: not PromQL: {err}\n{expr}") from err
    assert uses.selectors, f"{where}: selects no metric: {expr}"
    available: set[str] = set()
    for metric, labels in uses.selectors:
        assert metric in EXPORTED, f"{where}: the plugin exports no metric {metric}"
        unknown = labels - EXPORTED[metric]
        assert not unknown, (
            f"{where}: {metric} has no label {sorted(unknown)} (it has {sorted(EXPORTED[metric])})"
        )
        available |= EXPORTED[metric]
    unknown = uses.grouping - available
    assert not unknown, (
        f"{where}: groups or joins on {sorted(unknown)}, which none of its metrics carries: {expr}"
    )
    return uses


def test_every_panel_query_names_only_exported_metrics_and_their_labels() -> None:
    queries = list(panel_queries(dashboard()))
    assert len(queries) >= 8
    used: set[str] = set()
    for where, expr in queries:
        used |= {metric for metric, _ in check(where, expr).selectors}
    # The panels the dashboard promises: per-claim utilization and memory, idle claims, prepare latency.
    assert {
        "draplugin_claim_gpu_utilization_ratio",
        "draplugin_claim_memory_used_bytes",
        "draplugin_claim_idle",
        "draplugin_claim_idle_seconds",
        "draplugin_claim_operation_duration_seconds_bucket",
    } <= used


def test_legends_name_only_labels_their_query_keeps() -> None:
    for where, expr in panel_queries(dashboard()):
        target_legends = [
            t.get("legendFormat", "")
            for p in dashboard()["panels"]
            for t in p.get("targets") or []
            if t["expr"] == expr
        ]
        uses = uses_of(expr)
        labels = set().union(*(EXPORTED[m] for m, _ in uses.selectors))
        for legend in target_legends:
            for label in re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend):
                assert label in labels, f"{where}: legend names {label}, which its series do not carry"
                if uses.grouping:
                    assert label in uses.grouping, (
                        f"{where}: legend names {label}, which the query aggregates away"
                    )


def test_template_variables_read_exported_labels() -> None:
    variables = [v for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    assert {v["name"] for v in variables} == {"node", "namespace"}
    for variable in variables:
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        match = LABEL_VALUES.match(query)
        assert match and match.group("selector"), f"variable {variable['name']}: {query}"
        uses = check(f"variable {variable['name']}", match.group("selector"))
        ((metric, _),) = uses.selectors
        assert match.group("label") in EXPORTED[metric], (
            f"variable {variable['name']}: {metric} has no such label"
        )


@pytest.mark.parametrize(
    ("expr", "complaint"),
    [
        ("rate(draplugin_claim_prepare_seconds_bucket[5m])", "exports no metric"),
        ('draplugin_claim_idle{pod="x"}', "has no label"),
        ("sum by (gpu) (draplugin_claim_gpu_utilization_ratio)", "groups or joins on"),
        (
            "draplugin_claim_idle * on (node) group_left (gpu) draplugin_device_power_watts",
            "groups or joins on",
        ),
        ("sum(draplugin_claim_idle", "not PromQL"),
    ],
)
def test_the_check_catches_a_wrong_metric_label_grouping_or_syntax(expr: str, complaint: str) -> None:
    with pytest.raises(AssertionError, match=complaint):
        check("probe", expr)


def test_the_chart_dashboard_is_the_only_copy() -> None:
    """One JSON file: the chart's ConfigMap reads it with .Files.Get and the docs link to it."""
    copies = [p for p in REPO_ROOT.glob("deploy/**/*.json") if p.name != "values.schema.json"]
    assert copies == [DASHBOARD]
    template = (REPO_ROOT / "deploy/helm/draplugin/templates/dashboard-configmap.yaml").read_text()
    assert '.Files.Get "dashboards/draplugin-usage.json"' in template
