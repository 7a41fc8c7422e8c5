"""explain: which filter removed which devices, who holds devices in use, constraint conflicts."""

from __future__ import annotations

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    resource_slice,
    with_allocation,
)
from controller.explain.explanation import explain_claim
from controller.scheduler.allocator import Allocator, Node

D = "gpu.draplugin.dev"


def allocator() -> Allocator:
    devices = [
        device("gpu-0", {"model": "H100", "numa": 0}),
        device("gpu-1", {"model": "H100", "numa": 1}),
        device("gpu-2", {"model": "A100", "numa": 0}),
        device("gpu-3", {"model": "A100", "numa": 1}, taints=[{"key": "broken", "effect": "NoSchedule"}]),
    ]
    holder = with_allocation(
        claim("holder", [exactly("gpu")], namespace="team"),
        {"devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-2"}]}},
    )
    return Allocator(
        device_classes=[device_class("gpu")],
        slices=[resource_slice("s", devices, node="node-a")],
        allocated_claims=[holder],
    )


def test_counts_each_filter_and_names_the_holder() -> None:
    c = claim("c", [exactly("gpu", count=2, selectors=[f'device.attributes["{D}"].model == "A100"'])])
    explanation = explain_claim(allocator(), c, [Node("node-a")])
    request = explanation.nodes[0].requests[0]
    pool = request.pools[0]
    assert (pool.devices, pool.usable) == (4, 0)
    assert dict(pool.removed) == {"request-selector": 2, "in-use": 1, "taint": 1}
    assert dict(pool.holders) == {"team/holder": 1}
    assert "request selector removed 2" in explanation.summary
    assert "untolerated taint removed 1" in explanation.summary
    assert explanation.to_json()["nodes"][0]["requests"][0]["pools"][0]["inUseBy"] == {"team/holder": 1}


def test_cel_errors_are_reported_per_device() -> None:
    c = claim("c", [exactly("gpu", selectors=[f'device.attributes["{D}"].missing == 1'])])
    explanation = explain_claim(allocator(), c, [Node("node-a")])
    pool = explanation.nodes[0].requests[0].pools[0]
    assert pool.removed["cel-error"] == 4
    assert "no such key" in pool.cel_errors[0]
    assert "CEL runtime error" in explanation.nodes[0].verdict


def test_constraint_conflict_when_enough_devices_pass_the_filters() -> None:
    # gpu-0 (numa 0) and gpu-1 (numa 1) pass every filter, but not with the same numa.
    c = claim("c", [exactly("gpu", count=2)], constraints=[{"matchAttribute": f"{D}/numa"}])
    explanation = explain_claim(allocator(), c, [Node("node-a")])
    node = explanation.nodes[0]
    assert not node.allocatable
    assert node.requests[0].usable == 2
    assert node.verdict.startswith("constraint conflict")
    assert "matchAttribute gpu.draplugin.dev/numa" in node.verdict


def test_allocatable_claim_says_where() -> None:
    explanation = explain_claim(allocator(), claim("c", [exactly("gpu")]), [Node("node-a"), Node("node-b")])
    assert [n.allocatable for n in explanation.nodes] == [True, False]
    assert explanation.summary == "claim default/c can be allocated on: node-a"


def test_incomplete_pool_is_named() -> None:
    partial = resource_slice("s", [device("d0"), device("d1")], node="node-a", slice_count=2)
    a = Allocator(device_classes=[device_class("gpu")], slices=[partial])
    explanation = explain_claim(a, claim("c", [exactly("gpu")]), [Node("node-a")])
    assert explanation.nodes[0].requests[0].pools[0].removed == {"incomplete-pool": 2}
    assert "incomplete pool removed 2" in explanation.summary
