"""Time-slicing at prepare: the GPU's time-slice set through nvidia-smi, reset when its last holder leaves.

Against the stand-in `nvidia-smi` of a fake driver root, which records every
command and keeps the level each GPU was set to.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin import crashpoints
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.gpuconfig import TimeSliceInterval
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim
from draplugin.prepare.sharing import SharingState
from draplugin.prepare.timeslice import LEVELS
from tests.unit import sharing_fixtures
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, config, gpu_config, result

GPU0 = DEVICES["gpu-0"].uuid


# Stand-in nvidia-smi: the real one's compute-policy goes through NVML's undocumented export table,
# which the NVML double cannot serve ("Uninitialized"; tests/cluster/nvmldouble/README.md), and these
# tests assert the exact commands recorded. The real binary: tests/unit/test_drivertools.py.
tool_node = sharing_fixtures.tool_node  # the fixture: a state dir next to a stand-in driver root


class Killed(BaseException):
    """SIGKILL at a crash point: escapes every handler."""


def sliced(uid: str, interval: str, device: str = "gpu-0") -> ClaimPlan:
    settings = gpu_config("TimeSlicing", timeSlicingConfig={"interval": interval})
    doc = claim_doc(uid, [result("gpu", device)], [config("FromClaim", settings)])
    return plan_claim(ClaimRef("ns", uid, f"claim-{uid}"), doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def smi(node: ToolNode) -> list[str]:
    return [c for c in node.commands() if c.startswith("nvidia-smi compute-policy")]


def test_the_levels_are_nvidias() -> None:
    assert LEVELS == {
        TimeSliceInterval.DEFAULT: 0,
        TimeSliceInterval.SHORT: 1,
        TimeSliceInterval.MEDIUM: 2,
        TimeSliceInterval.LONG: 3,
    }


def test_prepare_sets_the_interval_and_unprepare_resets_it(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(sliced("uid-a", "Long"))
    assert smi(tool_node) == [f"nvidia-smi compute-policy -i {GPU0} --set-timeslice 3"]
    assert tool_node.timeslice_of(GPU0) == "3"
    (entry,) = sharing.ledger.entries("uid-a")
    assert (entry.state, entry.data["level"]) == ("set", 3)
    sharing.apply(sliced("uid-a", "Long"))  # repeated prepare: nothing to do
    assert len(smi(tool_node)) == 1
    sharing.release("uid-a")
    assert smi(tool_node)[-1] == f"nvidia-smi compute-policy -i {GPU0} --set-timeslice 0"
    assert tool_node.timeslice_of(GPU0) == "0" and sharing.ledger.entries() == []


def test_the_gpu_returns_to_default_only_when_the_last_holder_leaves(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(sliced("uid-a", "Short"))
    sharing.apply(sliced("uid-b", "Short"))
    assert len(smi(tool_node)) == 1  # the GPU already runs with it
    sharing.release("uid-a")
    assert tool_node.timeslice_of(GPU0) == "1" and len(smi(tool_node)) == 1
    sharing.release("uid-b")
    assert tool_node.timeslice_of(GPU0) == "0"


def test_a_different_interval_on_the_same_gpu_is_refused(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(sliced("uid-a", "Long"))
    with pytest.raises(PlanError) as err:
        sharing.apply(sliced("uid-b", "Short"))
    assert err.value.reason == "TimeSliceConflict"
    assert "runs with time-slice level 3 for claim uid uid-a; this claim asks for level 1" in str(err.value)
    assert tool_node.timeslice_of(GPU0) == "3" and [e.claim_uid for e in sharing.ledger.entries()] == [
        "uid-a"
    ]
    sharing.apply(sliced("uid-c", "Short", device="gpu-1"))  # another GPU is free to differ
    assert tool_node.timeslice_of(DEVICES["gpu-1"].uuid) == "1"


def test_kill_after_set_before_the_record_is_reset_at_start(
    tool_node: ToolNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reach(point: str) -> None:
        if point == crashpoints.AFTER_TIMESLICE_SET:
            raise Killed(point)

    monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(Killed):
        tool_node.sharing().apply(sliced("uid-a", "Medium"))
    monkeypatch.undo()
    assert tool_node.timeslice_of(GPU0) == "2"  # set on the GPU, the ledger only says "setting"
    restarted = tool_node.sharing()
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert tool_node.timeslice_of(GPU0) == "0" and restarted.ledger.entries() == []


def test_an_nvidia_smi_failure_is_a_prepare_error(tool_node: ToolNode) -> None:
    smi_path = tool_node.driver_root / "usr/bin/nvidia-smi"
    smi_path.write_text(
        "#!/bin/sh\necho 'Unable to set the timeslice: Insufficient Permissions' >&2\nexit 4\n"
    )
    with pytest.raises(PlanError) as err:
        tool_node.sharing().apply(sliced("uid-a", "Long"))
    assert err.value.reason == "TimeSliceFailed" and "Insufficient Permissions" in str(err.value)


def test_time_slicing_without_a_driver_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as err:
        SharingState(tmp_path).apply(sliced("uid-a", "Long"))
    assert err.value.reason == "TimeSliceUnavailable"
