"""Dynamic MIG: create the MIG device a claim was allocated at prepare, destroy it at unprepare.

A partitionable GPU publishes every MIG profile placement as a device with no
UUID (`draplugin.devices.schema`); the scheduler's shared counters keep two
claims off overlapping slices. Prepare turns the allocated placement into a
real GPU instance plus a compute instance spanning it, and the claim's CDI
device gets what the NVIDIA container toolkit gives a MIG device: the parent's
`/dev/nvidiaN` and control nodes (CUDA opens the GPU through them; with MIG
mode on they grant no compute by themselves) plus the `nvidia-caps` nodes of
exactly this GPU instance and compute instance, which is what lets a process
use the slice. Never the caps of another instance, never `mig/config` or
`mig/monitor`.

Crash safety, in order, each step durable before the next:
  1. the placement is checked free (taken by anyone else: `MigPlacementTaken`);
  2. a `creating` entry for (claim, device) goes into the sharing ledger;
  3. MIG mode is switched on if it is off (partitionable GPUs that switch without
     a reset: Hopper and later), then the GPU instance and compute instance are
     created (a half, GI without CI, is undone);
  4. the entry becomes `created` with the IDs and the MIG device's UUID.
A `creating` entry found at start-up means a crash inside step 3: whatever sits
at that placement was created by us (it was free in step 1) and is destroyed.

MIG mode goes back off when the last GPU instance of the GPU is gone: after
every destroy of ours (unprepare, an undone create, the start-up release of a
`creating` entry, which covers a kill between the switch and the create). A
whole GPU of a partitionable GPU is handed out only with MIG mode off: its
prepare switches the mode off when nothing is on the GPU and fails
(`MigModeEnabled`) when something is. MIG mode itself needs no ledger entry:
off is where every path ends, and what is on the GPU says whether it may go off.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from draplugin import crashpoints
from draplugin.devices.mig import (
    CreatedMig,
    MigModeSwitch,
    MigOperationError,
    MigPartitioner,
    MigPlacement,
)
from draplugin.devices.model import Device
from draplugin.devices.naming import DeviceNaming, mig_name
from draplugin.devices.schema import KIND_GPU, KIND_MIG
from draplugin.prepare.errors import PlanError
from draplugin.prepare.ledger import LedgerEntry, SharingLedger

if TYPE_CHECKING:  # for the annotations only: the sharing mechanisms load without planning
    from draplugin.prepare.plan import ClaimPlan

log = logging.getLogger(__name__)

KIND = "mig"
_MEMORY_SLICE_COUNTER = "memory-slice-"


class MigError(PlanError):
    """MIG prepare failed; `reason` says why (MigModeDisabled, MigPlacementTaken, MigError, ...)."""


def needs_instance(device: Device) -> bool:
    """A partitionable MIG device: published without a UUID, created at prepare."""
    return device.kind == KIND_MIG and not device.uuid


def needs_whole_gpu(device: Device) -> bool:
    """A whole GPU of a partitionable GPU (it draws from the counters its MIG devices share)."""
    return device.kind == KIND_GPU and bool(device.consumes_counters) and bool(device.uuid)


def placement_of(device: Device) -> MigPlacement:
    """The placement a partitionable MIG device names (`gpu-0-mig-1g10gb-19-3`: profile 1g.10gb,
    NVML profile ID 19, start 3; fake profiles have no ID: `gpu-0-mig-1g5gb-3`). Either naming
    scheme (`draplugin.devices.naming`): ours starts with the GPU's index, NVIDIA's with its minor."""
    profile = device.attributes.get("profile")
    head, _, tail = device.name.rpartition("-")
    if not isinstance(profile, str) or not tail.isdigit() or device.parent_uuid is None:
        raise MigError("MigError", f"device {device.name} does not name a MIG placement")
    start = int(tail)
    maybe_id = head.rpartition("-")[2]
    profile_id = next(
        (
            pid
            for pid in ((int(maybe_id),) if maybe_id.isdigit() else ()) + (None,)
            if device.name in _names_of(device, profile, start, pid)
        ),
        -1,
    )
    if profile_id == -1:
        raise MigError("MigError", f"device {device.name} does not name a MIG placement")
    slices = sorted(
        int(key.removeprefix(_MEMORY_SLICE_COUNTER))
        for consumption in device.consumes_counters
        for key in consumption.counters
        if key.startswith(_MEMORY_SLICE_COUNTER) and key.removeprefix(_MEMORY_SLICE_COUNTER).isdigit()
    )
    return MigPlacement(device.parent_uuid, device.minor, profile, start, tuple(slices), profile_id)


def _names_of(device: Device, profile: str, start: int, profile_id: int | None) -> set[str]:
    """What the placement is called in each naming scheme, for this device's parent GPU."""
    return {
        mig_name(
            naming,
            gpu_index=device.index,
            gpu_minor=device.minor,
            profile=profile,
            placement_start=start,
            profile_id=profile_id,
        )
        for naming in DeviceNaming
    }


