"""`make gpu-check`'s pod rows with NVIDIA's real binaries and no GPU (`tests/nvidia_roots.py`).

The real `nvidia-smi` runs in a runc container that has no NVIDIA library,
with the driver root at another path and nothing but `DriverTools.env`; it
loads the NVML double, which cannot serve `compute-policy` (exit 255,
"Uninitialized"), so both sides print that and the row compares the
environments, as it does on a GPU. The real MPS control daemon serves a
client under `unshare --pid`, whose real libcuda finds no GPU: the row says
which CUDA call failed, and the daemon is gone afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.devices.model import Device
from draplugin.devices.schema import KIND_GPU
from draplugin.gpucheck import pod as gpucheck_pod
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED
from draplugin.prepare import mps
from draplugin.prepare.drivertools import DriverTools
from tests import nvidia_roots as nr

AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="runc and unshare --pid need root")


def needs(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} is not on PATH (the pod rows run it)", pytrace=False)
    return found


def host_smi(root: nr.NvidiaRoot) -> gpucheck_pod.HostSmi:
    """The admin's nvidia-smi: the root's, in a test's environment that finds its libraries."""

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        env = nr.driver_env(root)
        env.pop("NVML_DOUBLE_CONFIG", None)  # the container's double runs unconfigured too
        return subprocess.run(
            [str(root.nvidia_smi), *args], env=env, capture_output=True, text=True, timeout=60, check=False
        )

    return run


@AS_ROOT
def test_compute_policy_in_the_plugin_image_answers_as_on_the_host(tmp_path: Path) -> None:
    root = nr.tool_root(tmp_path / "driver", "flat")
    row = gpucheck_pod.compute_policy_row(DriverRoot.at(str(root.path)), needs("runc"), host_smi(root))
    assert row.status == OK, row
    assert row.ours == row.theirs and row.ours.startswith(f"exit {nr.SMI_POLICY_ON_DOUBLE}: ")
    assert "Uninitialized" in row.ours and "libnvidia-ml" not in row.ours


@AS_ROOT
def test_compute_policy_that_differs_from_the_hosts_is_a_mismatch(tmp_path: Path) -> None:
    root = nr.tool_root(tmp_path / "driver", "flat")

    def other(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 0, "GPU 0  Timeslice  Default\n", "")

    row = gpucheck_pod.compute_policy_row(DriverRoot.at(str(root.path)), needs("runc"), other)
    assert row.status == MISMATCH and row.theirs == "GPU 0  Timeslice  Default"


def test_compute_policy_needs_runc_and_root(tmp_path: Path) -> None:
    root = DriverRoot.at(str(tmp_path))
    never = host_smi  # not called when skipped
    assert gpucheck_pod.compute_policy_row(root, None, never).ours == "no runc on PATH"  # type: ignore[arg-type]
    row = gpucheck_pod.compute_policy_row(root, "runc", never, is_root=lambda: False)  # type: ignore[arg-type]
    assert (row.status, row.ours) == (SKIPPED, "needs root (runc)")


@AS_ROOT
def test_an_mps_client_in_another_pid_namespace_reaches_the_real_daemon(tmp_path: Path) -> None:
    needs("unshare")
    root = nr.tool_root(tmp_path / "driver", "flat")
    tools = DriverTools(DriverFiles(DriverRoot.at(str(root.path))), tmp_path / "driver-libs")
    gpu = Device(
        name="gpu-0", kind=KIND_GPU, index=0, minor=0, uuid="GPU-3abc3b62-14a9-570a-b5bd-deed2b9c3acb"
    )
    before = set(os.listdir("/proc"))
    (row,) = gpucheck_pod.mps_client_rows(gpu, tools)
    # No GPU: the root's libcuda, loaded in the other PID namespace, says so at its first call.
    assert row.status == MISMATCH and row.ours.startswith("client: cuInit returned "), row
    left = [p for p in set(os.listdir("/proc")) - before if p.isdigit() and mps.process_start_time(int(p))]
    assert not [
        p for p in left if "nvidia-cuda-mps" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
    ]


def test_mps_and_client_answers_are_read_as_pids(tmp_path: Path) -> None:
    assert gpucheck_pod.pids_of("1234\n5678\n") == [1234, 5678]
    assert gpucheck_pod.pids_of("") == [] and gpucheck_pod.pids_of("Server 12 not found") == []
    task = tmp_path / "42/task/42"
    task.mkdir(parents=True)
    (task / "children").write_text("43 ")
    assert gpucheck_pod.child_pids(42, tmp_path) == [43] and gpucheck_pod.child_pids(7, tmp_path) == []
