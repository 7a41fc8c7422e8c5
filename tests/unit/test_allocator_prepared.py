"""A pod's claims prepared once per scheduling cycle (controller.scheduler.prepared.Prepared).

`Allocator.prefilter(claims)` does the claims' own work once (kube-scheduler's PreFilter) and
`filter(node)` / `allocate(node)` search one node with it. The answers must be those of
`Allocator.allocate(claims, node)` (itself one Prepared per call) on every node, also after
commits; screening now also knows that a claim under matchAttribute fits, and that answer
must be the search's too (checked against the same allocator with screening off).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from controller.allocation import search as search_module
from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.scheduler.allocator import FITS, Allocator, Node
from controller.scheduler.nodefilter import filter_nodes, first_fit
from controller.scheduler.prepared import StaleAllocation
from tests.unit.test_allocator_screen import build, claims, summary, unscreened

D = "gpu.draplugin.dev"
CLASSES = [device_class("gpu", [f'device.driver == "{D}"'])]


def numa_fleet(seed: int) -> tuple[list[dict[str, Any]], list[Node]]:
    """Nodes of 4 to 6 GPUs, two per NUMA node; some GPUs lack the numa attribute, some are A100."""
    rng = random.Random(seed)
    slices, nodes = [], []
    for n in range(10):
        name = f"node-{n}"
        devices = []
        for g in range(rng.randrange(4, 7)):
            attributes: dict[str, object] = {"model": rng.choice(["H100", "H100", "A100"])}
            if rng.random() > 0.15:
                attributes["numa"] = g // 2
            devices.append(device(f"gpu-{g}", attributes))
        slices.append(resource_slice(f"{name}-gpus", devices, node=name, driver=D))
        nodes.append(Node(name))
    return slices, nodes


def numa_claims() -> list[dict[str, Any]]:
    h100 = f'device.attributes["{D}"].model == "H100"'
    numa = {"matchAttribute": f"{D}/numa"}
    return [
        claim("one", [exactly("gpu", count=1, selectors=[h100])], constraints=[numa]),
        claim("two", [exactly("gpu", count=2, selectors=[h100])], constraints=[numa]),
        claim("two-any", [exactly("gpu", count=2)], constraints=[numa]),
        claim("three", [exactly("gpu", count=3)], constraints=[numa]),
        claim("two-both", [exactly("gpu", count=2)], constraints=[numa, {"matchAttribute": f"{D}/model"}]),
        claim("elsewhere", [exactly("gpu", count=2)], constraints=[{**numa, "requests": ["other"]}]),
        claim("distinct", [exactly("gpu", count=2)], constraints=[{"distinctAttribute": f"{D}/numa"}]),
        # One subrequest: the constraint names the request, or the subrequest by its full name.
        claim(
            "sub",
            [first_available("gpu", exactly("pair", count=2))],
            constraints=[{**numa, "requests": ["gpu"]}],
        ),
        claim(
            "sub-full",
            [first_available("gpu", exactly("pair", count=2))],
            constraints=[{**numa, "requests": ["gpu/pair"]}],
        ),
    ]


def place_all(seed: int) -> list[tuple[Any, ...]]:
    """Claims placed one after another as the scheduler would (first feasible node, committed),
    every node's Filter answer kept, allocations read."""
    slices, nodes = numa_fleet(seed)
    allocator = Allocator(device_classes=CLASSES, slices=slices)
    seen: list[tuple[Any, ...]] = []
    rng = random.Random(seed)
    for round_ in range(12):
        body = dict(rng.choice(numa_claims()))
        body["metadata"] = {**body["metadata"], "name": f"{body['metadata']['name']}-{round_}"}
        result = filter_nodes(allocator, [body], nodes)
        seen.append(tuple((e.node_name, summary(e.outcome)) for e in [*result.feasible, *result.rejected]))
        if result.chosen is not None:
            allocator.commit(body, result.chosen.outcome.allocations[0])
    return seen


