"""A shared GPU's one MPS daemon with NVIDIA's real `nvidia-cuda-mps-control` and `nvidia-smi`.

The driver root is built from Debian's NVIDIA packages with the NVML double as its NVML
(`tests/nvidia_roots.py`); the plugin's tools see exactly the environment the plugin gives them, so
the double runs with its built-in configuration: one H100, its state (compute mode included) in
/tmp/nvml-double-default.state. Two shares of that GPU: the real daemon is started for the first and
answers the second's prepare; the real nvidia-smi sets EXCLUSIVE_PROCESS through the double's
nvmlDeviceSetComputeMode (read back from the double's state) and the last release restores it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare import mps, mpsgpu
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim
from draplugin.prepare.sharing import SharingState
from tests import nvidia_roots as nr
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc
from tests.unit.test_shares import DEVICES, shared_result

# The double's built-in configuration keeps its state here (tests/cluster/nvmldouble/config.go).
DEFAULT_STATE = Path("/tmp/nvml-double-default.state")
NVML_EXCLUSIVE_PROCESS, NVML_DEFAULT = 3, 0  # nvml.h nvmlComputeMode_t


def double_compute_mode(gpu: str) -> int:
    state = json.loads(DEFAULT_STATE.read_text())
    mode: int = state["gpus"][gpu]["computeMode"]
    return mode


@pytest.fixture
def real_node(tmp_path: Path) -> Iterator[tuple[ToolNode, str]]:
    # A short state directory: the real daemon's sockets (<pipe>/control_privileged) must fit a
    # socket path's 108 bytes, which pytest's tmp_path below /tmp/pytest-of-<user>/ does not leave.
    state = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp"))
    node = ToolNode(state, nr.tool_root(tmp_path / "driver-root").path)
    sharing = node.sharing()
    assert sharing.mps is not None
    uuid = sharing.mps._tools.run(
        "nvidia-smi",
        ["--query-gpu=uuid", "--format=csv,noheader"],
        error=PlanError,
        reason="x",
        what="listing the double's GPU",
        timeout_s=30,
    ).strip()
    # The double's built-in state is shared by every test that runs it without a configuration of
    # its own; start from the default compute mode so the set and the restore are both seen here.
    sharing.mps._tools.run(
        "nvidia-smi",
        ["-i", uuid, "-c", "DEFAULT"],
        error=PlanError,
        reason="x",
        what="resetting the double's compute mode",
        timeout_s=30,
    )
    yield node, uuid
    for uid in list(sharing.claim_uids()):  # a failing test must not leave a real daemon running
        sharing.release(uid)
    sharing.release_orphans(set())
    shutil.rmtree(state)


def share_plan(uid: str, gpu: str, share_id: str, compute: str) -> ClaimPlan:
    device = dataclasses.replace(DEVICES["gpu-0"], uuid=gpu)
    doc = claim_doc(uid, [shared_result("gpu-0", share_id, memory="10Gi", compute=compute)])
    return plan_claim(ClaimRef("ns", uid, uid), doc, driver=DRIVER, pool=NODE, devices={"gpu-0": device})


def test_one_real_daemon_for_two_shares_and_the_compute_mode_set_and_restored(
    real_node: tuple[ToolNode, str],
) -> None:
    node, gpu = real_node
    sharing: SharingState = node.sharing()
    assert sharing.mps is not None
    before = double_compute_mode(gpu) if DEFAULT_STATE.exists() else NVML_DEFAULT
    assert before == NVML_DEFAULT
    first, second = share_plan("uid-a", gpu, "s-1", "30"), share_plan("uid-b", gpu, "s-2", "60")
    sharing.apply(first)
    assert double_compute_mode(gpu) == NVML_EXCLUSIVE_PROCESS
    owner = mpsgpu.owner_of(gpu)
    (daemon,) = node.daemon_pids()
    sharing.apply(second)
    assert node.daemon_pids() == [daemon]  # the second share is a client of the same daemon
    # The real daemon answers through the one pipe directory both claims' containers get; it has
    # no daemon-wide limit of either claim (each client's is in its own environment).
    assert sharing.mps.ask(owner, "get_default_active_thread_percentage", sharing.ledger) == "100.0"
    host_dirs = {sharing.host_dir_for(p) for p in (first, second)}
    assert host_dirs == {PurePosixPath(sharing.mps_dir(owner))}
    sharing.release("uid-a")
    assert node.daemon_pids() == [daemon] and double_compute_mode(gpu) == NVML_EXCLUSIVE_PROCESS
    sharing.release("uid-b")
    assert node.daemon_pids() == [] and double_compute_mode(gpu) == NVML_DEFAULT
    assert sharing.ledger.entries() == [] and not sharing.mps_dir(owner).exists()
    assert mps.process_start_time(daemon) is None
