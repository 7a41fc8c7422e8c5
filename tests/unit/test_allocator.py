"""Rules of the structured allocator: requests, modes, selectors, constraints, in-use, results."""

from __future__ import annotations

from typing import Any

import pytest

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    opaque,
    resource_slice,
    results_of,
    with_allocation,
)
from controller.scheduler.allocator import AllocationOutcome, Allocator, Features, Node

D = "gpu.draplugin.dev"
NODE = Node("node-a", {"zone": "z1"})


def gpus(n: int, **attrs_by_index: Any) -> list[dict[str, Any]]:
    return [
        device(f"gpu-{i}", {"index": i, "numa": i // 2, "model": "H100" if i % 2 == 0 else "A100"})
        for i in range(n)
    ]


def run(
    claims: list[dict[str, Any]],
    slices: list[dict[str, Any]] | None = None,
    classes: list[dict[str, Any]] | None = None,
    allocated: list[dict[str, Any]] | None = None,
    node: Node | None = NODE,
    **kwargs: Any,
) -> AllocationOutcome:
    allocator = Allocator(
        device_classes=classes if classes is not None else [device_class("gpu", [f'device.driver == "{D}"'])],
        slices=slices if slices is not None else [resource_slice("node-a-gpus", gpus(4), node="node-a")],
        allocated_claims=allocated or [],
        **kwargs,
    )
    return allocator.allocate(claims, node)


def test_exact_count_takes_devices_in_slice_order_and_pins_the_node() -> None:
    outcome = run([claim("c", [exactly("gpu", count=2)])])
    assert outcome.ok
    allocation = outcome.allocations[0]
    assert allocation["devices"]["results"] == [
        {"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-0"},
        {"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-1"},
    ]
    assert allocation["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]
    }


def test_count_defaults_to_one() -> None:
    outcome = run([claim("c", [exactly("gpu")])])
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-0")]


def test_more_devices_than_the_node_has_is_unschedulable_not_an_error() -> None:
    outcome = run([claim("c", [exactly("gpu", count=5)])])
    assert outcome.failure is not None and not outcome.failure.error


def test_slices_of_other_nodes_are_not_used() -> None:
    outcome = run([claim("c", [exactly("gpu")])], node=Node("node-b"))
    assert outcome.failure is not None and not outcome.failure.error


def test_class_and_request_selectors_both_apply() -> None:
    classes = [device_class("h100", [f'device.attributes["{D}"].model == "H100"'])]
    request = exactly("gpu", "h100", count=1, selectors=[f'device.attributes["{D}"].index > 0'])
    outcome = run([claim("c", [request])], classes=classes)
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-2")]


def test_all_mode_takes_every_matching_device() -> None:
    request = exactly("gpu", mode="All", selectors=[f'device.attributes["{D}"].model == "A100"'])
    outcome = run([claim("c", [request])])
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-1"), ("gpu", "gpu-3")]


def test_all_mode_with_no_matching_device_is_unschedulable() -> None:
    request = exactly("gpu", mode="All", selectors=[f'device.attributes["{D}"].model == "B200"'])
    outcome = run([claim("c", [request])])
    assert outcome.failure is not None and not outcome.failure.error


def test_all_mode_with_a_device_in_use_is_unschedulable() -> None:
    holder = with_allocation(
        claim("holder", [exactly("gpu")]),
        {"devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-3"}]}},
    )
    outcome = run([claim("c", [exactly("gpu", mode="All")])], allocated=[holder])
    assert outcome.failure is not None and not outcome.failure.error


def test_all_mode_on_an_incomplete_pool_is_an_error() -> None:
    partial = resource_slice("node-a-gpus", gpus(2), node="node-a", slice_count=2)
    outcome = run([claim("c", [exactly("gpu", mode="All")])], slices=[partial])
    assert outcome.failure is not None and outcome.failure.error
    assert "is currently being updated" in outcome.failure.message


def test_devices_held_by_allocated_claims_are_skipped() -> None:
    holder = with_allocation(
        claim("holder", [exactly("gpu")]),
        {"devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-0"}]}},
    )
    outcome = run([claim("c", [exactly("gpu")])], allocated=[holder])
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-1")]


def test_claims_allocated_together_do_not_share_devices() -> None:
    outcome = run([claim("c1", [exactly("gpu", count=3)]), claim("c2", [exactly("gpu", count=1)])])
    assert [results_of(a) for a in outcome.allocations] == [
        [("gpu", "gpu-0"), ("gpu", "gpu-1"), ("gpu", "gpu-2")],
        [("gpu", "gpu-3")],
    ]


def test_commit_marks_devices_in_use_for_later_calls() -> None:
    allocator = Allocator(
        device_classes=[device_class("gpu")], slices=[resource_slice("s", gpus(2), node="node-a")]
    )
    first_claim = claim("c1", [exactly("gpu")])
    first = allocator.allocate([first_claim], NODE)
    allocator.commit(first_claim, first.allocations[0])
    second = allocator.allocate([claim("c2", [exactly("gpu")])], NODE)
    assert results_of(second.allocations[0]) == [("gpu", "gpu-1")]


