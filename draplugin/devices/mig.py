"""Creating and destroying MIG devices: the interface the backends offer and prepare uses.

`draplugin.devices.nvml` implements it with NVML, `draplugin.devices.fakemig`
for fake GPUs; `draplugin.prepare.mig` drives it at prepare and unprepare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# Reasons of `MigOperationError`, used as Event reasons.
MIG_MODE_DISABLED = "MigModeDisabled"
# A whole GPU was to be handed out while it is in MIG mode (CUDA cannot use it so).
MIG_MODE_ENABLED = "MigModeEnabled"
MIG_PLACEMENT_TAKEN = "MigPlacementTaken"
MIG_ERROR = "MigError"


class MigOperationError(Exception):
    """A MIG create/destroy/lookup failed; `reason` is one of the constants above."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class MigPlacement:
    """Where a MIG device is to be created: parent GPU, profile name ("1g.10gb"), start slice."""

    parent_uuid: str
    parent_minor: int
    profile: str
    start: int
    # The memory slices it covers (from the published device's counters); NVML knows its own.
    slices: tuple[int, ...] = ()
    # NVML's GPU instance profile ID, from the device name; None for fake profiles (by name).
    profile_id: int | None = None


@dataclass(frozen=True, slots=True)
class CreatedMig:
    """A MIG device that exists: GPU/compute instance IDs, UUID, and its own nvidia-caps nodes."""

    gpu_instance_id: int
    compute_instance_id: int
    uuid: str
    cap_nodes: tuple[str, ...]


class MigPartitioner(Protocol):
    def mig_check_free(self, placement: MigPlacement) -> None:
        """Raise `MigOperationError` (MigModeDisabled, MigPlacementTaken) unless it can be created."""
        ...

    def mig_create(self, placement: MigPlacement) -> CreatedMig:
        """Create GPU + compute instance; on failure leave nothing behind and raise."""
        ...

    def mig_find(self, placement: MigPlacement) -> CreatedMig | None:
        """The GPU instance at exactly this placement and profile, if one exists."""
        ...

    def mig_destroy(self, placement: MigPlacement, gpu_instance_id: int | None) -> bool:
        """Destroy the instance with this ID, or (None) the one at the placement. True if none is left."""
        ...


@runtime_checkable
class MigModeSwitch(Protocol):
    """A partitioner that also switches MIG mode (NVML on GPUs that switch without a reset).

    Partitionable GPUs offer the whole GPU and its MIG devices; MIG mode decides which of them
    works. Prepare calls these around creates and destroys; each call holds the GPU's own lock
    so a create on one claim never races the switch-off of another.
    """

    def mig_release_mode(self, parent_uuid: str) -> None:
        """Switch MIG mode off if the GPU can without a reset and no GPU instance is left.
        Never raises: a GPU left in MIG mode is switched off by the next whole-GPU prepare."""
        ...

    def mig_whole_gpu(self, parent_uuid: str) -> None:
        """Make the whole GPU usable: MIG mode off (switched off if nothing is on it), else raise
        `MigOperationError` (MigModeEnabled)."""
        ...
