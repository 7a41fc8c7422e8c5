"""lint's placement findings, each with cases that must and must not raise it: untolerated
taints on every matching device, All-mode requests on nodes with an incomplete pool, and
requests matching devices of no node the pod could run on. Where allocation can tell, the
allocator is asked too, so a finding says what the scheduler would do."""

from __future__ import annotations

from collections.abc import Sequence
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
from controller.allocation.nodes import Node
from controller.lint.linter import Finding, lint
from controller.objects import ClusterObjects
from controller.options import build_allocator
from controller.scheduler.allocator import allocate

D = "gpu.draplugin.dev"
GPU = device_class("gpu")
MAINTENANCE = {"key": "maintenance", "value": "yes", "effect": "NoSchedule"}


def placement(objects: ClusterObjects, release: tuple[int, int] = (1, 37)) -> list[Finding]:
    selector_codes = {"no-match", "unknown-attribute", "unguarded-attribute", "runtime-error"}
    found = lint(objects, build_allocator(objects, release)).findings
    return [f for f in found if f.code not in selector_codes]


def only_codes(objects: ClusterObjects, release: tuple[int, int] = (1, 37)) -> list[str]:
    return [f.code for f in placement(objects, release)]


# ----- untolerated taints -------------------------------------------------------------------


def tainted(*taints: dict[str, str], clean: int = 0) -> list[dict[str, Any]]:
    devices = [device(f"t{i}", {"model": "H100"}, taints=list(taints)) for i in range(2)]
    devices += [device(f"c{i}", {"model": "H100"}) for i in range(clean)]
    return [resource_slice("s", devices, node="n")]


def test_every_matching_device_tainted_is_a_warning_and_the_allocator_agrees() -> None:
    claims = [claim("c", [exactly("gpu")])]
    objects = ClusterObjects(device_classes=[GPU], slices=tainted(MAINTENANCE), claims=claims)
    [finding] = placement(objects)
    assert (finding.severity, finding.code, finding.where) == ("warning", "untolerated-taint", "request gpu")
    assert "all 2 devices it matches carry a taint" in finding.message
    assert "maintenance=yes:NoSchedule on t0" in finding.message
    assert not allocate(claims, device_classes=[GPU], slices=objects.slices, node=Node("n")).ok


@pytest.mark.parametrize(
    ("taint", "toleration", "clean"),
    [
        (MAINTENANCE, {"key": "maintenance", "operator": "Exists"}, 0),  # tolerated
        (MAINTENANCE, {"key": "maintenance", "operator": "Equal", "value": "yes"}, 0),
        (MAINTENANCE, None, 1),  # one matching device is untainted
        ({"key": "maintenance", "effect": "None"}, None, 0),  # an effect that does not block
    ],
)
def test_no_taint_warning_when_some_device_can_be_used(
    taint: dict[str, str], toleration: dict[str, str] | None, clean: int
) -> None:
    claims = [claim("c", [exactly("gpu", tolerations=[toleration] if toleration else [])])]
    objects = ClusterObjects(device_classes=[GPU], slices=tainted(taint, clean=clean), claims=claims)
    assert only_codes(objects) == []
    assert allocate(claims, device_classes=[GPU], slices=objects.slices, node=Node("n")).ok


def test_taints_count_only_on_the_devices_the_request_matches() -> None:
    slices = [
        resource_slice(
            "s",
            [device("t0", {"model": "H100"}, taints=[MAINTENANCE]), device("a0", {"model": "A100"})],
            node="n",
        )
    ]
    h100 = claim("h", [exactly("gpu", selectors=[f'device.attributes["{D}"].model == "H100"'])])
    a100 = claim("a", [exactly("gpu", selectors=[f'device.attributes["{D}"].model == "A100"'])])
    found = placement(ClusterObjects(device_classes=[GPU], slices=slices, claims=[h100, a100]))
    assert [(f.object, f.code) for f in found] == [("ResourceClaim/default/h", "untolerated-taint")]


def test_device_taint_rules_taint_like_the_slice_would() -> None:
    rule = {
        "kind": "DeviceTaintRule",
        "metadata": {"name": "drain"},
        "spec": {"deviceSelector": {"driver": D, "pool": "n"}, "taint": MAINTENANCE},
    }
    slices = [resource_slice("s", [device("d0"), device("d1")], node="n")]
    objects = ClusterObjects(device_classes=[GPU], slices=slices, claims=[claim("c", [exactly("gpu")])])
    assert only_codes(objects) == []
    objects.taint_rules.append(rule)
    assert only_codes(objects) == ["untolerated-taint"]


