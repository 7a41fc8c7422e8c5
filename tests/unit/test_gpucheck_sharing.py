"""`make gpu-check`'s sharing rows without a GPU: fake NVML and the stand-in tools of a fake driver root.

MPS runs the stand-in `nvidia-cuda-mps-control` (a real daemon on named
pipes), the time-slice the stand-in `nvidia-smi compute-policy` (which keeps
the level per GPU), MIG the fake NVML's instances; each row is checked
against what the stand-ins recorded and what is left afterwards, and each
check is broken once to show its row turns into a MISMATCH while the check
still cleans up.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.devices.model import Device
from draplugin.devices.nvml import NvmlBackend
from draplugin.gpucheck import sharing as gpucheck_sharing
from draplugin.gpucheck.smi import parse_smi_xml
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row
from draplugin.prepare import mps
from draplugin.prepare.drivertools import DriverTools
from tests.driverroot_layout import TOOL_STATE, command_log
from tests.unit.fakenvml import FakeNvml, a10g, h100_with_mig
from tests.unit.test_gpucheck import SMI_XML, by_check, fake_listing, mig_caps_root, native_root, rows_for

# Python fake: an A10G without MIG support (no model of the NVML double) in a fixed nvidia-smi -q -x.
# Stand-ins stay here: these rows are checked against the exact commands the stand-ins record, and
# the real nvidia-smi's compute-policy cannot run on the NVML double (its export table). The real
# binaries: tests/unit/test_drivertools.py, test_gpucheck_pod.py, test_gpucheck_mig.py.
A10G = "GPU-99999999-0000-0000-0000-000000000000"
H100 = "GPU-11111111-2222-3333-4444-555555555555"


def statuses(rows: list[Row], *checks: str) -> list[tuple[str, str]]:
    return [(r.check, r.status) for r in rows if r.check in checks]


def driver_root_of(tmp_path: Path) -> Path:
    return tmp_path / "driver"


def running_daemons(root: Path) -> list[int]:
    """Stand-in MPS daemons still running (the log records each one's PID as it serves)."""
    pids = {int(line.split()[1].rstrip(":")) for line in command_log(root) if line.startswith("mps-daemon ")}
    return sorted(pid for pid in pids if mps.process_start_time(pid) is not None)


@pytest.fixture(autouse=True)
def no_daemon_left_behind(tmp_path: Path) -> object:
    yield None
    for pid in running_daemons(driver_root_of(tmp_path)):
        os.kill(pid, signal.SIGKILL)


def test_mps_timeslice_and_mig_rows_pass_on_the_fake_and_leave_nothing(tmp_path: Path) -> None:
    nvml = FakeNvml([h100_with_mig(), a10g()])
    migs_before = [m.uuid for m in nvml.gpus[0].migs if m is not None]
    rows = rows_for(tmp_path, nvml=nvml)
    root = driver_root_of(tmp_path)
    sharing = [r for r in rows if r.check.startswith(("MPS", "time-slice", "MIG create", "MIG destroy"))]
    assert [r for r in sharing if r.status == MISMATCH] == []
    # MPS and time-slice on the whole GPU (the H100 runs MIG: it has no whole-GPU device).
    # As root the GPU is in EXCLUSIVE_PROCESS mode while the daemon runs, and back after it.
    root_only = os.geteuid() == 0
    mode = "EXCLUSIVE_PROCESS" if root_only else "needs root (nvidia-smi -c)"
    assert [(r.check, r.subject, r.ours) for r in sharing if r.check.startswith("MPS")] == [
        ("MPS start", f"gpu-1 ({A10G})", "answered"),
        ("MPS compute mode", f"gpu-1 ({A10G})", mode),
        ("MPS thread %", f"gpu-1 ({A10G})", "50.0"),
        ("MPS pinned memory", f"gpu-1 ({A10G})", "1024M"),
        ("MPS stop", f"gpu-1 ({A10G})", "exited"),
        *([("MPS compute mode restored", f"gpu-1 ({A10G})", "DEFAULT")] if root_only else []),
        ("MPS client limits", f"gpu-1 ({A10G})", "not yet run: needs a CUDA client process"),
    ]
    (client,) = by_check(rows, "MPS client limits")
    assert client.status == SKIPPED
    assert [(r.check, r.ours) for r in sharing if r.check.startswith("time-slice")] == [
        ("time-slice set", "Medium (2)"),
        ("time-slice reset", "Default (0)"),
    ]
    # MIG on the H100 (MIG mode on); the A10G has none, and its row says so.
    create, destroy = by_check(rows, "MIG create")[0], by_check(rows, "MIG destroy")[0]
    assert create.status == OK and create.ours.startswith("MIG-") and destroy.ours == "gone"
    (skipped,) = [r for r in by_check(rows, "MIG create") if r.status == SKIPPED]
    assert A10G in skipped.subject and skipped.ours == "this GPU does not support MIG"
    # Through prepare's code, as the stand-ins recorded it: the daemon for the GPU with both limits,
    # then quit; the time-slice set and back to the default.
    log = command_log(root)
    assert any(
        line.startswith("nvidia-cuda-mps-control -d") and f"CUDA_VISIBLE_DEVICES={A10G}" in line
        for line in log
    )
    served = [
        line.split(": ", 1)[1].strip() for line in log if line.startswith("mps-daemon") and ": " in line
    ]
    assert served == [
        "get_default_active_thread_percentage",  # ready
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 1024M",
        "get_default_active_thread_percentage",  # the rows' questions
        "get_default_device_pinned_mem_limit 0",
        "quit",
        "exit",  # the daemon's own last line
    ]
    smi = [line for line in log if "--set-timeslice" in line]
    assert smi == [f"nvidia-smi compute-policy -i {A10G} --set-timeslice {n}" for n in (2, 0)]
    # Nothing left: no daemon, the default time-slice, exactly the MIG devices there were before.
    assert running_daemons(root) == []
    assert (root / TOOL_STATE / f"timeslice-{A10G}").read_text().strip() == "0"
    assert [m.uuid for m in nvml.gpus[0].migs if m is not None] == migs_before


def test_a_daemon_that_ignores_the_limits_is_a_mismatch_and_is_still_stopped(tmp_path: Path) -> None:
    root = native_root(tmp_path).mounted
    control = root / "usr/bin" / mps.CONTROL
    control.rename(control.with_name("mps-control.real"))
    # A client that drops every set_* command: the daemon keeps its defaults.
    control.write_text(
        '#!/bin/sh\n[ $# -gt 0 ] && exec "$(dirname "$0")/mps-control.real" "$@"\n'
        'grep -v "^set_" | "$(dirname "$0")/mps-control.real"\n'
    )
    control.chmod(0o755)
    rows = gpucheck_sharing.mps_rows(gpu_1(), tools_of(root))
    assert statuses(rows, "MPS start", "MPS thread %", "MPS pinned memory", "MPS stop") == [
        ("MPS start", OK),
        ("MPS thread %", MISMATCH),
        ("MPS pinned memory", MISMATCH),
        ("MPS stop", OK),
    ]
    assert by_check(rows, "MPS thread %")[0].ours == "100.0"
    assert running_daemons(root) == []


def test_a_daemon_that_does_not_start_is_a_mismatch_with_the_tools_words(tmp_path: Path) -> None:
    root = native_root(tmp_path).mounted
    (root / "usr/bin" / mps.CONTROL).write_text(
        "#!/bin/sh\necho 'MPS is not supported on this GPU' >&2\nexit 1\n"
    )
    rows = gpucheck_sharing.mps_rows(gpu_1(), tools_of(root))
    (start,) = by_check(rows, "MPS start")
    assert start.status == MISMATCH and "MpsStartFailed" in start.ours and "not supported" in start.ours
    (stop,) = by_check(rows, "MPS stop")
    assert stop.status == OK  # the half-started daemon's record was undone


def test_a_time_slice_that_does_not_take_is_a_mismatch_and_is_reset(tmp_path: Path) -> None:
    root = native_root(tmp_path).mounted
    smi = root / "usr/bin/nvidia-smi"
    # --set-timeslice answers success but keeps the GPU at the default.
    smi.write_text(smi.read_text().replace('echo "$level" > "$STATE/timeslice-$gpu"', "true"))
    rows = gpucheck_sharing.timeslice_rows(gpu_1(), tools_of(root))
    assert statuses(rows, "time-slice set", "time-slice reset") == [
        ("time-slice set", MISMATCH),
        ("time-slice reset", OK),
    ]
    assert by_check(rows, "time-slice set")[0].ours == "Default (0)"
    assert [line for line in command_log(root) if "--set-timeslice" in line][-1].endswith("--set-timeslice 0")


def test_a_gpu_that_runs_another_time_slice_is_left_alone(tmp_path: Path) -> None:
    root = native_root(tmp_path).mounted
    state = root / TOOL_STATE
    state.mkdir(parents=True, exist_ok=True)
    (state / f"timeslice-{A10G}").write_text("3\n")
    rows = gpucheck_sharing.timeslice_rows(gpu_1(), tools_of(root))
    assert [(r.status, r.ours) for r in rows] == [(SKIPPED, "runs Long (3) already: left alone")]
    assert (state / f"timeslice-{A10G}").read_text().strip() == "3"
    assert not [line for line in command_log(root) if "--set-timeslice" in line]


def test_time_slice_needs_root(tmp_path: Path) -> None:
    tools = tools_of(native_root(tmp_path).mounted)
    (row,) = gpucheck_sharing.timeslice_rows(gpu_1(), tools, is_root=lambda: False)
    assert (row.status, row.ours) == (SKIPPED, "needs root (nvidia-smi compute-policy)")


def test_mig_mode_off_is_a_skipped_row_that_says_so(tmp_path: Path) -> None:
    off = SMI_XML.replace("<current_mig>Enabled</current_mig>", "<current_mig>Disabled</current_mig>")
    nvml = FakeNvml([h100_with_mig(), a10g()])
    (gpu, _) = parse_smi_xml(off)
    rows = gpucheck_sharing.mig_rows(
        [gpu], [], NvmlBackend("n", nvml=nvml, partitionable=True), fake_listing(nvml)
    )
    assert [(r.status, r.ours.split(" (")[0]) for r in rows] == [(SKIPPED, "MIG mode is off")]


def test_a_mig_device_that_nvidia_smi_still_lists_after_destroy_is_a_mismatch(tmp_path: Path) -> None:
    nvml = FakeNvml([h100_with_mig(), a10g()])
    backend = NvmlBackend("n", nvml=nvml, partitionable=True, proc_root=mig_caps_root(tmp_path))
    listing = fake_listing(nvml)
    seen: list[str] = []

    def stale() -> str:  # a listing taken once, after the create, and never again
        if not seen:
            seen.append(listing())
        return seen[0]

    smi = parse_smi_xml(SMI_XML)
    rows = gpucheck_sharing.mig_rows(smi, backend.discover(), backend, stale)
    assert statuses(rows, "MIG create", "MIG destroy")[:2] == [
        ("MIG create", OK),
        ("MIG destroy", MISMATCH),
    ]
    assert "still there" in by_check(rows, "MIG destroy")[0].ours


def test_a_mig_create_that_fails_is_a_mismatch_and_leaves_no_instance(tmp_path: Path) -> None:
    nvml = FakeNvml([h100_with_mig(), a10g()])
    before = [m.uuid for m in nvml.gpus[0].migs if m is not None]
    # No nvidia-caps access files: a container could not use the instance, so the create is undone.
    backend = NvmlBackend("n", nvml=nvml, partitionable=True, proc_root=str(tmp_path / "empty-proc"))
    rows = gpucheck_sharing.mig_rows(parse_smi_xml(SMI_XML), backend.discover(), backend, fake_listing(nvml))
    (create,) = [r for r in by_check(rows, "MIG create") if r.status != SKIPPED]
    assert create.status == MISMATCH and "nvidia-caps" in create.ours
    assert [m.uuid for m in nvml.gpus[0].migs if m is not None] == before


def test_sizes_and_levels_as_the_tools_print_them() -> None:
    assert [gpucheck_sharing.mib_of(s) for s in ("1024M", "1G", "1024 MiB", "0.5G", "lots")] == [
        1024,
        1024,
        1024,
        512,
        None,
    ]
    assert gpucheck_sharing.listed_level(f"GPU {A10G} timeslice: 2") == 2
    assert gpucheck_sharing.listed_level("Timeslice : Medium") == 2
    assert gpucheck_sharing.listed_level("No compute policies") is None


def tools_of(root: Path) -> DriverTools:
    """The driver root's tools as gpu-check builds them (library links next to the root)."""
    return DriverTools(DriverFiles(DriverRoot.at(str(root))), root.parent / "driver-libs")


def gpu_1() -> Device:
    (gpu,) = [d for d in NvmlBackend("n", nvml=FakeNvml([a10g()])).discover() if d.uuid == A10G]
    return gpu


def test_mig_mode_off_says_hopper_needs_no_reset() -> None:
    off = SMI_XML.replace("<current_mig>Enabled</current_mig>", "<current_mig>Disabled</current_mig>")
    nvml = FakeNvml([h100_with_mig(), a10g()])
    (gpu, _) = parse_smi_xml(off)
    (row,) = gpucheck_sharing.mig_rows(
        [gpu], [], NvmlBackend("n", nvml=nvml, partitionable=True), fake_listing(nvml)
    )
    # Turning MIG mode on needs a GPU reset on Ampere only; Hopper and later take it at once.
    assert "nvidia-smi -i" in row.ours and "Ampere" in row.ours and "Hopper" in row.ours
