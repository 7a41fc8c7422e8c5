"""The real kube-scheduler and `dra-controller simulate` agree that a Filter error on one node
fails the pod's whole scheduling attempt.

Two fake nodes: node A publishes a complete pool, node B's pool says it has two slices but
only one exists (still being published). A claim asks for all matching devices
(allocationMode All), which node A alone could satisfy. kube-scheduler's DynamicResources
Filter errs on node B ("asks for all devices, but resource pool ... is currently being
updated"), and the pod stays unscheduled with SchedulerError; simulate on the same objects
must say the same, naming node B. Completing node B's pool then lets the scheduler bind the
pod, which shows the error was the only obstacle.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from controller.allocation.builders import claim, device, exactly, resource_slice
from controller.cli import main
from controller.objects import RESOURCE_API
from controller.scheduler.nodefilter import FILTER_ERROR_PREFIX
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.integration.release import cluster_version

pytestmark = pytest.mark.cluster

INCOMPLETE = "is currently being updated"


def pod(name: str, claim_name: str, node_selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": node_selector,
            "automountServiceAccountToken": False,
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim_name}],
            "containers": [{
                "name": "main",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"claims": [{"name": "gpus"}]},
            }],
        },
    }  # fmt: skip


def create_slice(rest: KubeApi, slice_obj: dict[str, Any], labels: dict[str, str]) -> None:
    slice_obj["metadata"]["labels"] = labels  # for the clean-up
    rest.create(f"{RESOURCE_API}/resourceslices", slice_obj)


def scheduler_error(rest: KubeApi, path: str) -> dict[str, Any] | None:
    """The pod's PodScheduled condition once the scheduler has reported an error."""
    pod_obj = rest.get(path)
    for condition in (pod_obj.get("status") or {}).get("conditions") or []:
        if condition["type"] == "PodScheduled" and condition.get("reason") == "SchedulerError":
            return dict(condition)
    return None


def test_scheduler_and_simulate_agree_an_incomplete_pool_on_another_node_fails_all_mode(
    kube_cluster: ControlPlane,
    fake_node: Callable[..., str],
    test_namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tag = uuid.uuid4().hex[:8]
    # Our own driver and class: no other test's devices or claims reach these nodes.
    driver = f"err-{tag}.draplugin.dev"
    label = {"draplugin.dev/test": tag}
    node_a, node_b = fake_node(f"err-a-{tag}", label), fake_node(f"err-b-{tag}", label)
    class_name = f"err-{tag}"
    claim_name = "all-gpus"
    ns = f"/api/v1/namespaces/{test_namespace}"
    resource_ns = f"{RESOURCE_API}/namespaces/{test_namespace}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        rest.create(f"{RESOURCE_API}/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": class_name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        })  # fmt: skip
        # Node B's slice first: kube-scheduler's slice informer delivers them in this order, so
        # any attempt that sees node A's devices sees node B's incomplete pool too (the other way
        # round, a loaded scheduler could place the pod on node A before it heard of node B's).
        slices = [
            # One of two slices: the pool is incomplete.
            resource_slice(f"{node_b}-0", [device("gpu-0")], node=node_b, driver=driver, slice_count=2),
            resource_slice(f"{node_a}-0", [device("gpu-0"), device("gpu-1")], node=node_a, driver=driver),
        ]
        try:
            for slice_obj in slices:
                create_slice(rest, slice_obj, label)
            all_mode = claim(claim_name, [exactly("gpus", class_name, mode="All")], namespace=test_namespace)
            rest.create(f"{resource_ns}/resourceclaims", all_mode)
            rest.create(f"{ns}/pods", pod("all-gpus-user", claim_name, label))

            condition = wait_for(
                "kube-scheduler to report a scheduling error",
                lambda: scheduler_error(rest, f"{ns}/pods/all-gpus-user"),
                60,
            )
            scheduled = rest.get(f"{ns}/pods/all-gpus-user")
            assert not scheduled["spec"].get("nodeName")
            assert condition["status"] == "False"
            assert FILTER_ERROR_PREFIX in condition["message"]
            assert INCOMPLETE in condition["message"] and f"{driver}/{node_b}" in condition["message"]

            def failed_scheduling() -> list[str]:
                return [
                    e["message"]
                    for e in rest.get(f"{ns}/events")["items"]
                    if e.get("reason") == "FailedScheduling"
                    and e["involvedObject"]["name"] == "all-gpus-user"
                ]

            # The scheduler's event broadcaster writes Events after the status patch, on its own.
            try:
                wait_for(
                    "a FailedScheduling event naming the incomplete pool",
                    lambda: any(INCOMPLETE in message for message in failed_scheduling()),
                    30,
                )
            except AssertionError as err:
                raise AssertionError(f"{err}; FailedScheduling events: {failed_scheduling()}") from None
            assert not (rest.get(f"{resource_ns}/resourceclaims/{claim_name}").get("status") or {}).get(
                "allocation"
            )

            # simulate on the same objects (read from the cluster, with this cluster's rules; this
            # namespace only, so claims of other tests still being deleted stay out of its answer).
            major, minor = cluster_version(kube_cluster)
            rc = main([
                "simulate", "--kubeconfig", str(kube_cluster.kubeconfig),
                "--kubernetes-version", f"{major}.{minor}", "-n", test_namespace, "-o", "json",
            ])  # fmt: skip
            results = json.loads(capsys.readouterr().out)["claims"]
            [ours] = [r for r in results if (r["namespace"], r["name"]) == (test_namespace, claim_name)]
            assert rc == 1
            assert ours["allocated"] is False and ours["pod"] == "all-gpus-user"
            assert f"on node {node_b}" in ours["reason"]
            # The scheduler's own message ends ours.
            scheduler_message = condition["message"].split(FILTER_ERROR_PREFIX, 1)[1]
            assert ours["reason"].endswith(FILTER_ERROR_PREFIX + scheduler_message), (
                ours["reason"],
                condition["message"],
            )

            # Node B's pool becomes complete (one slice of one; not a second slice: kube-scheduler
            # 1.34.4 with DRAConsumableCapacity panics on All mode over a two-slice pool): now the
            # scheduler places the pod, so the error was all that kept it off node A.
            rest.merge_patch(
                f"{RESOURCE_API}/resourceslices/{node_b}-0", {"spec": {"pool": {"resourceSliceCount": 1}}}
            )

            def bound() -> str | None:
                node_name = rest.get(f"{ns}/pods/all-gpus-user")["spec"].get("nodeName")
                return str(node_name) if node_name else None

            try:
                placed = wait_for("the pod to be scheduled once the pool is complete", bound, 60)
            except AssertionError as err:
                status = rest.get(f"{ns}/pods/all-gpus-user").get("status")
                raise AssertionError(f"{err}; pod status: {status}") from None
            assert placed in (node_a, node_b)
        finally:
            # The namespace (pod, claim) and the nodes go with their fixtures.
            rest.delete(
                f"{RESOURCE_API}/resourceslices", query={"labelSelector": f"draplugin.dev/test={tag}"}
            )
            rest.delete(f"{RESOURCE_API}/deviceclasses/{class_name}")
