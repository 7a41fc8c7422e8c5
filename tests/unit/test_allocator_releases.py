"""Release-dependent allocator rules: distinctAttribute per Kubernetes release, both
ResourceSlice layouts of shared counters, firstAvailable subrequests with allocationMode
All, and the features of a release and its gates."""

from __future__ import annotations

import dataclasses
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
from controller.scheduler.allocator import AllocationOutcome, Allocator, Features, Node

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


@pytest.mark.parametrize(
    ("release", "second"),
    [
        # gpu-1 repeats gpu-0's value while gpu-0 is the request's latest: skipped for gpu-2.
        pytest.param(35, "gpu-2", id="1.35-still-rejects-the-same-value-right-after"),
        # 1.34 compared attribute pointers: equal numbers on different devices do not conflict.
        pytest.param(34, "gpu-1", id="1.34-never-finds-two-different-devices-equal"),
    ],
)
def test_a_value_repeated_right_after_the_latest_device(release: int, second: str) -> None:
    one_request = claim("c", [exactly("a", count=2)], constraints=[DISTINCT_NUMA])
    outcome = allocate([one_request], on_node(numa_gpus(0, 0, 1)), Features.for_release(release))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("a", second)]
    across = claim("c", [exactly("a"), exactly("b")], constraints=[DISTINCT_NUMA])
    outcome = allocate([across], on_node(numa_gpus(0, 0, 1)), Features.for_release(release))
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("b", second)]


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


# ----- firstAvailable subrequests with allocationMode All ----------------------------------------


def model_gpus(*models: str) -> list[dict[str, Any]]:
    return [device(f"gpu-{i}", {"model": m}) for i, m in enumerate(models)]


def model_is(model: str) -> str:
    return f'device.attributes["{D}"].model == "{model}"'


def holder(name: str, pool: str, held: list[str]) -> dict[str, Any]:
    """An allocated claim that holds the `held` devices of `pool`."""
    results = [{"request": "gpu", "driver": D, "pool": pool, "device": device} for device in held]
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"{name}-uid"},
        "status": {"allocation": {"devices": {"results": results}}},
    }


def allocate_with_held(
    request: dict[str, Any], devices: list[dict[str, Any]], held: list[str], features: Features
) -> AllocationOutcome:
    """Allocate a one-request claim while another claim holds the `held` devices."""
    allocator = Allocator(
        device_classes=[device_class("gpu", [f'device.driver == "{D}"'])],
        slices=on_node(devices),
        allocated_claims=[holder("holder", "node-a", held)],
        features=features,
    )
    return allocator.allocate([claim("c", [request])], NODE)


def test_release_rules_for_all_subrequests() -> None:
    for minor in (34, 35):
        old = Features.for_release(minor)
        assert old.all_subrequest_continues_with_first and old.all_subrequest_selects_as_previous
    for minor in (36, 37):
        new = Features.for_release(minor)
        assert not new.all_subrequest_continues_with_first and not new.all_subrequest_selects_as_previous
    assert not Features().all_subrequest_continues_with_first


# Differential scenarios 92 and 214 (seed 20261129), where kube-scheduler 1.34.4 disagreed with
# the 1.37 rules: the class is the scenario's, the devices and the claim as generated.
SCENARIO_92_DEVICES = [
    device("gpu-0", {"model": "a100", "numa": 0, "scenario": 92, "memory": 16}),
    device("gpu-1", {"model": "a100", "numa": 1, "scenario": 92, "memory": 40}),
]
SCENARIO_92_REQUEST = first_available(
    "r0",
    exactly("big", "diff-92", count=1, selectors=[model_is("l4")]),
    exactly("small", "diff-92", mode="All", selectors=[model_is("a100")]),
)
SCENARIO_214_DEVICES = [device("gpu-0", {"model": "l4", "numa": 2, "scenario": 214, "memory": 80})]
SCENARIO_214_REQUEST = first_available(
    "r0",
    exactly("big", "diff-214", count=3, selectors=[model_is("h100")]),
    exactly(
        "small",
        "diff-214",
        mode="All",
        selectors=[f'"memory" in device.attributes["{D}"] && device.attributes["{D}"].memory >= 16'],
    ),
)


def allocate_scenario(
    index: int, request: dict[str, Any], devices: list[dict[str, Any]], held: list[str], minor: int
) -> AllocationOutcome:
    node = f"diff-{index}-node"
    selector = f'device.driver == "{D}" && device.attributes["{D}"].scenario == {index}'
    gates = parse_feature_gates(
        "DRADeviceTaints=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,"
        "DRADeviceBindingConditions=true,DRAExtendedResource=true"
    )
    allocator = Allocator(
        device_classes=[device_class(f"diff-{index}", [selector])],
        slices=[resource_slice(f"diff-{index}", devices, node=node, pool=node)],
        allocated_claims=[holder(f"blocker-{index}", node, held)],
        features=Features.for_release(minor).with_gates(gates),
    )
    return allocator.allocate([claim(f"claim-{index}", [request])], Node(node))


