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


def test_memory_limit_settings_reach_the_plugin_with_the_hook_mounted(helm_home: Path) -> None:
    values = {
        "kubeletPlugin": {"nvidiaCdiHookPath": "/usr/bin/nvidia-cdi-hook", "unlimitedShares": "publish"}
    }
    pod = only(render_chart(helm_home, values), "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    env = container_env(plugin)
    assert (env["NVIDIA_CDI_HOOK_PATH"], env["UNLIMITED_SHARES"]) == ("/usr/bin/nvidia-cdi-hook", "publish")
    (mount,) = [m for m in plugin["volumeMounts"] if m["name"] == "nvidia-cdi-hook"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "nvidia-cdi-hook"]
    assert (mount["mountPath"], mount["readOnly"]) == ("/usr/bin/nvidia-cdi-hook", True)
    assert volume["hostPath"] == {"path": "/usr/bin/nvidia-cdi-hook", "type": "File"}


def test_without_a_hook_path_no_hook_is_named_and_shares_are_skipped(helm_home: Path) -> None:
    env = plugin_env(helm_home)
    assert "NVIDIA_CDI_HOOK_PATH" not in env
    assert env["UNLIMITED_SHARES"] == "skip"


@pytest.mark.parametrize(
    "value", [{"unlimitedShares": "yes"}, {"nvidiaCdiHookPath": "usr/bin/nvidia-cdi-hook"}]
)
def test_schema_refuses_bad_memory_limit_settings(helm_home: Path, value: dict[str, str]) -> None:
    with pytest.raises(HelmError, match=next(iter(value))):
        render_chart(helm_home, {"kubeletPlugin": value})
