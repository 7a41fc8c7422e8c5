"""MPS under the chart: the claim's daemon is a Pod of its own and outlives the plugin's pod.

The chart's plugin (our image, a real container on the containerd node, fake
GPUs) gets a fake driver root (`kubeletPlugin.fakeDriverRoot`) whose
`nvidia-cuda-mps-control` is the recording stand-in of
tests/driverroot_layout.py. Prepare of an MPS claim creates the daemon Pod
(`mps-<claim uid>`, `kubeletPlugin.mpsDaemon: pod`, our image running the
stand-in in the foreground); the plugin pod is then deleted and the DaemonSet
makes a new one. The daemon Pod, owned by the DaemonSet (so an uninstall takes it along:
tests/integration/test_faults_plugin_powers.py), is the same Pod (same UID, never restarted),
its daemon still answers with the claim's limits, both through the pipe
directory on the host and from the claim's own container, and the new plugin
finds it in the ledger; deleting the workload unprepares the claim, which
stops the daemon and deletes its Pod. Verified on the fake only: no GPU here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.images import LocalImage
from devcluster.kubelet import KubeletNode
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from draplugin.prepare import mps, mpspod
from draplugin.prepare.ledger import FILE_NAME as LEDGER_FILE
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from tests.e2e.workloads import claim_pod
from tests.kube.chart import ChartRelease, deep_merge, import_our_image, installed, live_values

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
TIMEOUT_S = 120.0
MPS_CONFIG = {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 30, "defaultPinnedDeviceMemoryLimit": "2Gi"},
}
ASK = (
    "printf 'get_default_active_thread_percentage\\nget_default_device_pinned_mem_limit 0\\n' "
    "| nvidia-cuda-mps-control"
)


@pytest.fixture(scope="module")
def our_image(kubelet_node: KubeletNode) -> LocalImage:
    return import_our_image(kubelet_node)


@pytest.fixture
def release(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    our_image: LocalImage,
    test_namespace: str,
    api: KubeApi,
    driver_root: Path,
) -> Iterator[ChartRelease]:
    home = Path(tempfile.mkdtemp(prefix="dra-helm-"))
    state_dir = Path(tempfile.mkdtemp(prefix="dra-chart-state-"))
    values = deep_merge(
        live_values(kube_cluster, kubelet_node, our_image, state_dir),
        {
            "kubeletPlugin": {
                "nodeSelector": {"kubernetes.io/hostname": kubelet_node.name},
                "fakeDriverRoot": str(driver_root),
                "mpsDaemon": "pod",
            }
        },
    )
    try:
        yield ChartRelease(api, kube_cluster.kubeconfig, home, test_namespace, values)
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(state_dir, ignore_errors=True)


def create_mps_workload(api: KubeApi, node: KubeletNode, namespace: str) -> None:
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": f"{DRIVER}/v1alpha1", "kind": "GpuConfig", "sharing": MPS_CONFIG}}}],
        }},
    })  # fmt: skip
    pod = claim_pod(
        "shared",
        node.workload_image,
        {"resourceClaimName": "shared"},
        command=["sh", "-c", "sleep 3600"],
        nodeSelector={"kubernetes.io/hostname": node.name},
        automountServiceAccountToken=False,
        terminationGracePeriodSeconds=1,
        restartPolicy="Never",
    )
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def daemon_pod(api: KubeApi, namespace: str, claim_uid: str) -> dict[str, Any] | None:
    try:
        return api.get(f"/api/v1/namespaces/{namespace}/pods/{mpspod.pod_name(claim_uid)}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def running(pod: dict[str, Any] | None) -> bool:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)


def ask_from_host(driver_root: Path, pipe: Path) -> list[str]:
    """What the claim's daemon answers, asked with the driver root's client through the host's pipe dir."""
    done = subprocess.run(
        ["sh", "-c", ASK], capture_output=True, text=True, timeout=30, check=False,
        env={**os.environ, "PATH": f"{driver_root / 'usr/bin'}:{os.environ['PATH']}",
             "CUDA_MPS_PIPE_DIRECTORY": str(pipe)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def ledger_entries(state_dir: Path) -> list[LedgerEntry]:
    return SharingLedger(state_dir / LEDGER_FILE).entries()


def test_the_mps_daemon_pod_outlives_the_plugin_pod_and_unprepare_deletes_it(
    release: ChartRelease, api: KubeApi, kubelet_node: KubeletNode, driver_root: Path
) -> None:
    namespace = release.namespace
    state_dir = Path(release.values["kubeletPlugin"]["stateDir"])
    with installed(release):
        (old_plugin,) = release.plugin_pods()
        create_mps_workload(api, kubelet_node, namespace)
        pods.wait_running(api, namespace, "shared", TIMEOUT_S, kubelet_node.cdi_root)
        claim = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/shared")
        uid = claim["metadata"]["uid"]
        pipe = state_dir / "mps" / uid / "pipe"

        # Prepare made the daemon Pod on this node, our image running the driver root's daemon.
        daemon = daemon_pod(api, namespace, uid)
        assert daemon is not None and running(daemon), daemon
        assert daemon["spec"]["nodeName"] == kubelet_node.name
        (container,) = daemon["spec"]["containers"]
        assert container["command"] == [f"/driver-root/usr/bin/{mps.CONTROL}", "-f"]
        assert container["image"] == old_plugin["spec"]["containers"][0]["image"]
        # Owned by the plugin's DaemonSet, which outlives the plugin pod and goes with the release.
        (controller,) = [r for r in old_plugin["metadata"]["ownerReferences"] if r.get("controller")]
        assert daemon["metadata"]["ownerReferences"] == [
            {key: controller[key] for key in ("apiVersion", "kind", "name", "uid")}
        ]
        assert controller["kind"] == "DaemonSet"
        assert ask_from_host(driver_root, pipe) == ["30.0", "2048M"]
        # The daemon's entry, and its GPU's EXCLUSIVE_PROCESS compute mode recorded beside it.
        assert sorted(e.kind for e in ledger_entries(state_dir)) == ["computemode", "mps"]
        (entry,) = [e for e in ledger_entries(state_dir) if e.kind == "mps"]
        assert (entry.state, entry.data["podUid"]) == ("running", daemon["metadata"]["uid"])
        # A daemon that is started again makes its control pipe anew: the inode tells them apart.
        control_pipe = (pipe / "control").stat().st_ino

        # The plugin's pod goes (a crash, an eviction, the old pod of a rollout); the DaemonSet makes
        # a new one, which restores the claim from its checkpoint and finds the daemon in the ledger.
        api.delete(f"/api/v1/namespaces/{namespace}/pods/{old_plugin['metadata']['name']}")
        new_plugin = release.wait(
            "a new plugin pod, Ready",
            lambda: next(
                (
                    p
                    for p in release.wait_plugin_pods(1)
                    if p["metadata"]["uid"] != old_plugin["metadata"]["uid"]
                ),
                None,
            ),
        )
        assert new_plugin["metadata"]["uid"] != old_plugin["metadata"]["uid"]
        after = daemon_pod(api, namespace, uid)
        assert after is not None and after["metadata"]["uid"] == daemon["metadata"]["uid"] and running(after)
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        assert ask_from_host(driver_root, pipe) == ["30.0", "2048M"]
        assert (pipe / "control").stat().st_ino == control_pipe, "the daemon was started again"
        # The claim's container still reaches the same daemon through its CDI mount.
        code, out, err = pods.exec_in(api, namespace, "shared", "app", ["sh", "-c", ASK])
        assert (code, out.split()) == (0, ["30.0", "2048M"]), (code, out, err)
        (entry,) = [e for e in ledger_entries(state_dir) if e.kind == "mps"]
        assert (entry.state, entry.data["podUid"]) == ("running", daemon["metadata"]["uid"])
        # The new plugin's start-up logged the claim as restored, not its daemon as an orphan.
        assert api.get(f"/api/v1/namespaces/{namespace}/pods/shared")["status"]["phase"] == "Running"

        # Unprepare (the workload goes): `quit`, then the daemon Pod is deleted by the new plugin.
        api.delete(f"/api/v1/namespaces/{namespace}/pods/shared")
        wait_for("the daemon pod deleted", lambda: daemon_pod(api, namespace, uid) is None, TIMEOUT_S)
        wait_for("the ledger emptied", lambda: ledger_entries(state_dir) == [], TIMEOUT_S)
        assert not pipe.exists()
