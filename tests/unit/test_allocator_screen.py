"""Screening (controller.scheduler.allocator.Screen, nodefilter.first_fit) never changes an answer.

`cannot_fit` lets `allocate` skip the search, and `cannot_err` lets `first_fit` skip nodes past
the first feasible one; both must be exact. Each case here is checked against the same
allocator with screening switched off (the search alone, as before screening existed), on
nodes built to exercise what screening must stay away from: CEL runtime errors on some
devices, devices in use, admin access, incomplete and invalid pools, per-device node selection,
shared counters, All mode, firstAvailable, missing classes and claims the search refuses.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
    with_allocation,
)
from controller.allocation.features import Features
from controller.scheduler import allocator as allocator_module
from controller.scheduler.allocator import AllocationOutcome, Allocator, Node, Screen
from controller.scheduler.nodefilter import NodeOutcome, filter_nodes, first_fit
from controller.scheduler.nodescore import choose_node

D = "gpu.draplugin.dev"
ATTRS = f'device.attributes["{D}"]'
CLASSES = [
    device_class("gpu", [f'device.driver == "{D}"']),
    # Errs on devices without a "tier" attribute (a CEL runtime error: no such key).
    device_class("tiered", [f'{ATTRS}.tier == "gold"']),
]


def fleet() -> tuple[list[dict[str, Any]], list[Node]]:
    slices: list[dict[str, Any]] = []
    nodes = [Node(f"n{i}") for i in range(8)]
    for i, node in enumerate(nodes):
        devices = [
            device(f"gpu-{g}", {"model": ("H100", "A100")[(i + g) % 2], **({"tier": "gold"} if g else {})})
            for g in range(3)
        ]
        if i == 1:
            devices[0]["consumesCounters"] = [{"counterSet": "set", "counters": {"mem": {"value": "1"}}}]
            slices.append(resource_slice(f"{node.name}-c", [], node=node.name, pool=node.name, slice_count=2))
            slices[-1]["spec"]["sharedCounters"] = [{"name": "set", "counters": {"mem": {"value": "2"}}}]
            slices.append(
                resource_slice(f"{node.name}-d", devices, node=node.name, pool=node.name, slice_count=2)
            )
            continue
        if i == 2:  # incomplete: one of two slices
            slices.append(resource_slice(f"{node.name}-a", devices, node=node.name, slice_count=2))
            continue
        if i == 3:  # invalid: a device name twice
            devices[1]["name"] = devices[0]["name"]
        if i == 4:  # per-device node selection
            for d in devices:
                d["nodeName"] = node.name
            spec_slice = resource_slice(f"{node.name}-p", devices, pool=node.name)
            spec_slice["spec"]["perDeviceNodeSelection"] = True
            slices.append(spec_slice)
            continue
        slices.append(resource_slice(f"{node.name}-gpus", devices, node=node.name))
    return slices, nodes


def claims() -> list[dict[str, Any]]:
    h100 = f'{ATTRS}.model == "H100"'
    return [
        claim("one", [exactly("gpu", selectors=[h100])]),
        claim("two", [exactly("gpu", count=2, selectors=[h100])]),
        claim("none", [exactly("gpu", selectors=[f'{ATTRS}.model == "B200"'])]),
        claim("errs", [exactly("gpu", "tiered")]),
        claim("admin", [exactly("gpu", selectors=[h100], adminAccess=True)]),
        claim("all", [exactly("gpu", mode="All")]),
        claim(
            "fallback", [first_available("gpu", exactly("big", count=3), exactly("one", selectors=[h100]))]
        ),
        claim("missing-class", [exactly("gpu", "nope")]),
        claim("too-many", [exactly("gpu", count=40)]),
        claim("match", [exactly("gpu", count=2)], constraints=[{"matchAttribute": f"{D}/model"}]),
        claim("empty", []),
    ]


def unscreened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Screen, "cannot_fit", lambda self, node: False)
    monkeypatch.setattr(Screen, "cannot_err", lambda self, node: False)
    monkeypatch.setattr(Screen, "certainly_fits", lambda self, node: False)
    monkeypatch.setattr(Screen, "classify", lambda self, node: allocator_module.UNKNOWN)


def summary(outcome: AllocationOutcome) -> tuple[Any, ...]:
    failure = outcome.failure
    return (
        outcome.ok,
        outcome.node,
        failure and failure.message,
        failure and failure.error,
        outcome.allocations,
    )


def build(in_use: int) -> tuple[Allocator, list[Node]]:
    slices, nodes = fleet()
    ids = iter(range(1_000_000))
    allocator = Allocator(device_classes=CLASSES, slices=slices, new_share_id=lambda: f"share-{next(ids)}")
    rng = random.Random(in_use)
    held = [(rng.choice(nodes).name, f"gpu-{rng.randrange(3)}") for _ in range(in_use)]
    if in_use:
        held += [("n5", f"gpu-{g}") for g in range(3)]  # a node with every device in use
    for n, (pool, name) in enumerate(held):
        allocation = {"devices": {"results": [{"request": "gpu", "driver": D, "pool": pool, "device": name}]}}
        allocator.commit(with_allocation(claim(f"held-{n}", [exactly("gpu")]), allocation), allocation)
    return allocator, nodes


@pytest.mark.parametrize("in_use", [0, 5, 14])
def test_allocate_answers_alike_with_and_without_screening(
    monkeypatch: pytest.MonkeyPatch, in_use: int
) -> None:
    allocator, nodes = build(in_use)
    screened = {
        (c["metadata"]["name"], n.name): summary(allocator.allocate([c], n)) for c in claims() for n in nodes
    }
    screened_pairs = summary(allocator.allocate([claims()[0], claims()[3]], nodes[5]))
    skipped = sum(allocator.cannot_fit([c], n) for c in claims() for n in nodes)
    assert skipped > 0  # the screen is taken somewhere, or this test proves nothing
    unscreened(monkeypatch)
    allocator, nodes = build(in_use)
    plain = {
        (c["metadata"]["name"], n.name): summary(allocator.allocate([c], n)) for c in claims() for n in nodes
    }
    assert screened == plain
    assert screened_pairs == summary(allocator.allocate([claims()[0], claims()[3]], nodes[5]))


def test_first_fit_chooses_and_fails_as_filtering_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    def run() -> list[tuple[Any, ...]]:
        allocator, nodes = build(3)
        answers = []
        for start in range(len(nodes)):
            rotation = nodes[start:] + nodes[:start]
            for c in claims():
                fast = first_fit(allocator, [c], nodes, start=start)  # the same rotation
                full = filter_nodes(allocator, [c], rotation)
                assert (fast.chosen and fast.chosen.node) == (full.chosen and full.chosen.node)
                if full.chosen is None:  # what the failure says matters only then
                    assert fast.failure == full.failure
                assert (fast.error and fast.error.node) == (full.error and full.error.node)
                failure = fast.failure if fast.chosen is None else None
                answers.append((c["metadata"]["name"], start, fast.chosen and fast.chosen.node, failure))
                if fast.chosen is not None:
                    allocator.commit(c, fast.chosen.outcome.allocations[0])
        return answers

    screened = run()
    unscreened(monkeypatch)
    assert screened == run()


def test_cannot_err_skips_only_nodes_without_errors() -> None:
    allocator, nodes = build(0)
    one, errs = claims()[0], claims()[3]
    # n0 is plain; n1 has counters, n2 an incomplete pool, n4 per-device node selection.
    assert allocator.cannot_err([one], nodes[0]) and allocator.cannot_fit([claims()[2]], nodes[0])
    assert not any(allocator.cannot_err([one], nodes[i]) for i in (1, 2, 3, 4))
    assert not allocator.cannot_err([errs], nodes[0])  # gpu-0 has no tier: CEL errs there
    assert allocator.allocate([errs], nodes[0]).failure.error  # type: ignore[union-attr]


def test_new_slices_drop_what_was_screened() -> None:
    allocator, nodes = build(0)
    none = claims()[2]
    assert allocator.cannot_fit([none], nodes[0])
    slices, _ = fleet()
    slices[0]["spec"]["devices"][0]["attributes"]["model"] = {"string": "B200"}
    allocator.slices = list[Mapping[str, Any]](slices)
    assert not allocator.cannot_fit([none], nodes[0])
    assert allocator.allocate([none], nodes[0]).ok
    assert allocator_module.CANNOT_ALLOCATE == "cannot allocate all claims"


def test_filter_nodes_feasible_rejected_and_errors_as_without_screening(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def run() -> list[Any]:
        allocator, nodes = build(5)
        seen: list[Any] = []
        for c in claims():
            for available in (lambda _n: True, lambda n: n is not None and n.name != "n0"):
                result = filter_nodes(allocator, [c], nodes, available)
                seen.append(
                    (
                        [(e.node_name, summary(e.outcome)) for e in result.feasible],
                        [(e.node_name, summary(e.outcome)) for e in result.rejected],
                        result.error and (result.error.node_name, summary(result.error.outcome)),
                    )
                )
        return seen

    allocator, nodes = build(5)
    assert any(allocator.screen([c]).certainly_fits(n) for c in claims() for n in nodes)
    screened = run()
    unscreened(monkeypatch)
    assert screened == run()


def test_scores_without_first_available_read_no_allocation() -> None:
    def never() -> AllocationOutcome:
        raise AssertionError("a feasible node's allocation was made without need")

    feasible = [NodeOutcome(Node("a"), lazy=never), NodeOutcome(Node("b"), lazy=never)]
    features = Features()
    assert features.prioritized_list and features.prioritized_list_scoring
    choice = choose_node(feasible, [claims()[0]], features)
    assert choice is not None and choice.chosen is feasible[0]
    assert choice.to_json()["scores"] == {"a": 0, "b": 0}
