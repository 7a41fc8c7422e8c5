"""simulate with pods: claims generated from templates, existing claims used once, node constraints."""

from __future__ import annotations

from typing import Any

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    resource_slice,
    with_allocation,
)
from controller.objects import ClusterObjects
from controller.options import build_allocator, cluster_nodes
from controller.scheduler.podclaims import POD_CLAIM_NAME_ANNOTATION, resolve_pods
from controller.simulate.command import ClaimResult, simulate

D = "gpu.draplugin.dev"


def template(name: str, requests: list[dict[str, Any]], namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"metadata": {"labels": {"team": "ml"}}, "spec": {"devices": {"requests": requests}}},
    }


def pod(name: str, *entries: dict[str, str], uid: str = "", **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "default"}
    if uid:
        meta["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"resourceClaims": list(entries), **spec},
    }


def from_template(pod_claim: str, template_name: str) -> dict[str, str]:
    return {"name": pod_claim, "resourceClaimTemplateName": template_name}


def standalone(pod_claim: str, claim_name: str) -> dict[str, str]:
    return {"name": pod_claim, "resourceClaimName": claim_name}


def cluster(**kinds: list[dict[str, Any]]) -> ClusterObjects:
    objects = ClusterObjects(
        device_classes=[device_class("gpu")],
        slices=[
            resource_slice("a", [device("gpu-0"), device("gpu-1")], node="node-a"),
            resource_slice("b", [device("gpu-0")], node="node-b"),
        ],
    )
    for attribute, items in kinds.items():
        setattr(objects, attribute, items)
    return objects


def run(objects: ClusterObjects) -> list[ClaimResult]:
    allocator = build_allocator(objects)
    return simulate(objects, allocator, cluster_nodes(objects, allocator))


def summary(results: list[ClaimResult]) -> list[tuple[str, str | None, bool, str | None]]:
    return [(r.name, r.pod, r.allocated, r.node_name) for r in results]


def test_generated_claim_is_made_like_the_controller_would() -> None:
    objects = cluster(
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("gpu", "one"), uid="uid-p")],
    )
    [resolved] = resolve_pods(objects.pods, objects.claims, objects.claim_templates)
    [entry] = resolved.claims
    assert (entry.claim_name, entry.generated, entry.template) == ("p-gpu", True, "one")
    assert entry.claim is not None
    meta = entry.claim["metadata"]
    assert meta["annotations"] == {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    assert meta["labels"] == {"team": "ml"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "p",
            "uid": "uid-p",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert entry.claim["spec"] == {"devices": {"requests": [exactly("gpu")]}}


def test_each_pod_gets_its_own_claim_and_pods_fill_nodes_in_order() -> None:
    objects = cluster(
        claim_templates=[template("two", [exactly("gpu", count=2)]), template("one", [exactly("gpu")])],
        pods=[
            pod("big", from_template("gpus", "two")),
            pod("small", from_template("gpu", "one")),
            pod("again", from_template("gpus", "two")),
        ],
    )
    assert summary(run(objects)) == [
        ("big-gpus", "big", True, "node-a"),
        ("small-gpu", "small", True, "node-b"),
        ("again-gpus", "again", False, None),
    ]


def test_pod_claims_are_allocated_together_on_one_node() -> None:
    # Alone each fits node-a or node-b; together only node-a has two free GPUs.
    objects = cluster(
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("x", "one"), from_template("y", "one"), nodeName="node-b")],
    )
    results = run(objects)
    assert [r.allocated for r in results] == [False, False]
    assert "do not fit together on one node" in (results[0].reason or "")
    objects.pods[0]["spec"].pop("nodeName")
    assert summary(run(objects)) == [("p-x", "p", True, "node-a"), ("p-y", "p", True, "node-a")]


def test_node_name_and_node_selector_constrain_the_node() -> None:
    nodes = [
        {"kind": "Node", "metadata": {"name": "node-a", "labels": {"zone": "east"}}},
        {"kind": "Node", "metadata": {"name": "node-b", "labels": {"zone": "west"}}},
    ]
    objects = cluster(
        nodes=nodes,
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[
            pod("by-name", from_template("gpu", "one"), nodeName="node-b"),
            pod("by-label", from_template("gpu", "one"), nodeSelector={"zone": "west"}),
            pod("by-affinity", from_template("gpu", "one"), affinity={"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["east"]}]}
                ]}
            }}),
        ],
    )  # fmt: skip
    results = run(objects)
    assert summary(results) == [
        ("by-name-gpu", "by-name", True, "node-b"),
        ("by-label-gpu", "by-label", False, None),
        ("by-affinity-gpu", "by-affinity", True, "node-a"),
    ]
    assert "in use removed 1" in (results[1].reason or "")


