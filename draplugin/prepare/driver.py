"""The driver behind the kubelet protocol layer: prepare and unprepare claims on this node.

Prepare, per claim (concurrent across claims; the protocol layer's `ClaimRunner`
never runs two calls for one claim UID at once, so there is no lock here):

  1. GET the ResourceClaim as raw JSON and plan it (`prepare_plan`): UID check,
     allocation, our results, opaque config, CDI names.
  2. If the checkpoint already has the same plan completed, re-create its CDI
     spec and sharing state if they vanished and return the same answer (after
     writing the record, if the file does not hold it yet).
  3. Otherwise check no other claim holds the devices, record the claim as
     `PrepareStarted` (in memory; in the file first only for a redo), create
     sharing state, write the CDI spec (atomic, not fsynced), record it as
     `PrepareCompleted` (the one durable write), answer.

No claim is answered as prepared unless its record is durable: a failed
checkpoint write (ENOSPC, EIO, a read-only state filesystem) fails the call and
leaves memory saying what the file may say (`_prepare`, `_unprepare`).

Unprepare: remove the CDI spec first (a runtime must never resolve a device
we are about to give away), then release sharing state, then forget the claim.
An unknown claim is a success, and so is one whose UID cannot name a file
(nothing of it can be on disk; a checkpoint record of it is forgotten).

The API read is bounded by a deadline: the plugin's setting, or the kubelet's
own deadline for the call when that comes sooner (`draplugin.kubelet.deadline`).

Start-up (`recover`) removes our temp files of interrupted writes, restores
specs from the checkpoint, and when the checkpoint was lost rebuilds its
records from the surviving CDI specs and the API server, so the devices of
running claims stay taken and their specs stay on disk.

Every step is safe to repeat, so a crash anywhere is repaired by the
kubelet's retry: see `crashpoints` for the named points the tests kill at.

Size: the side effects of prepare and unprepare in their crash-safe order read best in one file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dracommon.kubeapi import ApiError
from dracommon.kubenames import is_safe_uid
from draplugin import crashpoints, statefile
from draplugin.cdi import spec as cdi
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRootError
from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from draplugin.devices.model import Device
from draplugin.events import EventSink
from draplugin.kubelet.deadline import call_deadline, call_started
from draplugin.kubelet.interface import ClaimError, ClaimRef, PreparedDevice
from draplugin.kubelet.nodestate import outside_node_state
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.api import (
    DEFAULT_API_DEADLINE_S,
    MAX_JSON_DEPTH,
    ApiDeadlineExceeded,
    ClaimReader,
    holds_too_deep,
    iter_opaque_configs,
)
from draplugin.prepare.claimstatus import ClaimStatusWriter
from draplugin.prepare.memlimits import MemoryLimitHook, check_memory_fits
from draplugin.prepare.metadata import claim_metadata, with_metadata_devices
from draplugin.prepare.metadatastore import MetadataStore
from draplugin.prepare.plan import (
    ClaimPlan,
    PlanError,
    check_sharing,
    plan_claim,
    plan_from_record,
    render_spec,
)
from draplugin.prepare.sharing import SharingState

log = logging.getLogger(__name__)

# Names for a claim rebuilt from its CDI spec alone: the spec holds only the UID and devices, and the
# checkpoint needs non-empty names. The kubelet's next prepare of the claim writes the real ones.
UNKNOWN_NAME = "(unknown)"
# What a prepare still does after its API read, reserved out of the kubelet's deadline.
LOCAL_WORK_S = 0.3


@dataclass
class RecoveryReport:
    """What start-up found and repaired; logged, and returned for tests and the CLI."""

    checkpoint_version: int | None = None
    claims: int = 0
    new_boot: bool = False
    corrupt_reason: str | None = None
    moved_to: Path | None = None
    specs_restored: list[str] = field(default_factory=list)
    specs_removed: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)
    # After a lost checkpoint: claims recorded again from the API, or from their spec alone.
    rebuilt_from_api: list[str] = field(default_factory=list)
    rebuilt_from_specs: list[str] = field(default_factory=list)
    temp_files_removed: list[str] = field(default_factory=list)
    # Device metadata documents and specs of claims no record held.
    metadata_removed: list[str] = field(default_factory=list)


class GpuDriver:
    """Implements `draplugin.kubelet.interface.Driver` for the devices of one node."""

    def __init__(
        self,
        *,
        driver_name: str,
        node_name: str,
        devices: Sequence[Device],
        claims: ClaimReader,
        cdi_store: cdi.SpecStore,
        checkpoint: CheckpointStore,
        sharing: SharingState,
        events: EventSink,
        metrics: ClaimMetrics,
        driver_files: DriverFiles | None = None,
        api_deadline_s: float = DEFAULT_API_DEADLINE_S,
        started_at: float = cdi.PROCESS_STARTED,
        status: ClaimStatusWriter | None = None,
        metadata: MetadataStore | None = None,
        memory_limit_hook: MemoryLimitHook | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.node_name = node_name
        self.devices: Mapping[str, Device] = {device.name: device for device in devices}
        self.claims = claims
        self.cdi = cdi_store
        self.checkpoint = checkpoint
        self.sharing = sharing
        self.events = events
        self.metrics = metrics
        # CDI device IDs use the kind of the specs the store writes: both follow the driver name.
        self.cdi_kind = cdi_store.kind
        # The driver's user-space files for CUDA containers; None: specs carry no driver files.
        self.driver_files = driver_files
        # NVIDIA's hook that gives each share's containers the driver's memory limit (memlimits).
        self.memory_limit_hook = memory_limit_hook
        # The longest a prepare waits for the API server; the kubelet's own deadline may be sooner.
        self.api_deadline_s = api_deadline_s
        # Temp files older than this (wall clock) are left over from a process that is gone.
        self.started_at = started_at
        # status.devices of prepared claims, written in the background (claimstatus); None: off.
        self.status = status
        # Device metadata files (KEP-5304, draplugin.prepare.metadata); None: none, and none removed.
        self.metadata = metadata

    # --- start-up ---------------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Load the checkpoint and bring the node back in line with it. Never raises for bad state."""
        loaded = self.checkpoint.load()
        report = RecoveryReport(
            checkpoint_version=loaded.version,
            claims=loaded.claims,
            new_boot=loaded.new_boot,
            corrupt_reason=loaded.corrupt_reason,
            moved_to=loaded.moved_to,
        )
        report.temp_files_removed = [
            str(path)
            for path in self.cdi.remove_stale_temp_files(self.started_at)
            # Checkpoint, sharing ledger, fake MIG state, each MPS claim's mps.json: one sweep.
            + statefile.sweep_state_dirs({self.checkpoint.path.parent, self.sharing.root}, self.started_at)
            + (self.metadata.remove_stale_temp_files(self.started_at) if self.metadata is not None else [])
        ]
        if report.temp_files_removed:
            log.info(
                "removed temp files of interrupted writes", extra={"files": len(report.temp_files_removed)}
            )
        if loaded.corrupt_reason is not None:
            note = (
                f"checkpoint {self.checkpoint.path} is unreadable ({loaded.corrupt_reason}); moved to "
                f"{loaded.moved_to}; its claims are rebuilt from the surviving CDI specs and the API server"
            )
            log.error(
                "checkpoint corrupt: moved aside, rebuilding",
                extra={
                    "path": str(self.checkpoint.path),
                    "reason": loaded.corrupt_reason,
                    "moved_to": str(loaded.moved_to),
                },
            )
            self.events.node_event("CheckpointCorrupted", note)
        if loaded.new_boot:
            log.info("node rebooted: known claims will be prepared again", extra={"claims": loaded.claims})
        for record in self.checkpoint.records():
            if not record.completed:
                continue
            try:
                plan = plan_from_record(record, self.devices, self.cdi_kind, driver=self.driver_name)
                if self.cdi.write(record.uid, self._spec(plan)):
                    report.specs_restored.append(record.uid)
                if self.metadata is not None:
                    self.metadata.restore_specs(record.uid, record.namespace, record.name)
            except (PlanError, OSError, cdi.CdiError) as err:
                # Keep the record (unprepare must still work) but make the next prepare redo it.
                log.warning(
                    "cannot restore prepared claim; the next prepare redoes it",
                    extra={
                        "claim": f"{record.namespace}/{record.name}",
                        "uid": record.uid,
                        "error": str(err),
                    },
                )
                self.checkpoint.put(
                    ClaimRecord(
                        record.uid, record.namespace, record.name, ClaimState.PREPARE_STARTED, record.devices
                    )
                )
                report.demoted.append(record.uid)
        if loaded.corrupt_reason is not None:
            self._rebuild_lost_records(report)
        known = {record.uid for record in self.checkpoint.records()}
        unexplained = [uid for uid in self.cdi.claim_uids() if uid not in known]
        if loaded.corrupt_reason is not None:
            # Specs the rebuild could not read: they may still belong to running pods, so they stay
            # until the kubelet's unprepare removes them.
            if unexplained:
                log.warning("keeping CDI specs the rebuild could not read", extra={"specs": len(unexplained)})
        else:
            for uid in unexplained:
                # With an intact checkpoint every spec has a record (it is written first), so a
                # spec without one is left over from a removal that was interrupted: it leaked.
                log.info("removing leaked CDI spec", extra={"uid": uid})
                self.cdi.remove(uid)
                report.specs_removed.append(uid)
            if self.metadata is not None:
                # The same for device metadata: a claim no record holds was never answered as
                # prepared, or its unprepare was cut short. With the records lost they stay, as
                # the specs do, until the kubelet prepares or unprepares the claim.
                stale = self.metadata.remove_stale({record.uid for record in self.checkpoint.records()})
                report.metadata_removed = [str(path) for path in stale]
                if stale:
                    log.info("removed device metadata of claims no record holds", extra={"files": len(stale)})
        if loaded.corrupt_reason is None:
            # MIG instances, MPS daemons, time-slices of claims that are not prepared: orphans. With
            # the records lost they may serve running pods: kept, as their CDI specs are; and so are
            # those of a claim an earlier recovery rebuilt from its spec alone, until the kubelet
            # prepares or unprepares it (the API server decides, not a second restart).
            self.sharing.release_orphans({r.uid for r in self.checkpoint.records() if r.holds_sharing_state})
        try:
            self.checkpoint.save()
        except OSError as err:
            # Serve anyway: unprepare must keep working on a full disk. What the file lacks stays
            # unwritten, and no claim is answered as prepared before a write of it succeeds.
            log.error(
                "cannot write the checkpoint at start-up: prepares fail until it can be written",
                extra={"path": str(self.checkpoint.path), "error": str(err)},
            )
            self.events.node_event(
                "CheckpointWriteFailed",
                f"checkpoint {self.checkpoint.path} cannot be written ({err}); claims cannot be prepared "
                "until it can",
            )
        self.metrics.prepared_claims.set(len(self.checkpoint))
        log.info(
            "checkpoint loaded",
            extra={
                "version": loaded.version,
                "claims": loaded.claims,
                "new_boot": loaded.new_boot,
                "corrupt": loaded.corrupt_reason is not None,
                "specs_restored": len(report.specs_restored),
                "specs_removed": len(report.specs_removed),
                "demoted": len(report.demoted),
                "rebuilt_from_api": len(report.rebuilt_from_api),
                "rebuilt_from_specs": len(report.rebuilt_from_specs),
            },
        )
        return report

    def _rebuild_lost_records(self, report: RecoveryReport) -> None:
        """Record again the claims the lost checkpoint knew, so their devices stay taken.

        Source one, the API server: claims with results of ours in our pool that have a surviving
        spec (they were prepared here) or are reserved for a pod (a pod using node-local devices
        runs here) are planned as a prepare would, their spec (re)written, and recorded as
        completed. Source two, the surviving CDI specs: a spec names its claim's UID and devices;
        one the API could not explain (unreachable, or the claim no longer plans) is recorded as
        started, which holds its devices exclusively until the kubelet prepares or unprepares it.
        Only the spec of a claim the API server no longer has is removed.
        """
        surviving = set(self.cdi.claim_uids())
        try:
            docs: list[dict[str, object]] | None = self.claims.list_claims(self.api_deadline_s)
        except ApiError as err:
            log.warning(
                "cannot list claims to rebuild the checkpoint: keeping what the CDI specs say",
                extra={"error": str(err)},
            )
            docs = None
        listed: set[str] = set()

        def spec_first(doc: dict[str, object]) -> bool:
            meta = doc.get("metadata")
            return not (isinstance(meta, dict) and meta.get("uid") in surviving)

        # Claims with a surviving spec were prepared here for sure: they take their devices first.
        for doc in sorted(docs or [], key=spec_first):
            meta = doc.get("metadata")
            uid = meta.get("uid") if isinstance(meta, dict) else None
            if not isinstance(uid, str):
                continue
            listed.add(uid)
            if self._rebuild_from_api(doc, has_spec=uid in surviving):
                report.rebuilt_from_api.append(uid)
        for uid in sorted(surviving):
            if self.checkpoint.get(uid) is not None:
                continue
            if docs is not None and uid not in listed:
                log.info("removing CDI spec of a claim the API server no longer has", extra={"uid": uid})
                self.cdi.remove(uid)
                report.specs_removed.append(uid)
            elif self._rebuild_from_spec(uid):
                report.rebuilt_from_specs.append(uid)
        self.metrics.prepared_claims.set(len(self.checkpoint))

    def _rebuild_from_api(self, doc: dict[str, object], *, has_spec: bool) -> bool:
        """Record one listed claim as prepared if it was prepared here or runs here; True if recorded."""
        meta, status = doc.get("metadata"), doc.get("status")
        if not isinstance(meta, dict) or not isinstance(status, dict):
            return False
        if not (has_spec or status.get("reservedFor")):
            return False  # never prepared here, in use by no pod: nothing to keep
        uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name")
        if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str)):
            return False
        if not is_safe_uid(uid):
            return False
        try:
            plan = self._plan(ClaimRef(namespace, uid, name), doc)
            if not plan.devices:
                return False
            check_sharing(plan, self.checkpoint.records())
            check_memory_fits(plan, self.checkpoint.records())
            self._materialize(plan)
        except (PlanError, OSError, cdi.CdiError, ValueError) as err:
            if has_spec:
                log.warning(
                    "cannot rebuild a prepared claim from the API: its spec decides",
                    extra={"claim": f"{namespace}/{name}", "uid": uid, "error": str(err)},
                )
            return False
        self.checkpoint.put(
            ClaimRecord(uid, namespace, name, ClaimState.PREPARE_COMPLETED, plan.device_records())
        )
        return True

    def _rebuild_from_spec(self, uid: str) -> bool:
        """Record a claim from its spec alone (devices `<uid>-<device>`), as started."""
        try:
            raw = self.cdi.read(uid)
            spec = json.loads(raw) if raw is not None else None
            names = [d.get("name") for d in spec.get("devices", [])] if isinstance(spec, dict) else []
        except (OSError, ValueError, RecursionError, AttributeError, cdi.CdiError) as err:
            log.warning("unreadable CDI spec of a lost claim: kept", extra={"uid": uid, "error": str(err)})
            return False
        prefix = f"{uid}-"
        devices = tuple(
            DeviceRecord(
                request_names=(),
                pool=self.node_name,
                device=name.removeprefix(prefix),
                cdi_ids=(f"{self.cdi_kind}={name}",),
            )
            for name in names
            if isinstance(name, str) and name.startswith(prefix) and len(name) > len(prefix)
        )
        if not devices:
            return False
        self.checkpoint.put(
            ClaimRecord(uid, UNKNOWN_NAME, UNKNOWN_NAME, ClaimState.PREPARE_STARTED, devices, from_spec=True)
        )
        log.warning(
            "claim rebuilt from its CDI spec alone: its devices stay taken until the kubelet "
            "prepares or unprepares it",
            extra={"uid": uid, "devices": ",".join(d.device for d in devices)},
        )
        return True

    def reload_state(self) -> None:
        """Re-read the checkpoint, which another plugin process on this node may have changed.

        Two plugin pods serve side by side during a rolling update; the protocol
        layer then serializes their calls with a file lock and calls this first
        under it, so each batch starts from what the other process committed.
        Only the claim records are re-read: CDI specs and sharing state live on
        disk already and are repaired by the next prepare of their claim.
        """
        loaded = self.checkpoint.load()
        if loaded.corrupt_reason is not None:
            note = (
                f"checkpoint {self.checkpoint.path} is unreadable ({loaded.corrupt_reason}); moved to "
                f"{loaded.moved_to}: the kubelet's retries prepare running claims again"
            )
            log.error("checkpoint corrupt on reload: moved aside", extra={"reason": loaded.corrupt_reason})
            self.events.node_event("CheckpointCorrupted", note)
        self.metrics.prepared_claims.set(len(self.checkpoint))

    def devices_changed(self, devices: Sequence[Device], removed: Sequence[str]) -> None:
        """The node's devices were re-discovered: prepare uses the new list from now on.

        A prepared claim whose device is gone stays in the checkpoint (its unprepare
        needs nothing from the device); it is logged and an Event goes on the Node.
        """
        self.devices = {device.name: device for device in devices}
        gone = set(removed)
        for record in list(self.checkpoint.records()):
            lost = sorted({d.device for d in record.devices if d.device in gone})
            if not lost:
                continue
            note = (
                f"device(s) {', '.join(lost)} of prepared claim {record.namespace}/{record.name} "
                "disappeared from this node; the claim stays prepared until the kubelet unprepares it"
            )
            log.warning(
                "prepared device disappeared",
                extra={"claim": f"{record.namespace}/{record.name}", "devices": ",".join(lost)},
            )
            self.events.node_event("PreparedDeviceGone", note)

    # --- Driver protocol --------------------------------------------------------------------------

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        start = time.perf_counter()
        # Our background status writes wait while prepares run: they must not slow a claim's GET.
        quiet = self.status.preparing() if self.status is not None else contextlib.nullcontext()
        with self.metrics.track("prepare"), quiet:
            try:
                devices = await self._prepare(claim)
            except PlanError as err:
                self._failed("prepare", claim, err.reason, str(err))
                raise ClaimError(str(err)) from None
            except ApiError as err:
                message = f"reading claim {claim.namespace}/{claim.name} from the API server failed: {err}"
                reason = "APIServerTimeout" if isinstance(err, ApiDeadlineExceeded) else "APIError"
                self._failed("prepare", claim, reason, message)
                raise ClaimError(message) from None
            except Exception as err:
                message = f"preparing claim {claim.namespace}/{claim.name} failed: {err}"
                log.exception("prepare failed unexpectedly", extra={"claim": str(claim)})
                self._failed("prepare", claim, "InternalError", message)
                raise ClaimError(message) from None
        # Debug: a line per claim per call; "CDI spec written" marks the real preparations.
        log.debug(
            "claim prepared",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "uid": claim.uid,
                "devices": ",".join(d.device_name for d in devices),
                "ms": round((time.perf_counter() - start) * 1e3, 1),
            },
        )
        crashpoints.reach(crashpoints.BEFORE_RETURN)
        return devices

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        with self.metrics.track("unprepare"):
            try:
                await self._unprepare(claim)
            except Exception as err:
                message = f"unpreparing claim {claim.namespace}/{claim.name} failed: {err}"
                log.exception("unprepare failed unexpectedly", extra={"claim": str(claim)})
                self.metrics.error("unprepare", "InternalError")
                raise ClaimError(message) from None

    # --- the work ---------------------------------------------------------------------------------

    def _deadline(self) -> float:
        """When this prepare's API work must end: the setting, counted from the kubelet's call, or the
        kubelet's deadline if sooner (less the local work that follows: planning, the CDI spec, the
        checkpoint's fsync)."""
        own = call_started() + self.api_deadline_s
        kubelet = call_deadline()
        return own if kubelet is None else min(own, kubelet - LOCAL_WORK_S)

    def _plan(self, claim: ClaimRef, doc: dict[str, object]) -> ClaimPlan:
        for where, source, parameters in iter_opaque_configs(doc, self.driver_name):
            if holds_too_deep(parameters):
                origin = "DeviceClass" if source == "FromClass" else "claim"
                raise PlanError(
                    "InvalidConfig",
                    f"claim {claim.namespace}/{claim.name}: invalid {origin} config: "
                    f"{where}.opaque.parameters is nested more than {MAX_JSON_DEPTH} levels deep",
                )
        return plan_claim(
            claim, doc, driver=self.driver_name, pool=self.node_name, devices=self.devices, kind=self.cdi_kind
        )

    async def _prepare(self, claim: ClaimRef) -> list[PreparedDevice]:
        # Outside the node-wide lock of per-pod sockets: a stalled API server must hold up no unprepare
        # and not the other plugin process (back in, the state is reloaded if that process had it).
        async with outside_node_state():
            doc = await self.claims.get_claim(claim.namespace, claim.name, self._deadline())
        if doc is None:
            raise PlanError("ClaimNotFound", f"claim {claim.namespace}/{claim.name} does not exist")
        plan = self._plan(claim, doc)
        if not plan.devices:
            log.info("no devices of this node in the claim", extra={"claim": str(claim)})
            return []
        record = self.checkpoint.get(claim.uid)
        records = plan.device_records()
        if record is not None and record.completed and record.devices == records:
            # Repeated prepare (kubelet retry or restart): same answer, and put back
            # anything a reboot or a cleaner took away.
            realized, ids = await self._materialized(plan, doc)
            if not self.checkpoint.durable(claim.uid):
                # Completed in memory only (a start-up rebuild whose save failed): write it first.
                await self._commit(claim)
            self._report_status(realized, doc)
            return with_metadata_devices(plan.prepared_devices(), ids)

        # No await between the check and the record: no other claim can slip in between.
        check_sharing(plan, self.checkpoint.records())
        check_memory_fits(plan, self.checkpoint.records())
        if record is not None:
            log.info(
                "preparing a known claim again",
                extra={
                    "claim": str(claim),
                    "state": record.state.value,
                    "same_devices": record.devices == records,
                },
            )
        self.checkpoint.put(
            ClaimRecord(claim.uid, claim.namespace, claim.name, ClaimState.PREPARE_STARTED, records)
        )
        self.metrics.prepared_claims.set(len(self.checkpoint))
        if record is not None:
            # A redo: the file must stop saying what the old record said before anything changes.
            # Not written: nothing changed yet, so memory goes back to the old record (the file's).
            await self._commit(claim, rollback=record)
        # A new claim's `PrepareStarted` is only held in memory (it takes the devices at once) and
        # reaches the file with the next commit of any claim: one checkpoint write (one fsync) per
        # prepare instead of two. Crash-safe because nothing on disk needs it: until the record
        # below is durable the kubelet has no answer and retries; start-up removes a spec that has
        # no record (leaked, never handed out) and releases sharing state (MIG, MPS, time-slices,
        # each in its ledger before it exists) of claims not completed; an unprepare removes
        # both by UID, record or not. So a kill at any point loses no prepared claim and orphans
        # no spec.
        crashpoints.reach(crashpoints.AFTER_CHECKPOINT_STARTED)

        if record is not None and not plan.uses_mps and record.devices != records and not record.from_spec:
            # A redo whose config dropped MPS must not leave the old MPS directory behind. Not for a
            # redo of the same plan (the state is what `apply` reuses), nor for a claim rebuilt from
            # its spec alone: its pod may be running on that state, which `apply` reuses too.
            await asyncio.to_thread(self.sharing.release, claim.uid)
        # The spec, then the device metadata (the crash points are reached in this order).
        realized, ids = await self._materialized(plan, doc, crash_points=True)

        self.checkpoint.put(
            ClaimRecord(claim.uid, claim.namespace, claim.name, ClaimState.PREPARE_COMPLETED, records)
        )
        # Not written: the claim goes back to `PrepareStarted` in memory, so the kubelet's retry
        # does the whole prepare again, this write included, instead of finding it completed. Its
        # CDI spec and sharing state stay, and so do its devices (no other claim may take them
        # while the spec exists): the retry reuses both (`_materialize` is idempotent), an
        # unprepare removes both by UID, and a restart whose file lacks the record removes them as
        # a never-answered claim's. Undoing them here instead would take more writes on the disk
        # that just failed (the sharing ledger lives next to the checkpoint), and half an undo is
        # worse than none. If another claim's commit got the completed record into the file first,
        # the file says more than memory, the safe way round: the devices stay taken either way.
        await self._commit(
            claim,
            rollback=ClaimRecord(claim.uid, claim.namespace, claim.name, ClaimState.PREPARE_STARTED, records),
        )
        crashpoints.reach(crashpoints.AFTER_CHECKPOINT_COMPLETED)
        self._report_status(realized, doc)
        return with_metadata_devices(plan.prepared_devices(), ids)

    async def _commit(self, claim: ClaimRef, rollback: ClaimRecord | None = None) -> None:
        """Write the checkpoint; on failure put `rollback` back in memory and fail the prepare."""
        try:
            await self.checkpoint.commit()
        except OSError as err:
            if rollback is not None:
                self.checkpoint.put(rollback)
                self.metrics.prepared_claims.set(len(self.checkpoint))
            raise PlanError(
                "CheckpointWriteFailed",
                f"claim {claim.namespace}/{claim.name} is not prepared: the checkpoint "
                f"{self.checkpoint.path} could not be written ({err}); the kubelet's retry tries again",
            ) from None

    def _report_status(self, realized: ClaimPlan, doc: dict[str, object]) -> None:
        """Queue the claim's status.devices write; it never delays or fails the prepare."""
        if self.status is not None:
            self.status.prepared(realized, doc)

    def _materialize(self, plan: ClaimPlan) -> ClaimPlan:
        """Sharing state, then the CDI spec that may point at it. Both idempotent. Returns the plan
        as realized (MIG devices created at prepare filled in)."""
        realized, spec = self._realize(plan)
        if self.cdi.write(plan.claim.uid, spec):
            # INFO: once per real preparation (a retry finds the file and writes nothing), and the
            # e2e tests count these lines to prove it.
            log.info(
                "CDI spec written",
                extra={"uid": plan.claim.uid, "path": str(self.cdi.path_for(plan.claim.uid))},
            )
        return realized

    async def _materialized(
        self, plan: ClaimPlan, doc: dict[str, object], *, crash_points: bool = False
    ) -> tuple[ClaimPlan, dict[str, str]]:
        """`_materialize_with_metadata`, on the event loop when it is only file work, else in a
        worker thread.

        Plain file work (a claim without MIG, MPS or time-slices, driver files already found) is
        a few syscalls on files that are never synced: ~0.17 ms of CPU alone. In worker threads
        the same work cost ~1 ms of CPU per claim at 64 concurrent prepares (the threads' own CPU
        times), most of it the GIL handed back and forth between a thread, which drops it at each
        syscall, and the busy loop (futex waits and context switches were a third of the process's
        samples in `perf`). On the loop, a prepare's CPU went from 2.1-2.3 ms to 1.2-1.4 ms. NVML,
        the driver's tools and a search of the driver root take up to seconds, so a plan that needs
        them still goes to a thread."""
        if self.sharing.is_plain(plan) and (self.driver_files is None or self.driver_files.discovered):
            return self._materialize_with_metadata(plan, doc, crash_points=crash_points)
        return await asyncio.to_thread(self._materialize_with_metadata, plan, doc, crash_points=crash_points)

    def _materialize_with_metadata(
        self, plan: ClaimPlan, doc: dict[str, object], *, crash_points: bool = False
    ) -> tuple[ClaimPlan, dict[str, str]]:
        """`_materialize`, then `_write_metadata`: the realized plan and the metadata CDI IDs."""
        realized = self._materialize(plan)
        if crash_points:
            crashpoints.reach(crashpoints.AFTER_CDI_WRITE)
        # After the claim's own spec, before its record: a kill in between leaves files that no
        # durable record holds, which start-up removes (MetadataStore.remove_stale).
        ids = self._write_metadata(realized, doc)
        if crash_points:
            crashpoints.reach(crashpoints.AFTER_METADATA_WRITE)
        return realized, ids

    def _write_metadata(self, realized: ClaimPlan, doc: dict[str, object]) -> dict[str, str]:
        """Each request's device metadata document and the CDI spec mounting it; base request →
        the metadata CDI device ID. Nothing when off. A name that cannot be a path, or a disk that
        takes no write, fails this claim alone, with the reason."""
        if self.metadata is None or not self.metadata.enabled:
            return {}
        metadata = claim_metadata(realized, doc)
        try:
            return self.metadata.write(metadata)
        except OSError as err:
            raise PlanError(
                "DeviceMetadataWriteFailed",
                f"claim {metadata.namespace}/{metadata.name}: its device metadata cannot be written under "
                f"{self.metadata.root} or {self.metadata.cdi_root} ({err}); the kubelet's retry tries again",
            ) from None

    def _spec(self, plan: ClaimPlan) -> cdi.Spec:
        return self._realize(plan)[1]

    def _realize(self, plan: ClaimPlan) -> tuple[ClaimPlan, cdi.Spec]:
        """The plan as realized and the claim's spec, after its sharing state; the driver files first,
        so a claim whose containers would lack them fails before anything is set up for it."""
        driver_edits = None
        if self.driver_files is not None:
            try:
                driver_edits = self.driver_files.edits()
            except DriverRootError as err:
                message = f"CUDA containers cannot get the NVIDIA driver files: {err}"
                raise PlanError(err.reason, message) from None
        plan = self.sharing.apply(plan)  # the plan as realized: created MIG devices filled in
        return plan, render_spec(
            plan, self.sharing.host_dir_for(plan), self.cdi_kind, driver_edits, self.memory_limit_hook
        )

    async def _unprepare(self, claim: ClaimRef) -> None:
        removed = False
        # A UID that cannot name a file was never prepared into one (prepare refuses it at the
        # edge): only a record of it, from an older release, can exist, and it is forgotten.
        if is_safe_uid(claim.uid):
            # One trip to a worker thread (the spec's removal syncs its directory; a release may
            # run NVML or the driver's tools): each trip costs the loop a GIL hand-over each way.
            removed = await asyncio.to_thread(self._remove_state, claim)
        record = self.checkpoint.get(claim.uid)
        known = self.checkpoint.forget(claim.uid)
        if record is not None:
            self.metrics.prepared_claims.set(len(self.checkpoint))
            try:
                await self.checkpoint.commit()
            except OSError:
                # The file still holds the claim: so must memory, or the kubelet's retry would
                # find nothing to forget, answer success without a write, and the next start
                # would bring the claim back from the file and hold its devices for good. Its
                # spec and sharing state are gone already; the retry's removal is a no-op.
                self.checkpoint.put(record)
                self.metrics.prepared_claims.set(len(self.checkpoint))
                raise
            if self.status is not None:
                # Only a claim we prepared can carry our entries; the rest cost no API call.
                self.status.unprepared(claim)
        log.debug(
            "claim unprepared",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "uid": claim.uid,
                "known": known,
                "spec_removed": removed,
            },
        )

    def _remove_state(self, claim: ClaimRef) -> bool:
        """The claim's spec, its device metadata, then its sharing state; whether a spec was removed."""
        removed = self.cdi.remove(claim.uid)
        if self.metadata is not None:
            # Off or on: what an earlier run wrote for the claim goes with it.
            self.metadata.remove(claim.uid, claim.namespace, claim.name)
        crashpoints.reach(crashpoints.UNPREPARE_AFTER_CDI_REMOVE)
        self.sharing.release(claim.uid)
        crashpoints.reach(crashpoints.UNPREPARE_AFTER_RELEASE)
        return removed

    def _failed(self, operation: str, claim: ClaimRef, reason: str, message: str) -> None:
        log.warning(
            "claim operation failed",
            extra={
                "operation": operation,
                "claim": f"{claim.namespace}/{claim.name}",
                "uid": claim.uid,
                "reason": reason,
                "error": message,
            },
        )
        self.metrics.error(operation, reason)
        try:
            self.events.claim_event(claim, reason, message)
        except Exception:  # events are best effort by contract; never let one fail the claim twice
            log.exception("posting the failure event failed", extra={"claim": str(claim)})
