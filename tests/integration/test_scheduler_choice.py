"""The real kube-scheduler and kube-controller-manager against `simulate` / `explain` on what DRA
decides beyond one node's Filter: which of several fitting nodes a pod goes to, and how a claim
made from a template is named.

Node choice: two fake nodes; node A has small GPUs, node B big ones. Each pod's claim asks for a
big GPU first and any GPU second (`firstAvailable`). From 1.35 on the DynamicResources Score
prefers the node where the better-ranked subrequest fits, so every pod lands on node B (a random
pick would put each on A half the time: four pods on B by chance is 1 in 16); 1.34 has no DRA
score, and simulate says that either node may be chosen.

Names: a pod and a claim entry whose names exceed kube-controller-manager's 57-character
generateName limit; the controller's claim must be named as `claim_generate_name` predicts, and
`explain pod/NAME` must find it through the pod's status.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from controller.allocation.builders import device, device_class, first_available, resource_slice
from controller.allocation.builders import exactly as exact_request
from controller.allocation.nodes import Node
from controller.cli import main
from controller.objects import RESOURCE_API, ClusterObjects
from controller.options import build_allocator
from controller.scheduler.podclaims import claim_generate_name, is_generated_name
from controller.simulate.command import simulate
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.integration.release import cluster_version

pytestmark = pytest.mark.cluster

PODS = 4


def pod(name: str, entry: dict[str, str], node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "automountServiceAccountToken": False,
            "resourceClaims": [entry],
            "containers": [{
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": entry["name"]}]},
            }],
        },
    }  # fmt: skip


def node_of(rest: KubeApi, path: str) -> str | None:
    node_name = rest.get(path)["spec"].get("nodeName")
    return str(node_name) if node_name else None


def test_prioritized_list_node_choice_matches_the_scheduler(
    kube_cluster: ControlPlane, fake_node: Callable[..., str], test_namespace: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    driver = f"score-{tag}.draplugin.dev"
    label = {"draplugin.dev/test": tag}
    node_a, node_b = fake_node(f"score-a-{tag}", label), fake_node(f"score-b-{tag}", label)
    gpus = device_class(f"score-{tag}", [f'device.driver == "{driver}"'])
    big = f'device.attributes["{driver}"].model == "big"'
    slices = [
        resource_slice(f"{node_a}-0", [device(f"gpu-{i}", {"model": "small"}) for i in range(PODS)],
                       node=node_a, driver=driver),
        resource_slice(f"{node_b}-0", [device(f"gpu-{i}", {"model": "big"}) for i in range(PODS)],
                       node=node_b, driver=driver),
    ]  # fmt: skip
    for s in slices:
        s["metadata"]["labels"] = label
    claims = []
    for i in range(PODS):
        request = first_available(
            "gpu", exact_request("big", gpus["metadata"]["name"], selectors=[big]),
            exact_request("any", gpus["metadata"]["name"]),
        )  # fmt: skip
        claims.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"pick-{i}", "namespace": test_namespace},
            "spec": {"devices": {"requests": [request]}},
        })  # fmt: skip
    pods = [pod(f"pick-{i}", {"name": "gpu", "resourceClaimName": f"pick-{i}"}, label) for i in range(PODS)]
    for p in pods:
        p["metadata"]["namespace"] = test_namespace

    release = cluster_version(kube_cluster)
    offline = ClusterObjects(device_classes=[gpus], slices=slices, claims=claims, pods=pods)
    allocator = build_allocator(offline, release)
    predicted = simulate(offline, allocator, [Node(node_a, label), Node(node_b, label)])
    assert all(r.allocated for r in predicted), [r.reason for r in predicted]

    ns = f"/api/v1/namespaces/{test_namespace}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        rest.create(f"{RESOURCE_API}/deviceclasses", gpus)
        try:
            for s in slices:
                rest.create(f"{RESOURCE_API}/resourceslices", s)
            placed = []
            for c, p in zip(claims, pods, strict=True):
                rest.create(f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaims", c)
                rest.create(f"{ns}/pods", p)
                path = f"{ns}/pods/{p['metadata']['name']}"
                # One at a time, so that each pod is scored against what the earlier ones took.
                bound = functools.partial(node_of, rest, path)
                placed.append(wait_for(f"pod {p['metadata']['name']} to be bound", bound, 60))
        finally:
            rest.delete(
                f"{RESOURCE_API}/resourceslices", query={"labelSelector": f"draplugin.dev/test={tag}"}
            )
            rest.delete(f"{RESOURCE_API}/deviceclasses/{gpus['metadata']['name']}")

    if release[1] >= 35:
        assert placed == [node_b] * PODS
        assert [r.node_name for r in predicted] == [node_b] * PODS
        assert all(not r.possible_nodes for r in predicted)
    else:
        # No DRA score in 1.34: the scheduler's pick is random, and simulate says so.
        assert set(placed) <= {node_a, node_b}
        assert predicted[0].possible_nodes == [node_a, node_b]


def test_template_claim_names_match_the_controller_and_explain_finds_them(
    kube_cluster: ControlPlane, test_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tag = uuid.uuid4().hex[:8]
    pod_name = f"a-pod-with-a-rather-long-name-for-truncation-{tag}"  # 53 characters
    entry = "accelerator-claim-entry"  # 23: 53 + 23 + 2 = 78 > 57, so both get cut
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "tmpl"},
        "spec": {"spec": {"devices": {"requests": [exact_request("gpu", f"none-{tag}")]}}},
    }
    # A node selector no node has: the pod stays pending; the claim is made all the same.
    the_pod = pod(pod_name, {"name": entry, "resourceClaimTemplateName": "tmpl"}, {"draplugin.dev/none": tag})
    ns = f"/api/v1/namespaces/{test_namespace}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        rest.create(f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaimtemplates", template)
        rest.create(f"{ns}/pods", the_pod)

        def recorded() -> str | None:
            statuses = (rest.get(f"{ns}/pods/{pod_name}").get("status") or {}).get("resourceClaimStatuses")
            return str(statuses[0]["resourceClaimName"]) if statuses else None

        made = wait_for("kube-controller-manager to make the claim", recorded, 60)

    prefix = claim_generate_name(pod_name, entry)
    assert len(prefix) < len(f"{pod_name}-{entry}-")  # the cut happened
    assert is_generated_name(made, prefix), (made, prefix)

    rc = main([
        "explain", f"pod/{pod_name}", "-n", test_namespace,
        "--kubeconfig", str(kube_cluster.kubeconfig), "-o", "json",
    ])  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    [claim_data] = data["claims"]
    assert rc == 1  # its class does not exist
    assert (claim_data["claim"], claim_data["generatedFrom"]) == (f"{test_namespace}/{made}", None)
