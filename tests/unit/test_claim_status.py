"""status.devices writes (draplugin.prepare.claimstatus): entries, apply calls, retries, order, driver.

The API side is a recording fake; what the real API server does with the
apply (merge by key, foreign entries kept, RBAC) is tested in
tests/integration/test_claim_status.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dracommon.kubeapi import ApiError
from draplugin import config as plugin_config
from draplugin.devices.model import Device, Version
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare import wiring
from draplugin.prepare.claimstatus import (
    ClaimStatusWriter,
    desired_entries,
    enabled_for,
    field_manager_for,
    up_to_date,
)
from draplugin.prepare.plan import plan_claim
from tests.unit.test_prepare_driver import Node, two_gpu_claim
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, config, gpu_config, result

NOW = "2026-12-01T10:00:00Z"
REF = ClaimRef("ns", "uid-1", "claim")

DEVICES = {
    "gpu-0": Device(
        name="gpu-0",
        kind="gpu",
        uuid="GPU-aaaa",
        index=0,
        minor=0,
        attributes={"productName": "NVIDIA H100 80GB HBM3", "driverVersion": Version.coerce("580.65.06")},
    ),
    "gpu-1-mig-1g10gb-0": Device(
        name="gpu-1-mig-1g10gb-0",
        kind="mig",
        uuid="MIG-bbbb",
        index=1,
        minor=1,
        parent_uuid="GPU-bbbb",
        attributes={"productName": "NVIDIA A100-SXM4-80GB", "profile": "1g.10gb"},
    ),
}


class FakeStatusApi:
    """Records apply calls; fails the first ones with the queued errors; `gate` holds a call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str, bool]] = []
        self.errors: list[ApiError] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        self.calls.append((path, dict(body), field_manager, force))
        if self.errors:
            raise self.errors.pop(0)
        return dict(body)

    def devices(self, call: int = -1) -> list[dict[str, Any]]:
        status: dict[str, Any] = self.calls[call][1]["status"]
        return list(status["devices"])


def writer(api: FakeStatusApi, registry: CollectorRegistry | None = None) -> ClaimStatusWriter:
    return ClaimStatusWriter(
        api,
        driver_name=DRIVER,
        node_name=NODE,
        registry=registry or CollectorRegistry(),
        backoff_s=0.001,
        now=lambda: NOW,
    )


def doc_with(*results: dict[str, Any], configs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc = claim_doc(results=list(results), configs=configs or [])
    doc["metadata"]["generation"] = 3
    return doc


def plan_of(doc: dict[str, Any]) -> Any:
    return plan_claim(REF, doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def writes(registry: CollectorRegistry, operation: str, result: str) -> float:
    value = registry.get_sample_value(
        "draplugin_claim_status_writes_total", {"operation": operation, "result": result}
    )
    return value or 0.0


# --- what is written -------------------------------------------------------------------------------


def test_entries_carry_the_gpu_data_and_a_ready_condition() -> None:
    shared = config(
        "FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Short"}), requests=["gpu"]
    )
    doc = doc_with(result("gpu", "gpu-0"), result("mig", "gpu-1-mig-1g10gb-0"), configs=[shared])
    gpu, mig = desired_entries(plan_of(doc), doc, DRIVER, NODE, lambda: NOW)
    assert (gpu["driver"], gpu["pool"], gpu["device"]) == (DRIVER, NODE, "gpu-0")
    assert "shareID" not in gpu
    assert gpu["data"] == {
        "uuid": "GPU-aaaa",
        "model": "NVIDIA H100 80GB HBM3",
        "driverVersion": "580.65.6",
        "sharing": "TimeSlicing",
    }
    assert gpu["conditions"] == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Prepared",
            "message": f"prepared on node {NODE}: CDI device gpu.draplugin.dev/gpu=uid-1-gpu-0",
            "lastTransitionTime": NOW,
            "observedGeneration": 3,
        }
    ]
    # A MIG device: `uuid` stays the physical GPU's, the MIG device's own is migUUID.
    assert mig["data"] == {
        "uuid": "GPU-bbbb",
        "model": "NVIDIA A100-SXM4-80GB",
        "driverVersion": "",
        "sharing": "Exclusive",
        "migUUID": "MIG-bbbb",
        "migProfile": "1g.10gb",
    }


def test_a_share_of_a_device_is_keyed_by_its_share_id() -> None:
    share = "9d7e5a52-7c3b-4b8e-9c1e-3c7a0f1d2b4e"
    doc = doc_with(result("gpu", "gpu-0", shareID=share))
    (entry,) = desired_entries(plan_of(doc), doc, DRIVER, NODE, lambda: NOW)
    assert entry["shareID"] == share


