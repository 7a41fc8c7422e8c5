"""The objects both sides of a scale row see: bench.fleet's nodes, slices, classes and claims,
plus one pod per claim (bench.fleet has no pods; kube-scheduler schedules pods, and simulate
then allocates each pod's claim as the scheduler would)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.fleet import FleetFiles, Format, unfittable_claim, whole_gpu_claims, write_fleet

JSON = dict[str, Any]
NAMESPACE = "default"
CLAIM_IN_POD = "gpu"
# Never pulled or run: no kubelet is behind the nodes, the scheduler only binds.
IMAGE = "registry.k8s.io/pause:3.10"


def pod_for(claim: JSON) -> JSON:
    """A pod that uses `claim` by name (no template: the claim exists already, as simulate reads it)."""
    name = claim["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"pod-{name}", "namespace": claim["metadata"].get("namespace", NAMESPACE)},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "main", "image": IMAGE, "resources": {"claims": [{"name": CLAIM_IN_POD}]}}
            ],
            "resourceClaims": [{"name": CLAIM_IN_POD, "resourceClaimName": name}],
        },
    }


def pending_workload(claims: int) -> tuple[list[JSON], list[JSON]]:
    """`claims` whole-GPU claims (by model and by memory, alternately) and one pod for each."""
    made = whole_gpu_claims(claims, by="mixed", namespace=NAMESPACE)
    return made, [pod_for(c) for c in made]


def explain_case(directory: Path, nodes: int, gpus: int, fmt: Format) -> FleetFiles:
    """The fleet and the one claim that fits nowhere (named "unfittable")."""
    return write_fleet(directory, nodes=nodes, gpus_per_node=gpus, fmt=fmt, claims=[unfittable_claim()])


def simulate_case(directory: Path, nodes: int, gpus: int, claims: int, fmt: Format) -> FleetFiles:
    """The fleet, `claims` pending claims and their pods, in one claims file."""
    made, pods = pending_workload(claims)
    return write_fleet(directory, nodes=nodes, gpus_per_node=gpus, fmt=fmt, claims=[*made, *pods])
