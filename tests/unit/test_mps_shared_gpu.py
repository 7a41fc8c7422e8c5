"""One MPS control daemon per shared GPU: started with the first share, stopped with the last, the GPU
in EXCLUSIVE_PROCESS mode while it runs, each client's limits in its own environment, and a kill -9
at any step leaves nothing that no claim holds once start-up has run.

Through the prepare driver, on the stand-in driver tools of `tests/driverroot_layout.py` (a real
background daemon on named pipes; an `nvidia-smi` that records compute modes). The same with NVIDIA's
real `nvidia-cuda-mps-control` and `nvidia-smi` on the NVML double: tests/unit/test_mps_real_shared.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from draplugin import crashpoints
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.prepare import computemode, mps, mpsgpu, timeslice
from draplugin.prepare.errors import PlanError
from draplugin.prepare.ledger import LedgerEntry
from draplugin.prepare.plan import plan_claim
from tests.driverroot_layout import TOOL_STATE
from tests.unit import sharing_fixtures, test_prepare_driver
from tests.unit.sharing_fixtures import ToolNode, kill_daemon
from tests.unit.test_mps_pod import PodApi, PodNode
from tests.unit.test_prepare_driver import FakeClaims, SimulatedCrash
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc
from tests.unit.test_shares import DEVICES, driver, shared_result

tool_node = sharing_fixtures.tool_node
crash_at = test_prepare_driver.crash_at  # the fixture: SIGKILL stood in for by an uncatchable exception
GPU0 = DEVICES["gpu-0"].uuid
OWNER = mpsgpu.owner_of(GPU0)


def daemon_starts(node: ToolNode) -> list[str]:
    return [c for c in node.commands() if c.startswith("nvidia-cuda-mps-control -d")]


def spec_env(node: ToolNode, uid: str) -> list[str]:
    import json

    (spec,) = (node.state.parent / "cdi").glob(f"*{uid}*.json")
    (device,) = json.loads(spec.read_text())["devices"]
    env: list[str] = device["containerEdits"]["env"]
    assert device["containerEdits"]["mounts"][0]["hostPath"] == str(node.state / "mps" / OWNER)
    return env


def reasons(process: Any) -> list[str]:
    return [reason for _, reason, _ in process.events.claim_events]


def small_and_large(claims: FakeClaims) -> tuple[Any, Any]:
    small = claims.add(claim_doc("uid-a", [shared_result("gpu-0", "s-1", memory="10Gi", compute="30")]))
    large = claims.add(
        claim_doc("uid-b", [shared_result("gpu-0", "s-2", memory="30Gi", compute="60")], name="other")
    )
    return small, large


async def test_two_shares_of_a_gpu_are_clients_of_one_daemon_started_first_and_stopped_last(
    tool_node: ToolNode,
) -> None:
    claims = FakeClaims()
    process = driver(tool_node, claims)
    small, large = small_and_large(claims)
    await process.prepare_claim(small)
    assert tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    await process.prepare_claim(large)
    assert daemon_starts(tool_node) == [
        f"nvidia-cuda-mps-control -d pipe={tool_node.state / 'mps' / OWNER / 'pipe'} "
        f"log={tool_node.state / 'mps' / OWNER / 'log'} CUDA_VISIBLE_DEVICES={GPU0}"
    ]
    assert len(tool_node.daemon_pids()) == 1
    # The compute mode was read before it was set: that is what the stop restores.
    smi = [c for c in tool_node.commands() if c.startswith("nvidia-smi")]
    assert smi == [
        f"nvidia-smi --query-gpu=compute_mode --format=csv,noheader -i {GPU0}",
        f"nvidia-smi -i {GPU0} -c EXCLUSIVE_PROCESS",
    ]
    # No daemon-wide limits: each client's own are in its containers' environment.
    daemon = [c for c in tool_node.commands() if c.startswith("mps-daemon")]
    assert not any("set_default" in c for c in daemon), daemon
    small_env, large_env = spec_env(tool_node, "uid-a"), spec_env(tool_node, "uid-b")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in small_env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU0}=10240M" in small_env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=60" in large_env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={GPU0}=30720M" in large_env
    assert "CUDA_MPS_PIPE_DIRECTORY=/var/run/draplugin/mps/pipe" in small_env

    restarted = driver(tool_node, claims)  # a new plugin process keeps the daemon both shares use
    assert len(tool_node.daemon_pids()) == 1
    await restarted.unprepare_claim(small)
    assert len(tool_node.daemon_pids()) == 1 and tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    await restarted.unprepare_claim(large)
    assert tool_node.daemon_pids() == [] and tool_node.compute_mode_of(GPU0) == "Default"
    assert restarted.sharing.ledger.entries() == [] and not (tool_node.state / "mps" / OWNER).exists()


async def test_the_mode_the_gpu_had_before_is_the_one_restored(tool_node: ToolNode) -> None:
    claims = FakeClaims()
    process = driver(tool_node, claims)
    sharing = process.sharing
    assert sharing.mps is not None
    computemode.ComputeModes(sharing.mps._tools)._set(GPU0, "PROHIBITED")
    small, _ = small_and_large(claims)
    await process.prepare_claim(small)
    assert tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    await process.unprepare_claim(small)
    assert tool_node.compute_mode_of(GPU0) == "Prohibited"


async def test_a_dead_daemon_is_started_again_by_the_next_share(tool_node: ToolNode) -> None:
    claims = FakeClaims()
    process = driver(tool_node, claims)
    small, large = small_and_large(claims)
    await process.prepare_claim(small)
    (pid,) = tool_node.daemon_pids()
    kill_daemon(pid)
    await process.prepare_claim(large)
    (again,) = tool_node.daemon_pids()
    assert again != pid and tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    # The restore after the dead daemon did not record Exclusive_Process as the mode to go back to.
    (entry,) = process.sharing.ledger.entries(OWNER, computemode.KIND)
    assert entry.data["previous"] == "DEFAULT"
    await process.unprepare_claim(small)
    await process.unprepare_claim(large)
    assert tool_node.compute_mode_of(GPU0) == "Default"


PREPARE_POINTS = [
    crashpoints.AFTER_CHECKPOINT_STARTED,
    crashpoints.AFTER_MPS_SHARE_JOIN,
    crashpoints.AFTER_COMPUTE_MODE_SET,
    crashpoints.AFTER_MPS_START,
    crashpoints.AFTER_CDI_WRITE,
    crashpoints.AFTER_CHECKPOINT_COMPLETED,
    crashpoints.BEFORE_RETURN,
]


@pytest.mark.parametrize("point", PREPARE_POINTS)
async def test_kill_while_preparing_the_first_share_leaves_nothing_and_retry_gives_the_same_answer(
    tool_node: ToolNode, crash_at: list[str], point: str
) -> None:
    claims = FakeClaims()
    small, large = small_and_large(claims)
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims).prepare_claim(small)
    restarted = driver(tool_node, claims)
    held = point in (crashpoints.AFTER_CHECKPOINT_COMPLETED, crashpoints.BEFORE_RETURN)
    assert len(tool_node.daemon_pids()) == (1 if held else 0)
    assert tool_node.compute_mode_of(GPU0) == ("Exclusive_Process" if held else "Default")
    if not held:
        assert restarted.sharing.ledger.entries() == []
    answer = await restarted.prepare_claim(small)
    assert [(d.device_name, d.share_id) for d in answer] == [("gpu-0", "s-1")]
    await restarted.prepare_claim(large)
    # Started again only where the kill came after the start and start-up stopped it.
    stopped = point in (crashpoints.AFTER_MPS_START, crashpoints.AFTER_CDI_WRITE)
    assert len(tool_node.daemon_pids()) == 1 and len(daemon_starts(tool_node)) == (2 if stopped else 1)
    await restarted.unprepare_claim(small)
    await restarted.unprepare_claim(large)
    assert tool_node.daemon_pids() == [] and tool_node.compute_mode_of(GPU0) == "Default"
    assert restarted.sharing.ledger.entries() == []


@pytest.mark.parametrize("point", [crashpoints.AFTER_CHECKPOINT_STARTED, crashpoints.AFTER_MPS_SHARE_JOIN])
async def test_kill_while_a_second_share_joins_leaves_the_first_ones_daemon_alone(
    tool_node: ToolNode, crash_at: list[str], point: str
) -> None:
    claims = FakeClaims()
    small, large = small_and_large(claims)
    await driver(tool_node, claims).prepare_claim(large)
    (pid,) = tool_node.daemon_pids()
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims).prepare_claim(small)
    restarted = driver(tool_node, claims)  # the orphan share goes; the daemon is the other's too
    assert tool_node.daemon_pids() == [pid] and tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    assert mpsgpu.SharedGpuDaemons.holders(restarted.sharing.ledger, GPU0) == ["uid-b"]
    await restarted.unprepare_claim(large)
    assert tool_node.daemon_pids() == [] and tool_node.compute_mode_of(GPU0) == "Default"


@pytest.mark.parametrize(
    "point",
    [
        crashpoints.UNPREPARE_AFTER_CDI_REMOVE,
        crashpoints.UNPREPARE_AFTER_MPS_STOP,
        crashpoints.AFTER_COMPUTE_MODE_RESTORE,
        crashpoints.UNPREPARE_AFTER_RELEASE,
    ],
)
async def test_kill_while_unpreparing_the_last_share_then_retry_leaves_nothing(
    tool_node: ToolNode, crash_at: list[str], point: str
) -> None:
    claims = FakeClaims()
    small, _ = small_and_large(claims)
    await driver(tool_node, claims).prepare_claim(small)
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await driver(tool_node, claims).unprepare_claim(small)
    restarted = driver(tool_node, claims)
    await restarted.unprepare_claim(small)
    assert tool_node.daemon_pids() == [] and tool_node.compute_mode_of(GPU0) == "Default"
    assert restarted.sharing.ledger.entries() == [] and len(restarted.checkpoint) == 0


async def test_start_up_stops_a_daemon_no_share_holds(tool_node: ToolNode) -> None:
    """A daemon whose holders' entries are gone (its last share dropped before the stop finished)."""
    claims = FakeClaims()
    small, _ = small_and_large(claims)
    process = driver(tool_node, claims)
    await process.prepare_claim(small)
    process.sharing.ledger.drop("uid-a", mpsgpu.KIND, GPU0)
    assert tool_node.sharing().release_orphans(prepared={"uid-a"}) == []
    assert tool_node.daemon_pids() == [] and tool_node.compute_mode_of(GPU0) == "Default"
    assert process.sharing.ledger.entries() == []


