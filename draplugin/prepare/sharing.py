"""Node-side state behind the sharing strategies, created on prepare and released on unprepare.

`SharingState` is the one place the driver calls for it (`apply`, `release`,
`claim_uids`); the work is in one module per mechanism:

- dynamic MIG (`draplugin.prepare.mig`): a partitionable MIG device allocated
  to a claim is created on the GPU; the claim's CDI device gets its UUID and
  its own `nvidia-caps` nodes;
- MPS on shares of a shared GPU (`draplugin.prepare.mpsgpu`): the GPU's one
  MPS control daemon, started with its first share and stopped with its last,
  in `<root>/mps/gpu-<hash of its UUID>/` (`pipe/`, `log/`, `shm/`), mounted into
  every client claim's containers at `/var/run/draplugin/mps`; each claim's
  limits are in its own containers' environment (its CDI spec);
- MPS on GPUs a claim has to itself (`draplugin.prepare.mps`): the claim gets
  a directory `<root>/mps/<claim uid>/` with the `pipe/` and `log/`
  directories its containers share (mounted through CDI at
  `/var/run/draplugin/mps`), a `mps.json` with the limits, and its own
  running MPS control daemon: it owns its GPUs, so this is one daemon per GPU
  too. Either daemon's GPUs are in EXCLUSIVE_PROCESS compute mode while it
  runs (`draplugin.prepare.computemode`);
- time-slicing (`draplugin.prepare.timeslice`): the GPU's time-slice is set,
  and reset when the last claim that asked for one on that GPU is released.

What exists on the GPU because of a claim is in the sharing ledger
(`draplugin.prepare.ledger`), written around every side effect, so start-up
can undo what no completed claim holds (`release` of each `claim_uids()` the
checkpoint does not hold as prepared, then the daemons of shared GPUs no share
holds any longer).

Mechanisms on one GPU, between different claims: MPS shares with MPS shares
(clients of the one daemon), time-slices with time-slices of the same
interval (`TimeSliceConflict` otherwise); an MPS share and a time-slice never
(`SharingConflict`, refused by whichever comes second), and a GPU a claim has
without a share is never another claim's (`draplugin.prepare.plan.check_sharing`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import TypeVar

from dracommon.kubenames import is_safe_uid
from draplugin.devices.mig import MigPartitioner
from draplugin.prepare import mig, mps, mpsgpu, timeslice
from draplugin.prepare.gpuconfig import SharingStrategy
from draplugin.prepare.ledger import FILE_NAME as LEDGER_FILE
from draplugin.prepare.ledger import SharingLedger
from draplugin.prepare.mps import MpsDaemons
from draplugin.prepare.mpsgpu import SharedGpuDaemons
from draplugin.prepare.mpspaths import SHM_DIR
from draplugin.prepare.plan import ClaimPlan, PlanError
from draplugin.prepare.timeslice import TimeSlicer, wanted_levels
from draplugin.statefile import atomic_write

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class SharingState:
    def __init__(
        self,
        root: Path,
        *,
        mig_partitioner: MigPartitioner | None = None,
        mps_daemons: MpsDaemons | None = None,
        time_slicer: TimeSlicer | None = None,
    ) -> None:
        self.root = root
        self.ledger = SharingLedger(root / LEDGER_FILE)
        # None: the backend cannot create MIG devices; a claim on a partitionable slice then fails.
        self.mig = mig_partitioner
        # None: no driver root, so no nvidia-cuda-mps-control / nvidia-smi; MPS and time-slice claims fail.
        self.mps = mps_daemons
        self.shared = SharedGpuDaemons(mps_daemons, self.mps_dir) if mps_daemons is not None else None
        self.timeslice = time_slicer

    def mps_dir(self, claim_uid: str) -> Path:
        if not is_safe_uid(claim_uid):
            raise ValueError(f"claim UID {claim_uid!r} cannot be used in a path")
        return self.root / "mps" / claim_uid

    def host_dir_for(self, plan: ClaimPlan) -> PurePosixPath | None:
        """The MPS directory the plan's containers get: its shared GPU's daemon's, or its own."""
        if not plan.uses_mps:
            return None
        gpu = shared_mps_gpu(plan)
        return PurePosixPath(self.mps_dir(mpsgpu.owner_of(gpu) if gpu is not None else plan.claim.uid))

    def apply(self, plan: ClaimPlan) -> ClaimPlan:
        """Create what the plan's sharing needs; the plan as realized (created MIG devices filled in).

        Order: MIG devices first (an MPS daemon or a time-slice may run on them), then the MPS
        daemon, then time-slices. Idempotent: a re-prepare finds and reuses the same state. A
        failure (a `PlanError`) of a first prepare undoes everything it did.
        """
        if self.is_plain(plan):
            # Nothing to create and nothing that can fail: no read of the ledger (a file, and a
            # lock that a thread writing an MPS or MIG entry holds through its fsyncs).
            return plan
        uid = plan.claim.uid
        fresh = not self.ledger.entries(uid)
        try:
            return self._apply(plan)
        except PlanError:
            if fresh:
                self._undo_quietly(uid)
            raise

    def is_plain(self, plan: ClaimPlan) -> bool:
        """Whether the plan needs nothing of `apply`: no MIG device to create, no MIG mode to switch,
        no MPS daemon, no time-slice. Everything `apply` does runs NVML or the driver's tools and may
        take seconds, so only a plain plan may be prepared on the event loop."""
        if plan.uses_mps or wanted_levels(plan):
            return False
        return not any(
            mig.needs_instance(d.device) or (self.mig is not None and mig.needs_whole_gpu(d.device))
            for d in plan.devices
        )

    def _apply(self, plan: ClaimPlan) -> ClaimPlan:
        who = f"claim {plan.claim.namespace}/{plan.claim.name}"
        if any(mig.needs_instance(d.device) for d in plan.devices):
            if self.mig is None:
                raise PlanError(
                    "MigUnavailable", f"{who}: this node's device backend cannot create MIG devices"
                )
            plan = mig.create_for_claim(plan, self.mig, self.ledger)
        if self.mig is not None:
            # A whole GPU of a partitionable GPU: never handed out in MIG mode (switched off here).
            mig.ready_whole_gpus(plan, self.mig)
        if plan.uses_mps:
            if self.mps is None:
                raise PlanError(
                    "MpsUnavailable",
                    f"{who}: MPS needs the NVIDIA driver's nvidia-cuda-mps-control; the plugin has no "
                    "driver root (--driver-root)",
                )
            gpu = shared_mps_gpu(plan)
            if gpu is not None:
                assert self.shared is not None  # made with self.mps
                _refuse_time_slices(plan, gpu, self.ledger)
                self.shared.join(plan.claim.uid, gpu, self.ledger)
            else:
                self._write_mps(plan)
                self.mps.ensure(plan, self.mps_dir(plan.claim.uid), self.ledger)
        if wanted_levels(plan):
            if self.timeslice is None:
                raise PlanError(
                    "TimeSliceUnavailable",
                    f"{who}: time-slicing needs the NVIDIA driver's nvidia-smi; the plugin has no driver "
                    "root (--driver-root)",
                )
            self.timeslice.apply(plan, self.ledger)
        return plan

    def _undo_quietly(self, uid: str) -> None:
        try:
            self.release(uid)
        except (PlanError, OSError) as err:  # the first error is the one to report; start-up retries
            log.error("undoing a failed prepare failed", extra={"claim_uid": uid, "error": str(err)})

    def _write_mps(self, plan: ClaimPlan) -> None:
        directory = self.mps_dir(plan.claim.uid)
        (directory / "pipe").mkdir(parents=True, exist_ok=True)
        (directory / "log").mkdir(parents=True, exist_ok=True)
        devices = [d for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS]
        doc = {
            "claim": {"namespace": plan.claim.namespace, "name": plan.claim.name, "uid": plan.claim.uid},
            "devices": sorted({d.device.uuid for d in devices}),
            "config": devices[0].config.to_json()["sharing"],
        }
        atomic_write(directory / "mps.json", (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())

    def release(self, claim_uid: str, *, daemon_listed: bool = False) -> None:
        """Undo everything `apply` did for the claim, in reverse order. Safe to repeat.

        `daemon_listed`: start-up found the claim among the runner's daemons (a Pod on this node),
        so its daemon is looked for even with nothing of it left in the ledger or on disk."""
        if self.ledger.entries(claim_uid, mpsgpu.KIND):
            self._require(self.shared, "a share of a GPU's MPS daemon", claim_uid).leave(
                claim_uid, self.ledger
            )
        if self.ledger.entries(claim_uid, mps.KIND):
            self._require(self.mps, "an MPS daemon", claim_uid).stop(claim_uid, self.ledger)
        elif self.mps is not None and (daemon_listed or self.mps_dir(claim_uid).exists()):
            # A daemon the ledger lost: the runner finds it by the claim's name. Only where the claim's
            # MPS directory says one was started (apply writes it before the ledger entry and the
            # daemon): a claim without one never had a daemon, and its unprepare must not wait on
            # the API server (`--mps-daemon=pod`). A Pod whose directory is gone too is start-up's:
            # it lists every daemon Pod of this node and releases those no prepared claim explains.
            self.mps.stop(claim_uid, self.ledger)
        if self.ledger.entries(claim_uid, timeslice.KIND):
            self._require(self.timeslice, "a time-slice", claim_uid).release(claim_uid, self.ledger)
        if self.ledger.entries(claim_uid, mig.KIND):
            mig.destroy_for_claim(claim_uid, self._require(self.mig, "MIG devices", claim_uid), self.ledger)
        directory = self.mps_dir(claim_uid)
        if directory.exists():
            mps.release_shm(directory / SHM_DIR)  # a tmpfs no ledger entry explained: never rmtree it
            shutil.rmtree(directory)
            log.info("sharing state released", extra={"claim_uid": claim_uid, "strategy": "MPS"})

    @staticmethod
    def _require(tool: _T | None, what: str, uid: str) -> _T:
        if tool is None:
            raise PlanError(
                "SharingUnavailable",
                f"claim uid {uid}: {what} recorded for it cannot be undone: this plugin runs without the "
                "backend or driver root that made it",
            )
        return tool

    def release_orphans(self, prepared: set[str]) -> list[str]:
        """Start-up: release the state of every claim that is not prepared (a crash mid-prepare, a
        lost unprepare). Never raises: what cannot be undone now is logged and tried next start."""
        released = []
        for uid in list(self.claim_uids()):
            if uid in prepared:
                continue
            try:
                self.release(uid, daemon_listed=True)
                released.append(uid)
            except (PlanError, OSError, ValueError) as err:
                log.error(
                    "cannot release orphaned sharing state", extra={"claim_uid": uid, "error": str(err)}
                )
        if self.shared is not None:
            try:  # after the claims: a daemon whose last share was an orphan's is free only now
                self.shared.sweep(self.ledger, self._names())
            except (PlanError, OSError) as err:
                log.error("cannot stop an unheld shared GPU's MPS daemon", extra={"error": str(err)})
        return released

    def claim_uids(self) -> Iterator[str]:
        """Claims that have sharing state on disk or on the GPU (to clean up what no record explains)."""
        yield from sorted(uid for uid in self._names() if not mpsgpu.is_owner(uid))

    def _names(self) -> set[str]:
        """Ledger names of claims and shared GPUs' daemons, from the ledger, the runner and the disk."""
        uids = set(self.ledger.claim_uids())
        if self.mps is not None:
            uids.update(self.mps.claim_uids())  # daemon Pods on this node, whatever the ledger says
        with contextlib.suppress(FileNotFoundError):
            uids.update(entry.name for entry in (self.root / "mps").iterdir() if entry.is_dir())
        return uids


def shared_mps_gpu(plan: ClaimPlan) -> str | None:
    """The UUID of the shared GPU whose daemon the plan's MPS devices use, None when they are GPUs of
    the claim's own; PlanError where no one daemon can serve them all (a client process reads one
    CUDA_MPS_PIPE_DIRECTORY, so it reaches one control daemon)."""
    devices = [d for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS]
    shared = sorted({d.device.uuid for d in devices if d.share_id is not None})
    if not shared:
        return None
    if len(shared) > 1 or any(d.share_id is None for d in devices):
        names = ", ".join(sorted({d.device.name for d in devices}))
        raise PlanError(
            "SharingConflict",
            f"claim {plan.claim.namespace}/{plan.claim.name}: its MPS devices ({names}) would need more "
            "than one MPS control daemon: each shared GPU has its own, and a process reaches one "
            "(CUDA_MPS_PIPE_DIRECTORY). Take MPS shares of one GPU per claim",
        )
    return shared[0]


def _refuse_time_slices(plan: ClaimPlan, gpu: str, ledger: SharingLedger) -> None:
    slicing = sorted(
        {e.claim_uid for e in ledger.entries(kind=timeslice.KIND) if e.key == gpu} - {plan.claim.uid}
    )
    if slicing:
        raise PlanError(
            "SharingConflict",
            f"claim {plan.claim.namespace}/{plan.claim.name}: GPU {gpu} is time-sliced for claim uid "
            f"{slicing[0]}; an MPS share cannot join a time-sliced GPU (its daemon needs the GPU in "
            "EXCLUSIVE_PROCESS mode, which the time-sliced claim's processes would lose)",
        )
