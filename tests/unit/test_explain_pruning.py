"""explain at fleet size: selectors run once per device, screened nodes explain exactly as
searched ones, and text lists the first nodes and counts the rest (--every-node lists all)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from bench import fleet
from controller import cel
from controller.allocation.selectors import SelectorProgram
from controller.cli import main
from controller.explain.explanation import NODE_LIMIT, explain_claim
from controller.scheduler.allocator import Allocator, Node, Screen

NODES = NODE_LIMIT + 7


class CountingProgram:
    """A compiled selector that counts its evaluations per device (wraps the real one)."""

    def __init__(self, expression: str, counts: dict[tuple[str, str, str], int]) -> None:
        self.inner = cel.compile_selector(expression)
        self.expression = expression
        self.counts = counts

    def matches(self, driver: str, device: Mapping[str, Any]) -> bool:
        uuid = str(device["attributes"]["uuid"]["string"])
        key = (self.expression, uuid, str(device.get("name")))
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.inner.matches(driver, device)


def fleet_allocator(counts: dict[tuple[str, str, str], int] | None = None) -> Allocator:
    objects = fleet.fleet_objects(NODES, 2)
    compiler = None
    if counts is not None:

        def compiler(expression: str) -> SelectorProgram:
            return CountingProgram(expression, counts)

    return Allocator(
        device_classes=[o for o in objects if o["kind"] == "DeviceClass"],
        slices=[o for o in objects if o["kind"] == "ResourceSlice"],
        compiler=compiler,
    )


def test_selectors_run_once_per_device() -> None:
    counts: dict[tuple[str, str, str], int] = {}
    allocator = fleet_allocator(counts)
    nodes = [Node(fleet.node_name(i)) for i in range(NODES)]
    explanation = explain_claim(allocator, fleet.unfittable_claim(), nodes)
    assert not explanation.usable and len(explanation.nodes) == NODES
    assert len(counts) == 2 * NODES * 2  # the class's and the claim's selector, on every device
    assert set(counts.values()) == {1}


def test_screened_nodes_explain_as_searched_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = [Node(fleet.node_name(i)) for i in range(NODES)]
    claims = [fleet.unfittable_claim(), *fleet.whole_gpu_claims(9)]
    screened = [explain_claim(fleet_allocator(), c, nodes).to_json() for c in claims]
    monkeypatch.setattr(Screen, "cannot_fit", lambda self, node: False)
    assert screened == [explain_claim(fleet_allocator(), c, nodes).to_json() for c in claims]


@pytest.fixture(scope="module")
def fleet_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("fleet")
    claims = [fleet.unfittable_claim(), *fleet.whole_gpu_claims(1)]
    files = fleet.write_fleet(root, nodes=NODES, gpus_per_node=2, claims=claims)
    return [str(p) for p in files.paths]


def explain(capsys: pytest.CaptureFixture[str], files: list[str], *args: str) -> str:
    main(["explain", *args, "--objects", *files])
    return capsys.readouterr().out


def test_text_lists_the_first_nodes_and_counts_the_rest(
    capsys: pytest.CaptureFixture[str], fleet_files: list[str]
) -> None:
    text = explain(capsys, fleet_files, "unfittable")
    assert text.count("\nnode ") == NODE_LIMIT
    assert f"node {fleet.node_name(NODE_LIMIT - 1)}:" in text and fleet.node_name(NODE_LIMIT) not in text
    assert text.splitlines()[-1] == (
        "... and 7 more node(s), not listed (--every-node lists them): 7 cannot allocate all claims"
    )
    every = explain(capsys, fleet_files, "unfittable", "--every-node")
    assert every.count("\nnode ") == NODES and "more node(s)" not in every
    data = json.loads(explain(capsys, fleet_files, "unfittable", "-o", "json"))
    assert len(data["nodes"]) == NODES


def test_a_claim_that_fits_lists_allocatable_nodes_past_the_limit(
    capsys: pytest.CaptureFixture[str], fleet_files: list[str], tmp_path: Path
) -> None:
    text = explain(capsys, fleet_files, "claim-00000")
    # claim-00000 asks for an A100 40GB: every fifth node has them.
    fits = [fleet.node_name(i) for i in range(NODES) if fleet.node_model(i) == fleet.MODELS[0]]
    assert text.splitlines()[0] == f"claim default/claim-00000 can be allocated on: {', '.join(fits)}"
    left = sum(1 for i in range(NODE_LIMIT, NODES) if fleet.node_model(i) == fleet.MODELS[0])
    assert text.splitlines()[-1] == (
        f"... and 7 more node(s), not listed (--every-node lists them): {7 - left} cannot allocate all "
        f"claims; {left} allocatable"
    )


def test_a_class_selector_runs_once_per_device_for_every_claim_of_the_class() -> None:
    counts: dict[tuple[str, str, str], int] = {}
    allocator = fleet_allocator(counts)
    nodes = [Node(fleet.node_name(i)) for i in range(NODES)]
    claims = fleet.whole_gpu_claims(9)  # nine selector shapes, one class
    for claim in claims:
        explain_claim(allocator, claim, nodes)
    class_expression = allocator.classes[fleet.GPU_CLASS]["spec"]["selectors"][0]["cel"]["expression"]
    by_class = [n for (expression, _, _), n in counts.items() if expression == class_expression]
    assert len(by_class) == NODES * 2 and set(by_class) == {1}