def _entry_placement(entry: LedgerEntry) -> MigPlacement:
    data = entry.data
    profile_id = data.get("profileId")
    return MigPlacement(
        str(data["parent"]),
        int(data["minor"]),
        str(data["profile"]),
        int(data["start"]),
        tuple(int(s) for s in data.get("slices", [])),
        profile_id if isinstance(profile_id, int) else None,
    )


def _placement_data(placement: MigPlacement) -> dict[str, object]:
    data: dict[str, object] = {
        "parent": placement.parent_uuid,
        "minor": placement.parent_minor,
        "profile": placement.profile,
        "start": placement.start,
        "slices": list(placement.slices),
    }
    if placement.profile_id is not None:
        data["profileId"] = placement.profile_id
    return data


def ready_whole_gpus(plan: ClaimPlan, partitioner: MigPartitioner) -> None:
    """Before a whole GPU of a partitionable GPU is handed out: MIG mode off (CUDA cannot use a
    GPU in MIG mode). Switched off when nothing is on it; `MigError` (MigModeEnabled) otherwise."""
    if not isinstance(partitioner, MigModeSwitch):
        return  # fake GPUs: their MIG state has no mode to switch
    for parent in dict.fromkeys(d.device.uuid for d in plan.devices if needs_whole_gpu(d.device)):
        try:
            partitioner.mig_whole_gpu(parent)
        except MigOperationError as err:
            who = f"{plan.claim.namespace}/{plan.claim.name}"
            raise MigError(err.reason, f"claim {who}: {err}") from None


def _release_modes(parents: set[str], partitioner: MigPartitioner) -> None:
    """MIG mode off on the GPUs whose last GPU instance is gone (the partitioner checks)."""
    if isinstance(partitioner, MigModeSwitch):
        for parent in sorted(parents):
            partitioner.mig_release_mode(parent)


def _realized(device: Device, created: CreatedMig) -> Device:
    return replace(device, uuid=created.uuid, device_nodes=(*device.device_nodes, *created.cap_nodes))


def create_for_claim(plan: ClaimPlan, partitioner: MigPartitioner, ledger: SharingLedger) -> ClaimPlan:
    """Make every partitionable MIG device of the plan exist; the plan with their real UUIDs and nodes.

    Idempotent: a device the ledger says was created for this claim and that
    still exists is reused (a repeated prepare gives the same answer). On any
    failure, what this call created is destroyed before the error propagates.
    """
    try:
        return _create_all(plan, partitioner, ledger)
    except MigOperationError as err:
        who = f"{plan.claim.namespace}/{plan.claim.name}"
        raise MigError(err.reason, f"claim {who}: {err}") from None


def create_device(uid: str, device: Device, partitioner: MigPartitioner, ledger: SharingLedger) -> Device:
    """`create_for_claim` for one partitionable MIG device (`make gpu-check`): the device as created
    (its MIG UUID and caps nodes), recorded in the ledger for `destroy_for_claim`."""
    try:
        placement = placement_of(device)
        created = _existing(uid, device.name, placement, partitioner, ledger)
        if created is None:
            created = _create(uid, device.name, placement, partitioner, ledger)
    except MigOperationError as err:
        raise MigError(err.reason, f"claim uid {uid}: {err}") from None
    return _realized(device, created)


def _create_all(plan: ClaimPlan, partitioner: MigPartitioner, ledger: SharingLedger) -> ClaimPlan:
    uid = plan.claim.uid
    made: list[tuple[MigPlacement, CreatedMig, str]] = []
    realized: dict[str, Device] = {}
    try:
        for planned in plan.devices:
            device = planned.device
            if not needs_instance(device) or device.name in realized:
                continue
            placement = placement_of(device)
            created = _existing(uid, device.name, placement, partitioner, ledger)
            if created is None:
                created = _create(uid, device.name, placement, partitioner, ledger)
                made.append((placement, created, device.name))
            realized[device.name] = _realized(device, created)
    except Exception:
        for placement, created, name in reversed(made):
            if _destroy_quietly(placement, created.gpu_instance_id, partitioner):
                ledger.drop(uid, KIND, name)
        _release_modes({p.parent_uuid for p, _, _ in made}, partitioner)
        raise
    if not realized:
        return plan
    devices = tuple(
        replace(d, device=realized[d.device.name]) if d.device.name in realized else d for d in plan.devices
    )
    return replace(plan, devices=devices)


