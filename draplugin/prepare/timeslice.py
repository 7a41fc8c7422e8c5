"""Time-slicing: set the GPU's time-slice at prepare, back to the default when its last holder leaves.

`nvidia-smi compute-policy -i <GPU UUID> --set-timeslice <level>` with the
levels NVIDIA's tools use: Default 0, Short 1, Medium 2, Long 3 (the same
numbers NVIDIA's DRA driver passes). The setting is per GPU, so every claim
that asked for a time-slice on a GPU has a ledger entry for it; a claim asking
for another interval than the one the GPU runs with for other claims is
refused (`TimeSliceConflict`), never a silent override, and so is a time-slice
on a GPU whose MPS daemon serves shares of other claims (`SharingConflict`).
When the last entry of a GPU goes, the GPU is set back to level 0.

Crash safety: the entry is written as `setting` before the command and as
`set` after it; both count as holding the GPU, so a kill -9 between the
command and the record still leads to a reset when the claim is released (or
found orphaned at start). A release that resets the GPU writes the entry as
`resetting` first and drops it after the reset: a kill -9 in between leaves an
entry that holds no level (it neither conflicts with another claim's interval
nor keeps the GPU from being reset for it), so the ledger never says "set" for
a GPU that runs at the default. The claim is still prepared in the checkpoint
(forgotten only after its release), so start-up prepares it again, time-slice
included, and the kubelet's retried unprepare resets and drops it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from draplugin import crashpoints
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.errors import PlanError
from draplugin.prepare.gpuconfig import SharingStrategy
from draplugin.prepare.ledger import LedgerEntry, SharingLedger

# draplugin.prepare.mpsgpu's kind, named here: that module imports the MPS machinery, this one need not.
MPS_SHARE_KIND = "mpsshare"

if TYPE_CHECKING:  # for the annotations only: the sharing mechanisms load without planning
    from draplugin.prepare.plan import ClaimPlan

log = logging.getLogger(__name__)

KIND = "timeslice"
TOOL = "nvidia-smi"
DEFAULT_LEVEL = 0
SETTING, SET, RESETTING = "setting", "set", "resetting"
# By the config's interval names (gpuconfig.TimeSliceInterval, a StrEnum: its members look these up).
LEVELS = {"Default": 0, "Short": 1, "Medium": 2, "Long": 3}
COMMAND_TIMEOUT_S = 30.0


class TimeSliceError(PlanError):
    """The time-slice could not be set or reset, or conflicts with another claim's."""


def wanted_levels(plan: ClaimPlan) -> dict[str, tuple[str, int]]:
    """GPU UUID → (device name, level) for every time-sliced device of the plan."""
    wanted = {}
    for planned in plan.devices:
        sharing = planned.config.sharing
        if sharing.strategy is SharingStrategy.TIME_SLICING and sharing.time_slicing is not None:
            wanted[planned.device.uuid] = (planned.device.name, LEVELS[sharing.time_slicing.interval])
    return wanted


class TimeSlicer:
    """Applies and resets GPU time-slices through the driver root's `nvidia-smi`, run by `tools` (with
    the environment that finds its NVML from inside the plugin's pod)."""

    def __init__(self, tools: DriverTools) -> None:
        self._tools = tools
        # Claims are prepared in parallel threads: the look at other holders and the set that
        # follows must not interleave with another claim's, or two intervals could both pass.
        self._lock = threading.Lock()

    def apply(self, plan: ClaimPlan, ledger: SharingLedger) -> None:
        who = f"{plan.claim.namespace}/{plan.claim.name}"
        self.apply_levels(plan.claim.uid, who, wanted_levels(plan), ledger)

    def apply_levels(
        self, uid: str, who: str, wanted: Mapping[str, tuple[str, int]], ledger: SharingLedger
    ) -> None:
        """`apply` for levels chosen elsewhere (`make gpu-check`): GPU UUID → (device name, level)."""
        with self._lock:
            self._apply(uid, who, wanted, ledger)

    def _apply(
        self, uid: str, who: str, wanted: Mapping[str, tuple[str, int]], ledger: SharingLedger
    ) -> None:
        for gpu, (name, level) in sorted(wanted.items()):
            mine = ledger.get(uid, KIND, gpu)
            if mine is not None and mine.state == SET and mine.data.get("level") == level:
                continue
            clients = sorted({e.claim_uid for e in ledger.entries(kind=MPS_SHARE_KIND) if e.key == gpu})
            if clients:
                raise TimeSliceError(
                    "SharingConflict",
                    f"claim {who}: device {name} ({gpu}) runs an MPS control daemon for the shares of claim "
                    f"uid {clients[0]}; a time-slice cannot be set on it (the GPU is in EXCLUSIVE_PROCESS "
                    "mode for the daemon, and a time-slice is between contexts MPS does not make)",
                )
            others = _holders(ledger, gpu, uid)
            for other in others:
                if other.data.get("level") != level:
                    raise TimeSliceError(
                        "TimeSliceConflict",
                        f"claim {who}: device {name} ({gpu}) runs with time-slice level "
                        f"{other.data.get('level')} for claim uid {other.claim_uid}; this claim asks for "
                        f"level {level}. A GPU has one time-slice: use the same interval, or another GPU",
                    )
            data = {"device": name, "level": level}
            if others and all(o.state == SET for o in others):
                ledger.put(LedgerEntry(uid, KIND, gpu, SET, data))  # the GPU already runs with it
                continue
            ledger.put(LedgerEntry(uid, KIND, gpu, SETTING, data))
            self._set(gpu, level, who)
            crashpoints.reach(crashpoints.AFTER_TIMESLICE_SET)
            ledger.put(LedgerEntry(uid, KIND, gpu, SET, data))
            log.info("GPU time-slice set", extra={"claim_uid": uid, "gpu": gpu, "level": level})

    def release(self, uid: str, ledger: SharingLedger) -> None:
        """Forget the claim's time-slices; reset each GPU no other claim holds a time-slice on."""
        with self._lock:
            self._release(uid, ledger)

    def _release(self, uid: str, ledger: SharingLedger) -> None:
        for entry in ledger.entries(uid, KIND):
            self._release_entry(entry, ledger)

    def _release_entry(self, entry: LedgerEntry, ledger: SharingLedger) -> None:
        uid, gpu = entry.claim_uid, entry.key
        if not _holders(ledger, gpu, uid):
            # Recorded first: from here on the entry holds no level, whether or not the reset ran.
            if entry.state != RESETTING:
                ledger.put(LedgerEntry(uid, KIND, gpu, RESETTING, entry.data))
            self._set(gpu, DEFAULT_LEVEL, f"uid {uid}")
            log.info("GPU time-slice reset", extra={"claim_uid": uid, "gpu": gpu})
            crashpoints.reach(crashpoints.UNPREPARE_AFTER_TIMESLICE_RESET)
        ledger.drop(uid, KIND, gpu)

    def _set(self, gpu: str, level: int, who: str) -> None:
        args = ["compute-policy", "-i", gpu, "--set-timeslice", str(level)]
        self._tools.run(
            TOOL,
            args,
            error=TimeSliceError,
            reason="TimeSliceFailed",
            what=f"claim {who}: {self._tools.path(TOOL)} {' '.join(args)}",
            timeout_s=COMMAND_TIMEOUT_S,
        )


def _holders(ledger: SharingLedger, gpu: str, uid: str) -> list[LedgerEntry]:
    """Other claims' entries that hold a level on the GPU (`setting` or `set`; not `resetting`)."""
    return [
        e for e in ledger.entries(kind=KIND) if e.key == gpu and e.claim_uid != uid and e.state != RESETTING
    ]
