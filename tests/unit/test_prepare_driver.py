"""The driver: idempotent prepare, unprepare order, serialization, crash recovery, events and metrics.

Size: one file because every case shares the driver fixture and its fake API.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dracommon.kubeapi import ApiError
from draplugin import checkpoint as checkpoint_module
from draplugin import crashpoints
from draplugin.cdi.spec import SpecStore, atomic_write
from draplugin.checkpoint import CheckpointStore, ClaimState
from draplugin.kubelet.dra import ClaimRunner
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.driver import GpuDriver
from tests.driverroot_layout import debian_layout
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, config, gpu_config, result


class FakeClaims:
    """Claims by namespace/name; optionally blocks GETs to observe concurrency."""

    def __init__(self) -> None:
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.gets = 0
        self.active: dict[str, int] = {}
        self.max_active: dict[str, int] = {}
        self.gate: asyncio.Event | None = None
        self.error: Exception | None = None
        # What a cluster-wide list at start-up recovery answers: the docs, or this error.
        self.list_error: Exception | None = None
        self.lists = 0

    def add(self, doc: dict[str, Any]) -> ClaimRef:
        meta = doc["metadata"]
        self.docs[(meta["namespace"], meta["name"])] = doc
        return ClaimRef(meta["namespace"], meta["uid"], meta["name"])

    def list_claims(self, timeout_s: float) -> list[dict[str, Any]]:
        self.lists += 1
        if self.list_error is not None:
            raise self.list_error
        return list(self.docs.values())

    def remove(self, ref: ClaimRef) -> None:
        del self.docs[(ref.namespace, ref.name)]

    async def get_claim(self, namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
        self.gets += 1
        self.active[name] = self.active.get(name, 0) + 1
        self.max_active[name] = max(self.max_active.get(name, 0), self.active[name])
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.error is not None:
                raise self.error
            return self.docs.get((namespace, name))
        finally:
            self.active[name] -= 1


@dataclass
class RecordingEvents:
    claim_events: list[tuple[str, str, str]] = field(default_factory=list)
    node_events: list[tuple[str, str]] = field(default_factory=list)
    fail: bool = False

    def claim_event(self, claim: ClaimRef, reason: str, note: str, *, warning: bool = True) -> None:
        if self.fail:
            raise RuntimeError("event sink down")
        self.claim_events.append((claim.uid, reason, note))

    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None:
        self.node_events.append((reason, note))


@dataclass
class Node:
    root: Path
    claims: FakeClaims = field(default_factory=FakeClaims)
    events: RecordingEvents = field(default_factory=RecordingEvents)
    boot_id: str = "boot-1"
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    driver_name: str = DRIVER

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "state" / "checkpoint.json"

    def driver(self, recover: bool = True) -> GpuDriver:
        """A fresh driver process on the same node state (the restart of a plugin)."""
        self.registry = CollectorRegistry()
        driver = GpuDriver(
            driver_name=self.driver_name,
            node_name=NODE,
            devices=list(DEVICES.values()),
            claims=self.claims,
            cdi_store=SpecStore(self.cdi_root, self.driver_name),
            checkpoint=CheckpointStore(self.checkpoint_path, self.boot_id),
            # MPS daemons from a driver root whose tools are recording stand-ins (test_mps.py).
            sharing=ToolNode(self.root / "state", self._driver_root()).sharing(),
            events=self.events,
            metrics=ClaimMetrics(self.registry),
        )
        if recover:
            driver.recover()
        return driver

    def _driver_root(self) -> Path:
        root = self.root / "driver-root"
        return root if root.exists() else debian_layout().build(root)

    def spec_files(self) -> list[str]:
        return sorted(p.name for p in self.cdi_root.glob("*.json")) if self.cdi_root.exists() else []

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def two_gpu_claim(uid: str = "uid-1", name: str = "claim") -> dict[str, Any]:
    return claim_doc(uid=uid, name=name, results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")])


async def test_prepare_writes_spec_and_checkpoint(node: Node) -> None:
    driver = node.driver()
    ref = node.claims.add(two_gpu_claim())
    devices = await driver.prepare_claim(ref)
    assert [d.cdi_device_ids for d in devices] == [
        ("gpu.draplugin.dev/gpu=uid-1-gpu-0",),
        ("gpu.draplugin.dev/gpu=uid-1-gpu-1",),
    ]
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]
    spec = json.loads((node.cdi_root / "gpu.draplugin.dev-claim_uid-1.json").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-0", "uid-1-gpu-1"]
    saved = json.loads(node.checkpoint_path.read_text())
    assert saved["claims"][0]["uid"] == "uid-1" and saved["claims"][0]["state"] == "PrepareCompleted"
    assert node.metric("draplugin_claim_operations_total", operation="prepare", result="success") == 1


async def test_repeated_prepare_is_identical_and_restores_a_vanished_spec(node: Node) -> None:
    driver = node.driver()
    ref = node.claims.add(two_gpu_claim())
    first = await driver.prepare_claim(ref)
    assert await driver.prepare_claim(ref) == first
    (node.cdi_root / "gpu.draplugin.dev-claim_uid-1.json").unlink()
    assert await driver.prepare_claim(ref) == first
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]


async def test_uid_mismatch_fails_changes_nothing_and_posts_event(node: Node) -> None:
    driver = node.driver()
    node.claims.add(two_gpu_claim(uid="uid-new"))
    with pytest.raises(ClaimError) as caught:
        await driver.prepare_claim(ClaimRef("ns", "uid-old", "claim"))
    message = "claim ns/claim has UID uid-new, kubelet asked for uid-old: the claim was replaced"
    assert str(caught.value) == message
    assert node.events.claim_events == [("uid-old", "ClaimReplaced", message)]
    assert node.spec_files() == [] and driver.checkpoint.get("uid-old") is None
    assert (
        node.metric("draplugin_claim_operation_errors_total", operation="prepare", reason="ClaimReplaced")
        == 1
    )


async def test_missing_claim_and_api_errors_are_claim_errors(node: Node) -> None:
    driver = node.driver()
    with pytest.raises(ClaimError, match="claim ns/gone does not exist"):
        await driver.prepare_claim(ClaimRef("ns", "u", "gone"))
    node.claims.error = ApiError(403, "forbidden")
    with pytest.raises(
        ClaimError, match="reading claim ns/x from the API server failed: HTTP 403: forbidden"
    ):
        await driver.prepare_claim(ClaimRef("ns", "u", "x"))


async def test_event_failure_does_not_change_the_answer(node: Node) -> None:
    driver = node.driver()
    node.events.fail = True
    with pytest.raises(ClaimError, match="is not allocated"):
        await driver.prepare_claim(node.claims.add(claim_doc(allocated=False)))


async def test_invalid_config_changes_nothing(node: Node) -> None:
    driver = node.driver()
    bad = config("FromClaim", gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 150}))
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")], configs=[bad]))
    with pytest.raises(ClaimError, match=r"spec\.devices\.config\[0\]\.opaque\.parameters\.sharing"):
        await driver.prepare_claim(ref)
    assert node.events.claim_events[0][1] == "InvalidConfig"
    assert node.spec_files() == [] and len(driver.checkpoint) == 0


async def test_device_prepared_for_another_claim_is_refused(node: Node) -> None:
    driver = node.driver()
    await driver.prepare_claim(
        node.claims.add(claim_doc(uid="uid-1", name="a", results=[result("g", "gpu-0")]))
    )
    other = node.claims.add(claim_doc(uid="uid-2", name="b", results=[result("g", "gpu-0")]))
    with pytest.raises(ClaimError, match="device node-a/gpu-0 is already prepared for claim ns/a"):
        await driver.prepare_claim(other)
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]


async def test_unprepare_removes_spec_sharing_state_and_record(node: Node) -> None:
    driver = node.driver()
    mps = config("FromClaim", gpu_config("MPS"))
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")], configs=[mps]))
    await driver.prepare_claim(ref)
    assert (node.root / "state" / "mps" / "uid-1" / "pipe").is_dir()
    await driver.unprepare_claim(ref)
    assert node.spec_files() == []
    assert not (node.root / "state" / "mps" / "uid-1").exists()
    assert driver.checkpoint.get("uid-1") is None
    # the device is free again
    await driver.prepare_claim(
        node.claims.add(claim_doc(uid="uid-2", name="b", results=[result("g", "gpu-0")]))
    )


async def test_a_configured_driver_name_names_the_cdi_kind_the_ids_and_the_spec_file(tmp_path: Path) -> None:
    node = Node(tmp_path, driver_name="gpu.example.com")
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0", driver="gpu.example.com")]))
    devices = await node.driver().prepare_claim(ref)
    assert [d.cdi_device_ids for d in devices] == [("gpu.example.com/gpu=uid-1-gpu-0",)]
    assert node.spec_files() == ["gpu.example.com-claim_uid-1.json"]
    spec_path = node.cdi_root / "gpu.example.com-claim_uid-1.json"
    assert json.loads(spec_path.read_text())["kind"] == "gpu.example.com/gpu"
    # A restart re-creates a vanished spec under the same kind, from the checkpoint alone.
    spec_path.unlink()
    node.driver()
    assert json.loads(spec_path.read_text())["kind"] == "gpu.example.com/gpu"


async def test_unprepare_of_unknown_claim_succeeds(node: Node) -> None:
    await node.driver().unprepare_claim(ClaimRef("ns", "never-seen", "x"))


async def test_same_claim_is_serialized_other_claims_run_concurrently(node: Node) -> None:
    # The driver has no lock of its own: the protocol layer's ClaimRunner holds the
    # node plugin's only per-claim lock, so the driver is driven through it as the kubelet does.
    runner = ClaimRunner(node.driver())
    a = node.claims.add(two_gpu_claim(uid="uid-a", name="a"))
    b = node.claims.add(claim_doc(uid="uid-b", name="b", results=[result("g", "gpu-2")]))
    node.claims.gate = asyncio.Event()
    # Separate requests, as kubelet retries are: one request may name a claim only once.
    tasks = [asyncio.create_task(runner.prepare([ref])) for ref in (a, a, a, b)]
    await asyncio.sleep(0.05)
    assert node.claims.active == {"a": 1, "b": 1}  # one GET of a in flight (others wait), b in parallel
    node.claims.gate.set()
    answers = await asyncio.gather(*tasks)
    assert answers[0] == answers[1] == answers[2]
    assert answers[0]["uid-a"].error == "" and len(answers[0]["uid-a"].devices) == 2
    assert answers[3]["uid-b"].error == ""
    assert node.claims.max_active == {"a": 1, "b": 1}
    assert len(runner._per_claim) == 0  # locks are dropped when unused


class SimulatedCrash(BaseException):
    """Stands in for SIGKILL: escapes every `except Exception` like a real kill escapes everything."""


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    armed: list[str] = []

    def reach(point: str) -> None:
        if armed and armed[0] == point:
            armed.clear()
            raise SimulatedCrash(point)

    monkeypatch.setattr(crashpoints, "reach", reach)
    yield armed


PREPARE_POINTS = [
    crashpoints.AFTER_CHECKPOINT_STARTED,
    crashpoints.AFTER_CDI_WRITE,
    crashpoints.AFTER_CHECKPOINT_COMPLETED,
    crashpoints.BEFORE_RETURN,
]


@pytest.mark.parametrize("point", PREPARE_POINTS)
async def test_crash_during_prepare_then_retry_gives_same_answer(
    node: Node, crash_at: list[str], point: str
) -> None:
    reference = Node(node.root.parent / "reference")
    expected = await reference.driver().prepare_claim(reference.claims.add(two_gpu_claim()))

    ref = node.claims.add(two_gpu_claim())
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await node.driver().prepare_claim(ref)
    restarted = node.driver()
    assert await restarted.prepare_claim(ref) == expected
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]
    record = restarted.checkpoint.get("uid-1")
    assert record is not None and record.state is ClaimState.PREPARE_COMPLETED


@pytest.mark.parametrize("point", PREPARE_POINTS)
async def test_crash_during_prepare_then_unprepare_leaves_nothing(
    node: Node, crash_at: list[str], point: str
) -> None:
    ref = node.claims.add(two_gpu_claim())
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await node.driver().prepare_claim(ref)
    restarted = node.driver()
    await restarted.unprepare_claim(ref)
    assert node.spec_files() == [] and len(restarted.checkpoint) == 0


@pytest.mark.parametrize(
    "point", [crashpoints.UNPREPARE_AFTER_CDI_REMOVE, crashpoints.UNPREPARE_AFTER_RELEASE]
)
async def test_crash_during_unprepare_then_retry(node: Node, crash_at: list[str], point: str) -> None:
    ref = node.claims.add(two_gpu_claim())
    await node.driver().prepare_claim(ref)
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await node.driver().unprepare_claim(ref)
    restarted = node.driver()
    # the record survived the crash, and start-up did not resurrect the removed spec ...
    assert restarted.checkpoint.get("uid-1") is not None
    await restarted.unprepare_claim(ref)
    assert node.spec_files() == [] and len(restarted.checkpoint) == 0


async def test_startup_restores_specs_of_completed_claims(node: Node) -> None:
    ref = node.claims.add(two_gpu_claim())
    await node.driver().prepare_claim(ref)
    spec = node.cdi_root / "gpu.draplugin.dev-claim_uid-1.json"
    content = spec.read_bytes()
    spec.unlink()
    report = node.driver(recover=False).recover()
    assert report.specs_restored == ["uid-1"]
    assert spec.read_bytes() == content


async def test_startup_removes_leaked_specs(node: Node) -> None:
    node.cdi_root.mkdir(parents=True)
    leaked = node.cdi_root / "gpu.draplugin.dev-claim_ghost.json"
    leaked.write_text("{}")
    foreign = node.cdi_root / "vendor.example-claim_x.json"
    foreign.write_text("{}")
    node.driver()
    assert not leaked.exists() and foreign.exists()


async def test_new_boot_redoes_prepare_and_unprepare_still_works(node: Node) -> None:
    ref = node.claims.add(two_gpu_claim())
    expected = await node.driver().prepare_claim(ref)
    for spec in node.cdi_root.iterdir():
        spec.unlink()  # /var/run/cdi is a tmpfs: a reboot empties it
    node.boot_id = "boot-2"
    rebooted = node.driver()
    record = rebooted.checkpoint.get("uid-1")
    assert record is not None and record.state is ClaimState.PREPARE_STARTED
    assert node.spec_files() == []  # not restored from a previous boot's record
    gets = node.claims.gets
    assert await rebooted.prepare_claim(ref) == expected
    assert node.claims.gets == gets + 1
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]
    node.boot_id = "boot-3"
    again = node.driver()
    await again.unprepare_claim(ref)
    assert len(again.checkpoint) == 0 and node.spec_files() == []


async def test_corrupt_checkpoint_is_reported_and_rebuilt(node: Node) -> None:
    doc = two_gpu_claim(uid="uid-running", name="running")
    doc["status"]["reservedFor"] = [{"resource": "pods", "name": "pod", "uid": "pod-uid"}]
    running = node.claims.add(doc)
    await node.driver().prepare_claim(running)
    node.checkpoint_path.write_text('{"version": 2, "claims": [')
    driver = node.driver()
    # the running claim's spec stays (its containers may restart), and its record is rebuilt
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-running.json"]
    assert [reason for reason, _ in node.events.node_events] == ["CheckpointCorrupted"]
    assert "moved to" in node.events.node_events[0][1]
    assert len(list(node.checkpoint_path.parent.glob("checkpoint.json.corrupt-*"))) == 1
    assert [c["uid"] for c in json.loads(node.checkpoint_path.read_text())["claims"]] == ["uid-running"]
    await driver.prepare_claim(node.claims.add(claim_doc(uid="uid-1", results=[result("gpu", "gpu-3")])))
    assert driver.checkpoint.get("uid-1") is not None
    await driver.unprepare_claim(running)
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-1.json"]


async def test_changed_allocation_for_same_uid_is_redone(node: Node) -> None:
    driver = node.driver()
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    await driver.prepare_claim(ref)
    node.claims.add(claim_doc(results=[result("gpu", "gpu-3")]))
    devices = await driver.prepare_claim(ref)
    assert [d.device_name for d in devices] == ["gpu-3"]
    spec = json.loads((node.cdi_root / "gpu.draplugin.dev-claim_uid-1.json").read_text())
    assert [d["name"] for d in spec["devices"]] == ["uid-1-gpu-3"]


async def test_metrics_track_in_flight_and_durations(node: Node) -> None:
    driver = node.driver()
    ref = node.claims.add(two_gpu_claim())
    node.claims.gate = asyncio.Event()
    task = asyncio.create_task(driver.prepare_claim(ref))
    await asyncio.sleep(0.01)
    assert node.metric("draplugin_claim_operations_in_flight", operation="prepare") == 1
    node.claims.gate.set()
    await task
    await driver.unprepare_claim(ref)
    assert node.metric("draplugin_claim_operations_in_flight", operation="prepare") == 0
    assert node.metric("draplugin_claim_operation_duration_seconds_count", operation="prepare") == 1
    assert node.metric("draplugin_claim_operations_total", operation="unprepare", result="success") == 1
    assert node.metric("draplugin_prepared_claims") == 0


async def test_fresh_prepare_writes_the_checkpoint_once_and_fsyncs_only_it(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One durable checkpoint write per fresh prepare (the file's fsync: it only adds a record), the
    spec unsynced;
    a redo of a known claim still records `PrepareStarted` in the file before changing anything."""
    driver = node.driver()
    ref = node.claims.add(two_gpu_claim())
    writes: list[bool] = []
    real = atomic_write
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def counting(
        path: Path, content: bytes, mode: int = 0o644, *, durable: bool = True, sync_dir: bool = True
    ) -> None:
        writes.append(durable)
        real(path, content, mode, durable=durable, sync_dir=sync_dir)

    def counting_fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(checkpoint_module, "atomic_write", counting)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    await driver.prepare_claim(ref)
    assert writes == [True] and len(fsyncs) == 1
    record = CheckpointStore(node.checkpoint_path, node.boot_id)
    record.load()
    loaded = record.get("uid-1")
    assert loaded is not None and loaded.state is ClaimState.PREPARE_COMPLETED

    # After a reboot the record is PrepareStarted: the redo commits it before touching the node.
    node.boot_id = "boot-2"
    rebooted = node.driver()
    writes.clear()
    await rebooted.prepare_claim(ref)
    assert writes == [True, True]
