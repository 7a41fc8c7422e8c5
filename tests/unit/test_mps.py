"""MPS at prepare: one control daemon per claim, from the driver root, configured, found again, stopped.

Against the stand-in `nvidia-cuda-mps-control` of a fake driver root
(`tests/driverroot_layout.py`): a real background process serving named pipes
in the claim's pipe directory, recording every command it gets.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from draplugin import crashpoints
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare import mps, mpspaths
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim, render_spec
from draplugin.prepare.sharing import SharingState
from tests.unit import sharing_fixtures
from tests.unit.sharing_fixtures import ToolNode, kill_daemon
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, config, gpu_config, result

LIMITS = {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}


# Stand-in daemon: these tests assert the exact control commands recorded (and kill it at will);
# the real daemon and server: tests/unit/test_drivertools.py.
tool_node = sharing_fixtures.tool_node  # the fixture: a state dir next to a stand-in driver root


class Killed(BaseException):
    """SIGKILL at a crash point: escapes every handler."""


def mps_plan(uid: str = "uid-a", devices: tuple[str, ...] = ("gpu-0",), **settings: object) -> ClaimPlan:
    mps_config = gpu_config("MPS", mpsConfig=settings or LIMITS)
    doc = claim_doc(
        uid, [result(f"r{i}", d) for i, d in enumerate(devices)], [config("FromClaim", mps_config)]
    )
    return plan_claim(ClaimRef("ns", uid, "claim"), doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def daemon_commands(node: ToolNode) -> list[str]:
    return [c.split(": ", 1)[1].strip() for c in node.commands() if c.startswith("mps-daemon")]


def test_prepare_starts_a_configured_daemon_for_the_claim(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    plan = mps_plan(devices=("gpu-0", "gpu-1"))
    sharing.apply(plan)
    pipe = sharing.mps_dir("uid-a") / "pipe"
    starts = [c for c in tool_node.commands() if c.startswith("nvidia-cuda-mps-control -d")]
    assert starts == [
        f"nvidia-cuda-mps-control -d pipe={pipe} log={pipe.parent / 'log'} "
        f"CUDA_VISIBLE_DEVICES={DEVICES['gpu-0'].uuid},{DEVICES['gpu-1'].uuid}"
    ]
    # Ready (it answered), then the limits through the control interface; ordinals as in
    # CUDA_VISIBLE_DEVICES.
    assert daemon_commands(tool_node) == [
        "get_default_active_thread_percentage",
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_device_pinned_mem_limit 1 10240M",
    ]
    assert stat.S_ISFIFO((pipe / "control").stat().st_mode)
    (entry,) = sharing.ledger.entries("uid-a", mps.KIND)
    assert entry.state == "running" and entry.data["pid"] in tool_node.daemon_pids()
    # The daemon answers with what it was set to.
    assert sharing.mps is not None
    answer = sharing.mps.command(
        {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, "get_default_active_thread_percentage"
    )
    assert answer == "50.0"
    # The containers get the pipe directory and the variables pointing at it.
    edits = render_spec(plan, sharing.host_dir_for(plan)).to_json()["devices"][0]["containerEdits"]
    assert edits["mounts"][0]["hostPath"] == str(pipe.parent)
    assert "CUDA_MPS_PIPE_DIRECTORY=/var/run/draplugin/mps/pipe" in edits["env"]


def test_per_device_limits_and_no_limits(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan(devices=("gpu-0", "gpu-1"), perDevicePinnedMemoryLimit={"gpu-1": "1Gi"}))
    assert daemon_commands(tool_node)[1:] == ["set_default_device_pinned_mem_limit 1 1024M"]


def test_repeated_prepare_and_a_plugin_restart_reuse_the_running_daemon(tool_node: ToolNode) -> None:
    tool_node.sharing().apply(mps_plan())
    (pid,) = tool_node.daemon_pids()
    tool_node.sharing().apply(mps_plan())  # a new plugin process: found again from the ledger
    assert tool_node.daemon_pids() == [pid]
    assert len([c for c in tool_node.commands() if c.startswith("nvidia-cuda-mps-control -d")]) == 1


def test_a_daemon_that_died_is_started_again(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan())
    (pid,) = tool_node.daemon_pids()
    kill_daemon(pid)
    sharing.apply(mps_plan())
    (again,) = tool_node.daemon_pids()
    assert again != pid


def test_unprepare_quits_the_daemon_and_removes_its_state(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan())
    sharing.release("uid-a")
    assert "quit" in daemon_commands(tool_node) and tool_node.daemon_pids() == []
    assert not sharing.mps_dir("uid-a").exists() and sharing.ledger.entries() == []
    sharing.release("uid-a")  # repeated: nothing left to do


def test_two_claims_get_two_daemons(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan("uid-a", ("gpu-0",)))
    sharing.apply(mps_plan("uid-b", ("gpu-1",)))
    assert len(tool_node.daemon_pids()) == 2
    sharing.release("uid-a")
    assert len(tool_node.daemon_pids()) == 1


@pytest.mark.parametrize("point", [crashpoints.AFTER_MPS_START])
def test_kill_after_start_before_the_record_leaves_a_daemon_start_up_stops(
    tool_node: ToolNode, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    def reach(at: str) -> None:
        if at == point:
            raise Killed(at)

    monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(Killed):
        tool_node.sharing().apply(mps_plan())
    monkeypatch.undo()
    assert len(tool_node.daemon_pids()) == 1  # running, the ledger only says "starting"
    restarted = tool_node.sharing()
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert tool_node.daemon_pids() == [] and restarted.ledger.entries() == []
    restarted.apply(mps_plan())  # the kubelet's retry: same answer, one daemon
    assert len(tool_node.daemon_pids()) == 1


def test_a_daemon_that_does_not_start_fails_prepare_and_leaves_nothing(tool_node: ToolNode) -> None:
    control = tool_node.driver_root / "usr/bin" / mps.CONTROL
    control.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2\nexit 1\n")
    sharing = tool_node.sharing()
    with pytest.raises(PlanError) as err:
        sharing.apply(mps_plan())
    assert err.value.reason == "MpsStartFailed" and "already running" in str(err.value)
    assert sharing.ledger.entries() == [] and not sharing.mps_dir("uid-a").exists()


def test_mps_without_a_driver_root_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError) as err:
        SharingState(tmp_path).apply(mps_plan())
    assert err.value.reason == "MpsUnavailable" and "--driver-root" in str(err.value)


def test_settings_follow_the_config() -> None:
    settings = mps.settings_for(mps_plan(devices=("gpu-1", "gpu-0"), defaultPinnedDeviceMemoryLimit="1500Mi"))
    assert settings is not None
    assert settings.devices == (DEVICES["gpu-0"].uuid, DEVICES["gpu-1"].uuid)
    assert settings.active_thread_percentage is None and settings.pinned_limits_mib == ((0, 1500), (1, 1500))


def test_process_start_time_tells_a_reused_pid_apart(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (sh (x)) S " + " ".join(["1"] * 18) + " 777 0 0\n")
    assert mps.process_start_time(42, tmp_path) == 777
    assert mps.process_start_time(43, tmp_path) is None
    assert mps.process_start_time(os.getpid()) is not None


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@needs_root
def test_the_claims_shm_is_a_sized_tmpfs_gone_at_unprepare(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan())
    shm = sharing.mps_dir("uid-a") / mpspaths.SHM_DIR
    (line,) = [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if f" {shm} " in m]
    assert " - tmpfs shm " in line and f"size={sharing_fixtures.SHM_BYTES // 1024}k" in line
    assert "nosuid" in line and "nodev" in line and "noexec" in line
    assert shm.stat().st_mode & 0o7777 == 0o1777
    sharing.release("uid-a")
    assert mps.mounts_at(shm) == 0 and not sharing.mps_dir("uid-a").exists()


@needs_root
@pytest.mark.parametrize("step", ["after the mount", "after the start"])
def test_kill_at_any_step_leaves_no_mount_once_start_up_has_run(
    tool_node: ToolNode, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    mount = mps.mount_shm

    def mount_then_die(path: Path, size: int) -> None:
        mount(path, size)
        raise Killed(step)

    def reach(at: str) -> None:
        if at == crashpoints.AFTER_MPS_START:
            raise Killed(at)

    if step == "after the mount":
        monkeypatch.setattr(mps, "mount_shm", mount_then_die)
    else:
        monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(Killed):
        tool_node.sharing().apply(mps_plan())
    monkeypatch.undo()
    shm = tool_node.state / "mps/uid-a" / mpspaths.SHM_DIR
    assert mps.mounts_at(shm) == 1  # killed: the tmpfs is there, the ledger says "starting"
    restarted = tool_node.sharing()
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert mps.mounts_at(shm) == 0 and not shm.parent.exists() and tool_node.daemon_pids() == []


@needs_root
def test_a_mount_no_ledger_entry_explains_is_removed_at_start_up(tool_node: ToolNode) -> None:
    sharing = tool_node.sharing()
    sharing.apply(mps_plan())
    shm = sharing.mps_dir("uid-a") / mpspaths.SHM_DIR
    # Taken now: the release removes the PID files, and a daemon no ledger entry names is left
    # running by design (it cannot be told from a stranger's process), so the test stops its own.
    daemons = tool_node.daemon_pids()
    # The record is lost (the daemon and its tmpfs are not).
    (tool_node.state / "sharing-ledger.json").unlink()
    restarted = tool_node.sharing()
    try:
        assert restarted.release_orphans(prepared=set()) == ["uid-a"]
        assert mps.mounts_at(shm) == 0 and not shm.parent.exists()
    finally:
        for pid in daemons:
            kill_daemon(pid)


def test_mps_shm_size_setting() -> None:
    from draplugin import config

    assert config.load({"node_name": "n"}, {}).mps_shm_size is None
    assert config.load({"node_name": "n"}, {"MPS_SHM_SIZE": "8Gi"}).mps_shm_size == 8 << 30
    assert config.load({"node_name": "n", "mps_shm_size": "0"}, {}).mps_shm_size == 0
    with pytest.raises(config.ConfigError, match=r"--mps-shm-size \(MPS_SHM_SIZE\)"):
        config.load({"node_name": "n", "mps_shm_size": "lots"}, {})


def test_default_shm_size_is_half_the_node_memory(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       16384000 kB\nMemFree: 1 kB\n")
    assert mps.default_shm_bytes(tmp_path / "meminfo") == 16384000 * 1024 // 2
    assert mps.default_shm_bytes(tmp_path / "none") == mps.SHM_FALLBACK_BYTES
