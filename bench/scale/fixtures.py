"""The objects both sides of a scale row see: bench.fleet's nodes, slices, classes and claims,
plus one pod per claim (bench.fleet has no pods; kube-scheduler schedules pods, and simulate
then allocates each pod's claim as the scheduler would)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fleet import Format, unfittable_claim, whole_gpu_claims, write_fleet

JSON = dict[str, Any]
NAMESPACE = "default"
CLAIM_IN_POD = "gpu"
# Never pulled or run: no kubelet is behind the nodes, the scheduler only binds.
IMAGE = "registry.k8s.io/pause:3.10"
FORMATS: tuple[Format, ...] = ("yaml", "json")


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


@dataclass(frozen=True)
class Objects:
    """What one command reads, in one format: the fleet and one claims file."""

    paths: list[Path]
    files: int
    bytes: int
    devices: int


class FleetPair:
    """The fleet written once as YAML and once as JSON (bench.fleet), for every case at one size:
    each case adds a claims file of its own in both formats."""

    def __init__(self, root: Path, nodes: int, gpus: int) -> None:
        self.root, self.nodes, self.gpus = root, nodes, gpus
        self.fleets = {
            fmt: write_fleet(root / fmt, nodes=nodes, gpus_per_node=gpus, fmt=fmt) for fmt in FORMATS
        }

    def with_claims(self, name: str, documents: list[JSON], fmt: Format) -> Objects:
        fleet = self.fleets[fmt]
        # A fleet of no nodes is just the claims file (and a copy of the classes, not passed on).
        claims = write_fleet(self.root / name / fmt, nodes=0, fmt=fmt, claims=documents)
        if claims.claim_file is None:
            raise ValueError(f"case {name} has no claims")
        paths = [*fleet.paths, claims.claim_file]
        size = fleet.bytes + claims.claim_file.stat().st_size
        for path in paths:  # read once, untimed: every timed command finds them in the page cache
            path.read_bytes()
        return Objects(paths, len(paths), size, fleet.devices)

    def explain_case(self, fmt: Format) -> Objects:
        """The fleet and the one claim that fits nowhere (named "unfittable")."""
        return self.with_claims("unfittable", [unfittable_claim()], fmt)

    def simulate_case(self, claims: int, fmt: Format) -> Objects:
        """The fleet, `claims` pending claims and a pod for each."""
        made, pods = pending_workload(claims)
        return self.with_claims(f"pending-{claims}", [*made, *pods], fmt)
