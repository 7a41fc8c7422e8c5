"""Our opaque device configuration API (`<driver name>/v1alpha1`, kind `GpuConfig`).

Users put it in `spec.devices.config[].opaque.parameters` of a ResourceClaim,
and admins in a DeviceClass. Example (driver `gpu.draplugin.dev`):

    apiVersion: gpu.draplugin.dev/v1alpha1
    kind: GpuConfig
    sharing:
      strategy: MPS
      mpsConfig:
        defaultActiveThreadPercentage: 50
        defaultPinnedDeviceMemoryLimit: 10Gi
        perDevicePinnedMemoryLimit: {gpu-0: 4Gi}

The API is one pydantic model: `validate_opaque_config` checks documents with it
(prepare and any admission webhook call it, so both accept and reject exactly the
same documents) and `gpu_config_json_schema` publishes it for admission policies.
A document it accepts becomes the frozen stdlib values prepare plans with
(`draplugin.prepare.gpuconfig`, which also holds the enums, `ConfigError` and
`default_config`): a plugin that never validates a config (no opaque config, no
partial share of a shared GPU) never imports this module, nor pydantic. Prepare
imports it only where it validates.
It is strict (unknown fields, wrong types and impossible values are errors) and
every message starts with the full field path so the user can find the mistake.
The `apiVersion` follows the driver name (`dracommon.drivername`), so callers
pass the one their driver serves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.functional_validators import BeforeValidator
from pydantic_core import ErrorDetails, PydanticCustomError

from dracommon.drivername import config_api_version
from dracommon.quantity import Quantity, QuantityError
from draplugin.prepare import gpuconfig
from draplugin.prepare.gpuconfig import KIND, ConfigError, SharingStrategy, TimeSliceInterval

# No GPU has 1 EiB of memory; anything above is a typo, not a limit.
_MAX_MEMORY_BYTES = 1 << 60
_DEVICE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_API_VERSION_CONTEXT = "api_version"


def _memory_bytes(value: Any) -> int:
    """A Kubernetes quantity of bytes (`10Gi`, `500M`, `1073741824`); fractions of a byte round up."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise PydanticCustomError(
            "quantity_type",
            "must be a quantity string such as '4Gi', got {kind}",
            {"kind": _type_name(value)},
        )
    text = str(value)
    try:
        quantity = Quantity.from_json(value)
    except QuantityError:
        raise PydanticCustomError(
            "quantity",
            "{text} is not a Kubernetes quantity (e.g. '512Mi', '4Gi', '10G')",
            {"text": repr(text)},
        ) from None
    if quantity.sign() <= 0:
        raise PydanticCustomError(
            "quantity_sign", "must be a positive amount of memory, got {text}", {"text": repr(text)}
        )
    if quantity.compare_int(_MAX_MEMORY_BYTES) > 0:
        raise PydanticCustomError(
            "quantity_size", "{text} is larger than any GPU memory", {"text": repr(text)}
        )
    return quantity.value()


