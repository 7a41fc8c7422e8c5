"""Creating and destroying MIG devices: the interface the backends offer and prepare uses.

`draplugin.devices.nvml` implements it with NVML, `draplugin.devices.fakemig`
for fake GPUs; `draplugin.prepare.mig` drives it at prepare and unprepare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Reasons of `MigOperationError`, used as Event reasons.
MIG_MODE_DISABLED = "MigModeDisabled"
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
