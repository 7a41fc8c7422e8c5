"""MIG devices for fake GPUs: create and destroy them the way the NVIDIA driver does, without a GPU.

The "hardware" state is a JSON file (`<state dir>/fake-mig.json`) that
outlives the plugin process, as a real GPU's MIG instances do:

    {"migModeOff": ["GPU-..."],           # GPUs whose MIG mode is off (default: on)
     "failCreate": "compute-instance",     # inject: the next creates fail at this step
     "instances": [{"parent": "GPU-...", "profile": "1g.5gb", "start": 0, "slices": [0],
                    "gi": 1, "ci": 0, "uuid": "MIG-...", "computeInstance": true}]}

Tests and demos edit it to put an instance there that the plugin did not
create (a placement taken by an admin's `nvidia-smi mig -cgi`), turn MIG mode
off or make NVML fail. Overlapping memory slices are refused like NVML's
INSUFFICIENT_RESOURCES. Each MIG device gets the `nvidia-caps` nodes of its GPU
instance and compute instance, as real character devices (1:3, like
`/dev/null`) in the fake device directory, so containers can be checked for
exactly the nodes they were given.

A state file that is not of this shape (an edit gone wrong, garbage) is moved
aside and read as a GPU without instances (`draplugin.statefile.read_state`),
logged: the plugin never crash-loops on it, and MIG operations go on.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid as uuidlib
from pathlib import Path
from typing import Any

from draplugin.devices.fake import make_device_nodes
from draplugin.devices.mig import (
    MIG_ERROR,
    MIG_MODE_DISABLED,
    MIG_PLACEMENT_TAKEN,
    CreatedMig,
    MigOperationError,
    MigPlacement,
)
from draplugin.statefile import StateFormatError, atomic_write, decode_json, read_state

log = logging.getLogger(__name__)

STATE_FILE = "fake-mig.json"
# The injectable failure points of `failCreate`.
FAIL_GPU_INSTANCE = "gpu-instance"
FAIL_COMPUTE_INSTANCE = "compute-instance"


def cap_nodes(minor: int, gi: int, ci: int) -> tuple[str, ...]:
    """The GI and CI access nodes; distinct per (GPU, GI, CI) like the driver's mig-minors table."""
    gi_minor = 1 + minor * 256 + gi * 9
    return (f"/dev/nvidia-caps/nvidia-cap{gi_minor}", f"/dev/nvidia-caps/nvidia-cap{gi_minor + 1 + ci}")


