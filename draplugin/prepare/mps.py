"""MPS: one CUDA MPS control daemon per claim, started at prepare, stopped at unprepare.

The daemon is the driver's own `nvidia-cuda-mps-control -d`, run from the
driver root with `CUDA_VISIBLE_DEVICES` set to the claim's GPUs and the pipe
and log directories of the claim (`<state>/mps/<claim uid>/{pipe,log}`, the
pipe directory is what the claim's containers get mounted at
`/var/run/draplugin/mps/pipe`). Prepare waits until it answers
`get_default_active_thread_percentage`, then sets the config's default active
thread percentage and pinned device memory limit per device through the same
control interface (`set_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit <ordinal> <MiB>M`), before returning.

Lifetime, and why: the daemon belongs to the claim, not to the plugin process.
It is started in a session of its own (`start_new_session`; `-d` daemonizes
too), so a crash or restart of the plugin process does not stop it while its
pods run. The plugin finds it again from the sharing ledger: the PID the
daemon writes to `<pipe>/nvidia-cuda-mps-control.pid` plus the process start
time from `/proc/<pid>/stat` (a reused PID has another start time, so we never
signal a stranger). A Deployment per claim (NVIDIA's driver) would need an API
round trip and an image per prepare; a detached process needs neither. Limit:
in the chart the daemon is a process of the plugin's container and ends with
it (the runtime kills a container's processes when its main process exits);
the restarted plugin finds the recorded daemon gone and starts it again at
start-up (prepared claims are restored then). Where the plugin is a host
process (the e2e tests) it survives. After a reboot the daemon is gone with
everything else and the re-prepare starts it again.

Unprepare sends `quit`, waits for the process to exit (SIGKILL after a grace
period, only if PID and start time still match), and removes the directories.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from draplugin import crashpoints
from draplugin.prepare.claimconfig import MpsConfig, SharingStrategy
from draplugin.prepare.drivertools import run_tool
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from draplugin.prepare.plan import ClaimPlan, PlanError

log = logging.getLogger(__name__)

KIND = "mps"
KEY = "daemon"
CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
READY_COMMAND = "get_default_active_thread_percentage"
READY_TIMEOUT_S = 10.0
QUIT_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
_MIB = 1 << 20


class MpsError(PlanError):
    """The claim's MPS daemon could not be started, configured or stopped."""


@dataclass(frozen=True, slots=True)
class MpsSettings:
    """What one claim's daemon is started with: devices (UUIDs, in CUDA ordinal order) and limits."""

    devices: tuple[str, ...]
    active_thread_percentage: int | None
    # (CUDA ordinal within `devices`, limit in MiB)
    pinned_limits_mib: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, object]:
        return {
            "devices": list(self.devices),
            "activeThreadPercentage": self.active_thread_percentage,
            "pinnedLimitsMiB": [list(limit) for limit in self.pinned_limits_mib],
        }


