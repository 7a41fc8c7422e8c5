"""`python -m bench.allocate`: claims per second, our allocator against the real kube-scheduler.

1. Ours alone, 1,000 claims over 1,000 nodes x 8 GPUs (placement: node scan +
   allocation, no API writes).
2. At a scale two cores handle in a few minutes (default 200 nodes, 200 claims),
   in one run against the real control plane built by `tests.kube`:
   - kube-scheduler: pods, each with one claim from a ResourceClaimTemplate
     (same request mix), held by a scheduling gate until kube-controller-manager
     has created every claim; then the gates are lifted and the clock runs until
     every pod is bound. This is the scheduler's whole path: Filter over the
     nodes, allocation, the finalizer and status writes, binding.
   - ours, decisions only: the same claims through our allocator over the same
     number of nodes (as in 1.).
   - ours, end to end: the same claims as standalone claims annotated for
     pre-allocation, allocated by the controller's reconciler with its API
     writes (mark, then status) against the same API server, on a second set of
     identical nodes.
   Ratios are ours / kube-scheduler in claims per second (higher is better for us).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry

from bench.controlplane import start_control_plane
from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.allocation.nodes import Node
from controller.allocator import Allocator
from controller.commands_simulate import Simulator
from controller.metrics import ControllerMetrics
from controller.reconcile_api import KubeClaimApi
from controller.reconciler import Reconciler, ReconcilerSettings, Snapshot, preallocate_annotation
from devcluster.objects import create_fake_node
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi

D = "gpu.draplugin.dev"
GPUS = 8
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
# The request mix: (count, matchAttribute on NUMA node or not), as claim templates.
MIX = [(count, numa) for count in (1, 2, 4) for numa in (False, True)]


def node_name(prefix: str, n: int) -> str:
    return f"{prefix}-{n:04d}"


def gpu_slice(node: str) -> dict[str, Any]:
    return resource_slice(
        f"{node}-gpus",
        [device(f"gpu-{i}", {"model": "h100", "numa": i // 4, "index": i}) for i in range(GPUS)],
        node=node,
    )


def claim_spec(count: int, numa: bool) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [exactly("gpu", "gpu", count=count)]}
    if numa:
        devices["constraints"] = [{"matchAttribute": f"{D}/numa"}]
    return {"devices": devices}


def request_mix(count: int, seed: int = 1) -> list[tuple[int, bool]]:
    rng = random.Random(seed)
    return [MIX[rng.randrange(len(MIX))] for _ in range(count)]


def ours_alone(nodes: int, claims: int) -> tuple[float, int]:
    """Seconds to place `claims` claims over `nodes` nodes, and how many were placed."""
    slices = [gpu_slice(node_name("node", n)) for n in range(nodes)]
    specs = [
        {**claim(f"c{i}", []), "spec": claim_spec(count, numa)}
        for i, (count, numa) in enumerate(request_mix(claims))
    ]
    allocator = Allocator(device_classes=[device_class("gpu", [f'device.driver == "{D}"'])], slices=slices)
    start = time.perf_counter()
    results = Simulator(allocator, [Node(node_name("node", n)) for n in range(nodes)], explain=False).run(
        specs
    )
    return time.perf_counter() - start, sum(r.allocated for r in results)


def parallel(fn: Callable[[Any], Any], items: list[Any]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in pool.map(fn, items):
            pass


class ClusterBench:
    def __init__(self, api: Any, nodes: int, claims: int) -> None:
        self.rest = KubeApi(api)
        self.api = api
        self.nodes = nodes
        self.claims = claims
        self.mix = request_mix(claims)

    def setup(self) -> None:
        self.rest.create(f"{RESOURCE_V1}/deviceclasses", device_class("gpu", [f'device.driver == "{D}"']))
        for ns in ("bench-sched", "bench-ours"):
            self.rest.create(
                "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
            )
        for prefix in ("sched", "ours"):
            names = [node_name(prefix, n) for n in range(self.nodes)]
            labels = {"bench-set": prefix}
            parallel(lambda name: create_fake_node(self.api, name, labels), names)  # noqa: B023 (used at once)
            parallel(lambda name: self.rest.create(f"{RESOURCE_V1}/resourceslices", gpu_slice(name)), names)
        for i, (count, numa) in enumerate(MIX):
            self.rest.create(f"{RESOURCE_V1}/namespaces/bench-sched/resourceclaimtemplates", {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaimTemplate",
                "metadata": {"name": f"mix-{i}"},
                "spec": {"spec": claim_spec(count, numa)},
            })  # fmt: skip
        wait_for(
            "the default ServiceAccount",
            lambda: bool(self.rest.get("/api/v1/namespaces/bench-sched/serviceaccounts").get("items")),
            60,
        )

    def kube_scheduler(self) -> tuple[float, int]:
        """Seconds from lifting the scheduling gates until every pod is bound; pods bound."""
        pods: list[dict[str, Any]] = []
        for i, spec in enumerate(self.mix):
            pods.append({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p{i:04d}"},
                "spec": {
                    "schedulingGates": [{"name": "bench.draplugin.dev/hold"}],
                    "nodeSelector": {"bench-set": "sched"},
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"claims": [{"name": "gpu"}]}}],
                    "resourceClaims": [{"name": "gpu",
                                        "resourceClaimTemplateName": f"mix-{MIX.index(spec)}"}],
                },
            })  # fmt: skip
        parallel(lambda pod: self.rest.create("/api/v1/namespaces/bench-sched/pods", pod), pods)
        wait_for(
            "kube-controller-manager to create every claim", lambda: self._count_claims() == self.claims, 180
        )

        def ungate(name: str) -> None:
            self.rest.merge_patch(
                f"/api/v1/namespaces/bench-sched/pods/{name}", {"spec": {"schedulingGates": None}}
            )

        start = time.perf_counter()
        parallel(ungate, [p["metadata"]["name"] for p in pods])
        bound = 0

        def all_bound() -> bool:
            nonlocal bound
            items, _ = self.rest.list("/api/v1/namespaces/bench-sched/pods", kind="Pod")
            bound = sum(1 for p in items if p["spec"].get("nodeName"))
            return bound == self.claims

        wait_for("kube-scheduler to bind every pod", all_bound, 600)
        return time.perf_counter() - start, bound

    def _count_claims(self) -> int:
        items, _ = self.rest.list(
            f"{RESOURCE_V1}/namespaces/bench-sched/resourceclaims", kind="ResourceClaim"
        )
        return len(items)

    def ours_end_to_end(self) -> tuple[float, int]:
        """Seconds for one reconcile pass that pre-allocates every claim (API writes included),
        and how many it allocated."""
        annotations = {preallocate_annotation(D): "any"}
        bodies = [
            {
                **claim(f"c{i:04d}", [], namespace="bench-ours", annotations=annotations),
                "spec": claim_spec(count, numa),
            }
            for i, (count, numa) in enumerate(self.mix)
        ]
        parallel(
            lambda body: self.rest.create(f"{RESOURCE_V1}/namespaces/bench-ours/resourceclaims", body), bodies
        )
        classes, _ = self.rest.list(f"{RESOURCE_V1}/deviceclasses", kind="DeviceClass")
        slices, _ = self.rest.list(f"{RESOURCE_V1}/resourceslices", kind="ResourceSlice")
        ours = [s for s in slices if str(s["spec"].get("nodeName", "")).startswith("ours-")]
        claims, _ = self.rest.list(
            f"{RESOURCE_V1}/namespaces/bench-ours/resourceclaims", kind="ResourceClaim"
        )
        snapshot = Snapshot(device_classes=classes, slices=ours, claims=claims)
        reconciler = Reconciler(
            KubeClaimApi(self.rest),
            lambda: snapshot,
            metrics=ControllerMetrics(CollectorRegistry()),
            settings=ReconcilerSettings(namespace="bench-ours"),
        )
        start = time.perf_counter()
        report = reconciler.reconcile()
        return time.perf_counter() - start, len(report.allocated)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate", description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000, help="nodes for our allocator alone")
    parser.add_argument("--claims", type=int, default=1000, help="claims for our allocator alone")
    parser.add_argument(
        "--cluster-nodes", type=int, default=200, help="nodes for the kube-scheduler comparison"
    )
    parser.add_argument("--cluster-claims", type=int, default=200, help="pods/claims for the comparison")
    parser.add_argument("--no-cluster", action="store_true", help="only our allocator alone")
    args = parser.parse_args(argv)

    seconds, placed = ours_alone(args.nodes, args.claims)
    print(
        f"ours alone: {placed}/{args.claims} claims placed over {args.nodes} nodes x {GPUS} GPUs "
        f"in {seconds:.2f}s ({args.claims / seconds:.0f} claims/s)",
        flush=True,
    )
    if args.no_cluster:
        return 0

    n, c = args.cluster_nodes, args.cluster_claims
    cluster = start_control_plane("bench-allocate-")
    if cluster is None:
        return 1
    try:
        with cluster.api_client() as api:
            bench = ClusterBench(api, n, c)
            bench.setup()
            sched_s, bound = bench.kube_scheduler()
            ours_e2e_s, ours_e2e_n = bench.ours_end_to_end()
    finally:
        cluster.stop()
    decide_s, decided = ours_alone(n, c)

    sched_rate, decide_rate, e2e_rate = c / sched_s, c / decide_s, c / ours_e2e_s
    print(f"at {n} nodes x {GPUS} GPUs, {c} claims (same request mix), real control plane:")
    print(
        f"  kube-scheduler (gates lifted -> all bound): {bound}/{c} in {sched_s:.2f}s "
        f"({sched_rate:.1f} claims/s)"
    )
    print(
        f"  ours, decisions only:                      {decided}/{c} in {decide_s:.2f}s "
        f"({decide_rate:.1f} claims/s), ratio {decide_rate / sched_rate:.1f}x"
    )
    print(
        f"  ours, pre-allocation with API writes:      {ours_e2e_n}/{c} in {ours_e2e_s:.2f}s "
        f"({e2e_rate:.1f} claims/s), ratio {e2e_rate / sched_rate:.1f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
