"""The device view limited to what an expression can read (controller.cel.device.ViewPlan)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.cel import EvaluationError, compile_selector
from controller.cel.analysis import WILDCARD
from controller.cel.device import DeviceShapeError, ViewPlan, build_view

DRIVER = "gpu.example.com"
DEVICE: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "model": {"string": "H100"},
        "gpu.example.com/index": {"int": 2},
        "driverVersion": {"version": "550.54.15"},
        "other.example.com/zone": {"string": "a"},
    },
    "capacity": {"memory": {"value": "80Gi"}, "other.example.com/slots": {"value": "4"}},
}


def _view(device: dict[str, Any], plan: ViewPlan | None) -> dict[str, Any]:
    return build_view(DRIVER, device, semver=lambda v: v, quantity=lambda q: q, plan=plan)


def test_plan_builds_only_the_entries_read_by_name_in_either_spelling() -> None:
    plan = ViewPlan((("attributes", DRIVER, "model"), ("attributes", DRIVER, "index")), DRIVER)
    view = _view(DEVICE, plan)
    assert view["attributes"] == {DRIVER: {"model": "H100", "index": 2}}
    assert view["capacity"] == {}
    assert view["driver"] == DRIVER and view["allowMultipleAllocations"] is False


def test_plan_keeps_a_domain_read_as_a_whole_and_everything_for_a_wildcard() -> None:
    domain = _view(DEVICE, ViewPlan((("attributes", "other.example.com", WILDCARD),), DRIVER))
    assert domain["attributes"] == {"other.example.com": {"zone": "a"}}
    whole = _view(DEVICE, ViewPlan((("capacity", WILDCARD, WILDCARD),), DRIVER))
    assert whole["capacity"] == _view(DEVICE, None)["capacity"]
    assert whole["attributes"] == {}


def test_plan_falls_back_to_the_whole_build_when_both_spellings_are_present() -> None:
    device = {"attributes": {"model": {"string": "A"}, "gpu.example.com/model": {"string": "B"}}}
    plan = ViewPlan((("attributes", DRIVER, "model"),), DRIVER)
    assert _view(device, plan) == _view(device, None)


def test_a_read_entry_is_still_validated() -> None:
    plan = ViewPlan((("attributes", DRIVER, "model"),), DRIVER)
    with pytest.raises(DeviceShapeError):
        _view({"attributes": {"model": None}}, plan)
    with pytest.raises(DeviceShapeError):
        _view({"attributes": {"model": {"version": "not-semver"}}}, plan)


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ('device.attributes["gpu.example.com"].model == "H100"', True),
        (
            'device.attributes["gpu.example.com"].index == 2 && device.capacity["gpu.example.com"].memory'
            '.isGreaterThan(quantity("40Gi"))',
            True,
        ),
        ('"zone" in device.attributes["other.example.com"]', True),
        ('device.attributes["gpu.example.com"].size() == 3', True),
        ('device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.0.0"))', True),
        ('"uuid" in device.attributes["gpu.example.com"]', False),
    ],
)
def test_selectors_decide_as_with_the_whole_view(expression: str, expected: bool) -> None:
    assert compile_selector(expression, engine="cel-expr-python").matches_uncached(DRIVER, DEVICE) is expected


def test_a_missing_read_attribute_is_still_no_such_key() -> None:
    selector = compile_selector('device.attributes["gpu.example.com"].uuid == "x"', engine="cel-expr-python")
    with pytest.raises(EvaluationError) as failure:
        selector.matches_uncached(DRIVER, DEVICE)
    assert failure.value.cause == "no such key: uuid"
