"""The opaque config API: defaults, accepted documents and the exact error for each bad one."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dracommon.drivername import config_api_version
from draplugin.prepare.claimconfig import gpu_config_json_schema, validate_opaque_config
from draplugin.prepare.gpuconfig import (
    ConfigError,
    GpuConfig,
    MpsConfig,
    SharingStrategy,
    TimeSliceInterval,
    TimeSlicingConfig,
    default_config,
)

PATH = "spec.devices.config[1].opaque.parameters"
DRIVER = "gpu.draplugin.dev"
API_VERSION = config_api_version(DRIVER)


def validate(parameters: Any, path: str = PATH) -> GpuConfig:
    return validate_opaque_config(parameters, path, api_version=API_VERSION)


def doc(sharing: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "GpuConfig", **extra}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def test_no_sharing_means_exclusive() -> None:
    config = validate(doc())
    assert config == default_config(API_VERSION)
    assert config.sharing.strategy is SharingStrategy.EXCLUSIVE


def test_time_slicing_defaults_interval() -> None:
    config = validate(doc({"strategy": "TimeSlicing"}))
    assert config.sharing.time_slicing == TimeSlicingConfig(interval=TimeSliceInterval.DEFAULT)


def test_mps_quantities_are_bytes_rounded_up() -> None:
    config = validate(
        doc(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "perDevicePinnedMemoryLimit": {"gpu-0": "1.5k", "gpu-1": 2048},
                },
            }
        )
    )
    assert config.sharing.mps == MpsConfig(
        default_active_thread_percentage=50,
        default_pinned_device_memory_limit=10 * 2**30,
        per_device_pinned_memory_limit={"gpu-0": 1500, "gpu-1": 2048},
    )


def test_canonical_json_round_trips() -> None:
    config = validate(doc({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Mi"}}))
    assert validate(config.to_json(), "x") == config


def test_api_version_follows_the_driver_name() -> None:
    other = config_api_version("gpu.example.com")
    config = validate_opaque_config(doc(apiVersion=other), PATH, api_version=other)
    assert config.to_json()["apiVersion"] == "gpu.example.com/v1alpha1"
    with pytest.raises(ConfigError, match=r"apiVersion: must be 'gpu\.example\.com/v1alpha1'"):
        validate_opaque_config(doc(), PATH, api_version=other)


INVALID: list[tuple[Any, str]] = [
    ("not an object", f"{PATH}: must be an object, got string"),
    ({"kind": "GpuConfig"}, f"{PATH}.apiVersion: required field is missing"),
    (
        {"apiVersion": "gpu.draplugin.dev/v1", "kind": "GpuConfig"},
        f"{PATH}.apiVersion: must be 'gpu.draplugin.dev/v1alpha1', got 'gpu.draplugin.dev/v1'",
    ),
    ({"apiVersion": API_VERSION, "kind": "TpuConfig"}, f"{PATH}.kind: must be 'GpuConfig', got 'TpuConfig'"),
    (doc(extra=1), f"{PATH}.extra: unknown field (allowed: apiVersion, kind, sharing)"),
    (doc([]), f"{PATH}.sharing: must be an object, got array"),
    (
        doc({"strategy": "Shared"}),
        f"{PATH}.sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, got 'Shared'",
    ),
    (doc({"strategy": 3}), f"{PATH}.sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, got 3"),
    (doc(kind=None), f"{PATH}.kind: must be 'GpuConfig', got None"),
    (
        doc({"strategy": "Exclusive", "mpsConfig": {}}),
        f"{PATH}.sharing.mpsConfig: is only allowed with strategy MPS, strategy is Exclusive",
    ),
    (
        doc({"strategy": "MPS", "timeSlicingConfig": {}}),
        f"{PATH}.sharing.timeSlicingConfig: is only allowed with strategy TimeSlicing, strategy is MPS",
    ),
    (
        doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
        f"{PATH}.sharing.timeSlicingConfig.interval: "
        "must be one of Default, Short, Medium, Long, got 'Forever'",
    ),
    (
        doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Short"}}),
        f"{PATH}.sharing.timeSlicingConfig.intervall: unknown field (allowed: interval)",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 150}}),
        f"{PATH}.sharing.mpsConfig.defaultActiveThreadPercentage: must be between 1 and 100, got 150",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
        f"{PATH}.sharing.mpsConfig.defaultActiveThreadPercentage: must be between 1 and 100, got 0",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}}),
        f"{PATH}.sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer, got boolean",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 12.5}}),
        f"{PATH}.sharing.mpsConfig.defaultActiveThreadPercentage: must be an integer, got 12.5",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "10GB"}}),
        f"{PATH}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '10GB' is not a Kubernetes quantity "
        "(e.g. '512Mi', '4Gi', '10G')",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}),
        f"{PATH}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: "
        "must be a positive amount of memory, got '-1Gi'",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "2Ei"}}),
        f"{PATH}.sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: '2Ei' is larger than any GPU memory",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"perDevicePinnedMemoryLimit": {"GPU 0": "1Gi"}}}),
        f"{PATH}.sharing.mpsConfig.perDevicePinnedMemoryLimit[GPU 0]: key must be a device name "
        "(a DNS label, e.g. gpu-0)",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"perDevicePinnedMemoryLimit": {"gpu-0": None}}}),
        f"{PATH}.sharing.mpsConfig.perDevicePinnedMemoryLimit[gpu-0]: "
        "must be a quantity string such as '4Gi', got null",
    ),
    (
        doc({"strategy": "MPS", "mpsConfig": {"pinnedLimit": "1Gi"}}),
        f"{PATH}.sharing.mpsConfig.pinnedLimit: unknown field (allowed: defaultActiveThreadPercentage, "
        "defaultPinnedDeviceMemoryLimit, perDevicePinnedMemoryLimit)",
    ),
]


@pytest.mark.parametrize(
    ("parameters", "message"), INVALID, ids=[m.split(": ")[0][len(PATH) :] for _, m in INVALID]
)
def test_invalid_config_names_the_field(parameters: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        validate(parameters)
    assert str(caught.value) == message
    assert message.startswith(caught.value.path + ": ")


def _schema_accepts(schema: dict[str, Any], value: Any, root: dict[str, Any]) -> bool:
    """The JSON Schema keywords pydantic emits for GpuConfig, evaluated (no validator library here)."""
    if "$ref" in schema:
        return _schema_accepts(root["$defs"][schema["$ref"].rsplit("/", 1)[1]], value, root)
    if "anyOf" in schema:
        return any(_schema_accepts(option, value, root) for option in schema["anyOf"])
    kinds = {"object": dict, "string": str, "integer": int, "null": type(None)}
    wanted = schema.get("type")
    if wanted is not None and (
        not isinstance(value, kinds[wanted]) or (wanted == "integer" and isinstance(value, bool))
    ):
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "minimum" in schema and value < schema["minimum"]:
        return False
    if "maximum" in schema and value > schema["maximum"]:
        return False
    if isinstance(value, dict):
        if any(key not in value for key in schema.get("required", [])):
            return False
        for key, item in value.items():
            patterns = [s for p, s in schema.get("patternProperties", {}).items() if re.search(p, key)]
            if key in schema.get("properties", {}):
                patterns.append(schema["properties"][key])
            if not patterns and schema.get("additionalProperties") is False:
                return False
            if not all(_schema_accepts(s, item, root) for s in patterns):
                return False
    return True


def _model_accepts(parameters: Any) -> bool:
    try:
        validate(parameters)
    except ConfigError:
        return False
    return True


SCHEMA_CASES: list[Any] = [
    doc(),
    doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    doc(
        {
            "strategy": "MPS",
            "mpsConfig": {
                "defaultActiveThreadPercentage": 100,
                "perDevicePinnedMemoryLimit": {"gpu-0": "1Gi"},
            },
        }
    ),
    {"kind": "GpuConfig"},
    {"apiVersion": API_VERSION},
    doc(apiVersion="gpu.other.dev/v1alpha1"),
    doc(kind="TpuConfig"),
    doc(extra=1),
    doc({"strategy": "Shared"}),
    doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Forever"}}),
    doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Short"}}),
    doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 0}}),
    doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
    doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": True}}),
    doc({"strategy": "MPS", "mpsConfig": {"pinnedLimit": "1Gi"}}),
    doc({"strategy": "MPS", "mpsConfig": {"perDevicePinnedMemoryLimit": {"GPU 0": "1Gi"}}}),
    doc({"strategy": "MPS", "mpsConfig": {"perDevicePinnedMemoryLimit": {"gpu-0": None}}}),
]


@pytest.mark.parametrize("parameters", SCHEMA_CASES)
def test_json_schema_agrees_with_the_model(parameters: Any) -> None:
    schema = gpu_config_json_schema(DRIVER)
    assert _schema_accepts(schema, parameters, schema) is _model_accepts(parameters)


def test_json_schema_names_required_fields_enums_and_closed_objects() -> None:
    schema = gpu_config_json_schema(DRIVER)
    assert schema["required"] == ["apiVersion", "kind"]
    assert schema["properties"]["apiVersion"]["const"] == API_VERSION
    assert schema["$defs"]["SharingStrategy"]["enum"] == [s.value for s in SharingStrategy]
    assert schema["$defs"]["TimeSliceInterval"]["enum"] == [i.value for i in TimeSliceInterval]
    for name in ("Sharing", "TimeSlicingConfig", "MpsConfig"):
        assert schema["$defs"][name]["additionalProperties"] is False
    assert schema["additionalProperties"] is False
    assert (
        gpu_config_json_schema("gpu.example.com")["properties"]["apiVersion"]["const"]
        == "gpu.example.com/v1alpha1"
    )
