"""The scheduler differential's own parts (tests/differential/), without a cluster: the generator
covers what it promises per release and is reproducible, the comparison flags what it must, and
the shrinker's steps and printed case are usable."""

from __future__ import annotations

import ast
import functools
import json
import random

from controller.allocation.features import Features, parse_feature_gates
from devcluster.controlplane import dra_settings
from tests.differential.compare import ERROR, PLACED, UNSCHEDULABLE, Outcome, disagreement, ours_outcome
from tests.differential.generator import generate
from tests.differential.play import Verdict
from tests.differential.scenario import Scenario
from tests.differential.shrink import pytest_case, reductions


def features(minor: int) -> Features:
    return Features.for_release(minor).with_gates(
        parse_feature_gates(dra_settings(f"1.{minor}.0").feature_gates)
    )


@functools.cache
def scenarios(minor: int, count: int = 300) -> list[Scenario]:
    rng = random.Random(7)
    return [generate(rng, f"t-{i:05d}", minor, features(minor)) for i in range(count)]


def text(s: Scenario) -> str:
    return json.dumps(s.to_json())


def test_the_same_seed_gives_the_same_scenarios() -> None:
    rng = random.Random(7)
    again = [generate(rng, f"t-{i:05d}", 37, features(37)) for i in range(50)]
    assert [text(s) for s in again] == [text(s) for s in scenarios(37)[:50]]


def test_the_generator_covers_every_promised_ingredient_on_1_37() -> None:
    all_text = [text(s) for s in scenarios(37)]
    for needle in (
        '"allocationMode": "All"', '"firstAvailable"', '"adminAccess": true', '"taints"', '"tolerations"',
        '"sharedCounters"', '"consumesCounters"', '"allowMultipleAllocations": true', '"requests": {"memory"',
        '"matchAttribute"', '"distinctAttribute"', '"requestPolicy"',
    ):  # fmt: skip
        assert any(needle in t for t in all_text), needle
    generated = scenarios(37)
    assert any(len(s.nodes) == 3 for s in generated)
    assert any(s.blockers for s in generated)
    assert any(".memory >= " in t and '"memory" in' not in t for t in all_text)  # may err at run time
    pools = [sl["spec"]["pool"] for s in generated for sl in s.slices]
    incomplete = [
        s for s in generated
        for sl in s.slices
        if sl["spec"]["pool"]["resourceSliceCount"]
        > sum(1 for o in s.slices if o["spec"]["pool"]["name"] == sl["spec"]["pool"]["name"])
    ]  # fmt: skip
    assert incomplete and any(p["resourceSliceCount"] > 1 for p in pools)
    # 1.35 on: a counter slice holds counters only.
    for s in generated:
        for sl in s.slices:
            assert not (sl["spec"].get("sharedCounters") and "devices" in sl["spec"])


def test_on_1_34_nothing_that_panics_its_scheduler() -> None:
    for s in scenarios(34):
        present: dict[str, int] = {}
        for sl in s.slices:
            present[sl["spec"]["pool"]["name"]] = present.get(sl["spec"]["pool"]["name"], 0) + 1
        assert max(present.values()) == 1, s.tag
        assert "allowMultipleAllocations" not in text(s)


def placed(node: str, *devices: str, ties: tuple[str, ...] = ()) -> Outcome:
    return Outcome(PLACED, node, tuple(("c", "r0", d) for d in devices), ties)


def test_the_comparison_flags_outcome_node_and_devices() -> None:
    s = scenarios(37)[0]
    node = s.nodes[0]
    never = lambda _node: Outcome(UNSCHEDULABLE)  # noqa: E731
    assert disagreement(s, Outcome(ERROR), Outcome(UNSCHEDULABLE), never) is not None
    assert disagreement(s, Outcome(ERROR), Outcome(ERROR), never) is None
    assert disagreement(s, placed(node, "gpu-0"), placed(node, "gpu-0"), never) is None
    assert (disagreement(s, placed(node, "gpu-0"), placed(node, "gpu-1"), never) or "").startswith("devices")
    assert (disagreement(s, placed("other", "gpu-0"), placed(node, "gpu-0"), never) or "").startswith("node")
    # A tie: the scheduler's node must be listed, and ours is then checked on that node.
    tie = placed(node, "gpu-0", ties=(node, "other"))
    assert disagreement(s, placed("other", "gpu-0"), tie, lambda n: placed(n, "gpu-0")) is None
    assert (disagreement(s, placed("third", "gpu-0"), tie, never) or "").startswith("node")


def test_every_reduction_is_smaller_and_the_printed_case_is_python() -> None:
    s = max(scenarios(37)[:60], key=Scenario.size)
    smaller = list(reductions(s))
    assert smaller
    assert all(t.size() <= s.size() and text(t) != text(s) for t in smaller)
    source = pytest_case(Verdict(s, Outcome(PLACED), Outcome(UNSCHEDULABLE), "outcome: x"), "1.37")
    tree = ast.parse(source)
    [function] = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert function.name == f"test_differential_{s.tag.replace('-', '_')}"
    literal = ast.literal_eval(function.body[1].value.args[0])  # type: ignore[attr-defined]
    assert Scenario.from_json(literal) == s


def test_an_error_in_one_claims_explanation_is_not_the_pods_error() -> None:
    from controller.scheduler.nodefilter import scheduling_error_message
    from controller.simulate.command import ClaimResult

    explained = "the claims of pod ns/p do not fit together on one node (... CEL runtime error ...)"
    assert ours_outcome([ClaimResult("ns", "c", False, reason=explained)]).kind == UNSCHEDULABLE
    failed = scheduling_error_message("n0", "claim ns/c: selector #0: CEL runtime error: no such key")
    assert ours_outcome([ClaimResult("ns", "c", False, reason=failed)]).kind == ERROR
