"""Allocator rules about pools, node selection and device taints."""

from __future__ import annotations

from typing import Any

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice, results_of
from controller.scheduler.allocator import AllocationOutcome, Allocator, Features, Node

D = "gpu.draplugin.dev"
NODE = Node("node-a", {"zone": "z1", "rack": "r7"})


def run(
    slices: list[dict[str, Any]],
    claims: list[dict[str, Any]] | None = None,
    node: Node | None = NODE,
    **kwargs: Any,
) -> AllocationOutcome:
    allocator = Allocator(device_classes=[device_class("gpu")], slices=slices, **kwargs)
    return allocator.allocate(claims or [claim("c", [exactly("gpu")])], node)


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = resource_slice("old", [device("old-0")], node="node-a", pool="p", generation=1)
    new = resource_slice("new", [device("new-0")], node="node-a", pool="p", generation=2)
    assert results_of(run([old, new]).allocations[0]) == [("gpu", "new-0")]


def test_incomplete_pool_is_skipped_from_1_35_on() -> None:
    partial = resource_slice("s0", [device("d0")], node="node-a", pool="p", slice_count=2)
    outcome = run([partial])
    assert outcome.failure is not None and not outcome.failure.error


def test_incomplete_pool_is_still_used_by_1_34_rules() -> None:
    partial = resource_slice("s0", [device("d0")], node="node-a", pool="p", slice_count=2)
    outcome = run([partial], features=Features.for_release(34))
    assert results_of(outcome.allocations[0]) == [("gpu", "d0")]


def test_pool_complete_with_slices_published_for_other_nodes() -> None:
    # One pool, two slices: one for this node, one for another node.
    here = resource_slice("s0", [device("d0")], node="node-a", pool="p", slice_count=2)
    there = resource_slice("s1", [device("d1")], node="node-b", pool="p", slice_count=2)
    assert results_of(run([here, there]).allocations[0]) == [("gpu", "d0")]


def test_pool_with_a_newer_generation_elsewhere_is_obsolete() -> None:
    here = resource_slice("s0", [device("d0")], node="node-a", pool="p", slice_count=2, generation=1)
    newer = resource_slice("s1", [device("d1")], node="node-b", pool="p", slice_count=2, generation=2)
    outcome = run([here, newer])
    assert outcome.failure is not None and not outcome.failure.error


def test_duplicate_device_names_make_the_pool_invalid() -> None:
    s0 = resource_slice("s0", [device("d0")], node="node-a", pool="p", slice_count=2)
    s1 = resource_slice("s1", [device("d0")], node="node-a", pool="p", slice_count=2)
    outcome = run([s0, s1])
    assert outcome.failure is not None
    assert outcome.failure.message == "invalid resource pools were encountered"


def test_pools_are_searched_by_driver_then_pool_name_and_slices_by_name() -> None:
    slices = [
        resource_slice("z-slice", [device("z0")], node="node-a", pool="b-pool"),
        resource_slice("b-slice", [device("b1")], node="node-a", pool="a-pool", slice_count=2),
        resource_slice("a-slice", [device("a1")], node="node-a", pool="a-pool", slice_count=2),
    ]
    outcome = run(slices, [claim("c", [exactly("gpu", count=3)])])
    assert results_of(outcome.allocations[0]) == [("gpu", "a1"), ("gpu", "b1"), ("gpu", "z0")]


def test_node_selector_slices_merge_into_one_term() -> None:
    zone = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}]
    }
    rack = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "Exists"}]}]}
    slices = [
        resource_slice("s-zone", [device("z0")], pool="zone", node_selector=zone),
        resource_slice("s-rack", [device("r0")], pool="rack", node_selector=rack),
    ]
    outcome = run(slices, [claim("c", [exactly("gpu", count=2)])])
    assert outcome.allocations[0]["nodeSelector"] == {
        "nodeSelectorTerms": [
            {
                "matchExpressions": [
                    {"key": "rack", "operator": "Exists"},
                    {"key": "zone", "operator": "In", "values": ["z1"]},
                ]
            }
        ]
    }


def test_node_selector_slice_for_other_nodes_is_not_used() -> None:
    elsewhere = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z9"]}]}]
    }
    outcome = run([resource_slice("s", [device("d0")], pool="p", node_selector=elsewhere)])
    assert outcome.failure is not None and not outcome.failure.error


def test_per_device_node_selection() -> None:
    devices = [
        device("elsewhere", nodeName="node-b"),
        device("here", nodeName="node-a"),
        device("anywhere", allNodes=True),
    ]
    slices = [resource_slice("s", devices, pool="p", perDeviceNodeSelection=True)]
    outcome = run(slices, [claim("c", [exactly("gpu", count=2)])])
    assert results_of(outcome.allocations[0]) == [("gpu", "here"), ("gpu", "anywhere")]
    assert outcome.allocations[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-a"
    ]


def test_untolerated_no_schedule_taint_blocks_the_device() -> None:
    taint = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}
    slices = [resource_slice("s", [device("d0", taints=[taint]), device("d1")], node="node-a")]
    assert results_of(run(slices).allocations[0]) == [("gpu", "d1")]


def test_tolerated_taint_allows_the_device() -> None:
    taint = {"key": "maintenance", "value": "yes", "effect": "NoExecute"}
    slices = [resource_slice("s", [device("d0", taints=[taint])], node="node-a")]
    toleration = {"key": "maintenance", "operator": "Equal", "value": "yes"}
    outcome = run(slices, [claim("c", [exactly("gpu", tolerations=[toleration])])])
    assert results_of(outcome.allocations[0]) == [("gpu", "d0")]


def test_toleration_with_wrong_value_does_not_tolerate() -> None:
    taint = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}
    slices = [resource_slice("s", [device("d0", taints=[taint])], node="node-a")]
    toleration = {"key": "maintenance", "operator": "Equal", "value": "no"}
    outcome = run(slices, [claim("c", [exactly("gpu", tolerations=[toleration])])])
    assert outcome.failure is not None


def test_taint_with_effect_none_is_ignored() -> None:
    slices = [resource_slice("s", [device("d0", taints=[{"key": "k", "effect": "None"}])], node="node-a")]
    assert results_of(run(slices).allocations[0]) == [("gpu", "d0")]


def test_taints_are_ignored_when_the_feature_is_off() -> None:
    slices = [
        resource_slice("s", [device("d0", taints=[{"key": "k", "effect": "NoSchedule"}])], node="node-a")
    ]
    outcome = run(slices, features=Features(device_taints=False))
    assert results_of(outcome.allocations[0]) == [("gpu", "d0")]


def test_device_taint_rule_taints_the_selected_device() -> None:
    slices = [resource_slice("s", [device("d0"), device("d1")], node="node-a", pool="p")]
    rule = {
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain-d0"},
        "spec": {
            "deviceSelector": {"driver": D, "pool": "p", "device": "d0"},
            "taint": {"key": "k", "effect": "NoSchedule"},
        },
    }
    outcome = run(slices, taint_rules=[rule])
    assert results_of(outcome.allocations[0]) == [("gpu", "d1")]