@pytest.mark.parametrize("minor", [34, 35])
def test_differential_scenario_92_placed_by_1_34(minor: int) -> None:
    # "big" finds no l4; "small" wants both a100s but gpu-1 is held. 1.34.4 placed the pod with
    # gpu-0 alone: after small's first device it went on with big's second (of one) device.
    outcome = allocate_scenario(92, SCENARIO_92_REQUEST, SCENARIO_92_DEVICES, ["gpu-1"], minor)
    assert outcome.ok
    assert results_of(outcome.allocations[0]) == [("r0/small", "gpu-0")]


@pytest.mark.parametrize("minor", [36, 37])
def test_differential_scenario_92_unsatisfiable_from_1_36(minor: int) -> None:
    outcome = allocate_scenario(92, SCENARIO_92_REQUEST, SCENARIO_92_DEVICES, ["gpu-1"], minor)
    assert outcome.failure is not None and not outcome.failure.error


@pytest.mark.parametrize("minor", [34, 35])
def test_differential_scenario_214_unsatisfiable_in_1_34(minor: int) -> None:
    # "small" gets the only device, then the search wants big's devices #1 and #2 (no h100).
    outcome = allocate_scenario(214, SCENARIO_214_REQUEST, SCENARIO_214_DEVICES, [], minor)
    assert outcome.failure is not None and not outcome.failure.error


@pytest.mark.parametrize("minor", [36, 37])
def test_differential_scenario_214_placed_from_1_36(minor: int) -> None:
    outcome = allocate_scenario(214, SCENARIO_214_REQUEST, SCENARIO_214_DEVICES, [], minor)
    assert outcome.ok
    assert results_of(outcome.allocations[0]) == [("r0/small", "gpu-0")]


def test_1_34_fills_an_all_subrequest_up_with_the_first_subrequests_devices() -> None:
    # Two a100s are too few for "big"; "small" gets the first l4, then big's devices #1 and #2.
    request = first_available(
        "r0",
        exactly("big", count=3, selectors=[model_is("a100")]),
        exactly("small", mode="All", selectors=[model_is("l4")]),
    )
    devices = model_gpus("l4", "a100", "l4", "a100")
    old = allocate([claim("c", [request])], on_node(devices), Features.for_release(34))
    assert results_of(old.allocations[0]) == [("r0/small", "gpu-0"), ("r0/big", "gpu-1"), ("r0/big", "gpu-3")]
    new = allocate([claim("c", [request])], on_node(devices), Features.for_release(37))
    assert results_of(new.allocations[0]) == [("r0/small", "gpu-0"), ("r0/small", "gpu-2")]


def test_1_34_sizes_a_second_all_subrequest_with_the_first_ones_selection() -> None:
    # "a" wants every l4, one is held. "b" should get every a100 (gpu-0), but 1.34 sized it with
    # a's selection (the l4s), so it fails on the held l4 too. Only the sizing rule is on here.
    request = first_available(
        "r0",
        exactly("a", mode="All", selectors=[model_is("l4")]),
        exactly("b", mode="All", selectors=[model_is("a100")]),
    )
    devices = model_gpus("a100", "l4")
    sizing_only = dataclasses.replace(Features(), all_subrequest_selects_as_previous=True)
    outcome = allocate_with_held(request, devices, ["gpu-1"], sizing_only)
    assert outcome.failure is not None and not outcome.failure.error
    fixed = allocate_with_held(request, devices, ["gpu-1"], Features())
    assert results_of(fixed.allocations[0]) == [("r0/b", "gpu-0")]
    # Nothing held: b takes a's selection, the l4, under its own name.
    free = allocate([claim("c", [request])], on_node(devices), sizing_only)
    assert results_of(free.allocations[0]) == [("r0/a", "gpu-1")]


def test_a_third_all_subrequest_is_sized_with_its_own_selection_in_1_34() -> None:
    # Index 2 is sized under index 1's key, which nothing else fills while sizing.
    request = first_available(
        "r0",
        exactly("a", selectors=["false"]),
        exactly("b", mode="All", selectors=["false"]),
        exactly("c", mode="All", selectors=[model_is("a100")]),
    )
    outcome = allocate([claim("c", [request])], on_node(model_gpus("l4", "a100")), Features.for_release(34))
    assert results_of(outcome.allocations[0]) == [("r0/c", "gpu-1")]


@pytest.mark.parametrize("minor", [34, 37])
def test_a_subrequest_over_the_result_limit_leaves_no_devices_behind(minor: int) -> None:
    # r0/big's two devices plus r1's 31 exceed the 32-result limit; r0/small must then start
    # from a clean slate (gpu-0 free again), so r0/small + r1 fit exactly.
    requests = [
        first_available("r0", exactly("big", count=2), exactly("small")),
        exactly("r1", count=31),
    ]
    devices = [device(f"gpu-{i}", {"model": "l4"}) for i in range(32)]
    outcome = allocate([claim("c", requests)], on_node(devices), Features.for_release(minor))
    assert outcome.ok
    results = results_of(outcome.allocations[0])
    assert results[0] == ("r0/small", "gpu-0")
    assert results[1:] == [("r1", f"gpu-{i}") for i in range(1, 32)]


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