def test_taints_are_ignored_on_releases_whose_scheduler_ignores_them() -> None:
    assert not Features.for_release(35).device_taints
    objects = ClusterObjects(
        device_classes=[GPU], slices=tainted(MAINTENANCE), claims=[claim("c", [exactly("gpu")])]
    )
    assert only_codes(objects, (1, 35)) == []


def test_first_available_is_blocked_only_when_every_subrequest_is() -> None:
    slices = [
        resource_slice(
            "s",
            [device("t0", {"model": "H100"}, taints=[MAINTENANCE]), device("a0", {"model": "A100"})],
            node="n",
        )
    ]
    h100 = exactly("h100", selectors=[f'device.attributes["{D}"].model == "H100"'])
    a100 = exactly("a100", selectors=[f'device.attributes["{D}"].model == "A100"'])
    fallback = claim("c", [first_available("gpu", h100, a100)])
    assert only_codes(ClusterObjects(device_classes=[GPU], slices=slices, claims=[fallback])) == []
    no_fallback = claim("c", [first_available("gpu", h100, h100 | {"name": "again"})])
    [finding] = placement(ClusterObjects(device_classes=[GPU], slices=slices, claims=[no_fallback]))
    assert (finding.code, finding.where) == ("untolerated-taint", "request gpu")
    assert "subrequest h100:" in finding.message and "subrequest again:" in finding.message


def test_an_allocated_claim_is_not_judged_again() -> None:
    allocated = with_allocation(claim("c", [exactly("gpu")]), {"devices": {"results": []}})
    objects = ClusterObjects(device_classes=[GPU], slices=tainted(MAINTENANCE), claims=[allocated])
    assert only_codes(objects) == []


# ----- All mode and incomplete pools --------------------------------------------------------


def gpu_node(node: str, *, slice_count: int = 1) -> dict[str, Any]:
    return resource_slice(f"{node}-0", [device(f"{node}-gpu-0")], node=node, slice_count=slice_count)


ALL_GPUS = claim("all", [exactly("gpus", mode="All")])


def test_all_mode_on_a_node_with_an_incomplete_pool_is_a_warning_and_the_allocator_agrees() -> None:
    slices = [gpu_node("a", slice_count=2)]
    [finding] = placement(ClusterObjects(device_classes=[GPU], slices=slices, claims=[ALL_GPUS]))
    assert (finding.code, finding.where) == ("all-mode-incomplete-pool", "request gpus")
    assert "resource pool gpu.draplugin.dev/a is currently being updated (node a)" in finding.message
    outcome = allocate([ALL_GPUS], device_classes=[GPU], slices=slices, node=Node("a"))
    assert outcome.failure is not None and outcome.failure.error
    assert "is currently being updated" in outcome.failure.message


def test_an_incomplete_pool_on_another_node_blocks_all_mode_too() -> None:
    # Node b could give the claim every GPU, but the scheduler's error on node a fails the pod.
    slices = [gpu_node("a", slice_count=2), gpu_node("b")]
    found = placement(ClusterObjects(device_classes=[GPU], slices=slices, claims=[ALL_GPUS]))
    assert [f.code for f in found] == ["all-mode-incomplete-pool"]
    assert "(node a)" in found[0].message


def test_an_incomplete_pool_of_another_driver_blocks_all_mode() -> None:
    other = resource_slice("nic", [device("nic-0")], node="a", driver="nic.example.com", slice_count=2)
    found = placement(ClusterObjects(device_classes=[GPU], slices=[gpu_node("a"), other], claims=[ALL_GPUS]))
    assert [f.code for f in found] == ["all-mode-incomplete-pool"]


@pytest.mark.parametrize(
    ("slices", "claims"),
    [
        ([gpu_node("a")], [ALL_GPUS]),  # complete pool
        ([gpu_node("a", slice_count=2)], [claim("one", [exactly("gpu")])]),  # ExactCount skips the pool
    ],
)
def test_no_all_mode_warning(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> None:
    assert only_codes(ClusterObjects(device_classes=[GPU], slices=slices, claims=claims)) == []


def test_all_mode_is_judged_on_the_nodes_the_pod_can_run_on() -> None:
    # With Node objects and a pod pinned to node b, node a's incomplete pool is never filtered.
    slices = [gpu_node("a", slice_count=2), gpu_node("b")]
    pinned = pod("p", "all", node_selector={"zone": "b"})
    objects = ClusterObjects(
        device_classes=[GPU],
        slices=slices,
        claims=[ALL_GPUS],
        nodes=[node_object("a"), node_object("b")],
        pods=[pinned],
    )
    assert only_codes(objects) == []
    objects.pods = [pod("p", "all")]
    assert only_codes(objects) == ["all-mode-incomplete-pool"]


# ----- devices on no node the pod could run on ------------------------------------------------


def node_object(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name, "labels": {"zone": name}}}