def test_match_attribute_backtracks_to_a_consistent_set() -> None:
    # gpu-0 (numa 0) is chosen first, then no second numa-0 device is free:
    # the search must drop gpu-0 and settle on gpu-2 and gpu-3 (numa 1).
    holder = with_allocation(
        claim("holder", [exactly("gpu")]),
        {"devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-1"}]}},
    )
    request = exactly("gpu", count=2)
    outcome = run(
        [claim("c", [request], constraints=[{"matchAttribute": f"{D}/numa"}])],
        allocated=[holder],
    )
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-2"), ("gpu", "gpu-3")]


def test_match_attribute_across_requests_limited_to_named_requests() -> None:
    constraint = {"matchAttribute": f"{D}/model", "requests": ["a", "b"]}
    outcome = run(
        [claim("c", [exactly("a"), exactly("b"), exactly("c")], constraints=[constraint])],
    )
    # a=gpu-0 (H100) forces b to the next H100 (gpu-2); c is unconstrained.
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("b", "gpu-2"), ("c", "gpu-1")]


def test_match_attribute_missing_on_device_rejects_it() -> None:
    devices = [
        device("gpu-0", {"index": 0}),
        device("gpu-1", {"index": 1, "numa": 0}),
        device("gpu-2", {"numa": 0}),
    ]
    outcome = run(
        [claim("c", [exactly("gpu", count=2)], constraints=[{"matchAttribute": f"{D}/numa"}])],
        slices=[resource_slice("s", devices, node="node-a")],
    )
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-1"), ("gpu", "gpu-2")]


def test_distinct_attribute_between_requests() -> None:
    constraint = {"distinctAttribute": f"{D}/numa"}
    outcome = run([claim("c", [exactly("a"), exactly("b")], constraints=[constraint])])
    assert results_of(outcome.allocations[0]) == [("a", "gpu-0"), ("b", "gpu-2")]


def test_unsatisfiable_constraint_is_unschedulable() -> None:
    constraint = {"matchAttribute": f"{D}/numa"}
    outcome = run([claim("c", [exactly("gpu", count=3)], constraints=[constraint])])
    assert outcome.failure is not None and not outcome.failure.error


def test_constraint_failure_in_all_mode_is_an_error() -> None:
    constraint = {"matchAttribute": f"{D}/numa"}
    outcome = run([claim("c", [exactly("gpu", mode="All")], constraints=[constraint])])
    assert outcome.failure is not None and outcome.failure.error
    assert "constraint would not be satisfied" in outcome.failure.message


def test_first_available_falls_back_to_the_next_subrequest() -> None:
    request = first_available(
        "gpu",
        exactly("big", count=8),
        exactly("small", count=2),
    )
    outcome = run([claim("c", [request])])
    assert results_of(outcome.allocations[0]) == [("gpu/small", "gpu-0"), ("gpu/small", "gpu-1")]


def test_first_available_prefers_the_first_subrequest_that_fits() -> None:
    request = first_available(
        "gpu", exactly("a100", selectors=[f'device.attributes["{D}"].model == "A100"']), exactly("any")
    )
    outcome = run([claim("c", [request])])
    assert results_of(outcome.allocations[0]) == [("gpu/a100", "gpu-1")]


def test_first_available_disabled_is_an_error() -> None:
    request = first_available("gpu", exactly("one"))
    outcome = run([claim("c", [request])], features=Features(prioritized_list=False))
    assert outcome.failure is not None and outcome.failure.error


def test_admin_access_ignores_devices_in_use_and_is_recorded() -> None:
    holder = with_allocation(
        claim("holder", [exactly("gpu", count=4)]),
        {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": D, "pool": "node-a", "device": f"gpu-{i}"} for i in range(4)
                ]
            }
        },
    )
    outcome = run([claim("c", [exactly("gpu", adminAccess=True)])], allocated=[holder])
    assert outcome.allocations[0]["devices"]["results"] == [
        {"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-0", "adminAccess": True}
    ]


def test_admin_access_results_do_not_block_other_claims() -> None:
    admin = with_allocation(
        claim("admin", [exactly("gpu", adminAccess=True)]),
        {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-0", "adminAccess": True}
                ]
            }
        },
    )
    outcome = run([claim("c", [exactly("gpu")])], allocated=[admin])
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-0")]


def test_admin_access_with_feature_disabled_is_an_error() -> None:
    outcome = run([claim("c", [exactly("gpu", adminAccess=True)])], features=Features(admin_access=False))
    assert outcome.failure is not None and outcome.failure.error


def test_cel_runtime_error_aborts_allocation_instead_of_not_matching() -> None:
    request = exactly("gpu", selectors=[f'device.attributes["{D}"].missing == "x"'])
    outcome = run([claim("c", [request])])
    assert outcome.failure is not None and outcome.failure.error
    assert "CEL runtime error" in outcome.failure.message