@pytest.mark.parametrize("seed", range(8))
def test_match_attribute_screening_answers_as_the_search(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    screened = place_all(seed)
    unscreened(monkeypatch)
    assert screened == place_all(seed)


def test_a_claim_under_match_attribute_fits_without_a_search(monkeypatch: pytest.MonkeyPatch) -> None:
    slices = [
        resource_slice(f"n{i}-gpus", [device(f"gpu-{g}", {"numa": g // 2}) for g in range(4)], node=f"n{i}")
        for i in range(5)
    ]
    for s in slices:
        s["spec"]["driver"] = D
    nodes = [Node(f"n{i}") for i in range(5)]
    allocator = Allocator(device_classes=CLASSES, slices=slices)
    body = claim("pair", [exactly("gpu", count=2)], constraints=[{"matchAttribute": f"{D}/numa"}])
    runs = 0
    real_run = search_module.Search.run

    def counted(self: search_module.Search) -> bool:
        nonlocal runs
        runs += 1
        return real_run(self)

    monkeypatch.setattr(search_module.Search, "run", counted)
    prepared = allocator.prefilter([body])
    assert [prepared.screen.classify(n) for n in nodes] == [FITS] * 5
    outcomes = [prepared.filter(n) for n in nodes]
    assert all(o.ok for o in outcomes) and runs == 0
    results = outcomes[2].allocations[0]["devices"]["results"]
    assert runs == 1 and [(r["pool"], r["device"]) for r in results] == [("n2", "gpu-0"), ("n2", "gpu-1")]


def test_claims_are_prepared_once_per_filter_over_many_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    allocator, nodes = build(3)
    prepares = 0
    real_prepare = search_module.Search.prepare

    def counted(self: search_module.Search) -> None:
        nonlocal prepares
        prepares += 1
        real_prepare(self)

    monkeypatch.setattr(search_module.Search, "prepare", counted)
    for c in claims():
        prepares = 0
        filter_nodes(allocator, [c], nodes)
        first_fit(allocator, [c], nodes, start=3)
        # Screening prepares the claim once to know it is covered (kept per claim), each of the
        # two passes over the nodes once more; All requests are sized on each node, so those
        # prepare there.
        all_mode = c["metadata"]["name"] == "all"
        assert prepares <= (1 + 2 * len(nodes) if all_mode else 3), c["metadata"]["name"]


@pytest.mark.parametrize("in_use", [0, 5, 14])
def test_filter_and_allocate_of_one_preparation_answer_as_allocate(in_use: int) -> None:
    allocator, nodes = build(in_use)
    for c in [*claims(), *numa_claims()]:
        prepared = allocator.prefilter([c])
        for n in nodes:
            expected = summary(allocator.allocate([c], n))
            assert summary(prepared.filter(n)) == expected, (c["metadata"]["name"], n.name)
            assert summary(prepared.allocate(n)) == expected, (c["metadata"]["name"], n.name)


def test_a_feasible_node_read_after_a_commit_is_refused() -> None:
    allocator, nodes = build(0)
    one = claims()[0]
    prepared = allocator.prefilter([one])
    assert prepared.screen.classify(nodes[0]) == FITS
    pending = prepared.filter(nodes[0])
    done = allocator.allocate([one], nodes[6])
    allocator.commit(one, done.allocations[0])
    with pytest.raises(StaleAllocation):
        _ = pending.allocations


def test_a_searched_node_builds_its_allocation_when_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    allocator, nodes = build(0)
    built = 0
    real = Allocator._allocation

    def counted(self: Allocator, *args: Any) -> dict[str, Any]:
        nonlocal built
        built += 1
        return real(self, *args)

    monkeypatch.setattr(Allocator, "_allocation", counted)
    two = claims()[1]  # two H100: the search runs on every node where screening cannot tell
    outcomes = [allocator.prefilter([two]).allocate(n) for n in nodes]
    assert any(o.ok for o in outcomes) and built == 0
    fitting = next(o for o in outcomes if o.ok)
    assert fitting.allocations[0]["devices"]["results"] and built == 1
    assert fitting.allocations and built == 1  # once