def pod(
    name: str,
    claim_name: str | None = None,
    *,
    template: str | None = None,
    node_selector: dict[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    entry: dict[str, str] = {"name": "gpu"}
    if template:
        entry["resourceClaimTemplateName"] = template
    else:
        entry["resourceClaimName"] = str(claim_name)
    spec: dict[str, Any] = {"containers": [{"name": "app"}], "resourceClaims": [entry]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def template(name: str, requests: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": claim(name, requests)["spec"]},
    }


TWO_NODES = [
    resource_slice("a-0", [device("a-gpu", {"model": "H100", "type": "gpu"})], node="a"),
    resource_slice(
        "b-0", [device("b-gpu", {"model": "A100", "type": "gpu"}), device("b-mig", {"type": "mig"})], node="b"
    ),
]
MIG = device_class("mig", [f'device.attributes["{D}"].type == "mig"'])
H100 = f'device.attributes["{D}"].model == "H100"'


def scene(requests: Sequence[dict[str, Any]], **pod_fields: Any) -> ClusterObjects:
    return ClusterObjects(
        device_classes=[GPU, MIG],
        slices=TWO_NODES,
        claim_templates=[template("t", requests)],
        nodes=[node_object("a"), node_object("b")],
        pods=[pod("p", template="t", **pod_fields)],
    )


def test_a_class_with_devices_only_on_other_nodes_is_a_warning() -> None:
    [finding] = placement(scene([exactly("gpu", "mig")], node_selector={"zone": "a"}))
    assert (finding.code, finding.object, finding.where) == (
        "no-device-on-pod-nodes",
        "ResourceClaimTemplate/default/t",
        "request gpu, pod default/p",
    )
    assert "the pod can run only on node a (nodeSelector zone=a)" in finding.message
    assert "class mig selects devices only on node b" in finding.message


def test_request_selectors_that_leave_only_other_nodes_devices_are_a_warning() -> None:
    [finding] = placement(scene([exactly("gpu", "gpu", selectors=[H100])], node_selector={"zone": "b"}))
    assert finding.code == "no-device-on-pod-nodes"
    assert (
        "class gpu has devices there, but the request's selectors match only devices on node a"
        in finding.message
    )


def test_a_pod_whose_nodes_have_the_devices_is_clean() -> None:
    assert only_codes(scene([exactly("gpu", "mig")], node_selector={"zone": "b"})) == []
    assert only_codes(scene([exactly("gpu", "gpu", selectors=[H100])], node_selector={"zone": "a"})) == []
    assert only_codes(scene([exactly("gpu", "mig")])) == []  # no node constraints at all


def test_node_name_is_judged_without_node_objects() -> None:
    objects = scene([exactly("gpu", "mig")], node_name="a")
    objects.nodes = []
    assert only_codes(objects) == ["no-device-on-pod-nodes"]


def test_label_constraints_without_node_objects_raise_nothing() -> None:
    # Nodes known only from slices have no labels: the objects given cannot say where the pod runs.
    objects = scene([exactly("gpu", "mig")], node_selector={"zone": "a"})
    objects.nodes = []
    assert only_codes(objects) == []


def test_a_first_available_request_with_one_usable_subrequest_is_clean() -> None:
    fallback = first_available("gpu", exactly("mig", "mig"), exactly("whole", "gpu"))
    assert only_codes(scene([fallback], node_selector={"zone": "a"})) == []
    a100 = f'device.attributes["{D}"].model == "A100"'
    stuck = first_available("gpu", exactly("mig", "mig"), exactly("a100", "gpu", selectors=[a100]))
    [finding] = placement(scene([stuck], node_selector={"zone": "a"}))
    assert finding.where == "request gpu, pod default/p"
    assert "subrequest mig: class mig selects devices only on node b" in finding.message
    assert "subrequest a100: class gpu has devices there" in finding.message


def test_a_standalone_claim_of_a_pinned_pod_is_judged_under_its_own_name() -> None:
    objects = ClusterObjects(
        device_classes=[GPU, MIG],
        slices=TWO_NODES,
        claims=[claim("shared", [exactly("gpu", "mig")])],
        nodes=[node_object("a"), node_object("b")],
        pods=[pod("p", "shared", node_selector={"zone": "a"})],
    )
    assert [(f.object, f.code) for f in placement(objects)] == [
        ("ResourceClaim/default/shared", "no-device-on-pod-nodes")
    ]