def test_an_entry_already_on_the_claim_keeps_its_ready_time_and_needs_no_write() -> None:
    doc = doc_with(result("gpu", "gpu-0"))
    first = desired_entries(plan_of(doc), doc, DRIVER, NODE, lambda: NOW)
    foreign = {"driver": "net.example.com", "pool": NODE, "device": "eth0", "conditions": []}
    doc["status"]["devices"] = [foreign, *first]
    again = desired_entries(plan_of(doc), doc, DRIVER, NODE, lambda: "2027-01-01T00:00:00Z")
    assert again == first  # the transition time is the first prepare's
    # Another driver's entry is no business of ours either way.
    assert up_to_date(doc, DRIVER, again)
    doc["status"]["devices"] = [foreign]
    assert not up_to_date(doc, DRIVER, again)


@pytest.mark.parametrize(
    ("mode", "version", "expected"),
    [
        ("auto", (1, 37), True),
        ("auto", (1, 36), True),
        ("auto", (1, 35), False),
        ("auto", (1, 34), False),
        ("auto", None, False),
        ("on", (1, 34), True),
        ("off", (1, 37), False),
    ],
)
def test_auto_writes_only_where_the_server_narrows_the_grant(
    mode: str, version: tuple[int, int] | None, expected: bool
) -> None:
    assert enabled_for(mode, version) is expected


# --- how it is written -----------------------------------------------------------------------------


async def test_prepare_applies_our_entries_to_the_status_subresource_and_unprepare_removes_them() -> None:
    api = FakeStatusApi()
    registry = CollectorRegistry()
    status = writer(api, registry)
    doc = doc_with(result("gpu", "gpu-0"))
    status.prepared(plan_of(doc), doc)
    await status.idle()
    path, body, manager, force = api.calls[0]
    assert path == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim/status"
    assert manager == field_manager_for(DRIVER) == "gpu.draplugin.dev/kubelet-plugin"
    assert force is True
    assert body["metadata"] == {"name": "claim", "namespace": "ns", "uid": "uid-1"}
    assert [e["device"] for e in api.devices()] == ["gpu-0"]

    status.unprepared(REF)
    await status.idle()
    assert api.devices() == []  # applying none of our entries removes the ones we own
    assert writes(registry, "prepare", "success") == writes(registry, "unprepare", "success") == 1


async def test_transient_failures_are_retried_and_a_refusal_is_only_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = FakeStatusApi()
    registry = CollectorRegistry()
    status = writer(api, registry)
    doc = doc_with(result("gpu", "gpu-0"))
    api.errors = [ApiError(0, "connection refused"), ApiError(409, "conflict"), ApiError(503, "busy")]
    status.prepared(plan_of(doc), doc)
    await status.idle()
    assert len(api.calls) == 4 and writes(registry, "prepare", "success") == 1

    api.errors = [ApiError(403, "resourceclaims/status is forbidden")]
    with caplog.at_level(logging.WARNING):
        status.unprepared(REF)
        await status.idle()
    assert len(api.calls) == 5  # a refusal is not retried
    assert writes(registry, "unprepare", "error") == 1
    warned = [r for r in caplog.records if r.getMessage().startswith("writing status.devices failed")]
    assert [str(getattr(r, "hint", "")).startswith("RBAC") for r in warned] == [True]


async def test_a_claim_that_is_gone_or_replaced_is_not_an_error_nor_retried() -> None:
    api = FakeStatusApi()
    registry = CollectorRegistry()
    status = writer(api, registry)
    api.errors = [
        ApiError(404, "not found"),
        # What the API server answers when the name now belongs to a claim with another UID.
        ApiError(
            422, 'ResourceClaim "claim" is invalid: metadata.uid: Invalid value: "uid-1": field is immutable'
        ),
        ApiError(409, "Precondition failed: UID in precondition: uid-1, UID in object meta: uid-2"),
    ]
    for _ in range(3):
        status.unprepared(REF)
        await status.idle()
    assert len(api.calls) == 3
    assert writes(registry, "unprepare", "gone") == 3 and writes(registry, "unprepare", "error") == 0


async def test_writes_of_one_claim_land_in_order_and_an_overtaken_one_is_skipped() -> None:
    api = FakeStatusApi()
    registry = CollectorRegistry()
    status = writer(api, registry)
    doc = doc_with(result("gpu", "gpu-0"))
    api.gate = asyncio.Event()
    status.prepared(plan_of(doc), doc)  # in flight, held at the server
    await api.started.wait()
    status.unprepared(REF)  # queued behind it
    status.prepared(plan_of(doc), doc)  # overtakes the queued clear
    api.gate.set()
    await status.idle()
    assert [len(api.devices(i)) for i in range(len(api.calls))] == [1, 1]
    assert writes(registry, "unprepare", "superseded") == 1


