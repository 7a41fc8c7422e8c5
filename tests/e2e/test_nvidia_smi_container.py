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
spec's. The fixtures (root, double, plugin) are `tests/e2e/conftest.py`'s.
"""

from __future__ import annotations

import pytest

from devcluster.chart import import_our_image
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from tests.e2e import nvml_double

pytestmark = pytest.mark.kubelet


def test_nvidia_smi_in_the_container_lists_exactly_the_claimed_gpu(
    api: KubeApi,
    nvml_plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    double_configs: nvml_double.DoubleConfigs,
) -> None:
    ns = test_namespace
    image = import_our_image(kubelet_node)
    uuids = nvml_double.published_uuids(api, kubelet_node.name)
    assert sorted(uuids) == [f"gpu-{i}" for i in range(nvml_double.DOUBLE_GPUS)], uuids
    with nvml_double.script_pod(
        api, nvml_plugin, kubelet_node, ns, "smi", image.name, "nvidia-smi -L", double_configs,
        device_class=gpu_device_class,
    ) as log:  # fmt: skip
        (claimed,) = nvml_double.allocated_devices(api, ns, "gpu")
        lines = [line for line in log.splitlines() if line.startswith("GPU ")]
        assert len(lines) == 1, log
        assert f"(UUID: {uuids[claimed]})" in lines[0], (claimed, log)
        assert "H100" in lines[0], log
        others = [uuid for name, uuid in uuids.items() if name != claimed]
        assert not any(uuid in log for uuid in others), log
