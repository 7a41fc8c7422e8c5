"""Prepare and unprepare through a real kubelet: scheduler allocation, CDI IDs, sharing, crash safety.

The plugin runs as `draplugin run --backend fake` (a child process, killed and
restarted by the tests) and publishes the node's ResourceSlices itself; a
restart keeps them, as in production. After each test, passed or failed, the
test's pods and claims are deleted and the plugin has unprepared them before
the next test starts. The kubelet retries a failed pod sync on its own
(about once a minute); after restarting the plugin the tests touch the pod to
have it retried at once, which changes when the retry happens, not what it does.

The kubelet here runs on the recording fake CRI (`fakecri_node`): these tests
check which CDI IDs the kubelet passed to the runtime across plugin crashes
and restarts, which a real runtime does not show, and running containers
adds nothing to that. What containers get from a real runtime is
tests/e2e/test_examples.py's subject.

Size: one file because every case shares the module's kubelet node and plugin.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from draplugin import crashpoints
from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet.sockets import socket_paths
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    fakecri_node: KubeletNode,
    api: KubeApi,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    """Keeps its slices across the restarts these tests put it through, as in production."""
    state_dir = tmp_path_factory.mktemp("plugin")
    with running_plugin(
        kube_cluster, fakecri_node, api, state_dir, delete_slices_on_shutdown=False
    ) as process:
        yield process


@pytest.fixture(scope="module")
def device_class(api: KubeApi, plugin: PluginProcess) -> Iterator[str]:
    name = f"e2e-gpu-{uuid.uuid4().hex[:6]}"
    api.create(f"{RESOURCE}/deviceclasses", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {
            "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"',
        }}]},
    })  # fmt: skip
    yield name
    api.delete(f"{RESOURCE}/deviceclasses/{name}")


@pytest.fixture
def healthy_plugin(plugin: PluginProcess, api: KubeApi, test_namespace: str) -> Iterator[PluginProcess]:
    """The module's plugin, running and registered at the start and end of each test.

    At the end the test's namespace is emptied and its claims unprepared (through the plugin, so
    after a restart if a test left it killed), whether the test passed or not.
    """
    if not plugin.running:
        plugin.start()
        plugin.wait_registered()
    yield plugin
    if not plugin.running:
        plugin.start()
        plugin.wait_registered()
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


# --- object builders ----------------------------------------------------------------------------------


def claim_spec(device_class: str) -> dict[str, Any]:
    return {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}


def pod(
    name: str, node: str, claim: dict[str, str], containers: tuple[str, ...] = ("main",)
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", **claim}],
            "containers": [
                {"name": c, "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                for c in containers
            ],
        },
    }


def create_template(api: KubeApi, namespace: str, device_class: str, name: str = "gpu") -> dict[str, str]:
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": claim_spec(device_class)},
    })  # fmt: skip
    return {"resourceClaimTemplateName": name}


def wait_running(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        obj = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        return obj if obj["status"].get("phase") == "Running" else None

    result: dict[str, Any] = wait_for(f"pod {namespace}/{name} to be Running", running, POD_TIMEOUT)
    return result


def pod_claim(api: KubeApi, namespace: str, pod_obj: dict[str, Any]) -> dict[str, Any]:
    statuses = pod_obj["status"].get("resourceClaimStatuses") or []
    name = (
        statuses[0]["resourceClaimName"]
        if statuses
        else pod_obj["spec"]["resourceClaims"][0]["resourceClaimName"]
    )
    return api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")


def expected_cdi_id(claim: dict[str, Any]) -> str:
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    return f"{DRIVER}/gpu={claim['metadata']['uid']}-{device}"


def expected_cdi_ids(claim: dict[str, Any]) -> list[str]:
    """The device's CDI ID, then its request's device metadata (on by default, --device-metadata):
    `<driver>/metadata=<claim uid>_<request>` on the request's first device, as upstream's helper."""
    request = claim["status"]["allocation"]["devices"]["results"][0]["request"]
    return [expected_cdi_id(claim), f"{DRIVER}/metadata={claim['metadata']['uid']}_{request}"]


def records_of(node: KubeletNode, namespace: str, pod_name: str) -> list[dict[str, Any]]:
    return [
        r for r in node.container_records() if r["podNamespace"] == namespace and r["podName"] == pod_name
    ]


def spec_path(node: KubeletNode, claim_uid: str) -> Path:
    return node.cdi_root / f"{DRIVER}-claim_{claim_uid}.json"


def cdicheck(cluster: ControlPlane, node: KubeletNode, *devices: str) -> dict[str, Any]:
    command = [str(cluster.bin_dir / "cdicheck"), "--cdi-dir", str(node.cdi_root)]
    for device in devices:
        command += ["--device", device]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def touch(api: KubeApi, namespace: str, name: str) -> None:
    """Annotate the pod so the kubelet syncs it now instead of after its retry delay."""
    nudge = {"metadata": {"annotations": {"e2e.draplugin.dev/nudge": uuid.uuid4().hex}}}
    try:
        api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}", nudge)
    except ApiError as err:
        assert err.status == 404, err


def delete_pod_and_wait(api: KubeApi, namespace: str, name: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    api.delete(path)

    def gone() -> bool:
        try:
            api.get(path)
        except Exception as err:
            return getattr(err, "status", None) == 404
        return False

    wait_for(f"pod {namespace}/{name} to be deleted", gone, POD_TIMEOUT, interval=0.5)


def wait_unprepared(plugin: PluginProcess, node: KubeletNode, uid: str) -> None:
    """The kubelet unprepares after the pod is gone (pod cleanup runs every few seconds)."""

    def unprepared() -> bool:
        return (
            not spec_path(node, uid).exists()
            and uid not in checkpoint_uids(plugin)
            and not metadata_left(plugin, node, uid)
        )

    wait_for(f"claim {uid} to be unprepared", unprepared, POD_TIMEOUT, interval=0.5)


def metadata_left(plugin: PluginProcess, node: KubeletNode, uid: str) -> list[Path]:
    """The claim's device metadata documents and CDI specs still on the node."""
    documents = plugin.kubelet_root_dir / "plugins" / DRIVER / "dra-device-metadata"
    return sorted(node.cdi_root.glob(f"{DRIVER}_metadata_{uid}_*.json")) + [
        path for path in documents.glob("*/*/metadata.json") if uid in path.read_text()
    ]


