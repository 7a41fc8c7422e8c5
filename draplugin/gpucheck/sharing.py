"""`make gpu-check`, sharing: MPS, time-slice and dynamic MIG on the GPU, through prepare's own code.

Each check drives the module prepare uses (`draplugin.prepare.mps`,
`timeslice`, `mig`) with a claim UID of its own, a ledger in a temporary
directory and the driver root's tools, then asks the driver's tools what the
GPU now does, and undoes what it did in a `finally` (also after a failure):

- MPS, per whole GPU without MIG mode: a control daemon with a thread
  percentage of `MPS_THREADS` and a pinned memory limit of `MPS_LIMIT_MIB`;
  it must answer, report both limits back, and be gone after `quit`. As root
  the GPU is in EXCLUSIVE_PROCESS compute mode while it runs, as prepare has
  it, and back in its mode before after the stop (`nvidia-smi
  --query-gpu=compute_mode`). The limits a client itself runs with (a CUDA
  process's CUDA_MPS_* environment, what `get_server_list` and
  `get_active_thread_percentage <server PID>` report for its server) is a row
  marked not yet run: it needs a CUDA client, which no machine here has run.
- Time-slice, per whole GPU, as root: level `TIMESLICE_LEVEL` set and read back
  with `nvidia-smi compute-policy -l`, then the default again. A GPU that
  already runs another time-slice (an admin's, a running plugin's) is left
  alone and the row says so.
- MIG, per GPU in MIG mode: the smallest profile at a free placement created
  (GPU instance and compute instance), listed by `nvidia-smi -L`, destroyed,
  and no longer listed. A GPU without MIG support or with MIG mode off is a
  skipped row saying which (gpu-check never changes the MIG mode: on Hopper
  and later that takes effect at once, on Ampere only after a GPU reset, and
  either way it is the admin's or the partitionable plugin's to change).

Nothing here imports pydantic (prepare's config model): the check runs with
the system python3, the repository and nvidia-ml-py only.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from draplugin.devices.mig import MigOperationError, MigPartitioner
from draplugin.devices.model import Device
from draplugin.devices.schema import KIND_GPU
from draplugin.gpucheck.mig import CreatedDevice
from draplugin.gpucheck.smi import SmiGpu, listed_uuids
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row
from draplugin.prepare import computemode, mig, mps, timeslice
from draplugin.prepare.computemode import ComputeModes
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.errors import PlanError
from draplugin.prepare.ledger import SharingLedger
from draplugin.prepare.mps import MpsDaemons, MpsSettings
from draplugin.prepare.timeslice import TimeSlicer

MPS_THREADS = 50
MPS_LIMIT_MIB = 1024
TIMESLICE_LEVEL = 2  # Medium: not the default, so a set that does nothing shows
LEVEL_NAMES = {level: name for name, level in timeslice.LEVELS.items()}
TOOL_TIMEOUT_S = 60.0
CLAIM_UID = "gpu-check"
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_LEVEL = re.compile(r"time\s*-?slice\D{0,20}?(\d)", re.IGNORECASE)
_LEVEL_NAME = re.compile(r"time\s*-?slice\W{0,20}(default|short|medium|long)\b", re.IGNORECASE)


def _row(check: str, subject: str, ours: str, theirs: str, ok: bool) -> Row:
    return Row(check, subject, ours, theirs, OK if ok else MISMATCH)


@contextmanager
def _ledger() -> Iterator[tuple[Path, SharingLedger]]:
    with tempfile.TemporaryDirectory(prefix="gpu-check-sharing-") as work:
        yield Path(work), SharingLedger(Path(work) / "ledger.json")


def whole_gpus(devices: Sequence[Device]) -> list[Device]:
    return [d for d in devices if d.kind == KIND_GPU and d.uuid]


def subject_of(device: Device) -> str:
    return f"{device.name} ({device.uuid})"


def mib_of(answer: str) -> float | None:
    """`1024M`, `1G`, `1024 MiB` → MiB; None when it is no size."""
    found = _QUANTITY.match(answer)
    if found is None:
        return None
    scale = {"": 1 / (1 << 20), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1 << 20}[found.group(2).upper()]
    return float(found.group(1)) * scale


def listed_level(output: str) -> int | None:
    """The time-slice level `nvidia-smi compute-policy -l` shows (a number or its name); None if none."""
    number = _LEVEL.search(output)
    if number is not None:
        return int(number.group(1))
    name = _LEVEL_NAME.search(output)
    return timeslice.LEVELS[name.group(1).capitalize()] if name is not None else None


# --- MPS ----------------------------------------------------------------------------------------------


def mps_rows(gpu: Device, tools: DriverTools) -> list[Row]:
    subject = subject_of(gpu)
    try:
        tools.path(mps.CONTROL)
    except PlanError as err:
        return [_row("MPS start", subject, str(err), "a daemon that answers", False)]
    # A process of this check, as a host-run plugin has it, with the plugin's environment
    # (DriverTools.env) and its /dev/shm tmpfs (root only: mounting needs it; else a directory).
    root = os.geteuid() == 0
    daemons = MpsDaemons(tools, shm_bytes=None if root else 0, exclusive_mode=root)
    modes = ComputeModes(tools)
    settings = MpsSettings((gpu.uuid,), MPS_THREADS, ((0, MPS_LIMIT_MIB),))
    rows: list[Row] = []
    before = _mode(modes, gpu.uuid) if root else None
    with _ledger() as (work, ledger):
        try:
            daemons.ensure_settings(CLAIM_UID, settings, work / "mps", ledger)
            rows.append(_row("MPS start", subject, "answered", "answered", True))
            if root:
                now = _mode(modes, gpu.uuid)
                expected = computemode.EXCLUSIVE_PROCESS
                rows.append(_row("MPS compute mode", subject, now, expected, now == expected))
            else:
                rows.append(Row("MPS compute mode", subject, "needs root (nvidia-smi -c)", "", SKIPPED))
            threads = daemons.ask(CLAIM_UID, "get_default_active_thread_percentage", ledger)
            rows.append(
                _row("MPS thread %", subject, threads, f"{MPS_THREADS}", _number(threads) == MPS_THREADS)
            )
            limit = daemons.ask(CLAIM_UID, "get_default_device_pinned_mem_limit 0", ledger)
            rows.append(
                _row("MPS pinned memory", subject, limit, f"{MPS_LIMIT_MIB}M", mib_of(limit) == MPS_LIMIT_MIB)
            )
        except (PlanError, OSError) as err:
            rows.append(_row("MPS start", subject, _error(err), "a daemon that answers", False))
        finally:
            rows.append(_stop_mps(daemons, ledger, subject))
    if before is not None:
        after = _mode(modes, gpu.uuid)
        rows.append(_row("MPS compute mode restored", subject, after, before, after == before))
    rows.append(Row("MPS client limits", subject, "not yet run: needs a CUDA client process", "", SKIPPED))
    return rows


def _mode(modes: ComputeModes, gpu: str) -> str:
    try:
        return modes.read(gpu)
    except PlanError as err:
        return _error(err)


def _stop_mps(daemons: MpsDaemons, ledger: SharingLedger, subject: str) -> Row:
    entry = ledger.get(CLAIM_UID, mps.KIND, mps.KEY)
    if entry is None:
        return Row("MPS stop", subject, "nothing started", "", SKIPPED)
    pid = entry.data.get("pid")
    if not isinstance(pid, int):  # never answered: its own PID file says who it is
        pid_file = Path(str(entry.data["pipe"])) / mps.PID_FILE
        pid = int(pid_file.read_text().strip()) if pid_file.is_file() else None
    try:
        daemons.stop(CLAIM_UID, ledger)  # `quit`, then SIGKILL after a grace period
    except (PlanError, OSError) as err:
        return _row("MPS stop", subject, _error(err), "exited", False)
    gone = pid is None or mps.process_start_time(pid) is None
    return _row("MPS stop", subject, "exited" if gone else f"PID {pid} still runs", "exited", gone)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


# --- time-slice -----------------------------------------------------------------------------------------


def timeslice_rows(
    gpu: Device, tools: DriverTools, *, is_root: Callable[[], bool] = lambda: os.geteuid() == 0
) -> list[Row]:
    subject = subject_of(gpu)
    if not is_root():
        return [Row("time-slice set", subject, "needs root (nvidia-smi compute-policy)", "", SKIPPED)]
    try:
        tools.path(timeslice.TOOL)
    except PlanError as err:
        return [_row("time-slice set", subject, str(err), _level(TIMESLICE_LEVEL), False)]

    def current() -> tuple[int | None, str]:
        output = tools.run(
            timeslice.TOOL,
            ["compute-policy", "-i", gpu.uuid, "-l"],
            error=PlanError,
            reason="TimeSliceFailed",
            what="nvidia-smi compute-policy -l",
            timeout_s=TOOL_TIMEOUT_S,
        )
        return listed_level(output), output

    try:
        before, output = current()
    except PlanError as err:
        return [_row("time-slice set", subject, _error(err), _level(TIMESLICE_LEVEL), False)]
    if before is None:
        return [_row("time-slice set", subject, f"no level in: {output[:120]}", "a time-slice level", False)]
    if before != timeslice.DEFAULT_LEVEL:
        return [Row("time-slice set", subject, f"runs {_level(before)} already: left alone", "", SKIPPED)]
    slicer = TimeSlicer(tools)  # prepare's own code and environment
    rows: list[Row] = []
    with _ledger() as (_, ledger):
        try:
            slicer.apply_levels(CLAIM_UID, "gpu-check", {gpu.uuid: (gpu.name, TIMESLICE_LEVEL)}, ledger)
            level, output = current()
            ours = _level(level) if level is not None else f"no level in: {output[:120]}"
            rows.append(
                _row("time-slice set", subject, ours, _level(TIMESLICE_LEVEL), level == TIMESLICE_LEVEL)
            )
        except PlanError as err:
            rows.append(_row("time-slice set", subject, _error(err), _level(TIMESLICE_LEVEL), False))
        finally:
            rows.append(_reset(slicer, ledger, subject, current))
    return rows


def _reset(
    slicer: TimeSlicer, ledger: SharingLedger, subject: str, current: Callable[[], tuple[int | None, str]]
) -> Row:
    if not ledger.entries(CLAIM_UID, timeslice.KIND):
        return Row("time-slice reset", subject, "nothing set", "", SKIPPED)
    want = _level(timeslice.DEFAULT_LEVEL)
    try:
        slicer.release(CLAIM_UID, ledger)
        level, output = current()
    except PlanError as err:
        return _row("time-slice reset", subject, _error(err), want, False)
    ours = _level(level) if level is not None else f"no level in: {output[:120]}"
    return _row("time-slice reset", subject, ours, want, level == timeslice.DEFAULT_LEVEL)


def _level(level: int) -> str:
    return f"{LEVEL_NAMES.get(level, '?')} ({level})"


# --- MIG -------------------------------------------------------------------------------------------------


def mig_rows(
    smi_gpus: Sequence[SmiGpu],
    placements: Sequence[Device],
    partitioner: MigPartitioner,
    list_gpus: Callable[[], str],
    inspect: Callable[[CreatedDevice], list[Row]] | None = None,
) -> list[Row]:
    """`placements`: the partitionable MIG devices NVML publishes (`partitionable=True` discovery);
    `list_gpus`: what `nvidia-smi -L` prints now; `inspect`: more rows on each MIG device created,
    run before it is destroyed (`draplugin.gpucheck.mig.MigInspector`)."""
    rows: list[Row] = []
    for gpu in smi_gpus:
        subject = f"{gpu.uuid} ({gpu.bus_id})"
        if not gpu.mig_capable:
            rows.append(Row("MIG create", subject, "this GPU does not support MIG", "", SKIPPED))
            continue
        if not gpu.mig_enabled:
            off = (
                f"MIG mode is off (nvidia-smi -i {gpu.uuid} -mig 1 turns it on, at once on Hopper and "
                "later, after a GPU reset on Ampere; gpu-check leaves it)"
            )
            rows.append(Row("MIG create", subject, off, "", SKIPPED))
            continue
        mine = [d for d in placements if d.parent_uuid == gpu.uuid and mig.needs_instance(d)]
        rows += _create_and_destroy(subject, mine, partitioner, list_gpus, inspect)
    return rows


def _create_and_destroy(
    subject: str,
    placements: Sequence[Device],
    partitioner: MigPartitioner,
    list_gpus: Callable[[], str],
    inspect: Callable[[CreatedDevice], list[Row]] | None,
) -> list[Row]:
    # The smallest profile first; the first placement nothing else holds.
    ordered = sorted(placements, key=lambda d: (int(d.capacity.get("multiprocessors", "0") or 0), d.name))
    free = None
    for device in ordered:
        try:
            partitioner.mig_check_free(mig.placement_of(device))
        except (MigOperationError, PlanError):  # taken, or not a placement: try the next one
            continue
        free = device
        break
    if free is None:
        return [
            Row("MIG create", subject, "no free placement (existing MIG devices hold them all)", "", SKIPPED)
        ]
    rows: list[Row] = []
    with _ledger() as (_, ledger):
        try:
            before = list_gpus() if inspect is not None else ""
            created = mig.create_device(CLAIM_UID, free, partitioner, ledger)
            listed = listed_uuids(list_gpus())
            rows.append(
                _row(
                    "MIG create",
                    f"{subject} {free.name}",
                    created.uuid,
                    "listed by nvidia-smi -L",
                    created.uuid in listed,
                )
            )
            entry = ledger.get(CLAIM_UID, mig.KIND, free.name)
            if inspect is not None and entry is not None:
                ids = entry.data
                rows += inspect(
                    CreatedDevice(created, free.minor, int(str(ids["gi"])), int(str(ids["ci"])), before)
                )
        except (PlanError, OSError, subprocess.SubprocessError) as err:
            rows.append(_row("MIG create", f"{subject} {free.name}", _error(err), "a MIG device", False))
        finally:
            rows.append(_destroy(subject, free.name, partitioner, ledger, list_gpus))
    return rows


def _destroy(
    subject: str, name: str, partitioner: MigPartitioner, ledger: SharingLedger, list_gpus: Callable[[], str]
) -> Row:
    entry = ledger.get(CLAIM_UID, mig.KIND, name)
    if entry is None:
        return Row("MIG destroy", f"{subject} {name}", "nothing created", "", SKIPPED)
    uuid = str(entry.data.get("uuid", ""))
    try:
        mig.destroy_for_claim(CLAIM_UID, partitioner, ledger)
        listed = listed_uuids(list_gpus())
    except (PlanError, OSError, subprocess.SubprocessError) as err:
        return _row("MIG destroy", f"{subject} {name}", _error(err), "gone", False)
    gone = not ledger.entries(CLAIM_UID) and (not uuid or uuid not in listed)
    return _row("MIG destroy", f"{subject} {name}", "gone" if gone else f"{uuid} still there", "gone", gone)


def driver_listing(tools: DriverTools) -> Callable[[], str]:
    """`nvidia-smi -L` of the driver root, as a listing function for `mig_rows`."""

    def listing() -> str:
        return tools.run(
            timeslice.TOOL, ["-L"], error=PlanError, reason="NvidiaSmiFailed", what="nvidia-smi -L",
            timeout_s=TOOL_TIMEOUT_S,
        )  # fmt: skip

    return listing


def _error(err: Exception) -> str:
    reason = getattr(err, "reason", type(err).__name__)
    return f"{reason}: {err}"[:300]
