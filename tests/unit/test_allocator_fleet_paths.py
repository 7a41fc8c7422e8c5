"""The allocator's shortcuts for fleet-size node views give what their general forms give:
candidates built without the dataclass's __init__, the unmodelled-attribute scan's one-union
test, and selector verdicts from the compiled-Python functions called directly."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from controller import cel
from controller.allocation.builders import device, device_class, resource_slice
from controller.allocation.pools import Pool
from controller.allocation.requests import alternatives
from controller.allocation.search import Candidate, candidate_of, has_plain_capacity
from controller.allocation.selectors import SelectorProgram
from controller.allocation.unsupported import slice_problems
from controller.scheduler.allocator import SELECTOR_ERRS, Allocator, Node

D = "gpu.draplugin.dev"
ATTRS = f'device.attributes["{D}"]'


def test_candidate_of_sets_every_field_as_the_constructor_does() -> None:
    pool = Pool(driver=D, name="p")
    dev = device("gpu-0", {"model": "H100"}, capacity={"memory": "80Gi"})
    dev["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    slice_obj = resource_slice("s", [dev], node="n", pool="p")
    slice_obj["spec"]["perDeviceNodeSelection"] = True
    built = candidate_of(pool, slice_obj, dev)
    expected = Candidate(
        built.device_id,
        dev,
        slice_obj,
        pool,
        consumes_counters=False,
        per_device_node_selection=True,
        plain_capacity=has_plain_capacity(dev),
        allows_multiple=False,
        tainted=True,
    )
    assert set(vars(built)) == {f.name for f in dataclasses.fields(Candidate)}
    assert built == expected and built.selected == {} and built.selected is not expected.selected
    assert tuple(built.device_id) == (D, "p", "gpu-0") and type(built.device_id) is type(expected.device_id)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.tainted = False  # type: ignore[misc]


@pytest.mark.parametrize(
    ("value", "flagged"),
    [
        ({"ints": [1, 2]}, True),
        ({"strings": ["a"]}, True),
        ({"string": "ints"}, False),
        (["ints"], False),  # not a mapping: not an attribute value with a list key
        ("ints", False),
        (5, False),
        (None, False),
        ([{"ints": 1}], False),
    ],
)
def test_the_attribute_scan_flags_only_mapping_values_with_list_keys(value: object, flagged: bool) -> None:
    dev = device("gpu-0", {"model": "H100"})
    dev["attributes"]["odd"] = value
    problems = slice_problems(resource_slice("s", [dev], node="n"))
    assert [p.where for p in problems] == (
        ["ResourceSlice s, device gpu-0, attribute odd"] if flagged else []
    )


class PlainProgram:
    """The real compiled selector without its fast function: the general path only."""

    def __init__(self, expression: str) -> None:
        self.inner = cel.compile_selector(expression)

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        return self.inner.matches(driver, device)


def _plain_compiler(expression: str) -> SelectorProgram:
    return PlainProgram(expression)


def test_direct_fast_functions_give_the_general_verdicts_and_errors() -> None:
    devices = [
        device("gpu-0", {"model": "H100", "tier": "gold"}),
        device("gpu-1", {"model": "A100", "tier": "gold"}),
        device("gpu-2", {"model": "H100"}),  # no tier: the claim's selector errs here
        device("gpu-3", {"model": "H100", "tier": "silver"}),
    ]
    devices[3]["attributes"]["tier"] = {"int": 3}  # CEL's == of an int and a string: false
    slices = [resource_slice("s", devices, node="n", pool="n")]
    classes = [device_class("gpu", [f'{ATTRS}.model == "H100"'])]
    selector = {"cel": {"expression": f'{ATTRS}.tier == "gold"'}}
    request = {"name": "r", "exactly": {"deviceClassName": "gpu", "selectors": [selector]}}
    option = alternatives(request)[0]
    answers = []
    for compiler in (None, _plain_compiler):
        allocator = Allocator(device_classes=classes, slices=slices, compiler=compiler)
        failing = allocator.first_failing(Node("n"), option)
        memo = [dict(c.selected) for c in allocator.search([], Node("n")).candidates[0]]
        answers.append((failing, memo))
    assert answers[0] == answers[1]
    assert answers[0][0] == [[None, 0, SELECTOR_ERRS, 1]]
