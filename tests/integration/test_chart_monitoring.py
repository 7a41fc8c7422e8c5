"""The chart's monitoring objects: the ServiceMonitor and the Grafana dashboard ConfigMap, off by
default, rendered (and checked by `helm lint`) only when their values turn them on; the dashboard
in the ConfigMap is the chart's one JSON file, byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.integration.test_chart import by_kind, only, render_chart
from tests.kube.chart import CHART, HelmError, run_helm

DASHBOARD = CHART / "dashboards" / "draplugin-usage.json"


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


def test_default_values_render_no_service_monitor_dashboard_or_metrics_service(helm_home: Path) -> None:
    objects = render_chart(helm_home)
    assert by_kind(objects, "ServiceMonitor") == []
    assert [
        o for o in by_kind(objects, "ConfigMap") if "grafana_dashboard" in o["metadata"].get("labels", {})
    ] == []
    assert by_kind(objects, "Service") == []


def test_service_monitor_scrapes_the_plugin_pods_through_the_metrics_service_keeping_claim_labels(
    helm_home: Path,
) -> None:
    values = {
        "metrics": {
            "port": 9400,
            "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}},
        }
    }
    objects = render_chart(helm_home, values, namespace="gpu-system")
    monitor = only(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "gpu-system"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": True}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
    # The monitor turns the headless Service on, and selects it; the Service selects the plugin pods.
    service = only(objects, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["name"] == "metrics" and service["spec"]["ports"][0]["port"] == 9400
    daemonset = only(objects, "DaemonSet")
    assert service["spec"]["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def test_service_monitor_without_a_metrics_port_is_refused(helm_home: Path) -> None:
    with pytest.raises(HelmError, match=r"metrics\.serviceMonitor\.enabled needs a metrics\.port"):
        render_chart(helm_home, {"metrics": {"port": 0, "serviceMonitor": {"enabled": True}}})


def test_dashboard_config_map_for_the_grafana_sidecar_holds_the_one_dashboard_file(helm_home: Path) -> None:
    values = {
        "metrics": {"dashboard": {"enabled": True, "namespace": "monitoring", "labels": {"team": "ml"}}}
    }
    objects = render_chart(helm_home, values)
    (config_map,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["labels"]["team"] == "ml"
    assert config_map["data"]["draplugin-usage.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(config_map["data"]["draplugin-usage.json"])["uid"] == "draplugin-usage"
    assert by_kind(objects, "ServiceMonitor") == []  # each is its own switch
    # Without a namespace of its own, the release's.
    (default_ns,) = [
        o
        for o in by_kind(render_chart(helm_home, {"metrics": {"dashboard": {"enabled": True}}}), "ConfigMap")
        if o["metadata"]["name"].endswith("-dashboard")
    ]
    assert default_ns["metadata"]["namespace"] == "draplugin-system"


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "interval"),
        ({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "enabled"),
        ({"metrics": {"dashboard": {"namespace": "Not_A_Namespace"}}}, "namespace"),
        ({"metrics": {"dashboard": {"labels": {"grafana_dashboard": 1}}}}, "labels"),
        ({"metrics": {"dashboard": {"folder": "GPUs"}}}, "folder"),
    ],
)
def test_schema_refuses_bad_monitoring_values(
    helm_home: Path, values: dict[str, object], complaint: str
) -> None:
    with pytest.raises(HelmError, match=complaint):
        render_chart(helm_home, values)


def test_helm_lint_strict_with_monitoring_on(helm_home: Path) -> None:
    values_file = helm_home / "monitoring.yaml"
    values_file.write_text(
        yaml.safe_dump({"metrics": {"serviceMonitor": {"enabled": True}, "dashboard": {"enabled": True}}})
    )
    out = run_helm(["lint", "--strict", str(CHART), "--values", str(values_file)], helm_home)
    assert "0 chart(s) failed" in out
