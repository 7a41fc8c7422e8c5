"""Our opaque device configuration API (`gpu.draplugin.dev/v1alpha1`, kind `GpuConfig`).

Users put it in `spec.devices.config[].opaque.parameters` of a ResourceClaim,
and admins in a DeviceClass. Example:

    apiVersion: gpu.draplugin.dev/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: MPS
      mpsConfig:
        defaultActiveThreadPercentage: 50
        defaultPinnedDeviceMemoryLimit: 10Gi
        perDevicePinnedMemoryLimit: {gpu-0: 4Gi}

`validate_opaque_config` is the only way in: prepare and any admission
webhook call it, so both accept and reject exactly the same documents. It is
strict (unknown fields, wrong types and impossible values are errors) and every
message starts with the full field path so the user can find the mistake.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import Any, TypeVar

API_VERSION = "gpu.draplugin.dev/v1alpha1"
KIND = "GpuConfig"


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
    """MPS limits. Memory limits are stored in bytes; `None` leaves the CUDA default in place."""

    default_active_thread_percentage: int | None = None
    default_pinned_device_memory_limit: int | None = None
    per_device_pinned_memory_limit: Mapping[str, int] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Sharing:
    strategy: SharingStrategy = SharingStrategy.EXCLUSIVE
    time_slicing: TimeSlicingConfig | None = None
    mps: MpsConfig | None = None


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """A validated config. `GpuConfig()` is the default: exclusive use of each device."""

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
        return {"apiVersion": API_VERSION, "kind": KIND, "sharing": sharing}


DEFAULT_CONFIG = GpuConfig()


def validate_opaque_config(parameters: Any, path: str) -> GpuConfig:
    """Parse and check `opaque.parameters`; raise `ConfigError` naming the field under `path`.

    `path` is where the parameters live in the user's object, for example
    `spec.devices.config[1].opaque.parameters`.
    """
    doc = _object(parameters, path)
    _only_fields(doc, path, ("apiVersion", "kind", "sharing"))
    api_version = _string(doc.get("apiVersion"), f"{path}.apiVersion", required=True)
    if api_version != API_VERSION:
        raise ConfigError(f"{path}.apiVersion", f"must be {API_VERSION!r}, got {api_version!r}")
    kind = _string(doc.get("kind"), f"{path}.kind", required=True)
    if kind != KIND:
        raise ConfigError(f"{path}.kind", f"must be {KIND!r}, got {kind!r}")
    if "sharing" not in doc:
        return DEFAULT_CONFIG
    return GpuConfig(sharing=_sharing(doc["sharing"], f"{path}.sharing"))


def _sharing(value: Any, path: str) -> Sharing:
    doc = _object(value, path)
    _only_fields(doc, path, ("strategy", "timeSlicingConfig", "mpsConfig"))
    raw_strategy = doc.get("strategy", SharingStrategy.EXCLUSIVE.value)
    strategy = _enum(SharingStrategy, raw_strategy, f"{path}.strategy")
    # A settings block for another strategy is almost certainly a mistake
    # (e.g. a forgotten strategy change); silently ignoring it would hide that.
    if "timeSlicingConfig" in doc and strategy is not SharingStrategy.TIME_SLICING:
        raise ConfigError(
            f"{path}.timeSlicingConfig",
            f"is only allowed with strategy TimeSlicing, strategy is {strategy.value}",
        )
    if "mpsConfig" in doc and strategy is not SharingStrategy.MPS:
        raise ConfigError(
            f"{path}.mpsConfig", f"is only allowed with strategy MPS, strategy is {strategy.value}"
        )
    if strategy is SharingStrategy.TIME_SLICING:
        return Sharing(strategy, time_slicing=_time_slicing(doc.get("timeSlicingConfig", {}), path))
    if strategy is SharingStrategy.MPS:
        return Sharing(strategy, mps=_mps(doc.get("mpsConfig", {}), path))
    return Sharing(strategy)


def _time_slicing(value: Any, parent: str) -> TimeSlicingConfig:
    path = f"{parent}.timeSlicingConfig"
    doc = _object(value, path)
    _only_fields(doc, path, ("interval",))
    if "interval" not in doc:
        return TimeSlicingConfig()
    return TimeSlicingConfig(_enum(TimeSliceInterval, doc["interval"], f"{path}.interval"))


def _mps(value: Any, parent: str) -> MpsConfig:
    path = f"{parent}.mpsConfig"
    doc = _object(value, path)
    _only_fields(
        doc,
        path,
        ("defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "perDevicePinnedMemoryLimit"),
    )
    percentage: int | None = None
    if "defaultActiveThreadPercentage" in doc:
        where = f"{path}.defaultActiveThreadPercentage"
        percentage = _integer(doc["defaultActiveThreadPercentage"], where)
        if not 1 <= percentage <= 100:
            raise ConfigError(where, f"must be between 1 and 100, got {percentage}")
    default_limit: int | None = None
    if "defaultPinnedDeviceMemoryLimit" in doc:
        where = f"{path}.defaultPinnedDeviceMemoryLimit"
        default_limit = _memory(doc["defaultPinnedDeviceMemoryLimit"], where)
    per_device: dict[str, int] = {}
    if "perDevicePinnedMemoryLimit" in doc:
        where = f"{path}.perDevicePinnedMemoryLimit"
        limits = _object(doc["perDevicePinnedMemoryLimit"], where)
        for name, limit in limits.items():
            if not _DEVICE_NAME.match(name):
                raise ConfigError(f"{where}[{name}]", "key must be a device name (a DNS label, e.g. gpu-0)")
            per_device[name] = _memory(limit, f"{where}[{name}]")
    return MpsConfig(percentage, default_limit, per_device)


# --- primitive checks ---------------------------------------------------------------------------------

_E = TypeVar("_E", bound=enum.StrEnum)

_DEVICE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[kMGTPE]|[eE]\d+)?$"
)
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL_SUFFIX = {"": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# No GPU has 1 EiB of memory; the cap keeps a hostile exponent from building a huge integer.
_MAX_MEMORY_BYTES = 1 << 60


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _object(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(path, f"must be an object, got {_type_name(value)}")
    for key in value:
        if not isinstance(key, str):
            raise ConfigError(path, f"keys must be strings, got {_type_name(key)}")
    return value


def _only_fields(doc: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for key in doc:
        if key not in allowed:
            raise ConfigError(f"{path}.{key}", f"unknown field (allowed: {', '.join(allowed)})")


def _string(value: Any, path: str, *, required: bool = False) -> str:
    if value is None and required:
        raise ConfigError(path, "required field is missing")
    if not isinstance(value, str):
        raise ConfigError(path, f"must be a string, got {_type_name(value)}")
    return value


def _integer(value: Any, path: str) -> int:
    # JSON `true` decodes to a Python bool, which is an int; it is not a number here.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(path, f"must be an integer, got {_type_name(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(path, f"must be an integer, got {value}")
        return int(value)
    return value


def _enum(cls: type[_E], value: Any, path: str) -> _E:
    text = _string(value, path)
    try:
        return cls(text)
    except ValueError:
        choices = ", ".join(member.value for member in cls)
        raise ConfigError(path, f"must be one of {choices}, got {text!r}") from None


def _memory(value: Any, path: str) -> int:
    """A Kubernetes quantity of bytes (`10Gi`, `500M`, `1073741824`); fractions of a byte round up."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ConfigError(path, f"must be a quantity string such as '4Gi', got {_type_name(value)}")
    text = str(value)
    match = _QUANTITY.match(text)
    if match is None:
        raise ConfigError(path, f"{text!r} is not a Kubernetes quantity (e.g. '512Mi', '4Gi', '10G')")
    suffix = match["suffix"] or ""
    try:
        number = Decimal(match["number"])
        if suffix in _BINARY_SUFFIX:
            amount = number * (1 << _BINARY_SUFFIX[suffix])
        elif suffix in _DECIMAL_SUFFIX:
            amount = number.scaleb(_DECIMAL_SUFFIX[suffix])
        else:
            exponent = int(suffix[1:])
            if exponent > 30:
                raise ConfigError(path, f"{text!r} is larger than any GPU memory")
            amount = number.scaleb(exponent)
    except InvalidOperation:
        raise ConfigError(path, f"{text!r} is not a Kubernetes quantity") from None
    if amount <= 0:
        raise ConfigError(path, f"must be a positive amount of memory, got {text!r}")
    if amount > _MAX_MEMORY_BYTES:
        raise ConfigError(path, f"{text!r} is larger than any GPU memory")
    return int(amount.to_integral_value(rounding=ROUND_CEILING))