def _existing(
    uid: str, name: str, placement: MigPlacement, partitioner: MigPartitioner, ledger: SharingLedger
) -> CreatedMig | None:
    entry = ledger.get(uid, KIND, name)
    if entry is None:
        return None
    found = partitioner.mig_find(placement)
    if entry.state == "created" and found is not None and found.gpu_instance_id == entry.data.get("gi"):
        return found
    if entry.state == "creating" and found is not None:
        # A crash inside create: the instance is ours but may lack its compute instance. Start over.
        partitioner.mig_destroy(placement, found.gpu_instance_id)
        _release_modes({placement.parent_uuid}, partitioner)
    # Recorded but gone (a GPU reset, a reboot, someone destroyed it): create it again.
    ledger.drop(uid, KIND, name)
    return None


def _create(
    uid: str, name: str, placement: MigPlacement, partitioner: MigPartitioner, ledger: SharingLedger
) -> CreatedMig:
    partitioner.mig_check_free(placement)
    ledger.put(LedgerEntry(uid, KIND, name, "creating", _placement_data(placement)))
    try:
        created = partitioner.mig_create(placement)
    except MigOperationError:
        # The partitioner undoes a half-made instance; if that undo failed too, the "creating"
        # entry stays so the next prepare or start-up destroys what is left at the placement.
        if _nothing_at(placement, partitioner):
            ledger.drop(uid, KIND, name)
            _release_modes({placement.parent_uuid}, partitioner)  # the create may have switched it on
        raise
    crashpoints.reach(crashpoints.AFTER_MIG_CREATE)
    data = {**_placement_data(placement), "gi": created.gpu_instance_id, "ci": created.compute_instance_id}
    ledger.put(LedgerEntry(uid, KIND, name, "created", {**data, "uuid": created.uuid}))
    log.info(
        "MIG device created",
        extra={
            "claim_uid": uid,
            "device": name,
            "parent": placement.parent_uuid,
            "profile": placement.profile,
            "start": placement.start,
            "gi": created.gpu_instance_id,
            "ci": created.compute_instance_id,
            "uuid": created.uuid,
        },
    )
    return created


def _nothing_at(placement: MigPlacement, partitioner: MigPartitioner) -> bool:
    try:
        return partitioner.mig_find(placement) is None
    except MigOperationError:
        return False


def destroy_for_claim(uid: str, partitioner: MigPartitioner, ledger: SharingLedger) -> None:
    """Destroy exactly the MIG devices the ledger says were created for this claim (or were being)."""
    try:
        _destroy_all(uid, partitioner, ledger)
    except MigOperationError as err:
        raise MigError(err.reason, f"claim uid {uid}: {err}") from None


def _destroy_all(uid: str, partitioner: MigPartitioner, ledger: SharingLedger) -> None:
    parents: set[str] = set()
    try:
        _destroy_entries(uid, partitioner, ledger, parents)
    finally:
        _release_modes(parents, partitioner)


def _destroy_entries(uid: str, partitioner: MigPartitioner, ledger: SharingLedger, parents: set[str]) -> None:
    for entry in ledger.entries(uid, KIND):
        placement = _entry_placement(entry)
        gi = entry.data.get("gi") if entry.state == "created" else None
        if gi is not None and not isinstance(gi, int):
            gi = None
        # A "creating" entry has no ID yet: the placement was free before, so what sits there is ours.
        if partitioner.mig_destroy(placement, gi):
            ledger.drop(uid, KIND, entry.key)
            parents.add(placement.parent_uuid)
            log.info("MIG device destroyed", extra={"claim_uid": uid, "device": entry.key, "gi": gi})


def _destroy_quietly(placement: MigPlacement, gi: int, partitioner: MigPartitioner) -> bool:
    try:
        return partitioner.mig_destroy(placement, gi)
    except (
        MigOperationError,
        OSError,
    ):  # the original error matters more; the ledger entry stays for start-up GC
        log.exception("undoing a MIG create failed", extra={"parent": placement.parent_uuid, "gi": gi})
        return False
