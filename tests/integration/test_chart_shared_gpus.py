"""The chart's `kubeletPlugin.sharedGpus`: it reaches the plugin as SHARED_GPUS, and only known modes pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin.devices.shared import SharedGpus
from tests.integration.test_chart import container_env, only, render_chart
from tests.kube.chart import HelmError


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


def plugin_env(helm_home: Path, values: dict[str, object] | None = None) -> dict[str, str]:
    pod = only(render_chart(helm_home, values or {}), "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    env: dict[str, str] = container_env(plugin)
    return env


def test_shared_gpus_are_off_by_default(helm_home: Path) -> None:
    assert plugin_env(helm_home)["SHARED_GPUS"] == "off"


@pytest.mark.parametrize("mode", [m.value for m in SharedGpus])
def test_each_mode_reaches_the_plugin(helm_home: Path, mode: str) -> None:
    assert plugin_env(helm_home, {"kubeletPlugin": {"sharedGpus": mode}})["SHARED_GPUS"] == mode


@pytest.mark.parametrize("mode", ["on", "true", "compute", ""])
def test_schema_refuses_an_unknown_mode(helm_home: Path, mode: str) -> None:
    with pytest.raises(HelmError, match="sharedGpus"):
        render_chart(helm_home, {"kubeletPlugin": {"sharedGpus": mode}})
