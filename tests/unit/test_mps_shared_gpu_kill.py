"""kill -9 (SIGKILL, through `draplugin.crashpoints` and DRAPLUGIN_CRASH_AT) of a process preparing or
releasing a share of a shared GPU at each of the MPS steps' crash points: the next process's start-up
sweep (or the retried unprepare) leaves no daemon, no changed compute mode and no ledger entry.

The killed process is a real child Python process on the stand-in driver tools of
`tests/driverroot_layout.py` (its daemon a real background process), so what it leaves is what a
killed plugin leaves on a node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from draplugin import crashpoints
from draplugin.prepare import mpsgpu
from tests.unit import sharing_fixtures
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_shares import DEVICES

tool_node = sharing_fixtures.tool_node
GPU0 = DEVICES["gpu-0"].uuid
REPO = Path(__file__).resolve().parents[2]

# One plugin process's step on the node: prepare (apply) or unprepare (release) of claim uid-a's share.
CHILD = """
import sys
from pathlib import Path
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.plan import plan_claim
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc
from tests.unit.test_shares import DEVICES, shared_result

state, root, action = sys.argv[1:]
sharing = ToolNode(Path(state), Path(root)).sharing()
doc = claim_doc("uid-a", [shared_result("gpu-0", "s-1", memory="10Gi", compute="30")])
if action == "apply":
    sharing.apply(plan_claim(ClaimRef("ns", "uid-a", "a"), doc, driver=DRIVER, pool=NODE, devices=DEVICES))
else:
    sharing.release("uid-a")
"""


def step(node: ToolNode, action: str, crash_at: str | None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(crashpoints.ENV_VAR, None)
    if crash_at is not None:
        env[crashpoints.ENV_VAR] = crash_at
    args = [sys.executable, "-c", CHILD, str(node.state), str(node.driver_root), action]
    return subprocess.run(args, env=env, cwd=REPO, timeout=120, check=False).returncode


def nothing_left(node: ToolNode) -> None:
    assert node.daemon_pids() == [] and node.compute_mode_of(GPU0) == "Default"
    assert node.sharing().ledger.entries() == []
    assert not (node.state / "mps" / mpsgpu.owner_of(GPU0)).exists()


@pytest.mark.parametrize(
    "point",
    [crashpoints.AFTER_MPS_SHARE_JOIN, crashpoints.AFTER_COMPUTE_MODE_SET, crashpoints.AFTER_MPS_START],
)
def test_kill_9_while_preparing_then_start_up_leaves_nothing(tool_node: ToolNode, point: str) -> None:
    assert step(tool_node, "apply", point) == -signal.SIGKILL
    assert tool_node.sharing().ledger.entries("uid-a")  # the killed step left its record
    tool_node.sharing().release_orphans(prepared=set())  # the next plugin's start-up
    nothing_left(tool_node)


@pytest.mark.parametrize(
    "point", [crashpoints.UNPREPARE_AFTER_MPS_STOP, crashpoints.AFTER_COMPUTE_MODE_RESTORE]
)
def test_kill_9_while_releasing_the_last_share_then_the_retry_leaves_nothing(
    tool_node: ToolNode, point: str
) -> None:
    assert step(tool_node, "apply", None) == 0
    assert tool_node.compute_mode_of(GPU0) == "Exclusive_Process"
    assert step(tool_node, "release", point) == -signal.SIGKILL
    assert tool_node.sharing().ledger.entries()  # killed before the last record went
    tool_node.sharing().release("uid-a")  # the kubelet's retried unprepare, in the next plugin
    nothing_left(tool_node)
