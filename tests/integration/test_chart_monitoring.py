"""The chart's monitoring objects: the ServiceMonitor and the Grafana dashboard ConfigMap, off by
default, rendered (and checked by `helm lint`) only when their values turn them on; the dashboard
in the ConfigMap is the chart's one JSON file, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_chart import by_kind, only, render_chart
from tests.kube.chart import CHART, HelmError, run_helm

DASHBOARD = CHART / "dashboards" / "draplugin-usage.json"
PLAIN_RULES = CHART.parents[1] / "monitoring" / "dcgm-compat.rules.yaml"


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
    monitor = of_component(by_kind(objects, "ServiceMonitor"), "kubelet-plugin")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "gpu-system"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = monitor["spec"]["endpoints"]
    # The plugin pod's own namespace/pod/container target labels are dropped: a device's series
    # (which has none) must not read as used by the plugin pod.
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "honorLabels": True,
        "relabelings": [{"action": "labeldrop", "regex": "(namespace|pod|container)"}],
    }
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["gpu-system"]}
    # The monitor turns the headless Service on, and selects it; the Service selects the plugin pods.
    service = of_component(by_kind(objects, "Service"), "kubelet-plugin")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["name"] == "metrics" and service["spec"]["ports"][0]["port"] == 9400
    daemonset = only(objects, "DaemonSet")
    assert service["spec"]["selector"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()


def of_component(objects: Sequence[Mapping[str, Any]], component: str) -> Mapping[str, Any]:
    (found,) = [o for o in objects if o["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return found


def test_service_monitor_scrapes_every_controller_replica_through_a_service_of_its_own(
    helm_home: Path,
) -> None:
    values = {"metrics": {"port": 9401, "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}}}
    objects = render_chart(helm_home, values, namespace="gpu-system")
    monitor = of_component(by_kind(objects, "ServiceMonitor"), "controller")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s"}]
    service = of_component(by_kind(objects, "Service"), "controller")
    assert service["spec"]["clusterIP"] == "None"  # every replica, not one behind a virtual IP
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9401, 9401)
    deployment = only(objects, "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=9401" in container["args"]


def test_prometheus_rule_carries_the_plain_rules_file_and_is_off_by_default(helm_home: Path) -> None:
    assert by_kind(render_chart(helm_home), "PrometheusRule") == []
    values = {"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}}}
    rule = only(render_chart(helm_home, values, namespace="gpu-system"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "gpu-system"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(PLAIN_RULES.read_text())
    records = [r["record"] for r in rule["spec"]["groups"][0]["rules"]]
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE"} <= set(records)


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
        ({"metrics": {"prometheusRule": {"enabled": "yes"}}}, "enabled"),
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
        yaml.safe_dump(
            {
                "metrics": {
                    "serviceMonitor": {"enabled": True},
                    "dashboard": {"enabled": True},
                    "prometheusRule": {"enabled": True},
                }
            }
        )
    )
    out = run_helm(["lint", "--strict", str(CHART), "--values", str(values_file)], helm_home)
    assert "0 chart(s) failed" in out
