"""The driver root's tools run with NVIDIA's real binaries, as the plugin runs them in its pod.

The plugin's image has no NVIDIA library, so every tool of a driver root that
is not `/` (the chart's `/driver-root`, the GPU Operator's `/run/nvidia/driver`)
must be told where its libraries are. These tests run the real `nvidia-smi`,
`nvidia-cuda-mps-control` and `nvidia-cuda-mps-server` of a driver root built
from NVIDIA's files (`tests/nvidia_roots.py`, the NVML double as its NVML) in
a temporary directory, through prepare's own code, with no GPU: the real
`nvidia-smi` finds its NVML (the double) and stops at the GPU the double does
not list (exit 6), rather than at the missing library (exit 12); the MPS
server the daemon starts reaches CUDA's "no CUDA-capable device" only once it
was found on PATH and has loaded libcuda.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from draplugin.prepare.plan import ClaimPlan, PlanError
from draplugin.prepare.sharing import SharingState
from tests import nvidia_roots as nr
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_mps import mps_plan
from tests.unit.test_mps_pod import PodApi, PodNode
from tests.unit.test_timeslice import sliced

SERVER_WAIT_S = 20.0


# Both layouts: Debian's usr/bin/nvidia-smi is a link to /etc/alternatives/nvidia-smi, which must
# be resolved inside the driver root, not on the plugin's own file system.
@pytest.fixture(params=["flat", "debian"])
def smi_layout(request: pytest.FixtureRequest) -> nr.Layout:
    layout: nr.Layout = request.param
    return layout


@pytest.fixture
def real_node(tmp_path: Path) -> Iterator[ToolNode]:
    node = ToolNode(tmp_path / "state", nr.tool_root(tmp_path / "driver-root").path)
    sharing = node.sharing()
    yield node
    for uid in list(sharing.claim_uids()):  # a failing test must not leave a real daemon running
        with contextlib.suppress(PlanError):  # a time-slice reset fails the same way without a GPU
            sharing.release(uid)


def test_time_slicing_runs_the_real_nvidia_smi_of_a_driver_root_that_is_not_slash(
    tmp_path: Path, smi_layout: nr.Layout
) -> None:
    node = ToolNode(tmp_path / "state", nr.tool_root(tmp_path / "driver-root", smi_layout).path)
    with pytest.raises(PlanError) as err:
        node.sharing().apply(sliced("uid-a", "Long"))
    # nvidia-smi found its NVML (the double), which lists no GPU of the plan's UUID: it stopped at
    # the device lookup, not at the library.
    assert err.value.reason == "TimeSliceFailed"
    assert f"exited with {nr.SMI_NOT_FOUND}: No devices were found" in str(err.value), str(err.value)
    assert f"exited with {nr.SMI_NO_NVML}" not in str(err.value)
    assert "couldn't find libnvidia-ml" not in str(err.value)


def server_log_after_start(sharing: SharingState, uid: str, *logs: Path) -> str:
    """Ask the claim's daemon for a server (what a client's first CUDA call does) and read the logs:
    the claim's log directory, and `logs` (a daemon in the foreground, the Pod's `-f`, logs both
    its own and its server's lines to its output)."""
    assert sharing.mps is not None
    sharing.mps.ask(uid, "start_server -uid 0", sharing.ledger)
    log = sharing.mps_dir(uid) / "log"
    files = [log / "server.log", log / "control.log", *logs]
    deadline = time.monotonic() + SERVER_WAIT_S
    text = ""
    while time.monotonic() < deadline:
        text = "".join(path.read_text() for path in files if path.exists())
        if "Failed to start" in text or "exited with status" in text:
            return text
        time.sleep(0.1)
    raise AssertionError(f"no server outcome in {files}: {text}")


def double_mps_plan(sharing: SharingState) -> ClaimPlan:
    """`mps_plan` on the GPU the double lists (its built-in configuration: the tools get no other),
    so the real nvidia-smi finds the GPU whose compute mode the daemon needs set."""
    assert sharing.mps is not None
    args = ["--query-gpu=uuid", "--format=csv,noheader"]
    what = "listing the double's GPU"
    uuid = sharing.mps._tools.run("nvidia-smi", args, error=PlanError, reason="x", what=what, timeout_s=30)
    plan = mps_plan()
    (planned,) = plan.devices
    device = dataclasses.replace(planned.device, uuid=uuid.strip())
    return dataclasses.replace(plan, devices=(dataclasses.replace(planned, device=device),))


def test_the_real_mps_daemon_answers_and_its_server_loads_libcuda(real_node: ToolNode) -> None:
    sharing = real_node.sharing()
    sharing.apply(double_mps_plan(sharing))
    assert sharing.mps is not None
    assert sharing.mps.ask("uid-a", "get_default_active_thread_percentage", sharing.ledger) == "50.0"
    assert sharing.mps.ask("uid-a", "get_default_device_pinned_mem_limit 0", sharing.ledger) == "10G"
    # The server is in the root's usr/sbin (Debian's packages) and loads the root's libcuda.
    logs = server_log_after_start(sharing, "uid-a")
    assert "no CUDA-capable device" in logs, logs
    sharing.release("uid-a")
    assert real_node.daemon_pids() == []


def test_the_real_mps_daemon_pod_gets_the_same_environment(tmp_path: Path) -> None:
    api = PodApi(log_dir=tmp_path)
    try:
        node = PodNode(tmp_path, api)
        node.driver_root = nr.tool_root(tmp_path / "real-root").path
        sharing = node.sharing()
        sharing.apply(double_mps_plan(sharing))
        assert node.ask(sharing, "get_default_active_thread_percentage") == "50.0"
        logs = server_log_after_start(sharing, "uid-a", tmp_path / "mps-uid-a.log")
        assert "no CUDA-capable device" in logs, logs
        sharing.release("uid-a")
        assert api.running() == []
    finally:
        api.close()
