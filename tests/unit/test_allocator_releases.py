"""Release-dependent allocator rules: distinctAttribute per Kubernetes release, both
ResourceSlice layouts of shared counters, and the features of a release and its gates."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
    results_of,
)
from controller.allocation.features import DistinctRule, parse_feature_gates
from controller.allocator import AllocationOutcome, Allocator, Features, Node

D = "gpu.draplugin.dev"
NODE = Node("node-a")
DISTINCT_NUMA = {"distinctAttribute": f"{D}/numa"}


def numa_gpus(*numa: int) -> list[dict[str, Any]]:
    return [device(f"gpu-{i}", {"numa": n}) for i, n in enumerate(numa)]


def allocate(
    claims: list[dict[str, Any]], slices: list[dict[str, Any]], features: Features
) -> AllocationOutcome:
    allocator = Allocator(
        device_classes=[device_class("gpu", [f'device.driver == "{D}"'])],
        slices=slices,
        features=features,
    )
    return allocator.allocate(claims, NODE)


def on_node(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [resource_slice("node-a-gpus", devices, node="node-a")]


# ----- distinctAttribute --------------------------------------------------------------------------


def test_release_rules_for_distinct_attribute() -> None:
    assert Features.for_release(34).distinct_rule is DistinctRule.SAME_DEVICE_ONLY
    assert Features.for_release(35).distinct_rule is DistinctRule.LATEST_PER_REQUEST
    assert Features.for_release(36).distinct_rule is DistinctRule.LATEST_PER_REQUEST
    assert Features.for_release(37).distinct_rule is DistinctRule.EVERY_DEVICE
    assert Features().distinct_rule is DistinctRule.EVERY_DEVICE


def test_1_37_needs_a_distinct_value_for_every_device() -> None:
    # numa 0, 1, 0: three devices of one request cannot all differ.
    one_request = claim("c", [exactly("a", count=3)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(numa_gpus(0, 1, 0)), Features.for_release(37))
    assert outcome.failure is not None and not outcome.failure.error


def test_1_35_compares_with_the_latest_device_of_each_request_only() -> None:
    # gpu-2 (numa 0) is compared with gpu-1 (numa 1), the request's latest device, not gpu-0.
    one_request = claim("c", [exactly("a", count=3)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(numa_gpus(0, 1, 0)), Features.for_release(35))
    assert outcome.ok
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", "gpu-1"), ("a", "gpu-2")]


def test_1_35_still_rejects_the_same_value_right_after() -> None:
    # gpu-1 repeats gpu-0's value while gpu-0 is the request's latest: skipped for gpu-2.
    one_request = claim("c", [exactly("a", count=2)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(numa_gpus(0, 0, 1)), Features.for_release(35))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", "gpu-2")]
    across = claim("c", [exactly("a"), exactly("b")], constraints=[DISTINCT_NUMA])
    outcome = allocate([across], on_node(numa_gpus(0, 0, 1)), Features.for_release(35))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("b", "gpu-2")]


def test_1_34_never_finds_two_different_devices_equal() -> None:
    # 1.34 compared attribute pointers: equal numbers on different devices do not conflict.
    one_request = claim("c", [exactly("a", count=2)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(numa_gpus(0, 0, 1)), Features.for_release(34))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", "gpu-1")]
    across = claim("c", [exactly("a"), exactly("b")], constraints=[DISTINCT_NUMA])
    outcome = allocate([across], on_node(numa_gpus(0, 0, 1)), Features.for_release(34))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("b", "gpu-1")]


def test_1_34_still_needs_the_attribute() -> None:
    devices = [device("gpu-0", {"numa": 0}), device("gpu-1", {"model": "l4"}), device("gpu-2", {"numa": 0})]
    one_request = claim("c", [exactly("a", count=2)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(devices), Features.for_release(34))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", "gpu-2")]


def test_kube_scheduler_1_34_placement_of_a_differential_scenario() -> None:
    # Recorded from kube-scheduler 1.34.4: five devices with numa values 0, 2, 1, 0, 1 satisfied
    # distinctAttribute there. 1.37 finds the claim unsatisfiable (three numa values only).
    numa = (0, 0, 2, 1, 0, 1, 1, 1)
    devices = [device(f"gpu-{i}", {"numa": n, "model": "l4"}) for i, n in enumerate(numa)]
    requests = [
        first_available("r0", exactly("big", count=2), exactly("small", count=3, selectors=["false"])),
        exactly("r1", count=3),
    ]
    scenario = claim("c", requests, constraints=[DISTINCT_NUMA])
    old = allocate([scenario], on_node(devices), Features.for_release(34))
    assert old.ok
    assert results_of(old.allocations[0]) == [
        ("r0/big", "gpu-0"),
        ("r0/big", "gpu-1"),
        ("r1", "gpu-2"),
        ("r1", "gpu-3"),
        ("r1", "gpu-4"),
    ]
    new = allocate([scenario], on_node(devices), Features.for_release(37))
    assert new.failure is not None and not new.failure.error


def test_constraint_scoped_to_requests_under_the_1_35_rule() -> None:
    # Only request "a" is constrained; "b" may repeat anything.
    scoped = {"distinctAttribute": f"{D}/numa", "requests": ["a"]}
    request = claim("c", [exactly("a", count=2), exactly("b")], constraints=[scoped])
    outcome = allocate([request], on_node(numa_gpus(0, 0, 1)), Features.for_release(35))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", "gpu-2"), ("b", "gpu-1")]


# ----- shared counters: same slice (1.34 layout) or a slice of their own (1.35+) ------------------

COUNTERS = [{"name": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]


def partitions() -> list[dict[str, Any]]:
    def consuming(name: str, memory: str) -> dict[str, Any]:
        return device(
            name,
            {"type": "gpu" if name == "gpu-0" else "mig", "part": name},
            consumesCounters=[{"counterSet": "gpu-0-counters", "counters": {"memory": {"value": memory}}}],
        )

    return [consuming("gpu-0", "80Gi"), consuming("mig-a", "40Gi"), consuming("mig-b", "40Gi")]


LAYOUTS = {
    "1.34 (same slice)": [
        resource_slice("node-a-0", partitions(), node="node-a", sharedCounters=COUNTERS),
    ],
    "1.35+ (own slice)": [
        resource_slice("node-a-0", [], node="node-a", slice_count=2, sharedCounters=COUNTERS),
        resource_slice("node-a-1", partitions(), node="node-a", slice_count=2),
    ],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_shared_counters_limit_allocation_in_both_layouts(layout: str) -> None:
    slices = LAYOUTS[layout]
    two_parts = claim("c", [exactly("part", count=2, selectors=[f'device.attributes["{D}"].type == "mig"'])])
    outcome = allocate([two_parts], slices, Features())
    assert results_of(outcome.allocations[0]) == [("part", "mig-a"), ("part", "mig-b")]
    # The whole GPU and a half of it need 120Gi of an 80Gi counter.
    whole_and_part = claim(
        "c",
        [
            exactly("whole", selectors=[f'device.attributes["{D}"].type == "gpu"']),
            exactly("part", selectors=[f'device.attributes["{D}"].part == "mig-a"']),
        ],
    )
    outcome = allocate([whole_and_part], slices, Features())
    assert outcome.failure is not None and not outcome.failure.error


# ----- features of a release and its gates --------------------------------------------------------


def test_gates_switch_features_on_top_of_a_release() -> None:
    gates = parse_feature_gates(
        "DRADeviceTaints=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,Other=false"
    )
    features = Features.for_release(34).with_gates(gates)
    assert features.device_taints and features.partitionable_devices and features.consumable_capacity
    assert not features.binding_conditions
    assert not features.skip_unusable_pools
    assert features.distinct_rule is DistinctRule.SAME_DEVICE_ONLY


@pytest.mark.parametrize("text", ["DRADeviceTaints", "DRADeviceTaints=maybe", "=true"])
def test_malformed_feature_gates_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="feature gate"):
        parse_feature_gates(text)
