"""The chart's side of moving from the device plugin: extendedResourceName per DeviceClass (KEP-5004)
and the plugin's device plugin guard (its setting, and the device-plugins directory it looks in)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient

from devcluster.binaries import pinned_kubernetes_version
from devcluster.controlplane import ControlPlane
from tests.integration.test_chart import by_kind, container_env, only, render_chart
from tests.kube.chart import HelmError

DRIVER = "gpu.draplugin.dev"


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


def classes(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {obj["metadata"]["name"]: obj["spec"] for obj in by_kind(objects, "DeviceClass")}


def test_no_class_maps_an_extended_resource_by_default(helm_home: Path) -> None:
    """The device plugin may own nvidia.com/gpu: mapping it is the admin's choice (values.yaml)."""
    for spec in classes(render_chart(helm_home)).values():
        assert "extendedResourceName" not in spec


def test_each_class_carries_its_own_extended_resource_name(helm_home: Path) -> None:
    values = {
        "deviceClasses": {
            "gpuExtendedResourceName": "nvidia.com/gpu",
            "migExtendedResourceName": "example.com/mig",
            "byModel": [
                {
                    "name": "l4.gpu.draplugin.dev",
                    "productName": "NVIDIA L4",
                    "extendedResourceName": "example.com/l4",
                },
                {"name": "a100.gpu.draplugin.dev", "productName": "NVIDIA A100-SXM4-40GB"},
            ],
        }
    }
    specs = classes(render_chart(helm_home, values))
    assert specs[DRIVER]["extendedResourceName"] == "nvidia.com/gpu"
    assert specs[f"mig.{DRIVER}"]["extendedResourceName"] == "example.com/mig"
    assert specs["l4.gpu.draplugin.dev"]["extendedResourceName"] == "example.com/l4"
    assert "extendedResourceName" not in specs["a100.gpu.draplugin.dev"]


@pytest.mark.parametrize("kube_version", ["v1.34.4", "v1.35.2"])
def test_before_1_36_the_mapping_needs_the_gate_declared(helm_home: Path, kube_version: str) -> None:
    """There the gate is off by default and the API server would drop the field without a word."""
    values: dict[str, Any] = {"deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu"}}
    needs = r"gpuExtendedResourceName: extendedResourceName \"nvidia.com/gpu\" needs Kubernetes 1\.36\+"
    with pytest.raises(HelmError, match=needs + " or the DRAExtendedResource feature gate"):
        render_chart(helm_home, values, kube_version=kube_version)
    values["deviceClasses"]["extendedResourceGateEnabled"] = True
    specs = classes(render_chart(helm_home, values, kube_version=kube_version))
    assert specs[DRIVER]["extendedResourceName"] == "nvidia.com/gpu"
    assert classes(render_chart(helm_home, kube_version=kube_version)), "unset renders everywhere"


def test_one_extended_resource_goes_to_one_class(helm_home: Path) -> None:
    values: dict[str, Any] = {
        "deviceClasses": {
            "gpuExtendedResourceName": "nvidia.com/gpu",
            "byModel": [
                {
                    "name": "l4.gpu.draplugin.dev",
                    "productName": "NVIDIA L4",
                    "extendedResourceName": "nvidia.com/gpu",
                }
            ],
        }
    }
    with pytest.raises(HelmError, match=r"set on both deviceClasses.gpuExtendedResourceName and "
                       r"deviceClasses.byModel l4.gpu.draplugin.dev"):  # fmt: skip
        render_chart(helm_home, values)
    # A class that is switched off maps nothing, so it conflicts with nothing.
    values["deviceClasses"]["gpu"] = False
    assert (
        classes(render_chart(helm_home, values))["l4.gpu.draplugin.dev"]["extendedResourceName"]
        == "nvidia.com/gpu"
    )


@pytest.mark.parametrize("name", ["gpu", "nvidia.com/", "/gpu", "Nvidia.com/gpu"])
def test_schema_refuses_a_name_that_is_not_domain_slash_name(helm_home: Path, name: str) -> None:
    with pytest.raises(HelmError, match="gpuExtendedResourceName"):
        render_chart(helm_home, {"deviceClasses": {"gpuExtendedResourceName": name}})


def test_the_plugin_gets_the_coexistence_policy_and_sees_the_device_plugin_sockets(helm_home: Path) -> None:
    pod = only(render_chart(helm_home), "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    assert container_env(plugin)["DEVICE_PLUGIN_COEXISTENCE"] == "refuse"
    mount = next(m for m in plugin["volumeMounts"] if m["name"] == "device-plugins")
    assert mount == {
        "name": "device-plugins",
        "mountPath": "/var/lib/kubelet/device-plugins",
        "readOnly": True,
    }
    volume = next(v for v in pod["volumes"] if v["name"] == "device-plugins")
    assert volume["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"

    values = {"kubeletPlugin": {"devicePluginCoexistence": "split:4,5", "kubeletRootDir": "/data/kubelet/"}}
    pod = only(render_chart(helm_home, values), "DaemonSet")["spec"]["template"]["spec"]
    (plugin,) = pod["containers"]
    assert container_env(plugin)["DEVICE_PLUGIN_COEXISTENCE"] == "split:4,5"
    # The kubelet keeps its device plugin sockets at the fixed path whatever its root dir.
    assert container_env(plugin)["DEVICE_PLUGIN_DIR"] == "/var/lib/kubelet/device-plugins"
    assert "/var/lib/kubelet/device-plugins" in {m["mountPath"] for m in plugin["volumeMounts"]}
    moved = {"kubeletPlugin": {"devicePluginDir": "/run/k0s/device-plugins"}}
    (plugin,) = only(render_chart(helm_home, moved), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container_env(plugin)["DEVICE_PLUGIN_DIR"] == "/run/k0s/device-plugins"
    assert "/run/k0s/device-plugins" in {m["mountPath"] for m in plugin["volumeMounts"]}


@pytest.mark.parametrize("policy", ["share", "split", "split:", "split:a", "refuse,split:1"])
def test_schema_refuses_an_unknown_policy(helm_home: Path, policy: str) -> None:
    with pytest.raises(HelmError, match="devicePluginCoexistence"):
        render_chart(helm_home, {"kubeletPlugin": {"devicePluginCoexistence": policy}})


@pytest.fixture
def dynamic_client(kube_cluster: ControlPlane) -> Iterator[DynamicClient]:
    with kube_cluster.api_client() as api:
        yield DynamicClient(api)  # type: ignore[no-untyped-call]


@pytest.mark.cluster
def test_the_api_server_keeps_the_rendered_extended_resource_name(
    helm_home: Path, dynamic_client: DynamicClient
) -> None:
    """Where the chart renders the field, the server stores it (our 1.34 test clusters run the gate on)."""
    values = {
        "deviceClasses": {"gpuExtendedResourceName": "nvidia.com/gpu", "extendedResourceGateEnabled": True}
    }
    rendered = classes(render_chart(helm_home, values, kube_version=pinned_kubernetes_version()))
    resource = dynamic_client.resources.get(api_version="resource.k8s.io/v1", kind="DeviceClass")
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"chart-er-{uuid.uuid4().hex[:6]}"},
        "spec": rendered[DRIVER],
    }
    stored = resource.create(body=body, dry_run="All").to_dict()
    assert stored["spec"]["extendedResourceName"] == "nvidia.com/gpu"