class FakeMigHardware:
    """`draplugin.devices.mig.MigPartitioner` for fake GPUs."""

    def __init__(self, state_file: Path, device_dir: Path | None = None) -> None:
        self.state_file = state_file
        self.device_dir = device_dir
        self._lock = threading.Lock()

    # --- the partitioner ----------------------------------------------------------------------------

    def mig_check_free(self, placement: MigPlacement) -> None:
        with self._lock:
            self._check_free(self._load(), placement)

    def mig_create(self, placement: MigPlacement) -> CreatedMig:
        with self._lock:
            state = self._load()
            self._check_free(state, placement)
            fail = state.get("failCreate")
            if fail == FAIL_GPU_INSTANCE:
                raise MigOperationError(
                    MIG_ERROR, "creating the GPU instance failed: Unknown Error (injected)"
                )
            used = {i["gi"] for i in state["instances"] if i["parent"] == placement.parent_uuid}
            gi = next(n for n in range(1, 64) if n not in used)
            instance = {
                "parent": placement.parent_uuid,
                "minor": placement.parent_minor,
                "profile": placement.profile,
                "start": placement.start,
                "slices": list(placement.slices),
                "gi": gi,
                "ci": 0,
                "uuid": f"MIG-{uuidlib.uuid4()}",
                "computeInstance": fail != FAIL_COMPUTE_INSTANCE,
            }
            state["instances"].append(instance)
            self._save(state)
            if fail == FAIL_COMPUTE_INSTANCE:
                # Left behind on purpose: a driver whose undo failed too (the worst case NVML allows).
                raise MigOperationError(
                    MIG_ERROR,
                    f"creating the compute instance in GPU instance {gi} failed: Unknown Error (injected)",
                )
            created = self._created(instance)
        if self.device_dir is not None:
            try:
                make_device_nodes(self.device_dir, created.cap_nodes)
            except ValueError as err:
                self.mig_destroy(placement, created.gpu_instance_id)
                raise MigOperationError(MIG_ERROR, str(err)) from None
        return created

    def mig_find(self, placement: MigPlacement) -> CreatedMig | None:
        with self._lock:
            instance = self._at(self._load(), placement)
            return None if instance is None else self._created(instance)

    def mig_destroy(self, placement: MigPlacement, gpu_instance_id: int | None) -> bool:
        with self._lock:
            state = self._load()
            if state.get("failDestroy"):
                raise MigOperationError(MIG_ERROR, "destroying the GPU instance failed: In use (injected)")
            target = self._at(state, placement)
            if target is None or (gpu_instance_id is not None and target["gi"] != gpu_instance_id):
                return True  # already gone (or replaced by someone else's: not ours to touch)
            state["instances"].remove(target)
            self._save(state)
            return True

    # --- state --------------------------------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._load()["instances"])

    def _check_free(self, state: dict[str, Any], placement: MigPlacement) -> None:
        if placement.parent_uuid in state.get("migModeOff", []):
            raise MigOperationError(
                MIG_MODE_DISABLED,
                f"GPU {placement.parent_uuid} has MIG mode off; enable it (nvidia-smi -i <gpu> -mig 1) "
                "before MIG devices can be created",
            )
        wanted = set(placement.slices) or {placement.start}
        for instance in state["instances"]:
            if instance["parent"] != placement.parent_uuid:
                continue
            taken = set(instance.get("slices") or [instance["start"]])
            if taken & wanted:
                raise MigOperationError(
                    MIG_PLACEMENT_TAKEN,
                    f"MIG placement {placement.profile}@{placement.start} on GPU {placement.parent_uuid} "
                    f"overlaps existing GPU instance {instance['gi']} ({instance['profile']}@"
                    f"{instance['start']}), which this claim did not create",
                )

    @staticmethod
    def _at(state: dict[str, Any], placement: MigPlacement) -> dict[str, Any] | None:
        instance: dict[str, Any]
        for instance in state["instances"]:
            if (
                instance["parent"] == placement.parent_uuid
                and instance["start"] == placement.start
                and instance["profile"] == placement.profile
            ):
                return instance
        return None

    @staticmethod
    def _created(instance: dict[str, Any]) -> CreatedMig:
        gi, ci = int(instance["gi"]), int(instance["ci"])
        nodes = cap_nodes(int(instance.get("minor", 0)), gi, ci)
        return CreatedMig(
            gi, ci, str(instance["uuid"]), nodes if instance.get("computeInstance") else nodes[:1]
        )

    def _load(self) -> dict[str, Any]:
        state = read_state(self.state_file, parse_state, what="fake MIG state").value
        return state if state is not None else {"instances": []}

    def _save(self, state: dict[str, Any]) -> None:
        atomic_write(self.state_file, (json.dumps(state, indent=1) + "\n").encode())


# The instance fields and their types, as `mig_create` writes them; those with a default are optional.
_INSTANCE_FIELDS: dict[str, tuple[type, bool]] = {
    "parent": (str, True),
    "profile": (str, True),
    "start": (int, True),
    "gi": (int, True),
    "ci": (int, True),
    "uuid": (str, True),
    "minor": (int, False),
    "slices": (list, False),
    "computeInstance": (bool, False),
}


def parse_state(raw: bytes) -> dict[str, Any]:
    """The state document, checked to be of the shape the operations above read (StateFormatError)."""
    state = decode_json(raw)
    if not isinstance(state, dict):
        raise StateFormatError("top level is not an object")
    state.setdefault("instances", [])
    if not isinstance(state["instances"], list):
        raise StateFormatError("instances is not a list")
    for i, instance in enumerate(state["instances"]):
        if not isinstance(instance, dict):
            raise StateFormatError(f"instances[{i}] is not an object")
        for name, (wanted, required) in _INSTANCE_FIELDS.items():
            if name not in instance and not required:
                continue
            value = instance.get(name)
            if not isinstance(value, wanted) or (wanted is int and isinstance(value, bool)):
                raise StateFormatError(f"instances[{i}].{name} is missing or not a {wanted.__name__}")
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in instance.get("slices", [])):
            raise StateFormatError(f"instances[{i}].slices is not a list of integers")
    mode_off = state.get("migModeOff", [])
    if not isinstance(mode_off, list) or not all(isinstance(u, str) for u in mode_off):
        raise StateFormatError("migModeOff is not a list of GPU UUIDs")
    if not isinstance(state.get("failCreate"), str | None):
        raise StateFormatError("failCreate is not a string")
    return state