# Bytes in Python; in the JSON document a quantity string (or a bare integer, as Kubernetes allows).
MemoryBytes = Annotated[
    int,
    BeforeValidator(_memory_bytes),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}),
]
DeviceName = Annotated[str, StringConstraints(pattern=_DEVICE_NAME_PATTERN)]
# Enum values arrive as JSON strings; strict mode would demand enum instances.
StrategyField = Annotated[SharingStrategy, Field(strict=False)]
IntervalField = Annotated[TimeSliceInterval, Field(strict=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)


class TimeSlicingConfig(_Strict):
    interval: IntervalField = TimeSliceInterval.DEFAULT


class MpsConfig(_Strict):
    """MPS limits. Memory limits are stored in bytes; `None` leaves the CUDA default in place."""

    default_active_thread_percentage: Annotated[int, Field(ge=1, le=100)] | None = Field(
        default=None, alias="defaultActiveThreadPercentage"
    )
    default_pinned_device_memory_limit: MemoryBytes | None = Field(
        default=None, alias="defaultPinnedDeviceMemoryLimit"
    )
    per_device_pinned_memory_limit: dict[DeviceName, MemoryBytes] = Field(
        default_factory=dict,
        alias="perDevicePinnedMemoryLimit",
        # Keys must be device names: the schema says so as the model does.
        json_schema_extra={"additionalProperties": False},
    )


class Sharing(_Strict):
    strategy: StrategyField = SharingStrategy.EXCLUSIVE
    time_slicing: TimeSlicingConfig | None = Field(default=None, alias="timeSlicingConfig")
    mps: MpsConfig | None = Field(default=None, alias="mpsConfig")

    @field_validator("time_slicing", "mps")
    @classmethod
    def _matches_strategy(cls, value: Any, info: ValidationInfo) -> Any:
        # A settings block for another strategy is almost certainly a mistake
        # (e.g. a forgotten strategy change); silently ignoring it would hide that.
        strategy = info.data.get("strategy")
        wanted = SharingStrategy.TIME_SLICING if info.field_name == "time_slicing" else SharingStrategy.MPS
        if strategy is not None and strategy is not wanted:
            raise PydanticCustomError(
                "strategy_mismatch",
                "is only allowed with strategy {wanted}, strategy is {strategy}",
                {"wanted": wanted.value, "strategy": strategy.value},
            )
        return value

    @model_validator(mode="after")
    def _default_settings(self) -> Sharing:
        if self.strategy is SharingStrategy.TIME_SLICING and self.time_slicing is None:
            return self.model_copy(update={"time_slicing": TimeSlicingConfig()})
        if self.strategy is SharingStrategy.MPS and self.mps is None:
            return self.model_copy(update={"mps": MpsConfig()})
        return self


class GpuConfig(_Strict):
    """The document's model; `validate_opaque_config` gives its `gpuconfig.GpuConfig` value."""

    api_version: str = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    sharing: Sharing = Field(default_factory=Sharing)

    @field_validator("api_version")
    @classmethod
    def _served_version(cls, value: str, info: ValidationInfo) -> str:
        expected = (info.context or {}).get(_API_VERSION_CONTEXT)
        if expected is not None and value != expected:
            raise PydanticCustomError(
                "api_version",
                "must be {expected}, got {got}",
                {"expected": repr(expected), "got": repr(value)},
            )
        return value


def validate_opaque_config(parameters: Any, path: str, *, api_version: str) -> gpuconfig.GpuConfig:
    """Parse and check `opaque.parameters`; raise `ConfigError` naming the field under `path`.

    `path` is where the parameters live in the user's object, for example
    `spec.devices.config[1].opaque.parameters`; `api_version` is the one this driver
    serves (`dracommon.drivername.config_api_version(driver_name)`).
    """
    if not isinstance(parameters, Mapping):
        raise ConfigError(path, f"must be an object, got {_type_name(parameters)}")
    try:
        model = GpuConfig.model_validate(dict(parameters), context={_API_VERSION_CONTEXT: api_version})
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        raise ConfigError(_error_path(path, first["loc"]), _problem(first)) from None
    config = _value(model)
    assert isinstance(config, gpuconfig.GpuConfig)
    return config


def _value(model: BaseModel) -> object:
    """The validated model as prepare's values: each model becomes the `gpuconfig` dataclass of its
    name, field by field (tests/unit/test_gpuconfig.py keeps the two layouts the same)."""
    cls = getattr(gpuconfig, type(model).__name__)
    values: dict[str, object] = {}
    for field in dataclasses.fields(cls):
        value = getattr(model, field.name)
        if isinstance(value, BaseModel):
            value = _value(value)
        elif isinstance(value, dict):
            value = dict(value)  # the frozen value owns its map
        values[field.name] = value
    return cls(**values)


def gpu_config_json_schema(driver_name: str) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of the documents `validate_opaque_config` accepts for this driver.

    Cross-field rules (a settings block must match the strategy) are not expressed;
    everything per field is: required fields, enums, ranges, unknown fields.
    """
    schema = GpuConfig.model_json_schema(by_alias=True, mode="validation")
    schema["properties"]["apiVersion"] = {"const": config_api_version(driver_name), "type": "string"}
    return schema


# --- error text ---------------------------------------------------------------------------------------

# Fields whose values are maps keyed by user data: their keys are written `field[key]`.
_MAP_FIELDS = frozenset({"perDevicePinnedMemoryLimit"})


def _error_path(root: str, loc: tuple[int | str, ...]) -> str:
    path = root
    parent = ""
    for part in loc:
        if part == "[key]":
            continue  # pydantic marks a bad map key after naming it: the key is already in the path
        path += f"[{part}]" if parent in _MAP_FIELDS else f".{part}"
        parent = str(part)
    return path


def _allowed_fields(loc: tuple[int | str, ...]) -> str:
    """The field names of the object an unknown field was found in."""
    model: type[BaseModel] = GpuConfig
    for part in loc[:-1]:
        field = next(f for name, f in model.model_fields.items() if (f.alias or name) == part)
        inner = [a for a in getattr(field.annotation, "__args__", (field.annotation,)) if isinstance(a, type)]
        model = next(a for a in inner if issubclass(a, BaseModel))
    return ", ".join(field.alias or name for name, field in model.model_fields.items())


def _problem(error: ErrorDetails) -> str:
    kind, value, context = error["type"], error["input"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"unknown field (allowed: {_allowed_fields(error['loc'])})"
    if kind == "missing":
        return "required field is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be an object, got {_type_name(value)}"
    if kind == "string_type":
        return f"must be a string, got {_type_name(value)}"
    if kind == "int_type":
        shown = value if isinstance(value, float) else _type_name(value)
        return f"must be an integer, got {shown}"
    if kind in ("greater_than_equal", "less_than_equal"):
        return f"must be between 1 and 100, got {value}"
    if kind == "enum":
        choices = context.get("expected", "").replace("'", "").replace(" or ", ", ")
        return f"must be one of {choices}, got {value!r}"
    if kind == "literal_error":
        return f"must be {KIND!r}, got {value!r}"
    if kind == "string_pattern_mismatch" and "[key]" in error["loc"]:
        return "key must be a device name (a DNS label, e.g. gpu-0)"
    return str(error["msg"])


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
