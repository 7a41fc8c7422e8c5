"""MPS: a CUDA MPS control daemon, started at prepare, stopped at unprepare.

Whose: a claim's own for GPUs it has to itself (named by its UID, below), or
a shared GPU's, started with its first share and stopped with its last
(`draplugin.prepare.mpsgpu`, named `gpu-<hash of its UUID>`: "claim" below is
then that name). Either way the daemon's GPUs are in EXCLUSIVE_PROCESS
compute mode from before it starts until after it stops
(`draplugin.prepare.computemode`).

The daemon is the driver's own `nvidia-cuda-mps-control`, run from the
driver root with `CUDA_VISIBLE_DEVICES` set to the claim's GPUs and the pipe
and log directories of the claim (`<state>/mps/<claim uid>/{pipe,log}`, the
pipe directory is what the claim's containers get mounted at
`/var/run/draplugin/mps/pipe`). Prepare waits until it answers
`get_default_active_thread_percentage`, then sets the config's default active
thread percentage and pinned device memory limit per device through the same
control interface (`set_default_active_thread_percentage`,
`set_default_device_pinned_mem_limit <ordinal> <MiB>M`), before returning.
Unprepare sends `quit`, waits for the daemon to exit (forces it after a grace
period), and removes the directories.

Shared memory: the MPS server and its clients exchange memory segments through
`/dev/shm`, so the daemon and the claim's containers get one directory as
theirs, `<state>/mps/<claim uid>/shm`: a tmpfs of `--mps-shm-size` (default
half the node's memory, as NVIDIA's DRA driver sizes it; `0`: a plain
directory, for a plugin that may not mount), mounted `nosuid,nodev,noexec`
with mode 1777 like a `/dev/shm`, so segments live in memory, not on the state
dir's disk, and a claim cannot fill that disk. The ledger's `starting` entry is
written before the mount, so a kill -9 at any later step leaves a record that
unprepare or start-up's orphan sweep acts on: they unmount it (every mount at
that path, lazily, so a process still holding a segment cannot keep it
mounted) and remove the directory; a claim directory that no ledger entry
explains is unmounted the same way before it is removed (`release_shm`).

Lifetime: the daemon belongs to the claim, not to the plugin process. CUDA
clients hold a connection to their daemon, so a daemon that is restarted is no
help: it must not stop when the plugin does. Where it runs is a `DaemonRunner`,
chosen by `--mps-daemon` (`draplugin.config`):

- `pod` (the chart's default, `draplugin.prepare.mpspod`): a Pod per claim,
  pinned to this node by `nodeName`, that runs the driver root's
  `nvidia-cuda-mps-control -f` in the foreground with the claim's directory
  and the driver root mounted from the host. Why a Pod: every process of a
  container dies with the container (its PID namespace and cgroup go), so in
  the chart's DaemonSet no process of the plugin, detached or not, survives a
  container restart, a crash loop or a rolling update; a Pod of its own is
  the one unit the kubelet keeps running independently of ours. A bare Pod,
  not a Deployment per claim as NVIDIA's driver has: a Deployment would
  restart a daemon that died, and a restarted daemon serves none of the
  clients the old one had (the claim's pods must be restarted anyway), while
  it adds a controller round trip to every prepare. The plugin talks to the
  daemon exactly as in the process mode, through the pipe directory on the
  host, and records the Pod's name and UID in the sharing ledger.
- `process` (outside Kubernetes: the tests' host plugin, a plugin run on the
  host): a detached process of the plugin (`-d`, in a session of its own), so
  a crash or restart of a plugin *process* does not stop it. The ledger
  records the PID the daemon writes to `<pipe>/nvidia-cuda-mps-control.pid`
  plus its start time from `/proc/<pid>/stat` (a reused PID has another start
  time, so a stranger is never signalled). In a container this mode ends with
  the container, which is why the chart does not use it.

Either way the plugin finds the daemon again from the sharing ledger at
start-up and re-prepare (`ensure` keeps a daemon that still runs with the same
limits), and start-up stops every daemon no prepared claim holds (the ledger's,
and in the pod mode every daemon Pod on this node labelled with a claim UID the
checkpoint does not hold). After a reboot the daemon is gone with everything
else and the re-prepare starts it again.

Size: one daemon's life (start, its /dev/shm, readiness, limits, stop) in the order prepare runs it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from draplugin import crashpoints
from draplugin.prepare import computemode
from draplugin.prepare.computemode import ComputeModes
from draplugin.prepare.drivertools import DriverTools, run_tool
from draplugin.prepare.errors import PlanError
from draplugin.prepare.gpuconfig import MpsConfig, SharingStrategy
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from draplugin.prepare.mpspaths import SHM_DIR

if TYPE_CHECKING:  # for the annotations only: the sharing mechanisms load without planning
    from draplugin.prepare.plan import ClaimPlan

log = logging.getLogger(__name__)

KIND = "mps"
KEY = "daemon"
CONTROL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
READY_COMMAND = "get_default_active_thread_percentage"
READY_TIMEOUT_S = 10.0
READY_POLL_S = 0.1
QUIT_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
_MIB = 1 << 20
# NVIDIA's DRA driver: half of MemTotal, 65536k when /proc/meminfo cannot be read.
SHM_FALLBACK_BYTES = 65536 * 1024
# mount(2) and umount2(2) flags (linux/fs.h, sys/mount.h).
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2
_OCTAL = re.compile(r"\\([0-7]{3})")


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


def default_shm_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Half the node's memory (MemTotal), the default size of a claim's MPS tmpfs, as NVIDIA's driver."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                number, _, unit = line.split(":", 1)[1].strip().partition(" ")
                scale = {"": 1, "kB": 1024, "mB": _MIB}.get(unit.strip(), 1024)
                return int(number) * scale // 2
    except (OSError, ValueError):
        pass
    return SHM_FALLBACK_BYTES


def mounts_at(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> int:
    """How many mounts are stacked at `path` in this process's mount namespace."""
    where = os.path.realpath(path)
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return 0
    # Field 5 is the mount point, with space, tab, newline and backslash octal-escaped.
    points = (_OCTAL.sub(lambda m: chr(int(m[1], 8)), line.split(" ")[4]) for line in lines if line)
    return sum(point == where for point in points)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_shm(path: Path, size_bytes: int) -> None:
    """Mount a tmpfs of `size_bytes` at `path` (an existing directory), like a /dev/shm."""
    options = f"size={size_bytes},mode=1777".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    where = os.path.realpath(path).encode()
    if _libc().mount(b"shm", where, b"tmpfs", flags, options) != 0:
        errno = ctypes.get_errno()
        raise MpsError(
            "MpsShmFailed",
            f"cannot mount a tmpfs of {size_bytes} bytes at {path} for the MPS daemon's /dev/shm: "
            f"{os.strerror(errno)} (the plugin needs CAP_SYS_ADMIN, and in a pod its state dir mounted "
            "with mountPropagation: Bidirectional; --mps-shm-size=0 keeps a plain directory)",
        )


