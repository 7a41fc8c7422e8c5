"""The opaque config API: defaults, accepted documents and the exact error for each bad one."""

from __future__ import annotations

from typing import Any

import pytest

from draplugin.prepare.claimconfig import (
    API_VERSION,
    ConfigError,
    GpuConfig,
    MpsConfig,
    Sharing,
    SharingStrategy,
    TimeSliceInterval,
    TimeSlicingConfig,
    validate_opaque_config,
)

PATH = "spec.devices.config[1].opaque.parameters"


def doc(sharing: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "GpuConfig", **extra}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def test_no_sharing_means_exclusive() -> None:
    assert validate_opaque_config(doc(), PATH) == GpuConfig(Sharing(SharingStrategy.EXCLUSIVE))


def test_time_slicing_defaults_interval() -> None:
    config = validate_opaque_config(doc({"strategy": "TimeSlicing"}), PATH)
    assert config.sharing.time_slicing == TimeSlicingConfig(TimeSliceInterval.DEFAULT)


def test_mps_quantities_are_bytes_rounded_up() -> None:
    config = validate_opaque_config(
        doc(
            {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 50,
                    "defaultPinnedDeviceMemoryLimit": "10Gi",
                    "perDevicePinnedMemoryLimit": {"gpu-0": "1.5k", "gpu-1": 2048},
                },
            }
        ),
        PATH,
    )
    assert config.sharing.mps == MpsConfig(50, 10 * 2**30, {"gpu-0": 1500, "gpu-1": 2048})


def test_canonical_json_round_trips() -> None:
    config = validate_opaque_config(
        doc({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "1Mi"}}), PATH
    )
    assert validate_opaque_config(config.to_json(), "x") == config


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
    (doc({"strategy": 3}), f"{PATH}.sharing.strategy: must be a string, got number"),
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
        validate_opaque_config(parameters, PATH)
    assert str(caught.value) == message
    assert message.startswith(caught.value.path + ": ")
