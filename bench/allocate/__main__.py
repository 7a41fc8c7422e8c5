"""`python -m bench.allocate`: allocation decisions per second, ours against upstream's structured allocator.

scheduler_perf-shaped work (default 500 nodes x 10 GPUs, 5,000 claims of one GPU with a
CEL selector; the variant: claims of two GPUs that must share a NUMA node, `matchAttribute`),
decisions only on both sides, on the same snapshot in this run:

- ours: controller.scheduler.allocator.Allocator as simulate and the reconciler use it: one
  `prefilter` per pod (PreFilter: the claim's own checks and request plans, once), its `filter`
  per node (Filter: screening, else the search), `commit` of the chosen allocation (Reserve). A
  node that screening knows to fit gets its devices chosen (the search) only if it is the one
  chosen; the other feasible nodes' allocations are never built, as in kube-scheduler they are
  built and dropped.
- upstream: the allocpeer harness (tests/cluster/peers) around
  k8s.io/dynamic-resource-allocation/structured v0.37.2, called as kube-scheduler's
  DynamicResources plugin calls it: NewAllocator per pod over the allocated-device state
  (PreFilter), Allocate per node (Filter), the chosen devices join the state (Reserve).

Node order is the scheduler's on both sides: rotate from the node after the last one chosen,
Filter until numFeasibleNodesToFind feasible nodes are found (kube-scheduler's adaptive
percentage of nodes to score) or every node was tried, first feasible wins (every node scores
alike here). Both sides' results are checked: no device used twice, devices on the chosen
node, the selector and the NUMA constraint hold (checked on the snapshot, not by either CEL
engine); the two sides' placements are compared claim by claim. Both sides Filter one node
after another on one thread (kube-scheduler spreads Filter over 16 goroutines; neither side
does that here, and this machine has 2 cores). At the default sizes (about 1.2 and 0.6
million Filter calls) the peer needs 25 to 50 s per case on 2 cores, ours 4 to 12 s;
--nodes/--claims make it smaller. Timings cover the decision loop only: the peer's start and JSON decoding of
its job are outside them.

Memory: the peak RSS of a process that reads one job of 8,000 devices (800 nodes x 10) and
makes 1,000 decisions, ours in a child Python process and the peer harness, both from the
child's own rusage (--memory-nodes, 0 to skip).

The earlier end-to-end comparison against the running kube-scheduler is gone: its path (pod
binding, the claim's finalizer and status writes under kube-scheduler's client QPS/burst) and
our reconciler's writes (mark, then status, unthrottled) are not the same API writes, so that
ratio compared different work.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.peers import PeerError, run_measured, run_peer, run_peer_measured
from bench.summary import Row, record
from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.allocation.nodes import Node
from controller.scheduler.allocator import AllocationOutcome, Allocator
from dracommon.quantity import parse_quantity

D = "gpu.draplugin.dev"
GPUS = 10
PEER = "structured allocator (k8s.io/dynamic-resource-allocation v0.37.2)"
SELECTOR = (
    f'device.attributes["{D}"].model == "H100"'
    f' && device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0'
)
MIN_MEMORY = "40Gi"


def node_name(n: int) -> str:
    return f"node-{n:04d}"


def gpu_slice(node: str) -> dict[str, Any]:
    # Two GPUs per NUMA node; the last two GPUs of a node have less memory (still enough).
    devices = [
        device(
            f"gpu-{i}",
            {"model": "H100", "numa": i // 2, "index": i, "uuid": f"GPU-{node}-{i:02d}"},
            {"memory": "80Gi" if i < GPUS - 2 else "48Gi"},
        )
        for i in range(GPUS)
    ]
    return resource_slice(f"{node}-gpus", devices, node=node, pool=node, driver=D)


def claims_for(count: int, gpus: int, numa: bool) -> list[dict[str, Any]]:
    constraints = [{"matchAttribute": f"{D}/numa"}] if numa else []
    out = []
    for i in range(count):
        body = claim(
            f"c{i:05d}",
            [exactly("gpu", "gpu", count=gpus, mode="ExactCount", selectors=[SELECTOR])],
            constraints=constraints,
        )
        body["metadata"]["uid"] = f"00000000-0000-0000-0000-{i:012d}"
        out.append(body)
    return out


def feasible_nodes_to_find(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the default (adaptive) percentageOfNodesToScore."""
    if nodes < 100:
        return nodes
    percentage = max(50 - nodes // 125, 5)
    return max(nodes * percentage // 100, 100)


@dataclass
class Placement:
    node: str
    devices: list[str]  # driver/pool/device


def ours(
    classes: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    nodes: list[str],
    claims: list[dict[str, Any]],
    k: int,
) -> tuple[float, int, list[Placement | None]]:
    """Seconds for the decision loop, Filter calls, and each claim's placement (None: unschedulable)."""
    allocator = Allocator(device_classes=classes, slices=slices)
    node_objs = [Node(n) for n in nodes]
    placements: list[Placement | None] = []
    calls, following = 0, 0
    start = time.perf_counter()
    for body in claims:
        prepared = allocator.prefilter([body])  # PreFilter
        chosen: tuple[int, AllocationOutcome] | None = None
        feasible = 0
        for i in range(len(node_objs)):
            if feasible >= k:
                break
            at = (following + i) % len(node_objs)
            calls += 1
            outcome = prepared.filter(node_objs[at])
            if outcome.failure is not None and outcome.failure.error:
                chosen = None  # a Filter error fails the pod's scheduling attempt
                break
            if outcome.ok:
                feasible += 1
                if chosen is None:
                    chosen = (at, outcome)
        if chosen is None:
            placements.append(None)
            continue
        at, chosen_outcome = chosen
        allocation = chosen_outcome.allocations[0]  # built now: before the commit, as it must be
        allocator.commit(body, allocation)
        following = (at + 1) % len(node_objs)
        results = allocation["devices"]["results"]
        placements.append(Placement(nodes[at], [f"{r['driver']}/{r['pool']}/{r['device']}" for r in results]))
    return time.perf_counter() - start, calls, placements


def upstream(
    classes: list[dict[str, Any]],
    slices: list[dict[str, Any]],
    nodes: list[str],
    claims: list[dict[str, Any]],
    k: int,
) -> tuple[float, int, list[Placement | None]]:
    job = {"classes": classes, "slices": slices, "nodes": nodes, "claims": claims, "feasible": k}
    result = run_peer("allocpeer", job)
    placements: list[Placement | None] = []
    for entry in result["claims"]:
        if entry.get("error"):
            raise PeerError(f"allocpeer: Filter error: {entry['error']}")
        placements.append(Placement(entry["node"], entry["devices"] or []) if entry["node"] else None)
    return result["seconds"], result["filter_calls"], placements


def invalid(
    placements: list[Placement | None], slices: list[dict[str, Any]], gpus: int, numa: bool
) -> list[str]:
    """Every rule a set of placements breaks (empty: valid)."""
    by_id = {f"{D}/{s['spec']['pool']['name']}/{d['name']}": d for s in slices for d in s["spec"]["devices"]}
    problems: list[str] = []
    used: set[str] = set()
    for i, p in enumerate(placements):
        if p is None:
            continue
        if len(p.devices) != gpus:
            problems.append(f"claim {i}: {len(p.devices)} devices, wants {gpus}")
        for ident in p.devices:
            if ident in used:
                problems.append(f"claim {i}: {ident} already allocated")
            used.add(ident)
            dev = by_id.get(ident)
            if dev is None or ident.split("/")[1] != p.node:
                problems.append(f"claim {i}: {ident} is not on node {p.node}")
                continue
            if dev["attributes"]["model"]["string"] != "H100" or parse_quantity(
                dev["capacity"]["memory"]["value"]
            ) < parse_quantity(MIN_MEMORY):
                problems.append(f"claim {i}: {ident} does not satisfy the selector")
        if numa and len({by_id[d]["attributes"]["numa"]["int"] for d in p.devices if d in by_id}) > 1:
            problems.append(f"claim {i}: devices on different NUMA nodes")
    return problems


def run_case(label: str, nodes_n: int, claims_n: int, gpus: int, numa: bool) -> bool:
    nodes = [node_name(n) for n in range(nodes_n)]
    slices = [gpu_slice(n) for n in nodes]
    classes = [device_class("gpu", [f'device.driver == "{D}"'])]
    claims = claims_for(claims_n, gpus, numa)
    k = feasible_nodes_to_find(nodes_n)
    sides: dict[str, tuple[float, int, list[Placement | None]]] = {}
    runners: dict[str, Callable[..., tuple[float, int, list[Placement | None]]]] = {
        "upstream": upstream,
        "ours": ours,
    }
    for side, runner in runners.items():
        sides[side] = runner(classes, slices, nodes, claims, k)
    ok = True
    print(
        f"{label}: {nodes_n} nodes x {GPUS} GPUs, {claims_n} claims of {gpus} GPU(s), "
        f"Filter until {k} feasible"
    )
    for side, (seconds, calls, placements) in sides.items():
        placed = sum(p is not None for p in placements)
        problems = invalid(placements, slices, gpus, numa)
        ok = ok and not problems
        print(
            f"  {side:<9} {placed}/{claims_n} placed in {seconds:.2f}s = {claims_n / seconds:,.0f} claims/s, "
            f"{calls} Filter calls ({calls / seconds:,.0f}/s); invalid: {len(problems)} {problems[:3]}"
        )
    differ = sum(
        (a is None) != (b is None)
        or (a is not None and b is not None and (a.node, a.devices) != (b.node, b.devices))
        for a, b in zip(sides["ours"][2], sides["upstream"][2], strict=True)
    )
    print(f"  claims placed differently by the two sides: {differ}")
    ours_rate, peer_rate = claims_n / sides["ours"][0], claims_n / sides["upstream"][0]
    print(f"  ours/upstream claims/s: {ours_rate:,.0f} / {peer_rate:,.0f} = {ours_rate / peer_rate:.2f}x")
    record(
        Row("allocate", f"{label}, decisions", "claims/s", ours_rate, peer_rate, PEER, higher_is_better=True)
    )
    return ok


MEMORY_NODES = 800  # x 10 GPUs: the 8,000 devices of the memory row
MEMORY_CLAIMS = 1000


def memory_case(nodes_n: int, claims_n: int) -> None:
    """Peak RSS of a process that reads the same job (JSON: classes, slices, claims) and makes
    `claims_n` one-GPU decisions on it: ours (this module in a child process, `--memory-probe`)
    and the allocpeer harness, both read from the child's own rusage. Ours is the allocator
    alone, as in `dra-controller`; the controller daemon adds its watch caches of the objects."""
    devices = nodes_n * GPUS
    nodes = [node_name(n) for n in range(nodes_n)]
    job = {
        "classes": [device_class("gpu", [f'device.driver == "{D}"'])],
        "slices": [gpu_slice(n) for n in nodes],
        "nodes": nodes,
        "claims": claims_for(claims_n, 1, numa=False),
        "feasible": feasible_nodes_to_find(nodes_n),
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="allocate-memory-") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        command = [sys.executable, "-m", "bench.allocate", f"--memory-probe={job_file.name}"]
        returncode, _, stderr, ours_mib = run_measured(command, timeout_s=1800)
    if returncode != 0:
        raise PeerError(f"our memory probe exited {returncode}: {stderr.strip()[-2000:]}")
    _, peer_mib = run_peer_measured("allocpeer", job)
    print(
        f"allocator process, {devices} devices ({nodes_n} nodes x {GPUS}), {claims_n} decisions: peak RSS "
        f"ours {ours_mib:.1f} MiB, upstream {peer_mib:.1f} MiB, ours/upstream {ours_mib / peer_mib:.2f}x"
    )
    record(
        Row(
            "allocate",
            f"allocator process peak RSS, {devices:,} devices, {claims_n:,} decisions",
            "MiB",
            ours_mib,
            peer_mib,
            PEER,
        )
    )


def memory_probe(job_path: str) -> None:
    """The child side of memory_case: our allocator on the peer's job, read as the peer reads it."""
    with open(job_path) as f:
        job = json.load(f)
    ours(job["classes"], job["slices"], job["nodes"], job["claims"], job["feasible"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.allocate", description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument(
        "--claims", type=int, default=5000, help="claims of one GPU (the variant: half as many of two)"
    )
    parser.add_argument(
        "--memory-nodes", type=int, default=MEMORY_NODES, help="nodes of the memory row (0: skip)"
    )
    parser.add_argument("--memory-probe", metavar="JOB", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        memory_probe(args.memory_probe)
        return 0
    try:
        ok = run_case("1 GPU, CEL selector", args.nodes, args.claims, 1, numa=False)
        ok = run_case("2 GPUs, matchAttribute numa", args.nodes, args.claims // 2, 2, numa=True) and ok
        if args.memory_nodes:
            memory_case(args.memory_nodes, min(MEMORY_CLAIMS, args.claims))
    except PeerError as err:
        print(f"bench.allocate: {err}", file=sys.stderr)
        return 1
    if not ok:
        print("bench.allocate: invalid placements (above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
