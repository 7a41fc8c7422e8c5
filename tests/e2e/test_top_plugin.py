"""`dra-controller top` against a real plugin process's /metrics, with a real kubelet.

The plugin (`draplugin run --backend fake`) serves Prometheus metrics on a loopback port and
samples its fake GPUs every second: the H100 is configured `usage: idle`, the A100 follows its
default wave (35% +- 20 points). Two pods each hold a claim for one of them. `top`, run as a user
runs it, must list both claims with their pods, show the A100's utilization moving, and flag the
H100's claim idle once it has stayed under 5% for the (short) idle duration, first in waste order.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane, free_port
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from devcluster.pods import wait_running
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.workloads import claim_pod

pytestmark = [pytest.mark.cluster, pytest.mark.kubelet]

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
POD_TIMEOUT = 120.0
IDLE_AFTER_S = 5
FAKE_GPUS = """\
gpus:
  - model: H100-80GB-HBM3
    count: 1
    usage: idle
  - model: A100-SXM4-40GB
    count: 1
"""
USAGE_ENV = {"USAGE_SAMPLE_INTERVAL": "1s", "IDLE_THRESHOLD_PERCENT": "5", "IDLE_AFTER": f"{IDLE_AFTER_S}s"}


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    config = tmp_path_factory.mktemp("top-fake") / "fake-gpus.yaml"
    config.write_text(FAKE_GPUS)
    with running_plugin(
        kube_cluster, kubelet_node, api, tmp_path_factory.mktemp("top-plugin"),
        delete_slices_on_shutdown=True, extra_env=USAGE_ENV, fake_config=config, metrics_port=free_port(),
    ) as process:  # fmt: skip
        yield process


@pytest.fixture(scope="module")
def metrics_url(plugin: PluginProcess) -> str:
    return f"http://127.0.0.1:{plugin.metrics_port}/metrics"


def claim(name: str, device_class: str, product: str) -> dict[str, Any]:
    expression = f'device.attributes["{DRIVER}"].productName == "{product}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": device_class,
                            "selectors": [{"cel": {"expression": expression}}],
                        },
                    }
                ]
            }
        },
    }


def top(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", "top", "--endpoint", url, *args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def top_devices(url: str, *args: str) -> list[dict[str, Any]]:
    run = top(url, "-o", "json", *args)
    assert run.returncode == 0, run.stdout + run.stderr
    devices: list[dict[str, Any]] = json.loads(run.stdout)["devices"]
    return devices


@pytest.fixture
def claims(
    plugin: PluginProcess, api: KubeApi, kubelet_node: KubeletNode, test_namespace: str, gpu_device_class: str
) -> Iterator[str]:
    """In the test's namespace: claim `notebook` (the idle H100) held by pod `nb`, and claim `train`
    (the A100) held by pod `trainer`; every GPU free again afterwards."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{test_namespace}/resourceclaims"
    api.create(path, claim("notebook", gpu_device_class, "NVIDIA H100 80GB HBM3"))
    api.create(path, claim("train", gpu_device_class, "NVIDIA A100-SXM4-40GB"))
    pods = f"/api/v1/namespaces/{test_namespace}/pods"
    image = kubelet_node.workload_image
    for pod, claim_name in (("nb", "notebook"), ("trainer", "train")):
        api.create(pods, claim_pod(pod, image, {"resourceClaimName": claim_name}, command=["sleep", "3600"]))
    try:
        for pod in ("nb", "trainer"):
            wait_running(api, test_namespace, pod, POD_TIMEOUT, kubelet_node.cdi_root)
        yield test_namespace
    finally:
        release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


def test_top_shows_both_claims_with_pods_moving_utilization_and_flags_the_idle_one(
    metrics_url: str, claims: str
) -> None:
    namespace = claims

    def listed() -> dict[str, dict[str, Any]] | None:
        rows = {d["claim"]: d for d in top_devices(metrics_url, "-n", namespace)}
        return rows if set(rows) == {"notebook", "train"} and all(r["pods"] for r in rows.values()) else None

    rows = wait_for("top to list both claims with their pods", listed, 30, interval=0.5)
    assert rows["notebook"]["pods"] == ["nb"] and rows["train"]["pods"] == ["trainer"]
    assert rows["notebook"]["device"] == "gpu-0" and rows["notebook"]["model"] == "NVIDIA H100 80GB HBM3"
    assert rows["train"]["device"] == "gpu-1" and rows["train"]["memoryTotalBytes"] > 0

    # The A100 follows its wave: two samples a few seconds apart differ, and it never counts as idle.
    readings: set[float] = set()
    deadline = time.monotonic() + 15
    while len(readings) < 2 and time.monotonic() < deadline:
        train = next(d for d in top_devices(metrics_url, "-n", namespace) if d["claim"] == "train")
        assert 0.05 < train["gpuUtilizationRatio"] <= 1.0, train
        assert not train["idle"] and not train["idleSeconds"], train
        readings.add(train["gpuUtilizationRatio"])
        time.sleep(1.5)
    assert len(readings) >= 2, f"the A100's utilization did not move: {readings}"

    def idle() -> dict[str, Any] | None:
        return next((d for d in top_devices(metrics_url, "-n", namespace, "--idle")), None)

    flagged = wait_for("top to flag the H100's claim idle", idle, IDLE_AFTER_S + 30, interval=1.0)
    assert flagged["claim"] == "notebook" and flagged["idleSeconds"] >= IDLE_AFTER_S
    assert flagged["gpuUtilizationRatio"] < 0.05

    table = top(metrics_url, "-n", namespace)
    assert table.returncode == 0, table.stderr
    header, first, second = table.stdout.splitlines()
    assert header.split()[:5] == ["NODE", "DEVICE", "MODEL", "CLAIM", "PODS"]
    assert f"{namespace}/notebook" in first and first.rstrip().endswith("IDLE")  # most waste first
    assert f"{namespace}/train" in second and "IDLE" not in second
