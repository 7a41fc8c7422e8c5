"""A node's sharing machinery on a fake driver root whose tools are recording stand-ins."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.prepare import mps
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.mps import MpsDaemons
from draplugin.prepare.sharing import SharingState
from draplugin.prepare.timeslice import TimeSlicer
from tests.driverroot_layout import TOOL_STATE, command_log, debian_layout

SHM_BYTES = 16 << 20


def shm_bytes() -> int:
    """Each claim's MPS tmpfs where this test may mount one (root), else a plain directory."""
    return SHM_BYTES if os.geteuid() == 0 else 0


@dataclass
class ToolNode:
    """State dir + driver root; `sharing()` is what one plugin process would build."""

    state: Path
    driver_root: Path

    def sharing(self) -> SharingState:
        tools = DriverTools(DriverFiles(DriverRoot.at(str(self.driver_root))), self.state / "driver-libs")
        return SharingState(
            self.state,
            mps_daemons=MpsDaemons(tools, shm_bytes=shm_bytes()),
            time_slicer=TimeSlicer(tools),
        )

    def commands(self) -> list[str]:
        return command_log(self.driver_root)

    def timeslice_of(self, gpu: str) -> str:
        """The level the stand-in nvidia-smi last set on the GPU ('0' when never set)."""
        path = self.driver_root / TOOL_STATE / f"timeslice-{gpu}"
        return path.read_text().strip() if path.exists() else "0"

    def compute_mode_of(self, gpu: str) -> str:
        """The compute mode the stand-in nvidia-smi last set on the GPU ('Default' when never set)."""
        path = self.driver_root / TOOL_STATE / f"computemode-{gpu}"
        return path.read_text().strip() if path.exists() else "Default"

    def daemon_pids(self) -> list[int]:
        """PIDs of stand-in MPS daemons that still run, from their pid files."""
        pids = []
        for pid_file in self.state.glob(f"mps/*/pipe/{mps.PID_FILE}"):
            pid = int(pid_file.read_text())
            if mps.process_start_time(pid) is not None:
                pids.append(pid)
        return pids


def kill_daemon(pid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL a daemon and wait until it is gone (a kill is delivered asynchronously)."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while mps.process_start_time(pid) is not None:
        assert time.monotonic() < deadline, f"process {pid} still runs after SIGKILL"
        time.sleep(0.01)


@pytest.fixture
def tool_node(tmp_path: Path) -> Iterator[ToolNode]:
    node = ToolNode(tmp_path / "state", debian_layout().build(tmp_path / "driver-root"))
    yield node
    for pid in node.daemon_pids():  # a failing test must not leave daemons running
        os.kill(pid, signal.SIGKILL)
    for shm in node.state.glob("mps/*/shm"):  # nor a claim's tmpfs mounted
        mps.release_shm(shm)
