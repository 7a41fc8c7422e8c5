"""Claim references from the kubelet at and past Kubernetes' limits, Event names for long claim names,
unprepare of anything unknown, and unprepare never queued behind prepares stuck on the API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from draplugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from draplugin.events import KubeEvents
from draplugin.kubelet.dra import ClaimRunner
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from tests.unit.test_kubelet_plugin_server import FakeDriver
from tests.unit.test_prepare_driver import Node

UUID = "0b5ad0c4-8a4f-4a8e-9a57-3c1f6f1bd1e0"


@pytest.mark.parametrize(
    ("text", "label", "subdomain"),
    [
        ("ns", True, True),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        ("a." * 126 + "a", False, True),  # 253
        ("a" * 254, False, False),
        ("a.b", False, True),
        ("rel/../../other-ns/resourceclaims/victim", False, False),
        ("Upper", False, False),
        ("-a", False, False),
        ("a-", False, False),
        ("a..b", False, False),
        ("", False, False),
    ],
)
def test_kubernetes_name_rules(text: str, label: bool, subdomain: bool) -> None:
    assert (dns_label_problem(text) is None) is label
    assert (dns_subdomain_problem(text) is None) is subdomain


@pytest.mark.parametrize(
    ("uid", "ok"),
    [
        (UUID, True),
        ("uid-1", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("..", False),
        (".hidden", False),
        ("a/b", False),
        ("a\x00b", False),
        ("", False),
    ],
)
def test_uid_rule(uid: str, ok: bool) -> None:
    assert (uid_problem(uid) is None) is ok


BAD_REFS = [
    ClaimRef("ns", "uid-1", "rel/../../other-ns/resourceclaims/victim"),
    ClaimRef("../kube-system", "uid-2", "claim"),
    ClaimRef("a" * 64, "uid-3", "claim"),
    ClaimRef("ns", "uid-4", "a" * 254),
    ClaimRef("ns", "a/../b", "claim"),
    ClaimRef("ns", "x" * 129, "claim"),
]


async def test_prepare_refuses_references_past_the_limits_before_the_driver_sees_them() -> None:
    driver = FakeDriver()
    good = ClaimRef("a" * 63, UUID, "b." * 126 + "b")
    answers = await ClaimRunner(driver).prepare([*BAD_REFS, good])
    assert [c.uid for c in driver.prepare_calls] == [UUID]
    assert answers[UUID].error == ""
    for ref in BAD_REFS:
        assert "is not a valid" in answers[ref.uid].error, ref
    assert "name 'rel/../../other-ns/resourceclaims/victim' is not a DNS subdomain" in answers["uid-1"].error
    assert "namespace '../kube-system'" in answers["uid-2"].error


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_unprepare_of_an_unknown_claim_with_an_unusable_uid_succeeds(node: Node) -> None:
    runner = ClaimRunner(node.driver())
    refs = [ClaimRef("ns", "x" * 300, "c"), ClaimRef("ns", "a/b", "c"), ClaimRef("ns", "..", "c")]
    answers = await runner.unprepare(refs)
    assert {uid: a.error for uid, a in answers.items()} == {r.uid: "" for r in refs}


async def test_a_checkpoint_record_with_an_unusable_uid_can_be_forgotten(node: Node) -> None:
    held = DeviceRecord(("gpu",), "node-a", "gpu-0", ("gpu.draplugin.dev/gpu=x-gpu-0",))
    driver = node.driver()
    driver.checkpoint.put(ClaimRecord("bad/uid", "ns", "c", ClaimState.PREPARE_COMPLETED, (held,)))
    driver.checkpoint.save()
    restarted = node.driver()
    assert restarted.checkpoint.get("bad/uid") is not None  # it holds gpu-0 until unprepared
    answers = await ClaimRunner(restarted).unprepare([ClaimRef("ns", "bad/uid", "c")])
    assert answers["bad/uid"].error == ""
    assert restarted.checkpoint.get("bad/uid") is None


class Recorder:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, body))
        return body


@pytest.mark.parametrize(
    "name",
    [
        "b",
        "a" * 236,
        "a" * 237,
        "a" * 235 + ".bb",  # the cut lands right after a dot
        "a" * 235 + "-bb",  # ... or a dash
        "a." * 126 + "a",  # 253, the longest valid name
    ],
)
def test_event_names_stay_valid_for_claim_names_up_to_the_limit(name: str) -> None:
    api = Recorder()
    events = KubeEvents(api, "gpu.draplugin.dev", "node-a")  # type: ignore[arg-type]
    events.claim_event(ClaimRef("ns", UUID, name), "DeviceInUse", "note")
    events.close()
    [(path, body)] = api.created
    assert path == "/apis/events.k8s.io/v1/namespaces/ns/events"
    assert dns_subdomain_problem(body["metadata"]["name"]) is None
    assert body["regarding"]["name"] == name


class StuckOnApi(FakeDriver):
    """Prepares wait on a gate as if the API server stalled; unprepare needs no API."""

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        assert self.gate is not None
        if claim.uid != "fast":
            await self.gate.wait()
        return []


async def test_unprepare_never_queues_behind_prepares_stuck_on_the_api() -> None:
    driver = StuckOnApi()
    driver.gate = asyncio.Event()
    runner = ClaimRunner(driver, max_concurrent_claims=32)
    stuck = asyncio.create_task(runner.prepare([ClaimRef("ns", f"p{i}", f"p{i}") for i in range(40)]))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    answers = await asyncio.wait_for(runner.unprepare([ClaimRef("ns", "other", "other")]), 2)
    assert answers["other"].error == "" and time.monotonic() - started < 0.5
    driver.gate.set()
    assert len(await stuck) == 40


async def test_a_claim_still_running_in_the_background_is_answered_by_the_deadline() -> None:
    driver = StuckOnApi()
    driver.gate = asyncio.Event()
    runner = ClaimRunner(driver)
    ref = ClaimRef("ns", "slow", "slow")
    first = asyncio.create_task(runner.prepare([ref]))  # no deadline: a caller that waits
    await asyncio.sleep(0.05)
    started = time.monotonic()
    answers = await runner.prepare([ref, ClaimRef("ns", "fast", "fast")], deadline=started + 0.5)
    assert "did not finish before the kubelet's deadline" in answers["slow"].error
    assert answers["fast"].error == ""
    assert time.monotonic() - started < 0.9
    driver.gate.set()
    assert (await first)["slow"].error == ""