async def test_writes_wait_while_prepares_run_and_one_overtaken_meanwhile_is_never_sent() -> None:
    api = FakeStatusApi()
    registry = CollectorRegistry()
    status = writer(api, registry)
    doc = doc_with(result("gpu", "gpu-0"))
    with status.preparing():
        status.prepared(plan_of(doc), doc)
        await asyncio.sleep(0.1)
        assert api.calls == []  # held back: a prepare is running
        status.unprepared(REF)  # the claim went away before the write was sent
    await status.idle()
    assert [len(api.devices(i)) for i in range(len(api.calls))] == [0]  # only the clear went out
    assert writes(registry, "prepare", "superseded") == 1


async def test_a_write_waits_for_prepares_at_most_its_limit() -> None:
    api = FakeStatusApi()
    status = ClaimStatusWriter(
        api, driver_name=DRIVER, node_name=NODE, registry=CollectorRegistry(), now=lambda: NOW,
        defer_max_s=0.2,
    )  # fmt: skip
    doc = doc_with(result("gpu", "gpu-0"))
    with status.preparing():  # a prepare that never ends, as a steady stream of them would look
        status.prepared(plan_of(doc), doc)
        started = time.monotonic()
        await asyncio.wait_for(api.started.wait(), 5.0)
        assert 0.15 < time.monotonic() - started < 2.0
    await status.idle()
    assert [e["device"] for e in api.devices()] == ["gpu-0"]


async def test_close_stops_a_write_waiting_out_its_backoff() -> None:
    api = FakeStatusApi()
    status = ClaimStatusWriter(
        api, driver_name=DRIVER, node_name=NODE, registry=CollectorRegistry(), backoff_s=60
    )
    api.errors = [ApiError(503, "busy")]
    status.unprepared(REF)
    await api.started.wait()
    async with asyncio.timeout(5):
        await status.close()
    assert len(api.calls) == 1


# --- in the driver ---------------------------------------------------------------------------------


async def test_the_driver_reports_prepared_claims_and_a_failing_write_fails_nothing(tmp_path: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    api = FakeStatusApi()
    registry = CollectorRegistry()
    driver.status = writer(api, registry)
    ref = node.claims.add(two_gpu_claim())
    api.errors = [ApiError(500, "down")] * 5
    devices = await driver.prepare_claim(ref)
    assert [d.device_name for d in devices] == ["gpu-0", "gpu-1"]
    await driver.status.idle()
    assert writes(registry, "prepare", "error") == 1
    assert [e["data"]["uuid"] for e in api.devices()] == ["GPU-00000000", "GPU-00000001"]

    # The kubelet's retry writes again (the claim as read carries nothing of ours yet).
    await driver.prepare_claim(ref)
    await driver.status.idle()
    assert writes(registry, "prepare", "success") == 1

    await driver.unprepare_claim(ref)
    await driver.status.idle()
    assert api.devices() == []
    # Unprepare of a claim this node never prepared costs no API call.
    calls = len(api.calls)
    await driver.unprepare_claim(ClaimRef("ns", "uid-other", "other"))
    await driver.status.idle()
    assert len(api.calls) == calls


# --- the setting -----------------------------------------------------------------------------------


def test_device_status_setting_defaults_to_auto_and_refuses_other_words() -> None:
    assert plugin_config.load({"node_name": "n"}, environ={}).device_status == "auto"
    assert plugin_config.load({"node_name": "n"}, environ={"DEVICE_STATUS": "on"}).device_status == "on"
    assert plugin_config.load({"node_name": "n", "device_status": "off"}, environ={}).device_status == "off"
    with pytest.raises(
        plugin_config.ConfigError, match=r"--device-status \(DEVICE_STATUS\): 'yes' is not one of"
    ):
        plugin_config.load({"node_name": "n", "device_status": "yes"}, environ={})


class VersionApi:
    """`KubeApi.get("/version")` of a server of this release, or failing."""

    def __init__(self, minor: int | None) -> None:
        self.minor = minor

    def get(self, path: str, query: object = None) -> dict[str, Any]:
        assert path == "/version"
        if self.minor is None:
            raise ApiError(0, "connection refused")
        return {"major": "1", "minor": str(self.minor), "gitVersion": f"v1.{self.minor}.0"}


@pytest.mark.parametrize(
    ("flags", "minor", "writes_status"),
    [
        ({}, 37, True),
        ({}, 35, False),
        ({}, None, False),  # the release is unknown: off, not guessed
        ({"kubernetes_version": "1.34"}, 37, False),  # the setting wins over asking
        ({"device_status": "on"}, None, True),
        ({"device_status": "off"}, 37, False),
    ],
)
def test_the_plugin_writes_status_where_the_setting_and_the_release_say(
    flags: dict[str, str], minor: int | None, writes_status: bool
) -> None:
    settings = plugin_config.load({"node_name": "n", **flags}, environ={})
    made = wiring._claim_status(settings, VersionApi(minor), FakeStatusApi(), CollectorRegistry())  # type: ignore[arg-type]
    assert (made is not None) is writes_status
