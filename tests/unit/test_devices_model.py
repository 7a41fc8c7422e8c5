"""Device rendering to resource.k8s.io/v1 and the API server's limits, each error naming device and field."""

from __future__ import annotations

from typing import Any

import pytest

from draplugin.devices.model import (
    CounterConsumption,
    CounterSet,
    Device,
    DeviceTaint,
    DeviceValidationError,
    Version,
    format_bytes,
    validate_devices,
)


def device(**overrides: Any) -> Device:
    base: dict[str, Any] = {"name": "gpu-0", "kind": "gpu", "uuid": "GPU-1", "index": 0, "minor": 0}
    base.update(overrides)
    return Device(**base)


def test_to_api_renders_typed_attributes_capacity_taints_and_counters() -> None:
    d = device(
        attributes={
            "index": 3,
            "healthy": True,
            "productName": "NVIDIA L4",
            "driverVersion": Version("580.65.6"),
        },
        capacity={"memory": "23034Mi"},
        consumes_counters=(CounterConsumption("gpu-0-counters", {"memory": "1Gi"}),),
        taints=(DeviceTaint("gpu.draplugin.dev/unhealthy", "NoSchedule", "xid-31"),),
    )
    assert d.to_api() == {
        "name": "gpu-0",
        "attributes": {
            "driverVersion": {"version": "580.65.6"},
            "healthy": {"bool": True},
            "index": {"int": 3},
            "productName": {"string": "NVIDIA L4"},
        },
        "capacity": {"memory": {"value": "23034Mi"}},
        "consumesCounters": [{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "1Gi"}}}],
        "taints": [{"key": "gpu.draplugin.dev/unhealthy", "value": "xid-31", "effect": "NoSchedule"}],
    }


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": "GPU_0"}, "name"),
        ({"name": "g" * 64}, "name"),
        # A final newline: `$` lets it through where the API server's patterns do not.
        ({"name": "gpu-0\n"}, "name"),
        ({"attributes": {"model\n": 1}}, "attributes[model\n]"),
        ({"attributes": {"v": Version("1.0.0\n")}}, "attributes[v]"),
        ({"capacity": {"memory": "40Gi\n"}}, "capacity[memory]"),
        (
            {"attributes": {f"a{i}": i for i in range(30)}, "capacity": {f"c{i}": "1" for i in range(3)}},
            "attributes+capacity",
        ),
        ({"attributes": {"x" * 33: 1}}, "attributes[" + "x" * 33 + "]"),
        ({"attributes": {"bad-name": 1}}, "attributes[bad-name]"),
        ({"attributes": {"Bad_Domain.io/ok": 1}}, "attributes[Bad_Domain.io/ok]"),
        ({"attributes": {"a/b/c": 1}}, "attributes[a/b/c]"),
        ({"attributes": {"productName": "x" * 65}}, "attributes[productName]"),
        ({"attributes": {"driverVersion": Version("580.65.06")}}, "attributes[driverVersion]"),
        ({"attributes": {"v": Version("1.0.0-" + "a" * 60)}}, "attributes[v]"),
        ({"attributes": {"big": 2**63}}, "attributes[big]"),
        ({"attributes": {"f": 1.5}}, "attributes[f]"),
        ({"capacity": {"memory": "40 GB"}}, "capacity[memory]"),
        ({"taints": (DeviceTaint("bad key!", "NoSchedule"),)}, "taints[0].key"),
        ({"taints": (DeviceTaint("k", "Sometimes"),)}, "taints[0].effect"),  # type: ignore[arg-type]
        ({"taints": tuple(DeviceTaint(f"k{i}", "NoSchedule") for i in range(5))}, "taints"),
        ({"consumes_counters": (CounterConsumption("Set", {"a": "1"}),)}, "consumesCounters[0].counterSet"),
    ],
)
def test_limits_name_device_and_field(overrides: dict[str, Any], field: str) -> None:
    d = device(**overrides)
    with pytest.raises(DeviceValidationError) as info:
        d.validate()
    assert info.value.device == d.name
    assert info.value.field_path == field
    assert str(info.value).startswith(f"device {d.name!r}: {field}: ")


def test_limits_accept_the_maximum() -> None:
    device(
        attributes={f"a{i}": "x" * 64 for i in range(31)} | {"resource.kubernetes.io/pcieRoot": "pci0000:00"},
        capacity={},
    ).validate()
    device(attributes={"x" * 32: Version("1.2.3-rc.1+build.5")}).validate()


def test_pool_checks_duplicates_and_counter_references() -> None:
    sets = [CounterSet("gpu-0-counters", {"memory": "40Gi"})]
    with pytest.raises(DeviceValidationError, match="duplicate"):
        validate_devices([device(), device()], sets)
    with pytest.raises(DeviceValidationError, match="unknown counter set 'nope'") as info:
        validate_devices([device(consumes_counters=(CounterConsumption("nope", {"memory": "1"}),))], sets)
    assert info.value.field_path == "consumesCounters[0].counterSet"
    with pytest.raises(DeviceValidationError, match="not defined") as info:
        validate_devices(
            [device(consumes_counters=(CounterConsumption("gpu-0-counters", {"sm": "1"}),))], sets
        )
    assert info.value.field_path == "consumesCounters[0].counters[sm]"


@pytest.mark.parametrize(
    ("text", "version"),
    [("580.65.06", "580.65.6"), ("9.0", "9.0.0"), ("13", "13.0.0"), ("1.2.3-rc1", "1.2.3-rc1")],
)
def test_version_coerce(text: str, version: str) -> None:
    assert Version.coerce(text).value == version


def test_version_coerce_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a numeric version"):
        Version.coerce("v5.x")


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0"), (1023, "1023"), (1024, "1Ki"), (40 << 30, "40Gi"), (81559 << 20, "81559Mi"), (1 << 40, "1Ti")],
)
def test_format_bytes_is_canonical(n: int, text: str) -> None:
    assert format_bytes(n) == text
