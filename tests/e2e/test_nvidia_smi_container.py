"""NVIDIA's real `nvidia-smi`, inside a workload container, lists exactly the GPUs the claim holds.

The plugin runs the NVML path (`--backend nvml`) on a driver root made of
NVIDIA's real 550.163.01 files (Debian's packages in the `.run` installer's flat
layout, `tests/nvidia_roots.py`) whose NVML library is the C-ABI NVML double
over go-nvml's DGX H100 model (`tests/nvmldouble.py`). Our CDI spec mounts the
root's files and injects the claimed GPU's device node; containerd and runc
apply it. In the container, NVIDIA's `nvidia-smi -L` loads the mounted NVML and
prints what it sees. Like NVML in a real container, the double lists only the
GPUs whose `/dev/nvidiaN` the container has (its `devRoot`), so the output
shows which GPUs the spec really gave: the claimed one, by its UUID, and not
the other. A real GPU is not involved (`make gpu-check` is the check for that).

The container's image is ours (Debian bookworm): `nvidia-smi` needs a C
library, which the busybox workload image has not. The double's configuration
reaches the container through a hostPath volume: it is the test's, not the
spec's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.chart import import_our_image
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi
from tests import nvidia_roots
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 180.0
GPUS = 2
CONTAINER_DOUBLE_DIR = "/nvml-double"


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> nvidia_roots.NvidiaRoot:
    root = nvidia_roots.build_root(
        "flat", tmp_path_factory.mktemp("nvidia") / "root", gpus=GPUS, nvml=nvidia_roots.nvml_double_library()
    )
    assert root.nvml_double, "the root's NVML library must be the double"
    assert len([n for n in root.device_nodes if n.name.startswith("nvidia") and n.name[6:].isdigit()]) == GPUS
    return root


@pytest.fixture(scope="module")
def double_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the plugin's config, the container's config directory); one machine, two views of it."""
    base = tmp_path_factory.mktemp("nvml-double")
    plugin_config = base / "plugin.json"
    container_dir = base / "container"
    container_dir.mkdir()
    machine = {"machine": "dgxh100", "gpuCount": GPUS, "driverVersion": nvidia_roots.VERSION}
    plugin_config.write_text(json.dumps({**machine, "stateFile": str(base / "state.json")}))
    # In the container the double sees the GPUs whose device nodes the runtime injected.
    container_config = {**machine, "devRoot": "/dev", "stateFile": f"{CONTAINER_DOUBLE_DIR}/state.json"}
    (container_dir / "config.json").write_text(json.dumps(container_config))
    container_dir.chmod(0o777)
    return plugin_config, container_dir


@pytest.fixture(scope="module")
def nvml_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    nvidia_root: nvidia_roots.NvidiaRoot,
    double_dirs: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    plugin_config, _ = double_dirs
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("plugin"),
        delete_slices_on_shutdown=True,
        extra_env={"DRIVER_ROOT": str(nvidia_root.path), "NVML_DOUBLE_CONFIG": str(plugin_config)},
        backend_args=("--backend", "nvml", "--nvml-lib-path", str(nvidia_root.path)),
        expected_devices=[f"gpu-{i}" for i in range(GPUS)],
    ) as process:
        yield process


def _published_uuids(api: KubeApi, node: str) -> dict[str, str]:
    uuids: dict[str, str] = {}
    for item in node_slices(api.api_client, node, DEFAULT_DRIVER_NAME):
        for device in item["spec"].get("devices", []):
            uuids[device["name"]] = device["attributes"]["uuid"]["string"]
    return uuids


def _allocated_devices(api: KubeApi, namespace: str, claim: str) -> list[str]:
    status: dict[str, Any] = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")["status"]
    return [result["device"] for result in status["allocation"]["devices"]["results"]]


def test_nvidia_smi_in_the_container_lists_exactly_the_claimed_gpu(
    api: KubeApi,
    nvml_plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    double_dirs: tuple[Path, Path],
) -> None:
    ns = test_namespace
    _, container_dir = double_dirs
    image = import_our_image(kubelet_node)
    uuids = _published_uuids(api, kubelet_node.name)
    assert sorted(uuids) == [f"gpu-{i}" for i in range(GPUS)], uuids
    api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": gpu_device_class}},
        ]}},
    })  # fmt: skip
    pod = claim_pod(
        "smi",
        image.name,
        {"resourceClaimName": "gpu"},
        command=["sh", "-c", "nvidia-smi -L; echo exit=$?; sleep 3600"],
        restartPolicy="Never",
        volumes=[{"name": "double", "hostPath": {"path": str(container_dir), "type": "Directory"}}],
    )
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": "NVML_DOUBLE_CONFIG", "value": f"{CONTAINER_DOUBLE_DIR}/config.json"}]
    container["volumeMounts"] = [{"name": "double", "mountPath": CONTAINER_DOUBLE_DIR}]
    api.create(f"/api/v1/namespaces/{ns}/pods", pod)
    try:
        pods.wait_running(api, ns, "smi", POD_TIMEOUT, kubelet_node.cdi_root)
        (claimed,) = _allocated_devices(api, ns, "gpu")

        def listed() -> str | None:
            text = pods.container_log(api, ns, "smi", "app")
            return text if "exit=" in text else None

        log = wait_for("nvidia-smi -L in the container", listed, 60.0, interval=0.5)
        assert "exit=0" in log, log
        lines = [line for line in log.splitlines() if line.startswith("GPU ")]
        assert len(lines) == 1, log
        assert f"(UUID: {uuids[claimed]})" in lines[0], (claimed, log)
        assert "H100" in lines[0], log
        others = [uuid for name, uuid in uuids.items() if name != claimed]
        assert not any(uuid in log for uuid in others), log
    finally:
        release_namespace(api, nvml_plugin, ns, POD_TIMEOUT)
