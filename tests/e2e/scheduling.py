"""What the scheduler and our controller say about a pod: its PodScheduled reason, its claims'
allocations, and `dra-controller explain` on the live cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi

RESOURCE = "/apis/resource.k8s.io/v1"
DRA_CONTROLLER = Path(sys.executable).parent / "dra-controller"


def wait_unschedulable(api: KubeApi, namespace: str, name: str, timeout_s: float) -> str:
    """The scheduler's PodScheduled=False message, once it has tried the pod and given up."""

    def unschedulable() -> str | None:
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        for condition in pod["status"].get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition["status"] == "False":
                message: str = condition.get("message", "")
                return message or None
        return None

    message: str = wait_for(f"the scheduler to report {name} unschedulable", unschedulable, timeout_s)
    return message


def claim(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}")
    return found


def pod_claim_names(pod: dict[str, Any]) -> dict[str, str]:
    """The pod's ResourceClaim names by pod claim name (templates: the generated claim)."""
    generated = {
        s["name"]: s.get("resourceClaimName") for s in pod["status"].get("resourceClaimStatuses") or []
    }
    out: dict[str, str] = {}
    for ref in pod["spec"].get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref["name"])
        assert name, f"pod {pod['metadata']['name']}: claim {ref['name']} has no ResourceClaim yet"
        out[ref["name"]] = name
    return out


def allocated_devices(found: dict[str, Any], driver: str) -> list[str]:
    """The names of the claim's allocated devices, all of `driver`, in result order."""
    allocation = found["status"].get("allocation")
    assert allocation, f"claim {found['metadata']['name']} is not allocated"
    results: list[dict[str, Any]] = allocation["devices"]["results"]
    assert {r["driver"] for r in results} == {driver}, results
    return [r["device"] for r in results]


def explain(kube_cluster: ControlPlane, namespace: str, what: str) -> dict[str, Any]:
    """`dra-controller explain WHAT -o json` against the live cluster, for the cluster's release and
    the feature gates its components run with (on 1.34 the cluster switches alpha DRA gates on)."""
    release = ".".join(kube_cluster.kubernetes_version.removeprefix("v").split(".")[:2])
    gates = kube_cluster.dra.feature_gates
    done = subprocess.run(
        [
            str(DRA_CONTROLLER),
            *("explain", what, "-n", namespace, "-o", "json"),
            *("--kubeconfig", str(kube_cluster.kubeconfig), "--kubernetes-version", release),
            *(("--feature-gates", gates) if gates else ()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.stdout, f"explain {what} printed nothing (exit {done.returncode}): {done.stderr}"
    found: dict[str, Any] = json.loads(done.stdout)
    return found