def test_node_selector_without_node_objects_says_labels_are_unknown() -> None:
    objects = cluster(
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("gpu", "one"), nodeSelector={"zone": "west"})],
    )
    [result] = run(objects)
    assert not result.allocated
    assert "none of 2 node(s) matches nodeSelector zone=west" in (result.reason or "")
    assert "add Node manifests" in (result.reason or "")


def test_existing_generated_claim_is_used_not_generated_again() -> None:
    # In a cluster the controller already made the claim (controlled by the pod, which the scheduler
    # checks) and recorded it in the pod's status.
    made = claim("p-gpu-x7k2p", [exactly("gpu")])
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}
    ]
    p = pod("p", from_template("gpu", "one"), uid="uid-p")
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7k2p"}]}
    objects = cluster(claims=[made], claim_templates=[template("one", [exactly("gpu")])], pods=[p])
    assert summary(run(objects)) == [("p-gpu-x7k2p", "p", True, "node-a")]


def test_claim_owned_by_the_pod_but_not_yet_recorded_is_adopted() -> None:
    made = claim("p-gpu-abcde", [exactly("gpu")])
    made["metadata"]["annotations"] = {POD_CLAIM_NAME_ANNOTATION: "gpu"}
    made["metadata"]["ownerReferences"] = [{"kind": "Pod", "name": "p", "uid": "uid-p", "controller": True}]
    objects = cluster(
        claims=[made],
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("gpu", "one"), uid="uid-p")],
    )
    assert summary(run(objects)) == [("p-gpu-abcde", "p", True, "node-a")]


def test_allocated_claims_are_not_counted_twice_and_pin_the_pod() -> None:
    # The pod's generated claim is allocated on node-b (the only GPU there): nothing is pending,
    # and a second pod sharing a claim allocated on node-b must go there too.
    allocation = {
        "devices": {"results": [{"request": "gpu", "driver": D, "pool": "node-b", "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}
        ]}]},
    }  # fmt: skip
    done = with_allocation(claim("p-gpu-1", [exactly("gpu")]), allocation)
    # Controlled by the pod whose status records it, as the scheduler checks.
    done["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "controller": True}
    ]
    first = pod("p", from_template("gpu", "one"))
    first["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-1"}]}
    second = pod("q", standalone("shared", "p-gpu-1"), from_template("more", "one"))
    objects = cluster(
        claims=[done], claim_templates=[template("one", [exactly("gpu")])], pods=[first, second]
    )
    [result] = run(objects)
    assert (result.name, result.allocated) == ("q-more", False)
    assert "in use removed 1" in (result.reason or "")


def test_standalone_claim_shared_by_two_pods_is_allocated_once() -> None:
    shared = claim("shared", [exactly("gpu")])
    objects = cluster(
        claims=[shared],
        pods=[pod("p", standalone("gpu", "shared")), pod("q", standalone("gpu", "shared"))],
    )
    assert summary(run(objects)) == [("shared", "p", True, "node-a")]


def test_missing_template_or_claim_is_reported_and_the_pod_waits() -> None:
    objects = cluster(
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("gpu", "one"), from_template("x", "absent"), standalone("y", "gone"))],
    )
    results = run(objects)
    assert [(r.name, r.allocated) for r in results] == [("p-x", False), ("gone", False), ("p-gpu", False)]
    assert results[0].reason == "resource claim template default/absent not found"
    assert results[1].reason == "resource claim default/gone not found"
    assert (results[2].reason or "").startswith("pod default/p waits for: resource claim template")


def test_finished_pods_and_claims_the_controller_said_are_not_needed_are_skipped() -> None:
    done = pod("done", from_template("gpu", "one"))
    done["status"] = {"phase": "Succeeded"}
    unneeded = pod("unneeded", from_template("gpu", "one"))
    unneeded["status"] = {"resourceClaimStatuses": [{"name": "gpu"}]}
    objects = cluster(claim_templates=[template("one", [exactly("gpu")])], pods=[done, unneeded])
    assert run(objects) == []


def test_generated_names_stay_unique() -> None:
    taken = claim("p-gpu", [exactly("gpu")])
    objects = cluster(
        claims=[taken],
        claim_templates=[template("one", [exactly("gpu")])],
        pods=[pod("p", from_template("gpu", "one"))],
    )
    assert [r.name for r in run(objects)] == ["p-gpu", "p-gpu-2"]


def test_preallocate_true_means_any_node() -> None:
    pinned = claim("c", [exactly("gpu")], annotations={"gpu.draplugin.dev/preallocate": "true"})
    objects = cluster(claims=[pinned], pods=[pod("p", standalone("gpu", "c"))])
    assert summary(run(objects)) == [("c", None, True, "node-a")]
