"""MPS daemons and time-slices on the real runtime, with the plugin killed -9 at their new steps.

The plugin runs with a driver root whose `nvidia-cuda-mps-control` and
`nvidia-smi` are recording stand-ins (`tests/driverroot_layout.py`): the MPS
daemon is a real background process serving named pipes in the claim's pipe
directory, which containers reach through the CDI mount. Killed right after
starting the daemon (or setting the time-slice) and before the ledger records
it, the restarted plugin undoes it at start; the kubelet's retry prepares the
claim again; unprepare leaves no daemon and the GPU at its default time-slice.
Verified on the fake only: no GPU here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.images import workload_image
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from draplugin import crashpoints
from draplugin.prepare.mps import PID_FILE, process_start_time
from tests.driverroot_layout import command_log
from tests.e2e import inside
from tests.e2e.cleanup import release_namespace
from tests.e2e.test_prepare_kubelet import touch
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

RESOURCE = "/apis/resource.k8s.io/v1"
API_VERSION = "gpu.draplugin.dev/v1alpha1"
POD_TIMEOUT = 120.0
MPS = {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "2Gi"},
}
SLICE = {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Medium"}}


@pytest.fixture(scope="module")
def plugin(driver_root_plugin: PluginProcess) -> PluginProcess:
    return driver_root_plugin


@pytest.fixture
def namespace(restarting_namespace: str) -> str:
    return restarting_namespace


def shared_pod(api: KubeApi, ns: str, device_class: str, sharing: dict[str, Any]) -> None:
    api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class, "selectors": [
                {"cel": {"expression": 'device.attributes["gpu.draplugin.dev"].type == "gpu"'}}]}}],
            "config": [{"opaque": {"driver": "gpu.draplugin.dev", "parameters": {
                "apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": sharing}}}],
        }},
    })  # fmt: skip
    pod = claim_pod(
        "shared",
        workload_image().name,
        {"resourceClaimName": "shared"},
        containers=("a", "b"),
        command=["sh", "-c", "env; sleep 3600"],
        restartPolicy="Never",
    )
    api.create(f"/api/v1/namespaces/{ns}/pods", pod)


def running_daemons(plugin: PluginProcess) -> list[int]:
    pids = [int(p.read_text()) for p in plugin.state_dir.glob(f"mps/*/pipe/{PID_FILE}")]
    return [pid for pid in pids if process_start_time(pid) is not None]


def ledger(plugin: PluginProcess) -> list[dict[str, Any]]:
    path = plugin.state_dir / "sharing-ledger.json"
    return list(json.loads(path.read_text())["entries"]) if path.exists() else []


def kill_then_restart(plugin: PluginProcess, api: KubeApi, ns: str, device_class: str, point: str,
                      sharing: dict[str, Any]) -> None:  # fmt: skip
    plugin.stop()
    plugin.start(crash_at=point)
    plugin.wait_registered()
    shared_pod(api, ns, device_class, sharing)
    assert plugin.wait_exit(60) == -9  # SIGKILL between the GPU change and its ledger record
    plugin.start()
    plugin.wait_registered()
    touch(api, ns, "shared")


def test_kill_after_mps_start_then_restart_leaves_one_daemon_that_unprepare_stops(
    api: KubeApi, plugin: PluginProcess, kubelet_node: KubeletNode, namespace: str, gpu_device_class: str
) -> None:
    kill_then_restart(plugin, api, namespace, gpu_device_class, crashpoints.AFTER_MPS_START, MPS)
    pods.wait_running(api, namespace, "shared", POD_TIMEOUT, kubelet_node.cdi_root)
    # The orphan of the killed process was stopped at start; the retry started the claim's daemon.
    (pid,) = running_daemons(plugin)
    # Its GPU in EXCLUSIVE_PROCESS compute mode for the daemon, recorded with the mode to restore.
    assert [(e["kind"], e["state"], e.get("pid")) for e in ledger(plugin)] == [
        ("computemode", "set", None),
        ("mps", "running", pid),
    ]
    # Both containers' /dev/shm is the claim's shm directory, where MPS keeps its shared segments.
    (shm,) = plugin.state_dir.glob("mps/*/shm")
    (shm / "segment-from-host").write_text("shared")
    for container in ("a", "b"):
        code, out, _ = pods.exec_in(
            api, namespace, "shared", container, ["cat", "/dev/shm/segment-from-host"]
        )
        assert (code, out) == (0, "shared"), (container, code, out)
        env = inside.log_env(pods.container_log(api, namespace, "shared", container))
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/draplugin/mps/pipe", env
        assert "/var/run/draplugin/mps" in inside.mounts_in(api, namespace, "shared", container)
        code, out, err = pods.exec_in(api, namespace, "shared", container, [
            "sh", "-c", "printf 'get_default_active_thread_percentage\\n"
            "get_default_device_pinned_mem_limit 0\\n' | nvidia-cuda-mps-control",
        ])  # fmt: skip
        assert (code, out.split()) == (0, ["30.0", "2048M"]), (code, out, err)
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    assert running_daemons(plugin) == [] and ledger(plugin) == []
    assert not shm.exists()


def test_kill_after_time_slice_set_then_restart_resets_and_unprepare_resets(
    api: KubeApi,
    plugin: PluginProcess,
    kubelet_node: KubeletNode,
    namespace: str,
    gpu_device_class: str,
    driver_root: Path,
) -> None:
    before = len(command_log(driver_root))
    kill_then_restart(plugin, api, namespace, gpu_device_class, crashpoints.AFTER_TIMESLICE_SET, SLICE)
    pods.wait_running(api, namespace, "shared", POD_TIMEOUT, kubelet_node.cdi_root)
    env = inside.log_env(pods.container_log(api, namespace, "shared", "a"))
    (uuid,) = [v for k, v in env.items() if k.startswith("DRAPLUGIN_DEVICE_") and k.endswith("_UUID")]
    assert [k for k, v in env.items() if k.endswith("_TIMESLICE_INTERVAL") and v == "Medium"], env
    smi = [line for line in command_log(driver_root)[before:] if line.startswith("nvidia-smi compute-policy")]
    # set by the killed process, reset by start-up (an orphan), set again by the kubelet's retry
    assert smi == [f"nvidia-smi compute-policy -i {uuid} --set-timeslice {n}" for n in (2, 0, 2)], smi
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    assert command_log(driver_root)[-1] == f"nvidia-smi compute-policy -i {uuid} --set-timeslice 0"
    assert ledger(plugin) == []
