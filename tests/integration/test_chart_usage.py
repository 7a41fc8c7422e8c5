"""The chart's usage settings: values to the plugin's environment, the node's /proc, bad values refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draplugin import config
from tests.integration.test_chart import container_env, only, render_chart
from tests.kube.chart import HelmError


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


def plugin_pod(objects: list[dict[str, Any]]) -> Any:
    return only(objects, "DaemonSet")["spec"]["template"]["spec"]


def test_defaults_are_the_plugins_and_the_node_proc_is_mounted_read_only(helm_home: Path) -> None:
    pod = plugin_pod(render_chart(helm_home))
    (container,) = pod["containers"]
    env = container_env(container)
    assert env["USAGE_SAMPLE_INTERVAL"] == config.DEFAULT_USAGE_SAMPLE_INTERVAL
    assert env["IDLE_THRESHOLD_PERCENT"] == config.DEFAULT_IDLE_THRESHOLD_PERCENT
    assert env["IDLE_AFTER"] == config.DEFAULT_IDLE_AFTER
    assert env["USAGE_PROC_ROOT"] == "/host/proc"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/host/proc"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/proc", "type": "Directory"}
    assert "hostPID" not in pod  # the node's /proc is enough to read cgroups; no host PID namespace


def test_values_reach_the_plugin_and_it_accepts_them(helm_home: Path) -> None:
    values = {"usage": {"sampleInterval": "2s", "idleThresholdPercent": 2.5, "idleAfter": "20s"}}
    (container,) = plugin_pod(render_chart(helm_home, values))["containers"]
    env = container_env(container)
    assert (env["USAGE_SAMPLE_INTERVAL"], env["IDLE_THRESHOLD_PERCENT"], env["IDLE_AFTER"]) == (
        "2s",
        "2.5",
        "20s",
    )
    settings = config.load(
        {"node_name": "n"},
        {k: env[k] for k in ("USAGE_SAMPLE_INTERVAL", "IDLE_THRESHOLD_PERCENT", "IDLE_AFTER")},
    )
    assert (settings.usage_sample_interval_s, settings.idle_threshold_percent, settings.idle_after_s) == (
        2,
        2.5,
        20,
    )
    off = plugin_pod(render_chart(helm_home, {"usage": {"sampleInterval": 0}}))["containers"][0]
    assert container_env(off)["USAGE_SAMPLE_INTERVAL"] == "0"


@pytest.mark.parametrize(
    "usage",
    [{"idleThresholdPercent": 150}, {"idleAfter": "half an hour"}, {"sampleInterval": "-1s"}, {"idle": True}],
)
def test_the_schema_refuses_bad_usage_values(helm_home: Path, usage: dict[str, Any]) -> None:
    with pytest.raises(HelmError, match="usage"):
        render_chart(helm_home, {"usage": usage})
