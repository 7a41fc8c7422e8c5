"""lint's untolerated-node-taint: a DeviceClass whose devices are all on nodes with taints the pods
using it do not tolerate. Each case that must warn has neighbours that must not."""

from __future__ import annotations

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
from controller.lint.linter import Finding, lint
from controller.objects import ClusterObjects
from controller.options import build_allocator

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_CLASS = device_class("gpu", ['device.attributes["gpu.draplugin.dev"].type == "gpu"'])
MIG_CLASS = device_class("mig", ['device.attributes["gpu.draplugin.dev"].type == "mig"'])
SLICES = [
    resource_slice("gpu-node-0", [device("gpu-0", {"type": "gpu"})], node="gpu-node"),
    resource_slice("mig-node-0", [device("mig-0", {"type": "mig"})], node="mig-node"),
]


def node(name: str, *taints: dict[str, str]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name}, "spec": {"taints": list(taints)}}


def pod(
    name: str,
    *,
    claim_name: str | None = None,
    template: str | None = None,
    tolerations: list[dict[str, str]] | None = None,
    limits: dict[str, str] | None = None,
    node_name: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "app", "resources": {"limits": limits or {}}}]}
    if claim_name or template:
        entry = {"name": "gpu", **({"resourceClaimTemplateName": template} if template else {})}
        if claim_name:
            entry["resourceClaimName"] = claim_name
        spec["resourceClaims"] = [entry]
    if tolerations:
        spec["tolerations"] = tolerations
    if node_name:
        spec["nodeName"] = node_name
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def node_taint_findings(objects: ClusterObjects, **kw: Any) -> list[Finding]:
    found = lint(objects, build_allocator(objects), **kw).findings
    return [f for f in found if f.code == "untolerated-node-taint"]


def objects_with(
    pods: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    claims: list[dict[str, Any]] | None = None,
    **kw: Any,
) -> ClusterObjects:
    return ClusterObjects(
        device_classes=[GPU_CLASS, MIG_CLASS],
        slices=SLICES,
        claims=claims if claims is not None else [claim("c", [exactly("gpu")])],
        nodes=nodes,
        pods=pods,
        **kw,
    )


def test_a_claim_pod_without_the_gpu_nodes_toleration_is_warned_on_the_class() -> None:
    objects = objects_with([pod("trainer", claim_name="c")], [node("gpu-node", GPU_TAINT), node("mig-node")])
    [finding] = node_taint_findings(objects)
    assert (finding.severity, finding.object, finding.where) == (
        "warning",
        "DeviceClass/gpu",
        "pod default/trainer, claim c",
    )
    assert (
        "only on nodes whose taints the pod does not tolerate: gpu-node (nvidia.com/gpu=present:NoSchedule)"
        in (finding.message)
    )
    assert "ExtendedResourceToleration" in finding.message


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"},
        {"operator": "Exists"},  # tolerates everything
    ],
)
def test_a_matching_toleration_silences_it(toleration: dict[str, str]) -> None:
    objects = objects_with(
        [pod("trainer", claim_name="c", tolerations=[toleration])], [node("gpu-node", GPU_TAINT)]
    )
    assert node_taint_findings(objects) == []


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"},
        {"key": "example.com/other", "operator": "Exists"},
    ],
)
def test_a_toleration_for_something_else_does_not(toleration: dict[str, str]) -> None:
    objects = objects_with(
        [pod("trainer", claim_name="c", tolerations=[toleration])], [node("gpu-node", GPU_TAINT)]
    )
    assert [f.object for f in node_taint_findings(objects)] == ["DeviceClass/gpu"]


def test_one_untainted_node_with_a_device_is_enough() -> None:
    slices = [*SLICES, resource_slice("spare-0", [device("gpu-9", {"type": "gpu"})], node="spare")]
    objects = objects_with([pod("trainer", claim_name="c")], [node("gpu-node", GPU_TAINT), node("spare")])
    objects.slices = slices
    assert node_taint_findings(objects) == []