def test_cel_compile_error_aborts_allocation() -> None:
    outcome = run([claim("c", [exactly("gpu", selectors=["device.attributes["])])])
    assert outcome.failure is not None and outcome.failure.error
    assert "CEL compile error" in outcome.failure.message


def test_cel_error_on_a_device_in_use_is_never_evaluated() -> None:
    devices = [device("gpu-0", {}), device("gpu-1", {"model": "H100"})]
    holder = with_allocation(
        claim("holder", [exactly("gpu")]),
        {"devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-0"}]}},
    )
    request = exactly("gpu", selectors=[f'device.attributes["{D}"].model == "H100"'])
    outcome = run(
        [claim("c", [request])], slices=[resource_slice("s", devices, node="node-a")], allocated=[holder]
    )
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-1")]


def test_missing_device_class_is_unschedulable() -> None:
    outcome = run([claim("c", [exactly("gpu", "nope")])])
    assert outcome.failure is not None and not outcome.failure.error
    assert "device class nope does not exist" in outcome.failure.message


def test_more_than_32_results_is_an_error() -> None:
    slices = [resource_slice("s", [device(f"d{i}") for i in range(40)], node="node-a")]
    outcome = run([claim("c", [exactly("gpu", count=33)])], slices=slices)
    assert outcome.failure is not None and outcome.failure.error
    assert "exceeds the claim limit of 32" in outcome.failure.message


def test_all_mode_over_32_devices_is_an_error() -> None:
    slices = [resource_slice("s", [device(f"d{i}") for i in range(40)], node="node-a")]
    outcome = run([claim("c", [exactly("gpu", mode="All")])], slices=slices)
    assert outcome.failure is not None and outcome.failure.error


def test_config_from_class_and_claim_in_upstream_order() -> None:
    classes = [
        device_class("gpu", config=[opaque({"from": "class-gpu"})]),
        device_class("other", config=[opaque({"from": "class-other"})]),
    ]
    c = claim(
        "c",
        [exactly("a"), exactly("b", "other"), exactly("c")],
        config=[{"requests": ["b"], **opaque({"from": "claim-b"})}, opaque({"from": "claim-all"})],
    )
    config = run([c], classes=classes).allocations[0]["devices"]["config"]
    assert config == [
        {"source": "FromClass", "requests": ["a", "c"], **opaque({"from": "class-gpu"})},
        {"source": "FromClass", "requests": ["b"], **opaque({"from": "class-other"})},
        {"source": "FromClaim", "requests": ["b"], **opaque({"from": "claim-b"})},
        {"source": "FromClaim", **opaque({"from": "claim-all"})},
    ]


def test_config_of_a_single_request_claim_covers_all_requests() -> None:
    classes = [device_class("gpu", config=[opaque({"x": 1})])]
    config = run([claim("c", [exactly("gpu")])], classes=classes).allocations[0]["devices"]["config"]
    assert config == [{"source": "FromClass", **opaque({"x": 1})}]


def test_config_of_first_available_uses_the_chosen_subrequest() -> None:
    classes = [device_class("gpu", config=[opaque({"x": 1})]), device_class("big", config=[opaque({"y": 2})])]
    request = first_available("r", exactly("huge", "big", count=9), exactly("one", "gpu"))
    c = claim(
        "c",
        [request, exactly("other")],
        config=[{"requests": ["r/huge"], **opaque({"z": 3})}, {"requests": ["r/one"], **opaque({"w": 4})}],
    )
    config = run([c], classes=classes).allocations[0]["devices"]["config"]
    assert config == [
        {"source": "FromClass", **opaque({"x": 1})},
        {"source": "FromClaim", "requests": ["r/one"], **opaque({"w": 4})},
    ]


def test_results_carry_request_tolerations() -> None:
    toleration = {"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}
    outcome = run([claim("c", [exactly("gpu", tolerations=[toleration])])])
    assert outcome.allocations[0]["devices"]["results"][0]["tolerations"] == [toleration]


@pytest.mark.parametrize("node", [Node("node-a"), None])
def test_all_nodes_slice_needs_no_node_selector(node: Node | None) -> None:
    slices = [resource_slice("net", [device("d0")], pool="shared", all_nodes=True)]
    outcome = run([claim("c", [exactly("gpu")])], slices=slices, node=node)
    assert outcome.ok
    assert "nodeSelector" not in outcome.allocations[0]


def test_distinct_attribute_counts_every_device_of_a_request() -> None:
    # Two devices of one request plus one of another: three different numa values
    # are needed, and the node has only two.
    constraint = {"distinctAttribute": f"{D}/numa"}
    outcome = run([claim("c", [exactly("a", count=2), exactly("b")], constraints=[constraint])])
    assert outcome.failure is not None and not outcome.failure.error