def spec_writes(plugin: PluginProcess, claim_uid: str) -> int:
    """How often the plugin wrote the claim's CDI spec: once per real preparation.

    The kubelet may call prepare more than once for a claim (pods synced in
    parallel, retries); repeated calls must be answered without redoing the work.
    """
    return sum(
        1
        for line in plugin.log_text().splitlines()
        if '"CDI spec written"' in line and f"uid={claim_uid}" in line
    )


def checkpoint_uids(plugin: PluginProcess) -> set[str]:
    return {c["uid"] for c in json.loads(plugin.checkpoint_path.read_text())["claims"]}


# --- tests --------------------------------------------------------------------------------------------


def test_template_claim_shared_by_two_containers(
    kube_cluster: ControlPlane,
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
) -> None:
    claim_ref = create_template(api, test_namespace, device_class)
    api.create(
        f"/api/v1/namespaces/{test_namespace}/pods",
        pod("two", fakecri_node.name, claim_ref, containers=("trainer", "profiler")),
    )
    running = wait_running(api, test_namespace, "two")
    claim = pod_claim(api, test_namespace, running)
    cdi_id = expected_cdi_id(claim)
    records = records_of(fakecri_node, test_namespace, "two")
    assert {r["containerName"]: r["cdiDevices"] for r in records} == {
        "trainer": expected_cdi_ids(claim),
        "profiler": expected_cdi_ids(claim),
    }
    assert spec_writes(healthy_plugin, claim["metadata"]["uid"]) == 1

    # The reference CDI library (what runtimes use) resolves the ID to the device's edits.
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    key = device.upper().replace("-", "_")
    check = cdicheck(kube_cluster, fakecri_node, cdi_id)
    assert f"DRAPLUGIN_DEVICE_{key}_NAME={device}" in check["edits"]["env"]
    assert any(e.startswith(f"DRAPLUGIN_DEVICE_{key}_UUID=GPU-") for e in check["edits"]["env"])
    # The fake GPU's own device nodes at NVIDIA's paths, resolved (from the plugin's directory on
    # the host) to what they are: character devices 1:3. Each once: the control nodes are written
    # at spec level only (CDI applies those first), the GPU's node with its device.
    index = device.removeprefix("gpu-")
    paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", f"/dev/nvidia{index}"]
    assert [(n["path"], n["type"], n["major"], n["minor"]) for n in check["edits"]["deviceNodes"]] == [
        (path, "c", 1, 3) for path in paths
    ]

    delete_pod_and_wait(api, test_namespace, "two")
    wait_unprepared(healthy_plugin, fakecri_node, claim["metadata"]["uid"])


