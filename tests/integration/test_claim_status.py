"""status.devices after prepare, against the real API server: our entries, another driver's kept, RBAC.

A claim allocated on fake node A holds one GPU of ours and one NIC of another
driver, whose driver has already written its own status.devices entry. The
real prepare driver (API reader, CDI spec, checkpoint) prepares it; the status
writer then applies our entry. What the server must do: merge our entry by
key and keep the other driver's untouched; on 1.36+ let the chart's grant,
used with a token bound to a pod on node A, write only claims allocated on
node A and only entries of our driver; on 1.34/1.35 the same grant cannot be
narrowed (a plugin on node B writes the claim too), which is why
`--device-status=auto` is off there (docs/configuration.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import ApiError, AsyncKubeApi, KubeApi
from dracommon.kubeversion import server_version
from draplugin import config as plugin_config
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.kubelet.interface import ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare import claimstatus, wiring
from draplugin.prepare.api import KubeClaimReader, claim_path
from draplugin.prepare.claimstatus import ClaimStatusWriter, apply_body, field_manager_for
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.sharing import SharingState
from tests.integration.test_rbac import Installed, admin, installed, pod_bound_token  # noqa: F401
from tests.unit.test_prepare_driver import RecordingEvents

pytestmark = pytest.mark.cluster

DRIVER = "gpu.draplugin.dev"
OTHER = "net.example.com"
RESOURCE = "/apis/resource.k8s.io/v1"


@dataclass
class Allocated:
    ref: ClaimRef
    node: str
    foreign: dict[str, Any]


def allocate(api: KubeApi, namespace: str, node: str) -> Allocated:
    """A claim allocated on `node` (our gpu-0 and another driver's eth0), with that driver's entry."""
    name = f"claim-{uuid.uuid4().hex[:6]}"
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    created = api.create(claims, {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu"}},
            {"name": "nic", "exactly": {"deviceClassName": "nic"}},
        ]}},
    })  # fmt: skip
    on_node = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    allocation = {
        "devices": {
            "results": [
                {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0"},
                {"request": "nic", "driver": OTHER, "pool": node, "device": "eth0"},
            ]
        },
        "nodeSelector": {"nodeSelectorTerms": [on_node]},
    }
    api.patch_status(f"{claims}/{name}", {"status": {"allocation": allocation}})
    foreign = {
        "driver": OTHER,
        "pool": node,
        "device": "eth0",
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Configured",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "data": {"mac": "02:00:00:00:00:01"},
        "networkData": {"interfaceName": "eth0", "ips": ["192.0.2.5/24"]},
    }
    # The other driver writes its entry its own way: server-side apply under its own manager.
    api.apply(
        f"{claims}/{name}/status",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"devices": [foreign]},
        },
        field_manager=f"{OTHER}/driver",
    )
    return Allocated(ClaimRef(namespace, created["metadata"]["uid"], name), node, foreign)


def status_devices(api: KubeApi, claim: Allocated) -> dict[str, dict[str, Any]]:
    doc = api.get(claim_path(claim.ref.namespace, claim.ref.name))
    return {entry["driver"]: entry for entry in doc.get("status", {}).get("devices", [])}


def prepare_driver(
    root: Path,
    node: str,
    client: k8s.ApiClient,
    status: bool = True,
    registry: CollectorRegistry | None = None,
) -> GpuDriver:
    """The real prepare driver for fake node `node`, reading and writing with `client`'s identity;
    its status writes are counted in `registry`."""
    async_api = AsyncKubeApi(KubeApi(client), 4, retries=0)
    driver = GpuDriver(
        driver_name=DRIVER,
        node_name=node,
        devices=FakeBackend(node, config_from_flags(2, "L4")).discover(),
        claims=KubeClaimReader(async_api),
        cdi_store=SpecStore(root / "cdi", DRIVER),
        checkpoint=CheckpointStore(root / "state" / "checkpoint.json", "boot-1"),
        sharing=SharingState(root / "state"),
        events=RecordingEvents(),
        metrics=ClaimMetrics(CollectorRegistry()),
        status=(
            ClaimStatusWriter(
                async_api,
                driver_name=DRIVER,
                node_name=node,
                registry=registry or CollectorRegistry(),
                backoff_s=0.05,
            )
            if status
            else None
        ),
    )
    driver.recover()
    return driver


def writes(registry: CollectorRegistry, result: str, operation: str = "prepare") -> float:
    labels = {"operation": operation, "result": result}
    return registry.get_sample_value("draplugin_claim_status_writes_total", labels) or 0.0


@pytest.fixture
def rest(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


async def test_prepare_writes_the_uuid_and_keeps_another_drivers_entry(
    kube_cluster: ControlPlane,
    rest: KubeApi,
    fake_node: Callable[..., str],
    test_namespace: str,
    tmp_path: Path,
) -> None:
    node = fake_node()
    claim = allocate(rest, test_namespace, node)
    registry = CollectorRegistry()
    with kube_cluster.api_client() as client:
        driver = prepare_driver(tmp_path, node, client, registry=registry)
        assert driver.status is not None
        prepared = await driver.prepare_claim(claim.ref)
        assert [d.device_name for d in prepared] == ["gpu-0"]
        await driver.status.idle()
        entries = status_devices(rest, claim)
        ours = entries[DRIVER]
        gpu = driver.devices["gpu-0"]
        assert (ours["pool"], ours["device"]) == (node, "gpu-0")
        assert ours["data"]["uuid"] == gpu.uuid and ours["data"]["model"] == "NVIDIA L4"
        (ready,) = ours["conditions"]
        assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "Prepared")
        # The other driver's entry is exactly as it wrote it, networkData included.
        assert entries[OTHER] == claim.foreign
        doc = rest.get(claim_path(test_namespace, claim.ref.name))
        managers = {m["manager"] for m in doc["metadata"]["managedFields"]}
        assert {field_manager_for(DRIVER), f"{OTHER}/driver"} <= managers

        # The kubelet's retry: the claim as read already carries our entry, so nothing is written.
        await driver.prepare_claim(claim.ref)
        await driver.status.idle()
        assert writes(registry, "unchanged") == 1 and writes(registry, "success") == 1
        assert status_devices(rest, claim)[DRIVER] == ours

        await driver.unprepare_claim(claim.ref)
        await driver.status.idle()
        assert status_devices(rest, claim) == {OTHER: claim.foreign}


async def test_an_entry_is_never_written_onto_a_claim_that_replaced_a_deleted_one(
    rest: KubeApi, fake_node: Callable[..., str], test_namespace: str
) -> None:
    claim = allocate(rest, test_namespace, fake_node())
    stale = ClaimRef(claim.ref.namespace, str(uuid.uuid4()), claim.ref.name)
    entry = {"driver": DRIVER, "pool": claim.node, "device": "gpu-0", "conditions": [], "data": {}}
    path = f"{claim_path(claim.ref.namespace, claim.ref.name)}/status"
    with pytest.raises(ApiError) as refused:
        rest.apply(path, apply_body(stale, [entry]), field_manager=field_manager_for(DRIVER), force=True)
    # Apply merges the UID, which validation refuses as immutable; the writer knows the answer for
    # what it is (claimstatus._replaced): the claim it prepared is gone.
    assert refused.value.status == 422 and "metadata.uid" in refused.value.message
    assert claimstatus._replaced(refused.value)
    assert status_devices(rest, claim) == {OTHER: claim.foreign}


async def test_the_plugins_own_grant_is_narrowed_to_its_node_from_1_36_and_not_before(
    kube_cluster: ControlPlane,
    rest: KubeApi,
    admin: k8s.ApiClient,  # noqa: F811
    installed: Installed,  # noqa: F811
    fake_node: Callable[..., str],
    tmp_path: Path,
) -> None:
    node_a, node_b = fake_node(), fake_node()
    claim = allocate(rest, installed.namespace, node_a)
    narrowed = server_version(rest) >= (1, 36)
    with kube_cluster.token_client(pod_bound_token(admin, installed, node_b)) as client:
        # The plugin of node B writing our driver's entry on a claim allocated on node A: refused
        # from 1.36 on (associated-node: the token's node is not the claim's).
        manager = field_manager_for(DRIVER)
        entry = {
            "driver": DRIVER,
            "pool": node_a,
            "device": "gpu-0",
            "conditions": [],
            "data": {"by": node_b},
        }
        path = f"{claim_path(claim.ref.namespace, claim.ref.name)}/status"
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim.ref.name, "namespace": claim.ref.namespace},
            "status": {"devices": [entry]},
        }
        if narrowed:
            with pytest.raises(ApiError) as refused:
                KubeApi(client).apply(path, body, field_manager=manager, force=True)
            # Granular authorization answers in validation: 422 Invalid, naming the missing verb.
            assert refused.value.status == 422 and "resourceclaims/driver" in refused.value.message
            assert DRIVER not in status_devices(rest, claim)
        else:
            # 1.34/1.35: resourceclaims/status is all the server checks, for every claim of the cluster.
            KubeApi(client).apply(path, body, field_manager=manager, force=True)
            assert status_devices(rest, claim)[DRIVER]["data"] == {"by": node_b}
            KubeApi(client).apply(path, {**body, "status": {"devices": []}}, field_manager=manager)
    if not narrowed:
        return  # what follows needs the narrowed grant; 1.34/1.35 get auto=off (next test)
    registry = CollectorRegistry()
    with kube_cluster.token_client(pod_bound_token(admin, installed, node_a)) as client:
        driver = prepare_driver(tmp_path, node_a, client, registry=registry)
        assert driver.status is not None
        await driver.prepare_claim(claim.ref)
        await driver.status.idle()
        assert writes(registry, "success") == 1
        assert status_devices(rest, claim)[DRIVER]["data"]["uuid"] == driver.devices["gpu-0"].uuid
        # Even on its own node, another driver's entry is not ours to write.
        foreign = {**body, "status": {"devices": [{**claim.foreign, "data": {"mac": "changed"}}]}}
        with pytest.raises(ApiError) as refused:
            KubeApi(client).apply(path, foreign, field_manager=f"{OTHER}/driver", force=True)
        assert refused.value.status == 422 and OTHER in refused.value.message
        assert status_devices(rest, claim)[OTHER] == claim.foreign


async def test_auto_writes_status_only_where_the_server_narrows_the_grant(
    kube_cluster: ControlPlane,
    rest: KubeApi,
    fake_node: Callable[..., str],
    test_namespace: str,
    tmp_path: Path,
) -> None:
    """The documented default: status.devices on 1.36+, nothing on 1.34/1.35."""
    node = fake_node()
    claim = allocate(rest, test_namespace, node)
    settings = plugin_config.load({"node_name": node}, environ={})
    assert settings.device_status == "auto"
    with kube_cluster.api_client() as client:
        async_api = AsyncKubeApi(KubeApi(client), 1)
        writer = wiring._claim_status(settings, KubeApi(client), async_api, CollectorRegistry())
        on = server_version(rest) >= (1, 36)
        assert (writer is not None) is on
        driver = prepare_driver(tmp_path, node, client, status=on)
        await driver.prepare_claim(claim.ref)
        if driver.status is not None:
            await driver.status.idle()
    entries = status_devices(rest, claim)
    assert (DRIVER in entries) is on
    assert entries[OTHER] == claim.foreign