async def test_shares_of_two_gpus_in_one_claim_are_refused(tool_node: ToolNode) -> None:
    claims = FakeClaims()
    ref = claims.add(claim_doc("uid-a", [
        shared_result("gpu-0", "s-1", "a", memory="4Gi", compute="20"),
        shared_result("gpu-1", "s-2", "b", memory="4Gi", compute="20"),
    ]))  # fmt: skip
    process = driver(tool_node, claims)
    with pytest.raises(ClaimError, match="more than one MPS control daemon"):
        await process.prepare_claim(ref)
    assert reasons(process) == ["SharingConflict"]
    assert tool_node.daemon_pids() == [] and daemon_starts(tool_node) == []


async def test_an_mps_share_and_a_time_slice_on_one_gpu_are_refused_either_way(tool_node: ToolNode) -> None:
    claims = FakeClaims()
    process = driver(tool_node, claims)
    ledger = process.sharing.ledger
    small, _ = small_and_large(claims)
    ledger.put(LedgerEntry("uid-t", timeslice.KIND, GPU0, timeslice.SET, {"device": "gpu-0", "level": 3}))
    with pytest.raises(ClaimError, match="time-sliced for claim uid uid-t"):
        await process.prepare_claim(small)
    assert reasons(process) == ["SharingConflict"]
    assert tool_node.daemon_pids() == [] and daemon_starts(tool_node) == []
    ledger.drop("uid-t", timeslice.KIND, GPU0)
    await process.prepare_claim(small)
    # Only an over-commit puts a time-slice next to shares (a whole share takes all the capacity):
    # the time-slicer itself refuses it.
    slicer = process.sharing.timeslice
    assert slicer is not None
    with pytest.raises(
        PlanError, match="runs an MPS control daemon for the shares of claim uid uid-a"
    ) as err:
        slicer.apply_levels("uid-c", "ns/sliced", {GPU0: ("gpu-0", 3)}, ledger)
    assert err.value.reason == "SharingConflict"
    assert tool_node.timeslice_of(GPU0) == "0" and ledger.entries("uid-c") == []