def test_two_pods_share_one_claim_prepared_once(
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
) -> None:
    api.create(f"{RESOURCE}/namespaces/{test_namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "shared"},
        "spec": claim_spec(device_class),
    })  # fmt: skip
    for name in ("first", "second"):
        api.create(
            f"/api/v1/namespaces/{test_namespace}/pods",
            pod(name, fakecri_node.name, {"resourceClaimName": "shared"}),
        )
    first = wait_running(api, test_namespace, "first")
    wait_running(api, test_namespace, "second")
    claim = pod_claim(api, test_namespace, first)
    uid = claim["metadata"]["uid"]
    ids = [
        fakecri_node.cdi_ids_per_device(r["cdiDevices"])
        for name in ("first", "second")
        for r in records_of(fakecri_node, test_namespace, name)
    ]
    assert ids == [expected_cdi_ids(claim), expected_cdi_ids(claim)]
    assert spec_writes(healthy_plugin, uid) == 1

    delete_pod_and_wait(api, test_namespace, "first")
    # Give the kubelet's pod cleanup time to act: the second pod still uses the claim, so it must not.
    time.sleep(5)
    assert spec_path(fakecri_node, uid).exists() and uid in checkpoint_uids(healthy_plugin)
    delete_pod_and_wait(api, test_namespace, "second")
    wait_unprepared(healthy_plugin, fakecri_node, uid)


@pytest.mark.parametrize(
    "point",
    [
        crashpoints.AFTER_CHECKPOINT_STARTED,
        crashpoints.AFTER_CDI_WRITE,
        crashpoints.AFTER_METADATA_WRITE,
        crashpoints.AFTER_CHECKPOINT_COMPLETED,
        crashpoints.BEFORE_RETURN,
    ],
)
def test_kill_during_prepare_then_restart(
    kube_cluster: ControlPlane,
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
    point: str,
) -> None:
    healthy_plugin.stop()
    healthy_plugin.start(crash_at=point)
    healthy_plugin.wait_registered()
    claim_ref = create_template(api, test_namespace, device_class)
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod("crash", fakecri_node.name, claim_ref))
    assert healthy_plugin.wait_exit(60) == -9  # SIGKILL at the crash point

    healthy_plugin.start()
    healthy_plugin.wait_registered()
    touch(api, test_namespace, "crash")
    running = wait_running(api, test_namespace, "crash")
    claim = pod_claim(api, test_namespace, running)
    uid = claim["metadata"]["uid"]
    assert [r["cdiDevices"] for r in records_of(fakecri_node, test_namespace, "crash")] == [
        expected_cdi_ids(claim)
    ]
    cdicheck(kube_cluster, fakecri_node, expected_cdi_id(claim))
    assert uid in checkpoint_uids(healthy_plugin)

    delete_pod_and_wait(api, test_namespace, "crash")
    wait_unprepared(healthy_plugin, fakecri_node, uid)


@pytest.mark.parametrize(
    "point", [crashpoints.UNPREPARE_AFTER_CDI_REMOVE, crashpoints.UNPREPARE_AFTER_RELEASE]
)
def test_kill_during_unprepare_then_restart(
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
    point: str,
) -> None:
    healthy_plugin.stop()
    healthy_plugin.start(crash_at=point)
    healthy_plugin.wait_registered()
    claim_ref = create_template(api, test_namespace, device_class)
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod("crash", fakecri_node.name, claim_ref))
    uid = pod_claim(api, test_namespace, wait_running(api, test_namespace, "crash"))["metadata"]["uid"]

    api.delete(f"/api/v1/namespaces/{test_namespace}/pods/crash")
    assert healthy_plugin.wait_exit(60) == -9
    assert uid in checkpoint_uids(healthy_plugin)  # not forgotten: the retry must still find it

    healthy_plugin.start()
    healthy_plugin.wait_registered()
    wait_unprepared(healthy_plugin, fakecri_node, uid)


async def _kubelet_style_prepare(plugin: PluginProcess, claim: dict[str, Any]) -> list[v1.Device]:
    """NodePrepareResources exactly as the kubelet sends it after its own restart (the node rebooted)."""
    dra_socket = socket_paths(plugin.kubelet_root_dir, plugin.driver_name, None).dra
    meta = claim["metadata"]
    async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
        response = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
            v1.NodePrepareResourcesRequest(
                claims=[v1.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])]
            ),
            timeout=45,
        )
    entry = response.claims[meta["uid"]]
    assert entry.error == ""
    return list(entry.devices)


