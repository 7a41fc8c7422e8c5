"""MPS daemons and time-slices through the prepare driver: the kill -9 table and Events.

Each simulated plugin process is a fresh `GpuDriver` on the same state
directory and the same stand-in driver root, whose MPS daemons are real
background processes and whose GPU time-slice levels are files: what a kill
leaves behind survives into the next process, as it would on a node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from draplugin import crashpoints
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore
from draplugin.devices.model import Device
from draplugin.kubelet.interface import ClaimError
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.driver import GpuDriver
from tests.unit import sharing_fixtures, test_prepare_driver
from tests.unit.sharing_fixtures import ToolNode, kill_daemon
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents, SimulatedCrash
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, config, gpu_config, result

crash_at = test_prepare_driver.crash_at  # the fixture: SIGKILL stood in for by an uncatchable exception
tool_node = sharing_fixtures.tool_node
GPU0 = DEVICES["gpu-0"].uuid


def driver(
    node: ToolNode, claims: FakeClaims, events: RecordingEvents, devices: Sequence[Device] = ()
) -> GpuDriver:
    """A fresh plugin process on the node (start-up recovery included)."""
    process = GpuDriver(
        driver_name=DRIVER,
        node_name=NODE,
        devices=list(devices or DEVICES.values()),
        claims=claims,
        cdi_store=SpecStore(node.state.parent / "cdi", DRIVER),
        checkpoint=CheckpointStore(node.state / "checkpoint.json", "boot-1"),
        sharing=node.sharing(),
        events=events,
        metrics=ClaimMetrics(CollectorRegistry()),
    )
    process.recover()
    return process


def claim(uid: str, strategy: str, device: str = "gpu-0", **settings: Any) -> dict[str, Any]:
    return claim_doc(uid, [result("gpu", device)], [config("FromClaim", gpu_config(strategy, **settings))])


MPS: dict[str, Any] = {"mpsConfig": {"defaultActiveThreadPercentage": 25}}
SLICE: dict[str, Any] = {"timeSlicingConfig": {"interval": "Long"}}
COMMON_POINTS = [
    crashpoints.AFTER_CHECKPOINT_STARTED,
    crashpoints.AFTER_CDI_WRITE,
    crashpoints.AFTER_CHECKPOINT_COMPLETED,
    crashpoints.BEFORE_RETURN,
]
TABLE = [("MPS", MPS, p) for p in [*COMMON_POINTS, crashpoints.AFTER_MPS_START]] + [
    ("TimeSlicing", SLICE, p) for p in [*COMMON_POINTS, crashpoints.AFTER_TIMESLICE_SET]
]


def gpu_state(node: ToolNode, strategy: str) -> object:
    return len(node.daemon_pids()) if strategy == "MPS" else node.timeslice_of(GPU0)


@pytest.mark.parametrize(("strategy", "settings", "point"), TABLE)
async def test_kill_during_prepare_then_restart_leaves_no_orphan_and_retry_gives_the_same_answer(
    tool_node: ToolNode, crash_at: list[str], strategy: str, settings: dict[str, Any], point: str
) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    ref = claims.add(claim("uid-a", strategy, **settings))
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims, events).prepare_claim(ref)
    restarted = driver(tool_node, claims, events)
    held = point in (crashpoints.AFTER_CHECKPOINT_COMPLETED, crashpoints.BEFORE_RETURN)
    # Start-up undid what no prepared claim holds; a completed claim keeps its daemon / time-slice.
    expected_held, expected_free = (1, 0) if strategy == "MPS" else ("3", "0")
    assert gpu_state(tool_node, strategy) == (expected_held if held else expected_free)
    answer = await restarted.prepare_claim(ref)
    assert [d.device_name for d in answer] == ["gpu-0"]
    assert gpu_state(tool_node, strategy) == expected_held
    await restarted.unprepare_claim(ref)
    assert gpu_state(tool_node, strategy) == expected_free
    assert restarted.sharing.ledger.entries() == []


@pytest.mark.parametrize(("strategy", "settings"), [("MPS", MPS), ("TimeSlicing", SLICE)])
@pytest.mark.parametrize(
    "point", [crashpoints.UNPREPARE_AFTER_CDI_REMOVE, crashpoints.UNPREPARE_AFTER_RELEASE]
)
async def test_kill_during_unprepare_then_retry_leaves_nothing(
    tool_node: ToolNode, crash_at: list[str], strategy: str, settings: dict[str, Any], point: str
) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    ref = claims.add(claim("uid-a", strategy, **settings))
    await driver(tool_node, claims, events).prepare_claim(ref)
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims, events).unprepare_claim(ref)
    restarted = driver(tool_node, claims, events)
    await restarted.unprepare_claim(ref)
    assert gpu_state(tool_node, strategy) == (0 if strategy == "MPS" else "0")
    assert restarted.sharing.ledger.entries() == [] and len(restarted.checkpoint) == 0


async def test_a_restart_keeps_the_daemon_of_a_prepared_claim(tool_node: ToolNode) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    ref = claims.add(claim("uid-a", "MPS", **MPS))
    await driver(tool_node, claims, events).prepare_claim(ref)
    before = tool_node.daemon_pids()
    restarted = driver(tool_node, claims, events)
    assert tool_node.daemon_pids() == before  # the claim's daemon, not the plugin's
    await restarted.unprepare_claim(ref)
    assert tool_node.daemon_pids() == []


async def test_a_conflicting_time_slice_fails_prepare_with_an_event(tool_node: ToolNode) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    # Two claims on one GPU: only consumable capacity (distinct share IDs on a shared GPU) does that.
    shared = dataclasses.replace(DEVICES["gpu-0"], allow_multiple_allocations=True)
    process = driver(tool_node, claims, events, [shared, *(d for d in DEVICES.values() if d.name != "gpu-0")])
    first = claim_doc(
        "uid-a",
        [result("gpu", "gpu-0", shareID="s-1")],
        [config("FromClaim", gpu_config("TimeSlicing", **SLICE))],
    )
    second = claim_doc("uid-b", [result("gpu", "gpu-0", shareID="s-2")], [
        config("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Short"}))
    ], name="other")  # fmt: skip
    await process.prepare_claim(claims.add(first))
    with pytest.raises(ClaimError, match="time-slice level 3"):
        await process.prepare_claim(claims.add(second))
    assert [reason for _, reason, _ in events.claim_events] == ["TimeSliceConflict"]
    assert tool_node.timeslice_of(GPU0) == "3"


async def test_start_up_restarts_the_dead_daemon_of_a_prepared_claim(tool_node: ToolNode) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    ref = claims.add(claim("uid-a", "MPS", **MPS))
    await driver(tool_node, claims, events).prepare_claim(ref)
    (pid,) = tool_node.daemon_pids()
    kill_daemon(pid)  # the plugin container went, and its processes with it
    restarted = driver(tool_node, claims, events)
    (again,) = tool_node.daemon_pids()
    assert again != pid
    await restarted.unprepare_claim(ref)
    assert tool_node.daemon_pids() == []
