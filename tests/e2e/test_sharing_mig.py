"""Dynamic MIG in real containers: two claims on two slices of one GPU each get their own MIG device.

The plugin publishes the fake inventory as partitionable (`partitionable: true`),
the scheduler allocates two 1g.5gb placements of one A100, and prepare creates
each MIG device on the fake MIG hardware (`<state-dir>/fake-mig.json`, the
stand-in for NVML's GPU/compute instances). From inside each container: the
`nvidia-caps` nodes of its own GPU and compute instance are there as character
devices, the other claim's are not, and its UUID variable names its own MIG
device. Deleting the pods destroys both instances. Verified on the fake only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import pods
from devcluster.controlplane import ControlPlane
from devcluster.images import workload_image
from devcluster.kubelet import KubeletNode
from devcluster.plugin import FAKE_GPUS, PluginProcess
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin import crashpoints
from draplugin.devices.fakemig import STATE_FILE, cap_nodes
from draplugin.prepare.plan import env_key
from tests.e2e import inside
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.test_prepare_kubelet import touch
from tests.e2e.workloads import claim_pod

pytestmark = pytest.mark.kubelet

RESOURCE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.draplugin.dev"
POD_TIMEOUT = 120.0
# gpu-1 is an A100 40GB: seven 1g.5gb placements.
ON_GPU_1 = (
    f'device.attributes["{DRIVER}"].type == "mig" && device.attributes["{DRIVER}"].profile == "1g.5gb"'
    f' && device.attributes["{DRIVER}"].index == 1'
)


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    state_dir = tmp_path_factory.mktemp("mig-plugin")
    # The examples' inventory, published partitionable (the file's form of --partitionable-mig).
    inventory = yaml.safe_load(FAKE_GPUS.read_text())
    inventory["partitionable"] = True
    fake_config = state_dir / "partitionable-gpus.yaml"
    fake_config.write_text(yaml.safe_dump(inventory))
    with running_plugin(
        kube_cluster, kubelet_node, api, state_dir, delete_slices_on_shutdown=True, fake_config=fake_config
    ) as process:
        yield process


@pytest.fixture
def namespace(restarting_namespace: str) -> str:
    return restarting_namespace


def instances(plugin: PluginProcess) -> list[dict[str, Any]]:
    path = plugin.state_dir / STATE_FILE
    return list(json.loads(path.read_text())["instances"]) if path.exists() else []


def mig_pod(api: KubeApi, ns: str, name: str, device_class: str) -> None:
    api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": device_class, "selectors": [{"cel": {"expression": ON_GPU_1}}],
        }}]}},
    })  # fmt: skip
    pod = claim_pod(
        name,
        workload_image().name,
        {"resourceClaimName": name},
        claim="mig",
        command=["sh", "-c", "env; ls /dev/nvidia-caps; sleep 3600"],
        restartPolicy="Never",
    )
    api.create(f"/api/v1/namespaces/{ns}/pods", pod)


def allocated_device(api: KubeApi, ns: str, name: str) -> str:
    claim = api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
    return str(claim["status"]["allocation"]["devices"]["results"][0]["device"])


def test_two_claims_on_two_slices_each_get_their_own_mig_device(
    api: KubeApi, plugin: PluginProcess, kubelet_node: KubeletNode, namespace: str, gpu_device_class: str
) -> None:
    for name in ("slice-a", "slice-b"):
        mig_pod(api, namespace, name, gpu_device_class)
    for name in ("slice-a", "slice-b"):
        pods.wait_running(api, namespace, name, POD_TIMEOUT, kubelet_node.cdi_root)
    made = {i["start"]: i for i in instances(plugin)}
    assert len(made) == 2 and all(i["profile"] == "1g.5gb" for i in made.values()), made
    seen_uuids = set()
    for name, other in (("slice-a", "slice-b"), ("slice-b", "slice-a")):
        device = allocated_device(api, namespace, name)
        mine = made[int(device.rsplit("-", 1)[1])]
        theirs = made[int(allocated_device(api, namespace, other).rsplit("-", 1)[1])]
        env = inside.log_env(pods.container_log(api, namespace, name, "app"))
        assert env[f"DRAPLUGIN_DEVICE_{env_key(device)}_UUID"] == mine["uuid"], env
        seen_uuids.add(mine["uuid"])
        own = list(cap_nodes(mine["minor"], mine["gi"], mine["ci"]))
        other_caps = list(cap_nodes(theirs["minor"], theirs["gi"], theirs["ci"]))
        got = inside.device_nodes_in(api, namespace, name, "app", own + other_caps)
        assert got == {**dict.fromkeys(own, "ok"), **dict.fromkeys(other_caps, "bad")}, got
        code, out, _ = pods.exec_in(api, namespace, name, "app", ["ls", "/dev/nvidia-caps"])
        assert code == 0 and sorted(out.split()) == sorted(Path(n).name for n in own), out
    assert len(seen_uuids) == 2

    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    assert instances(plugin) == []


def test_kill_after_mig_create_then_restart_leaves_no_orphan(
    api: KubeApi, plugin: PluginProcess, kubelet_node: KubeletNode, namespace: str, gpu_device_class: str
) -> None:
    plugin.stop()
    plugin.start(crash_at=crashpoints.AFTER_MIG_CREATE)
    plugin.wait_registered()
    mig_pod(api, namespace, "crash", gpu_device_class)
    assert plugin.wait_exit(60) == -9  # SIGKILL between the create and its ledger record
    assert len(instances(plugin)) == 1  # the orphan

    plugin.start()
    plugin.wait_registered()
    touch(api, namespace, "crash")
    pods.wait_running(api, namespace, "crash", POD_TIMEOUT, kubelet_node.cdi_root)
    # Start-up destroyed the orphan; the kubelet's retry created the device again: one instance.
    made = instances(plugin)
    assert len(made) == 1, made
    ledger = json.loads((plugin.state_dir / "sharing-ledger.json").read_text())["entries"]
    assert [(e["kind"], e["state"], e["uuid"]) for e in ledger] == [("mig", "created", made[0]["uuid"])]
    release_namespace(api, plugin, namespace, POD_TIMEOUT)
    wait_for("the MIG device destroyed at unprepare", lambda: instances(plugin) == [], 30)