def release_shm(path: Path) -> None:
    """Unmount every mount at `path` (detached: a process still holding a segment cannot keep it
    mounted), then remove the directory. Safe to repeat; MpsError if a mount stays."""
    for _ in range(16):  # a mount stacked on a mount (a retried start): each goes
        if not mounts_at(path):
            break
        if _libc().umount2(os.path.realpath(path).encode(), _MNT_DETACH) != 0:
            errno = ctypes.get_errno()
            raise MpsError(
                "MpsShmFailed", f"cannot unmount the MPS shared memory at {path}: {os.strerror(errno)}"
            )
    if mounts_at(path):
        raise MpsError("MpsShmFailed", f"the MPS shared memory at {path} is still mounted")
    shutil.rmtree(path, ignore_errors=True)


class DaemonRunner(Protocol):
    """Where a claim's daemon runs: a process of the plugin (`ProcessRunner`) or a Pod (`mpspod`).

    The control commands (readiness, limits, `quit`) are the same for both:
    `nvidia-cuda-mps-control` as a client in this process, through the pipe directory."""

    # How long a launched daemon may take to answer (a Pod must be scheduled and started first).
    ready_timeout_s: float

    def launch(self, uid: str, control: Path, env: Mapping[str, str], pipe: Path) -> dict[str, object]:
        """Start the claim's daemon; what the ledger records at once to find it again (maybe nothing)."""
        ...

    def failed(self, launched: Mapping[str, object]) -> str | None:
        """Why a launched daemon can no longer come up (its Pod failed), or None: keep waiting."""
        ...

    def identity(self, pipe: Path, launched: Mapping[str, object]) -> dict[str, object]:
        """Once it answers: what the ledger records to recognise this very daemon later."""
        ...

    def alive(self, data: Mapping[str, object]) -> bool:
        """Does the daemon the ledger's `running` entry names still run?"""
        ...

    def find(self, uid: str, state: str, data: Mapping[str, object], pipe: Path) -> object | None:
        """The claim's daemon as recorded (`starting` or `running`), if it still runs; None otherwise."""
        ...

    def end(self, uid: str, found: object) -> None:
        """After `quit` (answered or not): wait for `find`'s daemon to exit, force it when it does not."""
        ...

    def end_unrecorded(self, uid: str) -> None:
        """Stop a daemon of the claim that the ledger does not know (a lost ledger); no-op if none."""
        ...

    def claim_uids(self) -> set[str]:
        """Claims with a daemon this runner can see beyond the ledger (start-up's orphan sweep)."""
        ...


