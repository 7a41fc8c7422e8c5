"""A GPU's compute mode while an MPS control daemon serves it: EXCLUSIVE_PROCESS, then back.

NVIDIA's MPS documentation has the GPU in `EXCLUSIVE_PROCESS` mode under an
MPS server: the server is then the one process that holds a context on the
GPU, so a process that does not see the daemon's `CUDA_MPS_PIPE_DIRECTORY`
cannot open a context of its own beside it (its CUDA calls fail) rather than
run outside MPS and its limits. The mode is set through the driver root's
`nvidia-smi -i <GPU UUID> -c EXCLUSIVE_PROCESS` (NVML's
`nvmlDeviceSetComputeMode`) before the daemon starts, and the mode the GPU had
before (read with `nvidia-smi --query-gpu=compute_mode`) is put back once the
daemon has stopped.

Crash safety, through the sharing ledger: the entry (owner: the daemon's
ledger name, key: the GPU UUID, `previous`: the mode read before) is written
as `setting` before the command and `set` after it; a kill -9 anywhere after
the first write leaves an entry whose release restores `previous`. The
restore writes `restoring` first and drops the entry after the command, so a
kill -9 between them restores again (the same mode: idempotent). An entry
exists only while its daemon (or its start, or its stop) does; start-up's
orphan sweep releases it with the daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from draplugin import crashpoints
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.errors import PlanError
from draplugin.prepare.ledger import LedgerEntry, SharingLedger

log = logging.getLogger(__name__)

KIND = "computemode"
TOOL = "nvidia-smi"
SETTING, SET, RESTORING = "setting", "set", "restoring"
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"
# What `nvidia-smi --query-gpu=compute_mode` prints, and the name `-c` takes for it.
MODES = {"Default": "DEFAULT", "Exclusive_Process": EXCLUSIVE_PROCESS, "Prohibited": "PROHIBITED"}
COMMAND_TIMEOUT_S = 30.0


class ComputeModeError(PlanError):
    """The compute mode could not be read, set or restored."""


class ComputeModes:
    """Sets and restores GPUs' compute modes through the driver root's `nvidia-smi`, run by `tools`."""

    def __init__(self, tools: DriverTools) -> None:
        self._tools = tools

    def read(self, gpu: str) -> str:
        """The GPU's compute mode, by the name `nvidia-smi -c` takes (DEFAULT, EXCLUSIVE_PROCESS, ...)."""
        args = ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", gpu]
        answer = self._run(args, f"reading the compute mode of GPU {gpu}").strip()
        mode = MODES.get(answer)
        if mode is None:
            raise ComputeModeError(
                "ComputeModeFailed", f"nvidia-smi answered {answer!r} for the compute mode of GPU {gpu}"
            )
        return mode

    def make_exclusive(self, owner: str, gpus: Sequence[str], ledger: SharingLedger) -> None:
        """Every GPU in EXCLUSIVE_PROCESS mode for `owner`'s daemon, the previous mode recorded."""
        for gpu in gpus:
            entry = ledger.get(owner, KIND, gpu)
            # Kept from the first set: a re-set (a GPU reset or a reboot put it back) must not record
            # EXCLUSIVE_PROCESS as the mode to restore.
            previous = str(entry.data["previous"]) if entry is not None else self.read(gpu)
            data = {"previous": previous}
            ledger.put(LedgerEntry(owner, KIND, gpu, SETTING, data))
            self._set(gpu, EXCLUSIVE_PROCESS)
            crashpoints.reach(crashpoints.AFTER_COMPUTE_MODE_SET)
            ledger.put(LedgerEntry(owner, KIND, gpu, SET, data))
            log.info("GPU compute mode set", extra={"owner": owner, "gpu": gpu, "mode": EXCLUSIVE_PROCESS})

    def restore(self, owner: str, ledger: SharingLedger) -> None:
        """Each GPU `owner` set back to the mode it had before; safe to repeat."""
        for entry in ledger.entries(owner, KIND):
            if entry.state != RESTORING:
                ledger.put(LedgerEntry(owner, KIND, entry.key, RESTORING, entry.data))
            previous = str(entry.data["previous"])
            self._set(entry.key, previous)
            crashpoints.reach(crashpoints.AFTER_COMPUTE_MODE_RESTORE)
            ledger.drop(owner, KIND, entry.key)
            log.info("GPU compute mode restored", extra={"owner": owner, "gpu": entry.key, "mode": previous})

    def _set(self, gpu: str, mode: str) -> None:
        self._run(["-i", gpu, "-c", mode], f"{self._tools.path(TOOL)} -i {gpu} -c {mode}")

    def _run(self, args: list[str], what: str) -> str:
        return self._tools.run(
            TOOL,
            args,
            error=ComputeModeError,
            reason="ComputeModeFailed",
            what=what,
            timeout_s=COMMAND_TIMEOUT_S,
        )
