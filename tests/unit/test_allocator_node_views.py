"""One Allocator serving many Filter calls: the per-node pool views, the per-device facts and
selector verdicts it keeps between calls must never change an outcome."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from controller import cel
from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.allocation.capacity import request_fits
from controller.allocation.requests import alternatives, claim_requests
from controller.allocation.search import has_plain_capacity
from controller.allocation.selectors import SelectorProgram
from controller.scheduler.allocator import AllocationOutcome, Allocator, Node

D = "gpu.draplugin.dev"
CLASSES = [device_class("gpu", [f'device.driver == "{D}"'])]
H100 = f'device.attributes["{D}"].model == "H100"'


def node_slices(nodes: int) -> list[dict[str, Any]]:
    slices = []
    for n in range(nodes):
        devices = [
            device(f"gpu-{i}", {"model": "H100" if i % 3 else "A100", "numa": i // 2}, {"memory": "80Gi"})
            for i in range(6)
        ]
        slices.append(resource_slice(f"node-{n}-gpus", devices, node=f"node-{n}"))
    # Shareable devices with a request policy (capacity paths) and a labelled-node pool.
    shared = [device(f"nic-{i}", {"model": "H100"}, allowMultipleAllocations=True) for i in range(2)]
    shared[0]["capacity"] = {"bw": {"value": "10G", "requestPolicy": {"default": "4G"}}}
    shared[1]["capacity"] = {"bw": {"value": "10G"}}  # plain: the search's fast path
    selector = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]
    }
    slices.append(resource_slice("rack-r1-nics", shared, pool="rack-r1", node_selector=selector))
    return slices


def random_claim(rng: random.Random, index: int) -> dict[str, Any]:
    count = rng.choice((1, 1, 2, 3))
    selectors = [H100] if rng.random() < 0.5 else []
    constraints = [{"matchAttribute": f"{D}/numa"}] if count > 1 and rng.random() < 0.5 else []
    body = claim(
        f"c{index}",
        [exactly("gpu", count=count, selectors=selectors)],
        constraints=constraints,
    )
    body["metadata"]["uid"] = f"uid-{index}"
    return body


def outcome_view(outcome: AllocationOutcome) -> object:
    return (outcome.ok, outcome.failure, outcome.allocations)


def test_filter_calls_on_one_allocator_match_a_fresh_allocator_per_call() -> None:
    rng = random.Random(17)
    slices = node_slices(4)
    nodes = [Node(f"node-{n}", {"rack": "r1"} if n % 2 else {}) for n in range(4)]
    kept = Allocator(device_classes=CLASSES, slices=slices, new_share_id=lambda: "share")
    committed: list[dict[str, Any]] = []
    for index in range(40):
        body = random_claim(rng, index)
        if index % 3 == 0:  # a share of a NIC: the capacity paths, plain and with a policy
            bandwidth = ("6G", "11G", "3G", "5G")[index // 3 % 4]
            body["spec"]["devices"] = {
                "requests": [exactly("nic", count=1, capacity={"requests": {"bw": bandwidth}})]
            }
        chosen = None
        for node in nodes:
            fresh = Allocator(
                device_classes=CLASSES,
                slices=slices,
                allocated_claims=committed,
                new_share_id=lambda: "share",
            )
            expected = fresh.allocate([body], node)
            got = kept.allocate([body], node)
            assert outcome_view(got) == outcome_view(expected), (index, node)
            if got.ok and chosen is None:
                chosen = got.allocations[0]
        if chosen is not None:
            kept.commit(body, chosen)
            committed.append({"metadata": body["metadata"], "status": {"allocation": chosen}})
    assert committed, "the scenario allocated nothing, so it compared nothing"


def test_replacing_the_slices_rebuilds_the_node_views() -> None:
    allocator = Allocator(
        device_classes=CLASSES, slices=[resource_slice("s1", [device("gpu-0")], node="node-0")]
    )
    request = [claim("c", [exactly("gpu", count=2)])]
    assert not allocator.allocate(request, Node("node-0")).ok
    allocator.slices = [resource_slice("s1", [device("gpu-0"), device("gpu-1")], node="node-0")]
    assert allocator.allocate(request, Node("node-0")).ok
    assert allocator.node_names() == ["node-0"]


def test_node_labels_are_part_of_the_node_view() -> None:
    selector = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]
    }
    allocator = Allocator(
        device_classes=CLASSES,
        slices=[resource_slice("s", [device("gpu-0")], pool="p", node_selector=selector)],
    )
    request = [claim("c", [exactly("gpu")])]
    assert not allocator.allocate(request, Node("node-0")).ok
    assert allocator.allocate(request, Node("node-0", {"rack": "r1"})).ok
    assert not allocator.allocate(request, Node("node-0", {"rack": "r2"})).ok


class CountingProgram:
    def __init__(self, expression: str, counts: dict[str, int]) -> None:
        self.inner = cel.compile_selector(expression)
        self.expression = expression
        self.counts = counts

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        key = f"{self.expression}@{device.get('name')}"
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.inner.matches(driver, device)


def test_a_selector_runs_once_per_device_across_filter_calls() -> None:
    counts: dict[str, int] = {}

    def compiler(expression: str) -> SelectorProgram:
        return CountingProgram(expression, counts)

    slices = [
        resource_slice(
            "s", [device("gpu-0", {"model": "A100"}), device("gpu-1", {"model": "H100"})], node="n"
        )
    ]
    allocator = Allocator(device_classes=CLASSES, slices=slices, compiler=compiler)
    request = [claim("c", [exactly("gpu", selectors=[H100])])]
    for _ in range(3):
        outcome = allocator.allocate(request, Node("n"))
        assert outcome.ok and outcome.allocations[0]["devices"]["results"][0]["device"] == "gpu-1"
    assert counts == {
        f'device.driver == "{D}"@gpu-0': 1,
        f"{H100}@gpu-0": 1,
        f'device.driver == "{D}"@gpu-1': 1,
        f"{H100}@gpu-1": 1,
    }


def test_a_cel_runtime_error_fails_every_filter_call_not_just_the_first() -> None:
    allocator = Allocator(
        device_classes=CLASSES, slices=[resource_slice("s", [device("gpu-0", {"model": "H100"})], node="n")]
    )
    request = [claim("c", [exactly("gpu", selectors=[f'device.attributes["{D}"].missing == "x"'])])]
    for _ in range(2):
        outcome = allocator.allocate(request, Node("n"))
        assert outcome.failure is not None and outcome.failure.error
        assert "CEL runtime error" in outcome.failure.message


def test_a_malformed_capacity_is_an_error_on_every_filter_call() -> None:
    bad = device("gpu-0", capacity={"memory": "eighty"})
    allocator = Allocator(device_classes=CLASSES, slices=[resource_slice("s", [bad], node="n")])
    for _ in range(2):
        outcome = allocator.allocate([claim("c", [exactly("gpu")])], Node("n"))
        assert outcome.failure is not None and outcome.failure.error


def test_plain_capacity_excludes_request_policies_and_malformed_values() -> None:
    plain = device("a", capacity={"memory": "80Gi", "cores": "8"})
    no_capacity = device("b")
    with_policy = device("c")
    with_policy["capacity"] = {"memory": {"value": "80Gi", "requestPolicy": {"default": "1Gi"}}}
    malformed = device("d", capacity={"memory": "eighty"})
    assert has_plain_capacity(plain) and has_plain_capacity(no_capacity)
    assert not has_plain_capacity(with_policy) and not has_plain_capacity(malformed)
    for dev in (plain, no_capacity):
        assert request_fits(None, dev, {}, {}) and request_fits({}, dev, {}, {})


def _memos(allocator: Allocator, node: Node) -> list[list[dict[tuple[str, ...], bool]]]:
    return [[dict(c.selected) for c in pool] for pool in allocator._view(node).candidates]


def test_candidates_built_late_hold_the_verdicts_found_before() -> None:
    # A view screens from its devices until a search needs candidates; the verdicts found by
    # then must be in the candidates' memos, as when the candidates existed from the start.
    rng = random.Random(5)
    slices = node_slices(3)
    claims = [random_claim(rng, i) for i in range(12)]
    nodes = [Node(f"node-{n}", labels={"rack": "r1"} if n == 1 else {}) for n in range(3)]
    late = Allocator(device_classes=CLASSES, slices=slices)
    early = Allocator(device_classes=CLASSES, slices=slices)
    for node in nodes:
        _memos(early, node)  # built before any verdict
    for body in claims:
        for request in claim_requests(body):
            for allocator in (late, early):
                for node in nodes:
                    allocator.first_failing(node, alternatives(request)[0])
    assert all(late._view(node).built is None for node in nodes)
    for node in nodes:
        assert _memos(late, node) == _memos(early, node)
    for body in claims:
        for node in nodes:
            assert outcome_view(late.allocate([body], node)) == outcome_view(early.allocate([body], node))


def test_a_claim_no_device_passes_builds_no_candidates() -> None:
    # Most Filter calls at fleet size (explain of a claim that fits nowhere: 8,000 devices).
    slices = node_slices(3)
    allocator = Allocator(device_classes=CLASSES, slices=slices)
    nowhere = claim("c", [exactly("gpu", selectors=[f'device.attributes["{D}"].model == "B200"'])])
    for n in range(3):
        outcome = allocator.allocate([nowhere], Node(f"node-{n}"))
        assert not outcome.ok and outcome.failure is not None and not outcome.failure.error
        assert allocator._view(Node(f"node-{n}")).built is None