@pytest.mark.parametrize(
    "taint",
    [
        {"key": "nvidia.com/gpu", "effect": "PreferNoSchedule"},  # does not keep pods away
        {"key": "nvidia.com/gpu", "effect": "NoExecute"},
    ],
)
def test_only_scheduling_effects_count(taint: dict[str, str]) -> None:
    objects = objects_with([pod("trainer", claim_name="c")], [node("gpu-node", taint)])
    expected = ["DeviceClass/gpu"] if taint["effect"] == "NoExecute" else []
    assert [f.object for f in node_taint_findings(objects)] == expected


def test_templates_count_and_the_other_class_is_not_blamed() -> None:
    template = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig-t", "namespace": "default"},
        "spec": {"spec": claim("mig-t", [exactly("mig", "mig")])["spec"]},
    }
    objects = objects_with(
        [pod("inference", template="mig-t")],
        [
            node("gpu-node", GPU_TAINT),
            node("mig-node", {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}),
        ],
        claims=[],
        claim_templates=[template],
    )
    [finding] = node_taint_findings(objects)
    assert finding.object == "DeviceClass/mig" and "mig-node (dedicated=ml:NoSchedule)" in finding.message


def test_first_available_warns_only_when_no_subrequest_has_an_open_node() -> None:
    request = first_available("gpu", exactly("whole", "gpu"), exactly("part", "mig"))
    open_mig = objects_with(
        [pod("p", claim_name="c")],
        [node("gpu-node", GPU_TAINT), node("mig-node")],
        claims=[claim("c", [request])],
    )
    assert node_taint_findings(open_mig) == []
    both_closed = objects_with(
        [pod("p", claim_name="c")],
        [node("gpu-node", GPU_TAINT), node("mig-node", GPU_TAINT)],
        claims=[claim("c", [request])],
    )
    assert sorted(f.object for f in node_taint_findings(both_closed)) == [
        "DeviceClass/gpu",
        "DeviceClass/mig",
    ]


def test_bound_pods_allocated_claims_and_missing_node_objects_are_not_judged() -> None:
    bound = objects_with([pod("p", claim_name="c", node_name="gpu-node")], [node("gpu-node", GPU_TAINT)])
    assert node_taint_findings(bound) == []
    allocated = with_allocation(
        claim("c", [exactly("gpu")]),
        {"devices": {"results": [{"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "gpu-node",
                                  "device": "gpu-0"}]}},
    )  # fmt: skip
    assert (
        node_taint_findings(
            objects_with([pod("p", claim_name="c")], [node("gpu-node", GPU_TAINT)], [allocated])
        )
        == []
    )
    no_nodes = objects_with([pod("p", claim_name="c")], [])
    assert node_taint_findings(no_nodes) == []  # no Node objects: no taints known


def test_extended_resource_pods_get_the_admission_toleration_only_for_the_taint_of_their_resource() -> None:
    mapped = device_class("gpu", ['device.attributes["gpu.draplugin.dev"].type == "gpu"'])
    mapped["spec"]["extendedResourceName"] = "nvidia.com/gpu"
    unmodified = pod("legacy", limits={"nvidia.com/gpu": "1"})
    objects = ClusterObjects(
        device_classes=[mapped, MIG_CLASS],
        slices=SLICES,
        nodes=[node("gpu-node", GPU_TAINT)],
        pods=[unmodified],
    )
    # ExtendedResourceToleration tolerates nvidia.com/gpu for a pod that asks for it.
    assert node_taint_findings(objects) == []
    objects.nodes = [node("gpu-node", GPU_TAINT, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"})]
    [finding] = node_taint_findings(objects)
    assert (
        "gpu-node (dedicated=ml:NoSchedule)" in finding.message
        and "nvidia.com/gpu=present" not in finding.message
    )
    # Without the DRAExtendedResource gate the pod has no claim here: the device plugin serves it.
    assert node_taint_findings(objects, extended_resources=False) == []
