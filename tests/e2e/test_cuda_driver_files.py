"""A CUDA workload's view: the driver's user-space files inside a real container.

CUDA images do not ship the driver's libraries; the node's driver provides
them and our CDI spec mounts them. Here the plugin runs with `--driver-root`
pointing at a directory laid out like a Debian/Ubuntu driver install (real
ELF files with real SONAMEs, `nvidia-smi` as a small script), and containerd
applies the spec. From inside the container we check that `libcuda.so.1`,
`libnvidia-ml.so.1` and the versioned names resolve on the default library
path, are the driver's files and are read-only, that `nvidia-smi` runs, and
that `NVIDIA_VISIBLE_DEVICES=void` keeps the legacy NVIDIA hook from adding
GPUs the claim does not hold. A real GPU is not involved: `make gpu-check`
is the check for that.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from devcluster import pods
from devcluster.images import workload_image
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from tests.driverroot_layout import debian_layout
from tests.e2e import inside
from tests.e2e.cleanup import release_namespace
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

RESOURCE = "/apis/resource.k8s.io/v1"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"
POD_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def plugin(driver_root_plugin: PluginProcess) -> PluginProcess:
    return driver_root_plugin


def test_container_finds_libcuda_nvidia_smi_and_void_visible_devices(
    api: KubeApi,
    plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    driver_root: Path,
) -> None:
    ns = test_namespace
    version = debian_layout().version
    api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": gpu_device_class}},
        ]}},
    })  # fmt: skip
    pod = claim_pod(
        "cuda",
        workload_image().name,
        {"resourceClaimName": "gpu"},
        command=["sh", "-c", "env; sleep 3600"],
        restartPolicy="Never",
    )
    api.create(f"/api/v1/namespaces/{ns}/pods", pod)
    try:
        pods.wait_running(api, ns, "cuda", POD_TIMEOUT, kubelet_node.cdi_root)

        env = inside.log_env(pods.container_log(api, ns, "cuda", "app"))
        assert env.get("NVIDIA_VISIBLE_DEVICES") == "void", env

        # Each name resolves to the driver's own file: an ELF object, byte for byte the host's.
        host_cuda = (driver_root / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{version}").read_bytes()
        for name in (
            "libcuda.so.1",
            f"libcuda.so.{version}",
            "libnvidia-ml.so.1",
            f"libnvidia-ml.so.{version}",
        ):
            code, out, err = pods.exec_in(api, ns, "cuda", "app", ["head", "-c", "4", f"{LIB_DIR}/{name}"])
            assert code == 0, f"{LIB_DIR}/{name} in the container: {err}"
            assert out == "\x7fELF", f"{LIB_DIR}/{name} is not an ELF file: {out!r}"
        code, out, _ = pods.exec_in(api, ns, "cuda", "app", ["md5sum", f"{LIB_DIR}/libcuda.so.1"])
        assert code == 0 and out.split()[0] == hashlib.md5(host_cuda).hexdigest(), out

        # Read-only: a workload cannot replace the node's driver.
        code, _, err = pods.exec_in(api, ns, "cuda", "app", ["sh", "-c", f"echo x > {LIB_DIR}/libcuda.so.1"])
        assert code != 0, "libcuda.so.1 is writable from the container"
        assert "Read-only" in err or "read-only" in err, err

        code, out, err = pods.exec_in(api, ns, "cuda", "app", ["nvidia-smi"])
        assert code == 0 and out.strip() == "nvidia-smi", (code, out, err)

        mounts = inside.mounts_in(api, ns, "cuda", "app")
        assert f"/lib/firmware/nvidia/{version}" in mounts, sorted(mounts)
    finally:
        release_namespace(api, plugin, ns, POD_TIMEOUT)
