"""Start-up recovery after a lost checkpoint: running claims are rebuilt, their devices stay taken,
their specs stay on disk; stale temp files of interrupted writes go away (ours only)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubeapi import ApiError
from draplugin.checkpoint import ClaimState
from draplugin.kubelet.interface import ClaimError, ClaimRef
from tests.unit.test_prepare_driver import Node
from tests.unit.test_prepare_plan import claim_doc, result

SPEC_A = "gpu.draplugin.dev-claim_uid-a.json"


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def reserved(doc: dict[str, Any], pod: str = "pod-a") -> dict[str, Any]:
    """The claim as the scheduler leaves it for a running pod: allocated and reserved for it."""
    doc["status"]["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"{pod}-uid"}]
    return doc


async def prepared_a_then_checkpoint_truncated(node: Node) -> ClaimRef:
    """Claim A prepared on the exclusive gpu-0, then the checkpoint cut to 40 bytes (a torn disk)."""
    a = node.claims.add(reserved(claim_doc(uid="uid-a", name="a", results=[result("gpu", "gpu-0")])))
    await node.driver().prepare_claim(a)
    node.checkpoint_path.write_bytes(node.checkpoint_path.read_bytes()[:40])
    return a


def claim_b_on_gpu0(node: Node) -> ClaimRef:
    return node.claims.add(claim_doc(uid="uid-b", name="b", results=[result("gpu", "gpu-0")]))


async def test_lost_checkpoint_is_rebuilt_from_the_api_and_still_refuses_the_device(node: Node) -> None:
    a = await prepared_a_then_checkpoint_truncated(node)
    driver = node.driver()
    record = driver.checkpoint.get("uid-a")
    assert record is not None and record.state is ClaimState.PREPARE_COMPLETED
    assert (record.namespace, record.name) == ("ns", "a")
    assert record.devices[0].config is not None  # the API's config: specs can be re-created offline
    with pytest.raises(ClaimError, match="device node-a/gpu-0 is already prepared for claim ns/a"):
        await driver.prepare_claim(claim_b_on_gpu0(node))
    # an ordinary restart later keeps A's spec (its pod still runs), and its prepare answers the same
    again = node.driver()
    assert node.spec_files() == [SPEC_A]
    assert [d.device_name for d in await again.prepare_claim(a)] == ["gpu-0"]
    await again.unprepare_claim(a)
    assert node.spec_files() == []
    await again.prepare_claim(claim_b_on_gpu0(node))


async def test_lost_checkpoint_with_the_api_down_is_rebuilt_from_the_surviving_specs(node: Node) -> None:
    a = await prepared_a_then_checkpoint_truncated(node)
    node.claims.list_error = ApiError(0, "connection refused")
    driver = node.driver()
    record = driver.checkpoint.get("uid-a")
    assert record is not None and [d.device for d in record.devices] == ["gpu-0"]
    with pytest.raises(ClaimError, match="device node-a/gpu-0 is already prepared"):
        await driver.prepare_claim(claim_b_on_gpu0(node))
    node.driver()  # an ordinary restart: the spec is explained by the rebuilt record
    assert node.spec_files() == [SPEC_A]
    node.claims.list_error = None
    restarted = node.driver()
    # the kubelet's next prepare of A completes the record with what the API says
    assert [d.device_name for d in await restarted.prepare_claim(a)] == ["gpu-0"]
    completed = restarted.checkpoint.get("uid-a")
    assert completed is not None and completed.completed and completed.devices[0].config is not None
    await restarted.unprepare_claim(a)
    assert node.spec_files() == [] and len(restarted.checkpoint) == 0


async def test_lost_checkpoint_drops_specs_of_claims_the_api_says_are_gone(node: Node) -> None:
    a = await prepared_a_then_checkpoint_truncated(node)
    node.claims.remove(a)
    driver = node.driver()
    assert node.spec_files() == [] and driver.checkpoint.get("uid-a") is None
    await driver.prepare_claim(claim_b_on_gpu0(node))


async def test_lost_checkpoint_records_running_claims_whose_spec_vanished(node: Node) -> None:
    a = await prepared_a_then_checkpoint_truncated(node)
    (node.cdi_root / SPEC_A).unlink()
    # a claim allocated here but reserved for nobody is not in use: nothing to rebuild for it
    node.claims.add(claim_doc(uid="uid-c", name="c", results=[result("gpu", "gpu-1")]))
    driver = node.driver()
    assert driver.checkpoint.get("uid-c") is None
    record = driver.checkpoint.get("uid-a")
    assert record is not None and record.completed
    assert node.spec_files() == [SPEC_A]  # re-created: A's containers can restart
    with pytest.raises(ClaimError, match="already prepared"):
        await driver.prepare_claim(claim_b_on_gpu0(node))
    assert [d.device_name for d in await driver.prepare_claim(a)] == ["gpu-0"]


async def test_an_intact_checkpoint_still_removes_leaked_specs_without_asking_the_api(node: Node) -> None:
    node.cdi_root.mkdir(parents=True)
    (node.cdi_root / "gpu.draplugin.dev-claim_ghost.json").write_text("{}")
    node.driver()
    assert node.spec_files() == [] and node.claims.lists == 0


def stale(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b'{"partial')
    old = time.time() - 3600
    os.utime(path, (old, old))
    return path


async def test_startup_removes_our_stale_temp_files_and_only_ours(node: Node) -> None:
    ours = [
        stale(node.cdi_root / ".gpu.draplugin.dev-claim_uid-1.json.k2j3h4.tmp"),
        stale(node.checkpoint_path.parent / ".checkpoint.json.abc123.tmp"),
    ]
    foreign = [
        stale(node.cdi_root / ".vendor.example-claim_x.json.k2j3h4.tmp"),
        stale(node.cdi_root / "gpu.draplugin.dev-claim_uid-1.json.tmp"),
        stale(node.checkpoint_path.parent / ".other.json.abc123.tmp"),
    ]
    # a temp file younger than this process may be a write of the other plugin pod in a rolling update
    fresh = node.cdi_root / ".gpu.draplugin.dev-claim_uid-2.json.zzz.tmp"
    fresh.write_bytes(b"{")
    driver = node.driver(recover=False)
    report = driver.recover()
    assert [p for p in ours if p.exists()] == []
    assert all(p.exists() for p in foreign) and fresh.exists()
    assert sorted(report.temp_files_removed) == sorted(str(p) for p in ours)
    assert json.loads(node.checkpoint_path.read_text())["claims"] == []


async def test_lost_checkpoint_keeps_a_prepared_claim_the_api_still_has_without_a_reservation(
    node: Node,
) -> None:
    # Its pod may be finishing: the claim is not gone, so its spec stays until the kubelet unprepares.
    a = await prepared_a_then_checkpoint_truncated(node)
    del node.claims.docs[("ns", "a")]["status"]["reservedFor"]
    driver = node.driver()
    assert node.spec_files() == [SPEC_A] and driver.checkpoint.get("uid-a") is not None
    await driver.unprepare_claim(a)
    assert node.spec_files() == []
