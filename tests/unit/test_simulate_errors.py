"""A Filter error on any node fails the pod's whole scheduling attempt, as in kube-scheduler:
simulate, explain and pre-allocation report it with the node and the error, and allocate
as before where no node errs.

Two nodes throughout: node-a could satisfy the claim; node-b errs (its pool is still being
published, or one of its devices makes a selector fail at run time)."""

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
    resource_slice,
    with_allocation,
)
from controller.cli import main
from controller.objects import ClusterObjects
from controller.options import build_allocator, cluster_nodes
from controller.scheduler.allocator import Allocator, Node
from controller.scheduler.nodefilter import FILTER_ERROR_PREFIX, filter_nodes
from controller.simulate.command import ClaimResult, simulate
from tests.unit.test_reconciler import World

D = "gpu.draplugin.dev"
PREALLOCATE = f"{D}/preallocate"
GPU_CLASS = device_class("gpu", [f'device.driver == "{D}"'])
MODEL_SELECTOR = f'device.attributes["{D}"].model == "h100"'


def node_a() -> dict[str, Any]:
    return resource_slice("node-a-gpus", [device("gpu-0", {"model": "h100"})], node="node-a")


def node_b(*, incomplete: bool = False, attributes: bool = True) -> dict[str, Any]:
    """node-b's pool; `incomplete`: one slice of two published; without `attributes`, no model."""
    gpu = device("gpu-0", {"model": "h100"} if attributes else None)
    return resource_slice("node-b-gpus", [gpu], node="node-b", slice_count=2 if incomplete else 1)


def all_mode(name: str = "all-gpus", **kwargs: Any) -> dict[str, Any]:
    return claim(name, [exactly("gpu", mode="All")], **kwargs)


def by_model(name: str = "h100", **kwargs: Any) -> dict[str, Any]:
    return claim(name, [exactly("gpu", selectors=[MODEL_SELECTOR])], **kwargs)


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def pod(name: str, *claims: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims], **spec},
    }


def cluster(
    slices: list[dict[str, Any]], claims: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> ClusterObjects:
    return ClusterObjects(
        device_classes=[GPU_CLASS],
        slices=slices,
        claims=claims,
        pods=pods,
        nodes=[node("node-a", zone="a"), node("node-b", zone="b")],
    )


def run(objects: ClusterObjects) -> list[ClaimResult]:
    allocator = build_allocator(objects)
    return simulate(objects, allocator, cluster_nodes(objects, allocator))


def assert_fails_on_node_b(result: ClaimResult, error: str) -> None:
    assert not result.allocated and result.allocation is None
    reason = result.reason or ""
    assert "on node node-b" in reason, reason
    assert FILTER_ERROR_PREFIX + error in reason, reason
    assert "aborts the pod's whole scheduling attempt" in reason


INCOMPLETE_ERROR = (
    "claim default/all-gpus, request gpu: asks for all devices, but resource pool "
    f"{D}/node-b is currently being updated"
)
CEL_ERROR = "claim default/h100: selector #0 on device gpu-0: CEL runtime error"


# ----- simulate ---------------------------------------------------------------------------


def test_all_mode_pod_is_not_scheduled_while_another_nodes_pool_is_incomplete() -> None:
    objects = cluster([node_a(), node_b(incomplete=True)], [all_mode()], [pod("p", "all-gpus")])
    [result] = run(objects)
    assert result.pod == "p"
    assert_fails_on_node_b(result, INCOMPLETE_ERROR)


def test_cel_runtime_error_on_another_nodes_device_fails_the_pod() -> None:
    objects = cluster([node_a(), node_b(attributes=False)], [by_model()], [pod("p", "h100")])
    [result] = run(objects)
    assert_fails_on_node_b(result, CEL_ERROR)


def test_without_errors_the_pod_is_allocated_on_the_first_node_that_fits() -> None:
    for objects in (
        cluster([node_a(), node_b()], [all_mode()], [pod("p", "all-gpus")]),
        cluster([node_a(), node_b()], [by_model()], [pod("p", "h100")]),
    ):
        [result] = run(objects)
        assert (result.allocated, result.node_name, result.reason) == (True, "node-a", None)
        assert [(d["pool"], d["device"]) for d in result.results] == [("node-a", "gpu-0")]


def test_a_node_the_pod_may_not_run_on_is_not_filtered_by_dra() -> None:
    # NodeAffinity rejects node-b before the DynamicResources Filter runs there: no error.
    objects = cluster(
        [node_a(), node_b(incomplete=True)], [all_mode()], [pod("p", "all-gpus", nodeSelector={"zone": "a"})]
    )
    [result] = run(objects)
    assert (result.allocated, result.node_name) == (True, "node-a")


def test_an_error_where_an_allocated_claim_of_the_pod_is_unavailable_still_fails_the_pod() -> None:
    # "held" is allocated on node-a, so node-b can never be chosen; but Filter runs the
    # allocator for the pending claim on node-b before it rejects the node, and errs there.
    held = with_allocation(
        claim("held", [exactly("gpu")]),
        {
            "devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-a", "device": "gpu-9"}]},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
                ]
            },
        },
    )
    slices = [node_a(), node_b(incomplete=True)]
    [result] = run(cluster(slices, [held, all_mode()], [pod("p", "held", "all-gpus")]))
    assert_fails_on_node_b(result, INCOMPLETE_ERROR)
    # Without the error on node-b, node-a still fits (the allocated claim's device is not node-a's gpu-0).
    [result] = run(cluster([node_a(), node_b()], [held, all_mode()], [pod("p", "held", "all-gpus")]))
    assert (result.allocated, result.node_name) == (True, "node-a")


