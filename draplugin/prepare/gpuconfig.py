"""The values of our opaque device config (`GpuConfig`) that prepare plans with; stdlib only.

The config API itself (what a document may say, its error messages, its JSON
Schema) is the pydantic model in `draplugin.prepare.claimconfig`, the one
validator: it turns every accepted document into these frozen values. They are
apart from it so that a plugin whose claims carry no opaque config (most: they
get `default_config`) and take no partial share of a shared GPU (whose MPS
limits are a config validated like one) never imports pydantic, some 8 MiB of its resident memory,
and so that `make gpu-check` renders specs with nvidia-ml-py alone. The field
layout mirrors the model's (a unit test keeps the two the same). A config
read back from the checkpoint is `draplugin.prepare.storedconfig`'s.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

KIND: Final = "GpuConfig"


class ConfigError(ValueError):
    """An opaque config is invalid. `path` is the field that is wrong, `problem` what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class SharingStrategy(enum.StrEnum):
    EXCLUSIVE = "Exclusive"
    TIME_SLICING = "TimeSlicing"
    MPS = "MPS"


class TimeSliceInterval(enum.StrEnum):
    DEFAULT = "Default"
    SHORT = "Short"
    MEDIUM = "Medium"
    LONG = "Long"


@dataclass(frozen=True, slots=True)
class TimeSlicingConfig:
    interval: TimeSliceInterval = TimeSliceInterval.DEFAULT


@dataclass(frozen=True, slots=True)
class MpsConfig:
    """MPS limits. Memory limits are in bytes; `None` leaves the CUDA default in place."""

    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: int | None = None
    per_device_pinned_memory_limit: dict[str, int] = field(default_factory=dict)

    def __hash__(self) -> int:
        # Plans are hashable values; the per-device map is hashed by its items.
        limits = tuple(sorted(self.per_device_pinned_memory_limit.items()))
        return hash((self.default_active_thread_percentage, self.default_pinned_device_memory_limit, limits))


@dataclass(frozen=True, slots=True)
class Sharing:
    strategy: SharingStrategy = SharingStrategy.EXCLUSIVE
    time_slicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """A validated config. `default_config(api_version)` is exclusive use of each device."""

    api_version: str
    kind: str = KIND
    sharing: Sharing = field(default_factory=Sharing)

    def to_json(self) -> dict[str, Any]:
        """The canonical document for this config; `validate_opaque_config` reads it back unchanged."""
        sharing: dict[str, Any] = {"strategy": self.sharing.strategy.value}
        if self.sharing.time_slicing is not None:
            sharing["timeSlicingConfig"] = {"interval": self.sharing.time_slicing.interval.value}
        mps = self.sharing.mps
        if mps is not None:
            doc: dict[str, Any] = {}
            if mps.default_active_thread_percentage is not None:
                doc["defaultActiveThreadPercentage"] = mps.default_active_thread_percentage
            if mps.default_pinned_device_memory_limit is not None:
                doc["defaultPinnedDeviceMemoryLimit"] = str(mps.default_pinned_device_memory_limit)
            if mps.per_device_pinned_memory_limit:
                doc["perDevicePinnedMemoryLimit"] = {
                    name: str(limit) for name, limit in sorted(mps.per_device_pinned_memory_limit.items())
                }
            sharing["mpsConfig"] = doc
        return {"apiVersion": self.api_version, "kind": KIND, "sharing": sharing}


def default_config(api_version: str) -> GpuConfig:
    """The config of a device no opaque config applies to: exclusive use."""
    return GpuConfig(api_version=api_version)
