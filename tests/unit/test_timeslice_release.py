"""An unprepare killed between resetting the GPU's time-slice and dropping the ledger entry.

The ledger must say what the GPU has: after the kill it may not claim the old level for the
claim (a second claim asking for another interval would be refused for a level the GPU no
longer runs with, by the other plugin process of a rolling update), and the restarted
plugin's ledger matches the GPU. Through the
prepare driver, on the stand-in `nvidia-smi` of a fake driver root that keeps each GPU's level.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from draplugin import crashpoints
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare import timeslice
from draplugin.prepare.ledger import SharingLedger
from draplugin.prepare.plan import plan_claim
from tests.unit import sharing_fixtures, test_prepare_driver
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents, SimulatedCrash
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, config, gpu_config, result
from tests.unit.test_sharing_driver import driver

crash_at = test_prepare_driver.crash_at
tool_node = sharing_fixtures.tool_node
GPU0 = DEVICES["gpu-0"].uuid
# Two claims on one GPU need a GPU that allows several allocations (distinct share IDs).
SHARED = [dataclasses.replace(DEVICES["gpu-0"], allow_multiple_allocations=True)] + [
    d for d in DEVICES.values() if d.name != "gpu-0"
]


def sliced(uid: str, interval: str, share: str) -> dict[str, Any]:
    settings = gpu_config("TimeSlicing", timeSlicingConfig={"interval": interval})
    return claim_doc(uid, [result("gpu", "gpu-0", shareID=share)], [config("FromClaim", settings)], name=uid)


def ledger_level(ledger: SharingLedger, gpu: str) -> str | None:
    """The level the ledger says the GPU runs with: its `set` entries' level, the default when no
    entry holds one, None when it cannot say (an entry in the middle of a change)."""
    entries = [e for e in ledger.entries(kind=timeslice.KIND) if e.key == gpu]
    held = {str(e.data["level"]) for e in entries if e.state == "set"}
    if any(e.state == "setting" for e in entries) or len(held) > 1:
        return None
    return held.pop() if held else str(timeslice.DEFAULT_LEVEL)


async def test_a_kill_after_the_reset_leaves_a_ledger_that_matches_the_gpu(
    tool_node: ToolNode, crash_at: list[str]
) -> None:
    claims, events = FakeClaims(), RecordingEvents()
    a = claims.add(sliced("uid-a", "Long", "s-1"))
    await driver(tool_node, claims, events, SHARED).prepare_claim(a)
    assert tool_node.timeslice_of(GPU0) == "3"
    crash_at.append(crashpoints.UNPREPARE_AFTER_TIMESLICE_RESET)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims, events, SHARED).unprepare_claim(a)
    assert tool_node.timeslice_of(GPU0) == "0"
    killed = SharingLedger(tool_node.state / "sharing-ledger.json")
    assert [e.state for e in killed.entries(kind=timeslice.KIND) if e.state == "set"] == []

    # Start-up prepares the claim again (its record is still completed, as the kubelet still holds
    # it prepared): time-slice included, and the ledger says so.
    restarted = driver(tool_node, claims, events, SHARED)
    assert ledger_level(restarted.sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0)
    await restarted.unprepare_claim(a)  # the kubelet's retry
    assert ledger_level(restarted.sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0) == "0"
    assert restarted.sharing.ledger.entries() == [] and len(restarted.checkpoint) == 0
    b = claims.add(sliced("uid-b", "Short", "s-2"))
    await restarted.prepare_claim(b)
    assert ledger_level(restarted.sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0) == "1"
    await restarted.unprepare_claim(b)
    assert ledger_level(restarted.sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0) == "0"


async def test_before_a_restart_the_cut_reset_holds_no_level_against_another_claim(
    tool_node: ToolNode, crash_at: list[str]
) -> None:
    """Between the kill and the restart (the other plugin process of a rolling update serves)."""
    claims, events = FakeClaims(), RecordingEvents()
    a = claims.add(sliced("uid-a", "Long", "s-1"))
    process = driver(tool_node, claims, events, SHARED)
    await process.prepare_claim(a)
    crash_at.append(crashpoints.UNPREPARE_AFTER_TIMESLICE_RESET)
    with pytest.raises(SimulatedCrash):
        await process.unprepare_claim(a)
    sharing = tool_node.sharing()
    doc = sliced("uid-b", "Short", "s-2")
    ref = ClaimRef("ns", "uid-b", "uid-b")
    sharing.apply(
        plan_claim(ref, doc, driver=DRIVER, pool=NODE, devices={d.name: d for d in SHARED})
    )  # refused before: "runs with time-slice level 3 for claim uid uid-a"
    assert ledger_level(sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0) == "1"
    sharing.release("uid-a")  # the retried unprepare
    assert ledger_level(sharing.ledger, GPU0) == tool_node.timeslice_of(GPU0) == "1"