def test_a_claim_no_pod_uses_follows_the_same_rule() -> None:
    [result] = run(cluster([node_a(), node_b(incomplete=True)], [all_mode()], []))
    assert result.pod is None
    assert_fails_on_node_b(result, INCOMPLETE_ERROR)


def test_filter_nodes_reports_the_first_erring_node_in_the_given_order() -> None:
    slices = [
        node_a(),
        node_b(incomplete=True),
        resource_slice("node-c-gpus", [device("gpu-0")], node="node-c", slice_count=3),
    ]
    allocator = Allocator(device_classes=[GPU_CLASS], slices=slices)
    nodes: list[Node | None] = [Node("node-c"), Node("node-a"), Node("node-b")]
    filtered = filter_nodes(allocator, [all_mode()], nodes)
    assert filtered.chosen is None
    assert filtered.error is not None and filtered.error.node_name == "node-c"
    assert [n.node_name for n in filtered.feasible] == ["node-a"]
    assert filtered.failure.error and "on node node-c" in filtered.failure.message


# ----- explain ----------------------------------------------------------------------------


def write(tmp_path: Path, objects: ClusterObjects) -> str:
    items = [*objects.device_classes, *objects.slices, *objects.claims, *objects.pods, *objects.nodes]
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(items))
    return str(tmp_path)


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc = main(["explain", *args, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_explain_claim_names_the_erring_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path, cluster([node_a(), node_b(incomplete=True)], [all_mode()], []))
    rc, data = explain(capsys, "all-gpus", "--objects", source)
    assert rc == 1
    assert data["schedulingError"]["node"] == "node-b"
    assert INCOMPLETE_ERROR in data["schedulingError"]["message"]
    assert "on node node-b" in data["summary"] and INCOMPLETE_ERROR in data["summary"]
    verdicts = {n["node"]: (n["allocatable"], n["error"]) for n in data["nodes"]}
    assert verdicts == {"node-a": (True, False), "node-b": (False, True)}
    main(["explain", "all-gpus", "--objects", source])
    text = capsys.readouterr().out
    assert "node node-b: " in text and "(Filter error: fails the pod on every node)" in text


def test_explain_pod_names_the_erring_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path, cluster([node_a(), node_b(attributes=False)], [by_model()], [pod("p", "h100")]))
    rc, data = explain(capsys, "pod/p", "--objects", source)
    assert rc == 1
    assert data["schedulingError"]["node"] == "node-b"
    assert CEL_ERROR in data["schedulingError"]["message"]
    main(["explain", "pod/p", "--objects", source])
    assert capsys.readouterr().out.startswith("pod default/p cannot be scheduled: ")


def test_explain_without_errors_is_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path, cluster([node_a(), node_b()], [all_mode()], [pod("p", "all-gpus")]))
    rc, data = explain(capsys, "all-gpus", "--objects", source)
    assert (rc, data["schedulingError"]) == (0, None)
    assert data["summary"] == "claim default/all-gpus can be allocated on: node-a, node-b"
    rc, data = explain(capsys, "pod/p", "--objects", source)
    assert (rc, data["schedulingError"]) == (0, None)


# ----- pre-allocation ---------------------------------------------------------------------


def preallocated(node_value: str, make: Any = all_mode) -> dict[str, Any]:
    return make(annotations={PREALLOCATE: node_value})  # type: ignore[no-any-return]


def test_preallocation_to_any_node_does_not_place_what_the_scheduler_would_not() -> None:
    for slices, make in (
        ([node_a(), node_b(incomplete=True)], all_mode),
        ([node_a(), node_b(attributes=False)], by_model),
    ):
        world = World([preallocated("any", make)], slices)
        report = world.reconciler.reconcile()
        name = f"default/{make()['metadata']['name']}"
        assert (report.allocated, report.unschedulable) == ([], [name])
        assert "allocation" not in (world.claim(name.split("/")[1]).get("status") or {})
        assert world.metric("dra_controller_allocation_attempts_total", result="error") == 1


def test_preallocation_to_a_named_node_only_filters_that_node() -> None:
    world = World([preallocated("node-a")], [node_a(), node_b(incomplete=True)], nodes=["node-a"])
    assert world.reconciler.reconcile().allocated == ["default/all-gpus"]


def test_preallocation_without_errors_is_as_before() -> None:
    world = World([preallocated("any")], [node_a(), node_b()])
    assert world.reconciler.reconcile().allocated == ["default/all-gpus"]
    results = world.claim("all-gpus")["status"]["allocation"]["devices"]["results"]
    assert [(r["pool"], r["device"]) for r in results] == [("node-a", "gpu-0")]
