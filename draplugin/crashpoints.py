"""Named points where the plugin can be made to die, for crash-safety tests.

With `DRAPLUGIN_CRASH_AT=<point>` in the environment the process sends itself
SIGKILL when it reaches that point: no cleanup, no flushed buffers, exactly
what a node-level kill or OOM does. Unset, `reach()` is a dictionary lookup.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV_VAR = "DRAPLUGIN_CRASH_AT"

AFTER_CHECKPOINT_STARTED = "after-checkpoint-started"
AFTER_CDI_WRITE = "after-cdi-write"
# Device metadata documents and their CDI specs written, the claim's record not yet completed.
AFTER_METADATA_WRITE = "after-metadata-write"
AFTER_CHECKPOINT_COMPLETED = "after-checkpoint-completed"
BEFORE_RETURN = "before-return"
UNPREPARE_AFTER_CDI_REMOVE = "unprepare-after-cdi-remove"
UNPREPARE_AFTER_RELEASE = "unprepare-after-release"
# Sharing side effects, each right after the GPU changed and before the ledger records it.
AFTER_MIG_CREATE = "after-mig-create"
AFTER_MPS_START = "after-mps-start"
AFTER_TIMESLICE_SET = "after-timeslice-set"
# Unprepare: the GPU's time-slice is back at the default, the claim's ledger entry not yet dropped.
UNPREPARE_AFTER_TIMESLICE_RESET = "unprepare-after-timeslice-reset"
# The GPU in EXCLUSIVE_PROCESS mode for an MPS daemon, the ledger entry still `setting`.
AFTER_COMPUTE_MODE_SET = "after-compute-mode-set"
# A claim's share recorded as joining its GPU's MPS daemon, the daemon not yet started or found.
AFTER_MPS_SHARE_JOIN = "after-mps-share-join"
# Unprepare of the last share of a GPU: its daemon stopped, the GPU's compute mode not yet restored.
UNPREPARE_AFTER_MPS_STOP = "unprepare-after-mps-stop"
# The GPU's compute mode restored, its ledger entry (`restoring`) not yet dropped.
AFTER_COMPUTE_MODE_RESTORE = "after-compute-mode-restore"

POINTS: tuple[str, ...] = (
    AFTER_CHECKPOINT_STARTED,
    AFTER_CDI_WRITE,
    AFTER_METADATA_WRITE,
    AFTER_CHECKPOINT_COMPLETED,
    BEFORE_RETURN,
    UNPREPARE_AFTER_CDI_REMOVE,
    UNPREPARE_AFTER_RELEASE,
    AFTER_MIG_CREATE,
    AFTER_MPS_START,
    AFTER_TIMESLICE_SET,
    UNPREPARE_AFTER_TIMESLICE_RESET,
    AFTER_COMPUTE_MODE_SET,
    AFTER_MPS_SHARE_JOIN,
    UNPREPARE_AFTER_MPS_STOP,
    AFTER_COMPUTE_MODE_RESTORE,
)


def reach(point: str) -> None:
    """Die here if the environment asks for it."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}")
    if os.environ.get(ENV_VAR) == point:
        log.warning("crash point reached: killing this process", extra={"point": point, "pid": os.getpid()})
        os.kill(os.getpid(), signal.SIGKILL)