def test_the_time_slicers_name_for_the_share_kind_is_the_shares_own() -> None:
    assert timeslice.MPS_SHARE_KIND == mpsgpu.KIND
    assert mps.KIND != mpsgpu.KIND != computemode.KIND


def test_in_pod_mode_the_gpus_daemon_is_one_pod_that_outlives_a_plugin_restart(tmp_path: Path) -> None:
    api = PodApi()
    try:
        node = PodNode(tmp_path, api)
        devices = {"gpu-0": DEVICES["gpu-0"]}
        first, second = (
            plan_claim(ClaimRef("ns", uid, uid), claim_doc(uid, [shared_result("gpu-0", sid, memory="10Gi")]),
                       driver=DRIVER, pool=NODE, devices=devices)
            for uid, sid in (("uid-a", "s-1"), ("uid-b", "s-2"))
        )  # fmt: skip
        node.sharing().apply(first)
        node.sharing().apply(second)  # another plugin process: finds the Pod in the ledger
        (pod,) = api.created
        assert pod["metadata"]["name"] == f"mps-{OWNER}" and api.running() == [f"mps-{OWNER}"]
        assert pod["metadata"]["labels"][f"{DRIVER}/claim-uid"] == OWNER
        mode = node.driver_root / TOOL_STATE / f"computemode-{GPU0}"
        assert mode.read_text().strip() == "Exclusive_Process"
        node.sharing().release("uid-a")
        assert api.running() == [f"mps-{OWNER}"]
        node.sharing().release("uid-b")
        assert api.running() == [] and api.pods == {} and mode.read_text().strip() == "Default"
    finally:
        api.close()
