"""Node choice as kube-scheduler makes it: the DynamicResources score from 1.35 on, else a random tie."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.allocation.features import Features
from controller.cli import main
from controller.objects import ClusterObjects
from controller.options import build_allocator, cluster_nodes
from controller.scheduler.nodescore import dra_score, normalize
from controller.simulate.command import ClaimResult, simulate, to_text


def template(name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def pod(name: str, template_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "c", "image": "x"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template_name}],
        },
    }


BIG = "device.attributes['gpu.draplugin.dev'].model == 'big'"
PRIORITIZED = [
    first_available("gpu", exactly("big", "gpu", selectors=[BIG]), exactly("any", "gpu"))
]  # fmt: skip


def objects(requests: list[dict[str, Any]]) -> ClusterObjects:
    """node-a (first in name order) has a small GPU, node-b a big one."""
    return ClusterObjects(
        device_classes=[device_class("gpu")],
        slices=[
            resource_slice("a", [device("gpu-0", {"model": "small"})], node="node-a"),
            resource_slice("b", [device("gpu-0", {"model": "big"})], node="node-b"),
        ],
        claim_templates=[template("t", requests)],
        pods=[pod("p", "t")],
    )


def run(objs: ClusterObjects, minor: int = 37) -> ClaimResult:
    allocator = build_allocator(objs, (1, minor))
    [result] = simulate(objs, allocator, cluster_nodes(objs, allocator))
    return result


# ----- the score itself ------------------------------------------------------------------


def test_score_adds_eight_minus_the_index_of_each_allocated_subrequest() -> None:
    claims = [claim("c1", PRIORITIZED), claim("c2", PRIORITIZED)]
    first = {"devices": {"results": [{"request": "gpu/big"}]}}
    second = {"devices": {"results": [{"request": "gpu/any"}]}}
    assert dra_score(claims, [first, second]) == 8 + 7
    assert dra_score([claim("c", [exactly("gpu")])], [{"devices": {"results": [{"request": "gpu"}]}}]) == 0


def test_normalize_scales_to_100_with_integer_division_as_upstream() -> None:
    assert normalize({"a": 199, "b": 198, "c": 200}) == {"a": 99, "b": 99, "c": 100}
    assert normalize({"a": 0, "b": 0}) == {"a": 0, "b": 0}


# ----- simulate ------------------------------------------------------------------------------


def test_prioritized_list_prefers_the_node_of_the_better_subrequest_from_1_35() -> None:
    for minor in (35, 36, 37):
        result = run(objects(PRIORITIZED), minor)
        assert (result.node_name, result.possible_nodes) == ("node-b", []), minor
        assert [r["request"] for r in result.results] == ["gpu/big"]
        assert result.node_choice is not None and "prefers node-b" in result.node_choice


def test_1_34_has_no_dra_score_so_either_node_may_be_chosen() -> None:
    result = run(objects(PRIORITIZED), 34)
    assert (result.node_name, result.possible_nodes) == ("node-a", ["node-a", "node-b"])
    assert result.node_choice is not None
    assert result.node_choice.startswith("any of these nodes may be chosen: node-a, node-b")


def test_exactly_requests_tie_and_say_so_in_the_output() -> None:
    result = run(objects([exactly("gpu", "gpu")]))
    assert result.possible_nodes == ["node-a", "node-b"]
    text = to_text([result])
    assert "allocated on node-a" in text
    assert (
        "any of these nodes may be chosen: node-a, node-b (the same DynamicResources score after normalizing"
        in text
    )


def test_a_single_fitting_node_is_not_called_a_choice() -> None:
    result = run(objects([exactly("gpu", "gpu", selectors=[BIG])]))
    assert (result.node_name, result.possible_nodes, result.node_choice) == ("node-b", [], None)


def test_scoring_follows_the_release_rule() -> None:
    assert not Features.for_release(34).prioritized_list_scoring
    assert Features.for_release(35).prioritized_list_scoring


# ----- explain -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "candidates", "deterministic"),
    [("1.37", ["node-b"], True), ("1.34", ["node-a", "node-b"], False)],
)
def test_explain_pod_reports_the_node_choice(
    version: str,
    candidates: list[str],
    deterministic: bool,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    objs = objects(PRIORITIZED)
    manifests = [*objs.device_classes, *objs.slices, *objs.claim_templates, *objs.pods]
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(manifests))
    args = ["explain", "pod/p", "--objects", str(tmp_path), "--kubernetes-version", version, "-o", "json"]
    main(args)
    choice = json.loads(capsys.readouterr().out)["nodeChoice"]
    assert (choice["candidates"], choice["deterministic"]) == (candidates, deterministic)


# ----- 1.35's Score error --------------------------------------------------------------------


def with_allocated_shared_claim(objs: ClusterObjects) -> ClusterObjects:
    """The pod also uses a claim allocated before, usable on every node (no nodeSelector)."""
    shared = claim("shared", [exactly("net", "gpu")])
    shared["status"] = {
        "allocation": {"devices": {"results": [
            {"request": "net", "driver": "gpu.draplugin.dev", "pool": "fabric", "device": "link-0"}
        ]}}
    }  # fmt: skip
    objs.claims = [shared]
    objs.slices = [*objs.slices, resource_slice("fabric", [device("link-0")], pool="fabric", all_nodes=True)]
    objs.pods[0]["spec"]["resourceClaims"].append({"name": "net", "resourceClaimName": "shared"})
    return objs


def test_1_35_score_fails_for_a_pod_with_an_allocated_claim_when_several_nodes_fit() -> None:
    result = run(with_allocated_shared_claim(objects([exactly("gpu", "gpu")])), 35)
    assert not result.allocated
    assert result.reason is not None
    assert result.reason.endswith(
        'running Score plugins: plugin "DynamicResources" failed with: '
        "number of allocations 1 is smaller than number of claims"
    )


@pytest.mark.parametrize("minor", [34, 36, 37])
def test_other_releases_score_such_a_pod(minor: int) -> None:
    result = run(with_allocated_shared_claim(objects([exactly("gpu", "gpu")])), minor)
    assert (result.allocated, result.possible_nodes) == (True, ["node-a", "node-b"])


def test_1_35_does_not_score_a_single_fitting_node() -> None:
    objs = with_allocated_shared_claim(objects([exactly("gpu", "gpu", selectors=[BIG])]))
    result = run(objs, 35)
    assert (result.allocated, result.node_name) == (True, "node-b")


def test_explain_reports_the_score_error_as_the_scheduling_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objs = with_allocated_shared_claim(objects([exactly("gpu", "gpu")]))
    manifests = [*objs.device_classes, *objs.slices, *objs.claim_templates, *objs.claims, *objs.pods]
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(manifests))
    args = ["explain", "pod/p", "--objects", str(tmp_path), "--kubernetes-version", "1.35", "-o", "json"]
    assert main(args) == 1
    data = json.loads(capsys.readouterr().out)
    assert "number of allocations 1 is smaller than number of claims" in data["schedulingError"]["message"]
    assert "nodeChoice" not in data