def settings_for(plan: ClaimPlan) -> MpsSettings | None:
    """The daemon settings of a plan, or None when no device uses MPS."""
    devices = sorted(
        {d.device.name: d for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS}.values(),
        key=lambda d: d.device.name,
    )
    if not devices:
        return None
    mps = devices[0].config.sharing.mps or MpsConfig()
    limits = []
    for ordinal, planned in enumerate(devices):
        limit = mps.per_device_pinned_memory_limit.get(
            planned.device.name, mps.default_pinned_device_memory_limit
        )
        if limit is not None:
            limits.append((ordinal, -(-limit // _MIB)))  # whole MiB, rounded up: a limit never shrinks
    return MpsSettings(
        tuple(d.device.uuid for d in devices), mps.default_active_thread_percentage, tuple(limits)
    )


def process_start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot); None if no such process (or a zombie)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    if not fields or fields[0] == "Z":
        return None
    return int(fields[19])


class MpsDaemons:
    """Start, find and stop per-claim MPS control daemons. `control` gives the binary's path (driver root)."""

    def __init__(self, control: Callable[[], Path], *, proc: Path = Path("/proc")) -> None:
        self._control = control
        self._proc = proc

    def ensure(self, plan: ClaimPlan, directory: Path, ledger: SharingLedger) -> None:
        """A running, configured daemon for the claim: the ledger's one if it still runs, else a new one."""
        settings = settings_for(plan)
        if settings is None:
            return
        uid = plan.claim.uid
        entry = ledger.get(uid, KIND, KEY)
        if entry is not None:
            if (
                entry.state == "running"
                and entry.data.get("settings") == settings.to_json()
                and self._alive(entry)
            ):
                return
            self.stop(uid, ledger)  # died, half-started, or other limits: start over
        self._start(uid, settings, directory, ledger)

    def _start(self, uid: str, settings: MpsSettings, directory: Path, ledger: SharingLedger) -> None:
        pipe, logs = directory / "pipe", directory / "log"
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        control = self._control()
        env = self._env(pipe, logs, settings.devices)
        ledger.put(LedgerEntry(uid, KIND, KEY, "starting", {"pipe": str(pipe), "log": str(logs)}))
        run_tool(
            [str(control), "-d"],
            error=MpsError,
            reason="MpsStartFailed",
            what=f"starting {control} -d",
            timeout_s=COMMAND_TIMEOUT_S,
            env=env,
            new_session=True,  # the claim's daemon outlives this plugin process
        )
        crashpoints.reach(crashpoints.AFTER_MPS_START)
        self._wait_ready(control, env)
        pid = self._pid(pipe)
        for command in self._commands(settings):
            self.command(control, env, command)
        ledger.put(
            LedgerEntry(
                uid,
                KIND,
                KEY,
                "running",
                {
                    "pipe": str(pipe),
                    "log": str(logs),
                    "pid": pid,
                    "startTime": process_start_time(pid, self._proc),
                    "settings": settings.to_json(),
                },
            )
        )
        log.info(
            "MPS control daemon running",
            extra={"claim_uid": uid, "pid": pid, "devices": ",".join(settings.devices)},
        )

    @staticmethod
    def _commands(settings: MpsSettings) -> list[str]:
        commands = []
        if settings.active_thread_percentage is not None:
            commands.append(f"set_default_active_thread_percentage {settings.active_thread_percentage}")
        commands.extend(
            f"set_default_device_pinned_mem_limit {ordinal} {mib}M"
            for ordinal, mib in settings.pinned_limits_mib
        )
        return commands

    def command(self, control: Path, env: Mapping[str, str], command: str) -> str:
        """One control command (`echo <command> | nvidia-cuda-mps-control`); its answer, or MpsError."""
        return run_tool(
            [str(control)],
            error=MpsError,
            reason="MpsControlFailed",
            what=f"MPS control command {command!r}",
            timeout_s=COMMAND_TIMEOUT_S,
            env=env,
            stdin=command + "\n",
        )

    def _wait_ready(self, control: Path, env: Mapping[str, str]) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            try:
                self.command(control, env, READY_COMMAND)
                return
            except MpsError as err:
                last = str(err)
            time.sleep(0.1)
        raise MpsError(
            "MpsNotReady", f"the MPS control daemon did not answer within {READY_TIMEOUT_S:.0f}s: {last}"
        )

    def _pid(self, pipe: Path) -> int:
        try:
            return int((pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError) as err:
            raise MpsError(
                "MpsStartFailed", f"the MPS control daemon wrote no PID file in {pipe}: {err}"
            ) from None

    def _alive(self, entry: LedgerEntry) -> bool:
        pid, start = entry.data.get("pid"), entry.data.get("startTime")
        return isinstance(pid, int) and start is not None and process_start_time(pid, self._proc) == start

    def stop(self, uid: str, ledger: SharingLedger) -> None:
        """`quit` the claim's daemon (also one that was still starting) and forget it. Safe to repeat."""
        entry = ledger.get(uid, KIND, KEY)
        if entry is None:
            return
        pipe, logs = Path(str(entry.data["pipe"])), Path(str(entry.data["log"]))
        pid, start = self._identity(entry, pipe)
        if pid is not None and start is not None:
            try:
                self.command(self._control(), self._env(pipe, logs, ()), "quit")
            except (MpsError, PlanError) as err:
                log.warning(
                    "MPS quit failed, killing the daemon", extra={"claim_uid": uid, "error": str(err)}
                )
            deadline = time.monotonic() + QUIT_TIMEOUT_S
            while process_start_time(pid, self._proc) == start and time.monotonic() < deadline:
                time.sleep(0.05)
            if process_start_time(pid, self._proc) == start:
                os.kill(pid, signal.SIGKILL)  # same PID and start time: still our daemon
        # A daemon that died leaves its pipes and PID file; a new one must not find them.
        shutil.rmtree(pipe, ignore_errors=True)
        ledger.drop(uid, KIND, KEY)
        log.info("MPS control daemon stopped", extra={"claim_uid": uid, "pid": pid})

    def _identity(self, entry: LedgerEntry, pipe: Path) -> tuple[int | None, int | None]:
        if entry.state == "running":
            pid = entry.data.get("pid")
            if isinstance(pid, int):
                start = process_start_time(pid, self._proc)
                return (pid, start) if start == entry.data.get("startTime") else (None, None)
            return None, None
        # Killed before the record: the daemon's own PID file says who it is.
        try:
            pid = int((pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None, None
        return pid, process_start_time(pid, self._proc)

    def _env(self, pipe: Path, logs: Path, devices: Sequence[str]) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        return env
