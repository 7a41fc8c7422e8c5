"""The chart in the NVIDIA-compatible naming mode (`kubeletPlugin.deviceNaming: nvidia`).

The plugin gets `DEVICE_NAMING=nvidia` under `gpu.nvidia.com`; the DeviceClasses are the ones NVIDIA's
chart installs (k8s-dra-driver-gpu deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml
and deviceclass-mig.yaml: `gpu.nvidia.com` and `mig.nvidia.com`, selecting `type` gpu and mig of that
driver), so claims written for NVIDIA's driver find them; the two settings go together or not at all.
Rendered with the Helm CLI (tests/integration/test_chart.py's helpers).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_chart import by_kind, container_env, only, render_chart
from tests.kube.chart import HelmError

NVIDIA = {"driverName": "gpu.nvidia.com", "kubeletPlugin": {"deviceNaming": "nvidia"}}


def test_nvidia_naming_reaches_the_plugin_and_names_the_classes_as_nvidias_chart(tmp_path: Path) -> None:
    objects = render_chart(tmp_path, NVIDIA)
    (plugin,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    env = container_env(plugin)
    assert (env["DRIVER_NAME"], env["DEVICE_NAMING"]) == ("gpu.nvidia.com", "nvidia")
    classes = {
        c["metadata"]["name"]: c["spec"]["selectors"][0]["cel"]["expression"]
        for c in by_kind(objects, "DeviceClass")
    }
    selector = 'device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].type == "{}"'
    assert classes == {"gpu.nvidia.com": selector.format("gpu"), "mig.nvidia.com": selector.format("mig")}


def test_the_default_keeps_our_names(tmp_path: Path) -> None:
    objects = render_chart(tmp_path)
    (plugin,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container_env(plugin)["DEVICE_NAMING"] == "draplugin"
    assert {c["metadata"]["name"] for c in by_kind(objects, "DeviceClass")} == {
        "gpu.draplugin.dev", "mig.gpu.draplugin.dev",
    }  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [{"driverName": "gpu.nvidia.com"}, {"kubeletPlugin": {"deviceNaming": "nvidia"}}],
    ids=["nvidia-driver-our-names", "our-driver-nvidia-names"],
)
def test_nvidia_names_and_nvidias_driver_name_render_only_together(
    tmp_path: Path, values: dict[str, object]
) -> None:
    with pytest.raises(HelmError, match=r"go with the driver name gpu\.nvidia\.com"):
        render_chart(tmp_path, values)
