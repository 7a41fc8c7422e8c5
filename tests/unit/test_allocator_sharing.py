"""Allocator rules for shared devices: consumable capacity and shared counters."""

from __future__ import annotations

import itertools
from typing import Any

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice, results_of
from controller.scheduler.allocator import Allocator, Features, Node

D = "gpu.draplugin.dev"
NODE = Node("node-a")


def shared_gpu(memory: str = "40Gi", policy: dict[str, Any] | None = None) -> dict[str, Any]:
    capacity: dict[str, Any] = {"value": memory}
    if policy:
        capacity["requestPolicy"] = policy
    return device("gpu-0", allowMultipleAllocations=True) | {"capacity": {"memory": capacity}}


def memory_claim(name: str, memory: str | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"capacity": {"requests": {"memory": memory}}} if memory else {}
    return claim(name, [exactly("gpu", **extra)])


def allocator_for(devices: list[dict[str, Any]], **kwargs: Any) -> Allocator:
    ids = itertools.count()
    return Allocator(
        device_classes=[device_class("gpu")],
        slices=[resource_slice("s", devices, node="node-a", **kwargs)],
        new_share_id=lambda: f"00000000-0000-4000-8000-{next(ids):012d}",
    )


def test_shared_device_is_allocated_until_its_capacity_is_used_up() -> None:
    allocator = allocator_for([shared_gpu("40Gi")])
    outcomes = []
    for index in range(3):
        c = memory_claim(f"c{index}", "16Gi")
        outcome = allocator.allocate([c], NODE)
        outcomes.append(outcome)
        if outcome.ok:
            allocator.commit(c, outcome.allocations[0])
    assert [o.ok for o in outcomes] == [True, True, False]
    first = outcomes[0].allocations[0]["devices"]["results"][0]
    assert first["shareID"] == "00000000-0000-4000-8000-000000000000"
    assert first["consumedCapacity"] == {"memory": "16Gi"}


def test_capacity_request_is_rounded_up_to_the_policy_step() -> None:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "step": "4Gi"}}
    allocator = allocator_for([shared_gpu("40Gi", policy)])
    outcome = allocator.allocate([memory_claim("c", "6Gi")], NODE)
    assert outcome.allocations[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "9Gi"}


def test_no_capacity_request_takes_the_policy_default() -> None:
    allocator = allocator_for([shared_gpu("40Gi", {"default": "8Gi", "validRange": {"min": "1Gi"}})])
    outcome = allocator.allocate([memory_claim("c", None)], NODE)
    assert outcome.allocations[0]["devices"]["results"][0]["consumedCapacity"] == {"memory": "8Gi"}


def test_request_for_a_capacity_the_device_lacks_skips_the_device() -> None:
    allocator = allocator_for([shared_gpu()])
    c = claim("c", [exactly("gpu", capacity={"requests": {"cores": "2"}})])
    outcome = allocator.allocate([c], NODE)
    assert outcome.failure is not None and not outcome.failure.error


def test_capacity_requests_with_the_feature_off_are_an_error() -> None:
    allocator = Allocator(
        device_classes=[device_class("gpu")],
        slices=[resource_slice("s", [shared_gpu()], node="node-a")],
        features=Features(consumable_capacity=False),
    )
    outcome = allocator.allocate([memory_claim("c", "1Gi")], NODE)
    assert outcome.failure is not None and outcome.failure.error


def partitions_slices() -> list[dict[str, Any]]:
    """A GPU with 8 memory slices: the whole GPU, or two halves; all draw from one counter set."""
    counters = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "8"}}}]

    def part(name: str, memory: str) -> dict[str, Any]:
        return device(
            name,
            consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": memory}}}],
        )

    return [
        resource_slice("a-counters", [], node="node-a", pool="p", slice_count=2, sharedCounters=counters),
        resource_slice(
            "b-devices",
            [part("whole", "8"), part("half-0", "4"), part("half-1", "4")],
            node="node-a",
            pool="p",
            slice_count=2,
        ),
    ]


def test_shared_counters_limit_partitions() -> None:
    allocator = Allocator(device_classes=[device_class("gpu")], slices=partitions_slices())
    first = claim("first", [exactly("gpu")])
    outcome = allocator.allocate([first], NODE)
    assert results_of(outcome.allocations[0]) == [("gpu", "whole")]
    allocator.commit(first, outcome.allocations[0])
    # The whole GPU took all counters: no half fits any more.
    second = allocator.allocate([claim("second", [exactly("gpu")])], NODE)
    assert second.failure is not None and not second.failure.error


def test_partitions_that_fit_together_are_allocated_together() -> None:
    allocator = Allocator(device_classes=[device_class("gpu")], slices=partitions_slices())
    c = claim("c", [exactly("gpu", count=2)])
    outcome = allocator.allocate([c], NODE)
    # "whole" + any half exceeds the counters: the search backtracks to both halves.
    assert results_of(outcome.allocations[0]) == [("gpu", "half-0"), ("gpu", "half-1")]


def test_counter_reference_to_a_missing_set_makes_the_pool_invalid() -> None:
    bad = device("d0", consumesCounters=[{"counterSet": "nope", "counters": {"memory": {"value": "1"}}}])
    allocator = Allocator(
        device_classes=[device_class("gpu")], slices=[resource_slice("s", [bad], node="node-a")]
    )
    outcome = allocator.allocate([claim("c", [exactly("gpu")])], NODE)
    assert (
        outcome.failure is not None and outcome.failure.message == "invalid resource pools were encountered"
    )