def test_reboot_wipes_cdi_root_and_prepare_restores_it(
    kube_cluster: ControlPlane,
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
) -> None:
    claim_ref = create_template(api, test_namespace, device_class)
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod("reboot", fakecri_node.name, claim_ref))
    claim = pod_claim(api, test_namespace, wait_running(api, test_namespace, "reboot"))
    uid = claim["metadata"]["uid"]

    healthy_plugin.stop()
    spec_path(fakecri_node, uid).unlink()  # /var/run/cdi is a tmpfs
    old_boot = healthy_plugin.boot_id
    healthy_plugin.boot_id = f"boot-{uuid.uuid4().hex[:8]}"
    try:
        healthy_plugin.start()
        healthy_plugin.wait_registered()
        assert not spec_path(fakecri_node, uid).exists()  # a previous boot's record is not trusted
        saved = json.loads(healthy_plugin.checkpoint_path.read_text())
        assert [c["state"] for c in saved["claims"] if c["uid"] == uid] == ["PrepareStarted"]

        devices = asyncio.run(_kubelet_style_prepare(healthy_plugin, claim))
        assert [list(d.cdi_device_ids) for d in devices] == [expected_cdi_ids(claim)]
        cdicheck(kube_cluster, fakecri_node, expected_cdi_id(claim))
        delete_pod_and_wait(api, test_namespace, "reboot")
        wait_unprepared(healthy_plugin, fakecri_node, uid)
    finally:
        healthy_plugin.boot_id = old_boot


def test_corrupt_checkpoint_is_reported_and_plugin_recovers(
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
) -> None:
    healthy_plugin.stop()
    healthy_plugin.checkpoint_path.write_text('{"version": 2, "claims": [{"uid": ')
    healthy_plugin.start()
    healthy_plugin.wait_registered()
    assert list(healthy_plugin.checkpoint_path.parent.glob("checkpoint.json.corrupt-*"))

    def corruption_event() -> dict[str, Any] | None:
        events = api.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
        for event in events:
            if event["reason"] == "CheckpointCorrupted" and event["regarding"]["name"] == fakecri_node.name:
                found: dict[str, Any] = event
                return found
        return None

    event = wait_for("a CheckpointCorrupted event on the Node", corruption_event, 30)
    assert event["type"] == "Warning" and "moved to" in event["note"]

    claim_ref = create_template(api, test_namespace, device_class)
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod("after", fakecri_node.name, claim_ref))
    uid = pod_claim(api, test_namespace, wait_running(api, test_namespace, "after"))["metadata"]["uid"]
    assert uid in checkpoint_uids(healthy_plugin)
    delete_pod_and_wait(api, test_namespace, "after")
    wait_unprepared(healthy_plugin, fakecri_node, uid)


def test_bad_opaque_config_fails_prepare_with_event_on_claim(
    fakecri_node: KubeletNode,
    api: KubeApi,
    healthy_plugin: PluginProcess,
    device_class: str,
    test_namespace: str,
) -> None:
    spec = claim_spec(device_class)
    spec["devices"]["config"] = [{
        "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "gpu.draplugin.dev/v1alpha1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}},
        }},
    }]  # fmt: skip
    api.create(f"{RESOURCE}/namespaces/{test_namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "bad"}, "spec": spec,
    })  # fmt: skip
    api.create(
        f"/api/v1/namespaces/{test_namespace}/pods",
        pod("bad", fakecri_node.name, {"resourceClaimName": "bad"}),
    )

    def invalid_config_event() -> dict[str, Any] | None:
        events = api.get(f"/apis/events.k8s.io/v1/namespaces/{test_namespace}/events")["items"]
        for event in events:
            if event["reason"] == "InvalidConfig":
                found: dict[str, Any] = event
                return found
        return None

    event = wait_for("an InvalidConfig event on the claim", invalid_config_event, 60)
    assert event["regarding"]["kind"] == "ResourceClaim" and event["regarding"]["name"] == "bad"
    assert (
        "spec.devices.config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: "
        "must be between 1 and 100, got 150"
    ) in event["note"]
    assert records_of(fakecri_node, test_namespace, "bad") == []
    delete_pod_and_wait(api, test_namespace, "bad")