class ProcessRunner:
    """The daemon as a detached process of the plugin (`-d`, in a session of its own): outside Kubernetes."""

    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc

    def launch(self, uid: str, control: Path, env: Mapping[str, str], pipe: Path) -> dict[str, object]:
        run_tool(
            [str(control), "-d"],
            error=MpsError,
            reason="MpsStartFailed",
            what=f"starting {control} -d",
            timeout_s=COMMAND_TIMEOUT_S,
            env=env,  # DriverTools.env, built by MpsDaemons
            new_session=True,  # the claim's daemon outlives this plugin process
        )
        return {}  # who it is: its PID file, read by `identity` (or by `find` after a crash)

    def failed(self, launched: Mapping[str, object]) -> str | None:
        return None

    def identity(self, pipe: Path, launched: Mapping[str, object]) -> dict[str, object]:
        pid = _pid(pipe)
        return {"pid": pid, "startTime": process_start_time(pid, self._proc)}

    def alive(self, data: Mapping[str, object]) -> bool:
        pid, start = data.get("pid"), data.get("startTime")
        return isinstance(pid, int) and start is not None and process_start_time(pid, self._proc) == start

    def find(self, uid: str, state: str, data: Mapping[str, object], pipe: Path) -> object | None:
        if state == "running":
            return (data["pid"], data["startTime"]) if self.alive(data) else None
        # Killed before the record: the daemon's own PID file says who it is.
        try:
            pid = int((pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        start = process_start_time(pid, self._proc)
        return (pid, start) if start is not None else None

    def end(self, uid: str, found: object) -> None:
        pid, start = cast(tuple[int, int], found)  # what `find` returned
        deadline = time.monotonic() + QUIT_TIMEOUT_S
        while process_start_time(pid, self._proc) == start and time.monotonic() < deadline:
            time.sleep(0.05)
        if process_start_time(pid, self._proc) == start:
            os.kill(pid, signal.SIGKILL)  # same PID and start time: still our daemon

    def end_unrecorded(self, uid: str) -> None:
        return None  # a process no ledger entry names cannot be told from a stranger's

    def claim_uids(self) -> set[str]:
        return set()  # its state directories are what SharingState already lists


def _pid(pipe: Path) -> int:
    try:
        return int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError) as err:
        raise MpsError(
            "MpsStartFailed", f"the MPS control daemon wrote no PID file in {pipe}: {err}"
        ) from None


class MpsDaemons:
    """Start, find and stop per-claim MPS control daemons. `tools` runs the driver root's
    `nvidia-cuda-mps-control` (and gives the environment the daemon runs with, wherever it runs);
    `runner` where the daemons run (default: processes of this plugin, `ProcessRunner`);
    `shm_bytes` the size of each claim's shared-memory tmpfs (None: `default_shm_bytes`, 0: a
    plain directory); `exclusive_mode`: each daemon's GPUs in EXCLUSIVE_PROCESS compute mode while
    it runs (`draplugin.prepare.computemode`), the mode before restored when it stops."""

    def __init__(
        self,
        tools: DriverTools,
        *,
        proc: Path = Path("/proc"),
        runner: DaemonRunner | None = None,
        shm_bytes: int | None = None,
        exclusive_mode: bool = True,
    ) -> None:
        self._tools = tools
        self._runner: DaemonRunner = runner if runner is not None else ProcessRunner(proc)
        self._shm_bytes = default_shm_bytes() if shm_bytes is None else shm_bytes
        self._modes = ComputeModes(tools) if exclusive_mode else None

    @property
    def runner(self) -> DaemonRunner:
        return self._runner

    def ensure(self, plan: ClaimPlan, directory: Path, ledger: SharingLedger) -> None:
        """A running, configured daemon for the claim: the ledger's one if it still runs, else a new one."""
        settings = settings_for(plan)
        if settings is not None:
            self.ensure_settings(plan.claim.uid, settings, directory, ledger)

    def ensure_settings(
        self, uid: str, settings: MpsSettings, directory: Path, ledger: SharingLedger
    ) -> None:
        """`ensure` for settings made elsewhere (consumable capacity, `make gpu-check`): the claim's
        daemon running with exactly these devices and limits, its pipe and log under `directory`."""
        entry = ledger.get(uid, KIND, KEY)
        if entry is not None:
            if (
                entry.state == "running"
                and entry.data.get("settings") == settings.to_json()
                and self._runner.alive(entry.data)
            ):
                return
            self.stop(uid, ledger)  # died, half-started, or other limits: start over
        self._start(uid, settings, directory, ledger)

    def _start(self, uid: str, settings: MpsSettings, directory: Path, ledger: SharingLedger) -> None:
        pipe, logs = directory / "pipe", directory / "log"
        control = self._tools.path(CONTROL)
        mps_env = self._mps_env(pipe, logs, settings.devices)
        env = self._tools.env(CONTROL, mps_env)
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        # The MPS server and its clients also talk through POSIX shared memory: the daemon and the
        # claim's containers get this one directory as /dev/shm (NVIDIA's driver does the same).
        shm = directory / SHM_DIR
        shm.mkdir(exist_ok=True)
        where = {"pipe": str(pipe), "log": str(logs)}
        if self._modes is not None:
            # Before the daemon: its server is then the one process with a context on the GPU.
            self._modes.make_exclusive(uid, settings.devices, ledger)
        # Recorded before the mount: a kill -9 from here on leaves an entry whose stop unmounts it.
        ledger.put(LedgerEntry(uid, KIND, KEY, "starting", where))
        release_shm(shm)  # a mount no record explained (a lost ledger): never stack a second one
        shm.mkdir(exist_ok=True)
        if self._shm_bytes:
            mount_shm(shm, self._shm_bytes)
        shm.chmod(0o1777)  # like /dev/shm: any user of the workload may create segments, not remove others'
        launched = self._runner.launch(uid, control, env, pipe)
        if launched:
            ledger.put(LedgerEntry(uid, KIND, KEY, "starting", {**where, **launched}))
        crashpoints.reach(crashpoints.AFTER_MPS_START)
        self._wait_ready(mps_env, launched)
        identity = self._runner.identity(pipe, launched)
        for command in self._commands(settings):
            self.command(mps_env, command)
        ledger.put(
            LedgerEntry(uid, KIND, KEY, "running", {**where, **identity, "settings": settings.to_json()})
        )
        log.info(
            "MPS control daemon running",
            extra={"claim_uid": uid, **identity, "devices": ",".join(settings.devices)},
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

    def command(self, mps_env: Mapping[str, str], command: str) -> str:
        """One control command (`echo <command> | nvidia-cuda-mps-control`) with the MPS variables
        `mps_env` (pipe directory); its answer, or MpsError."""
        return self._tools.run(
            CONTROL,
            [],
            error=MpsError,
            reason="MpsControlFailed",
            what=f"MPS control command {command!r}",
            timeout_s=COMMAND_TIMEOUT_S,
            env=mps_env,
            stdin=command + "\n",
        )

    def ask(self, uid: str, command: str, ledger: SharingLedger) -> str:
        """One control command to the claim's recorded daemon (what a client of the claim would see)."""
        entry = ledger.get(uid, KIND, KEY)
        if entry is None:
            raise MpsError("MpsNotRunning", f"claim uid {uid} has no MPS control daemon")
        pipe, logs = Path(str(entry.data["pipe"])), Path(str(entry.data["log"]))
        return self.command(self._mps_env(pipe, logs, ()), command)

    def _wait_ready(self, mps_env: Mapping[str, str], launched: Mapping[str, object]) -> None:
        timeout = self._runner.ready_timeout_s
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            why = self._runner.failed(launched)
            if why is not None:
                raise MpsError("MpsStartFailed", f"the MPS control daemon did not start: {why}")
            try:
                self.command(mps_env, READY_COMMAND)
                return
            except MpsError as err:
                last = str(err)
            time.sleep(READY_POLL_S)
        raise MpsError("MpsNotReady", f"the MPS control daemon did not answer within {timeout:.0f}s: {last}")

    def stop(self, uid: str, ledger: SharingLedger) -> None:
        """`quit` the claim's daemon (also one that was still starting) and forget it. Safe to repeat."""
        entry = ledger.get(uid, KIND, KEY)
        if entry is None:
            self._runner.end_unrecorded(uid)
            self._restore_modes(uid, ledger)  # killed after the mode was set, before the daemon
            return
        pipe, logs = Path(str(entry.data["pipe"])), Path(str(entry.data["log"]))
        found = self._runner.find(uid, entry.state, entry.data, pipe)
        if found is not None:
            try:
                self.command(self._mps_env(pipe, logs, ()), "quit")
            except (MpsError, PlanError) as err:
                log.warning(
                    "MPS quit failed, killing the daemon", extra={"claim_uid": uid, "error": str(err)}
                )
            self._runner.end(uid, found)
        # A daemon that died leaves its pipes, PID file and shared memory; a new one must not find them.
        shutil.rmtree(pipe, ignore_errors=True)
        release_shm(pipe.parent / SHM_DIR)  # the entry stays if a mount does: unprepare is retried
        ledger.drop(uid, KIND, KEY)
        log.info("MPS control daemon stopped", extra={"claim_uid": uid, "ran": found is not None})
        crashpoints.reach(crashpoints.UNPREPARE_AFTER_MPS_STOP)
        self._restore_modes(uid, ledger)

    def _restore_modes(self, uid: str, ledger: SharingLedger) -> None:
        # Also without `exclusive_mode`: an entry a plugin with it left must not stay behind.
        if ledger.entries(uid, computemode.KIND):
            (self._modes or ComputeModes(self._tools)).restore(uid, ledger)

    def claim_uids(self) -> set[str]:
        """Claims whose daemon the runner sees outside the ledger (start-up stops those not prepared)."""
        return self._runner.claim_uids()

    @staticmethod
    def _mps_env(pipe: Path, logs: Path, devices: Sequence[str]) -> dict[str, str]:
        """The MPS variables; `DriverTools.env` adds what finds the driver's binaries and libraries."""
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        return env
