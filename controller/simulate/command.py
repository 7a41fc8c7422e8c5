"""Allocate pending claims one after the other, as dra-controller and kube-scheduler would.

Order: first the claims no pod uses and the claims annotated for
pre-allocation (`dra-controller run` allocates those as soon as they exist),
then each pod's claims, pod by pod. A pod's pending claims are allocated
together on one node, as in one scheduler Filter call, on a node the pod may
run on (spec.nodeName, nodeSelector, required node affinity) and that every
already allocated claim of the pod can be used on. Claims a pod makes from a
ResourceClaimTemplate are generated here when the cluster has not made them
yet (see `controller.scheduler.podclaims`).

Without a fixed node, a claim on its own goes to the first node (in name
order, starting after the node used last) where it fits, as dra-controller
pre-allocates. A pod goes to the node kube-scheduler would pick for a pod with
no other constraints (`controller.scheduler.nodescore`: the DynamicResources score for
prioritized lists from 1.35 on); where several nodes score the same the
scheduler picks one at random, so the result lists them all
(`possibleNodes`) and the simulation continues with the first in rotating
order. As in kube-scheduler, every node the pod may run on is
filtered first, and a Filter error on any of them (a CEL runtime error, All
mode over an incomplete pool, ...) leaves the pod unscheduled, naming that
node (see `controller.scheduler.nodefilter`). Claims annotated for pre-allocation to a
node only try that node.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.nodes import Node, NodeSelectorError
from controller.allocation.requests import claim_ref
from controller.cli import EXIT_FAILURE, EXIT_OK, Subcommand, register_subcommand
from controller.explain.explanation import explain_claim
from controller.objects import ClusterObjects
from controller.options import (
    add_namespace_arguments,
    add_source_arguments,
    build_allocator,
    chosen_namespace,
    cluster_nodes,
    emit,
    extended_resources_enabled,
    find_node,
    gates_of,
    in_namespace,
    release_of,
    with_objects,
)
from controller.run.preallocation import ANY_NODE_SYNONYMS, preallocate_annotation
from controller.scheduler.allocator import AllocationOutcome, Allocator, Failure
from controller.scheduler.extendedclaim import Mapped
from controller.scheduler.nodefilter import filter_nodes, first_fit
from controller.scheduler.nodescore import ScoreError, choose_node
from controller.scheduler.podclaims import (
    PodClaim,
    PodClaims,
    allocations_fit_node,
    no_node_reason,
    pod_node_constraints,
    reachable_nodes,
    resolve_pods,
)
from dracommon.drivername import DEFAULT_DRIVER_NAME

JSON = Mapping[str, Any]
# simulate has no --driver-name: it reads the default driver's pre-allocation annotation.
PREALLOCATE_ANNOTATION = preallocate_annotation(DEFAULT_DRIVER_NAME)


@dataclass
class ClaimResult:
    namespace: str
    name: str
    allocated: bool
    results: list[dict[str, Any]] = field(default_factory=list)
    node_name: str | None = None
    reason: str | None = None
    allocation: dict[str, Any] | None = None
    pod: str | None = None  # the pod whose scheduling allocated (or would allocate) the claim
    template: str | None = None  # set when the claim was generated here from this template
    # Set for the scheduler's implicit claim: which extended resources map to which class.
    extended: str | None = None
    # Every node kube-scheduler may equally pick for the pod (more than one: a random choice), and why.
    possible_nodes: list[str] = field(default_factory=list)
    node_choice: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "allocated": self.allocated,
            "results": self.results,
            "nodeName": self.node_name,
            "reason": self.reason,
            "pod": self.pod,
            **({"extendedResources": self.extended} if self.extended else {}),
            **({"possibleNodes": self.possible_nodes} if self.possible_nodes else {}),
            **({"nodeChoice": self.node_choice} if self.node_choice else {}),
        }


def describe_extended(mapped: Sequence[Mapped]) -> str:
    """`nvidia.com/gpu: 2 (container trainer, request container-0-request-1) -> DeviceClass X (why)`."""
    parts = []
    for m in mapped:
        parts.append(
            f"{m.resource}: {m.count} (container {m.container}, request {m.request}) -> DeviceClass "
            f"{m.device_class} ({m.why})"
        )
    return "; ".join(parts)


def pending_claims(claims: Sequence[JSON]) -> list[JSON]:
    return [c for c in claims if not (c.get("status") or {}).get("allocation")]


def _preallocate_value(claim: JSON) -> str | None:
    annotations = (claim.get("metadata") or {}).get("annotations") or {}
    if PREALLOCATE_ANNOTATION not in annotations:
        return None
    return str(annotations[PREALLOCATE_ANNOTATION]).strip()


def _pinned_node(claim: JSON) -> str | None:
    """The node a pre-allocation annotation names; None for none, "any" or "true"."""
    value = _preallocate_value(claim)
    return value if value and value not in ANY_NODE_SYNONYMS else None


def _result_json(allocation: JSON) -> list[dict[str, Any]]:
    """Each result as the scheduler would write it, less the share's random ID: `shared` says one
    was assigned (the device is shared with other claims), `consumedCapacity` what this share takes."""
    results: list[dict[str, Any]] = []
    for r in allocation["devices"]["results"]:
        entry: dict[str, Any] = {k: r[k] for k in ("request", "driver", "pool", "device")}
        if r.get("adminAccess"):
            entry["adminAccess"] = True
        if r.get("shareID"):
            entry["shared"] = True
        if r.get("consumedCapacity"):
            entry["consumedCapacity"] = dict(r["consumedCapacity"])
        results.append(entry)
    return results


def _result_text(result: Mapping[str, Any]) -> str:
    """`request=pool/device`, with what a share consumes or that it is admin access."""
    text = f"{result['request']}={result['pool']}/{result['device']}"
    notes = []
    if result.get("shared"):
        consumed = result.get("consumedCapacity") or {}
        taken = ", ".join(f"{name} {amount}" for name, amount in sorted(consumed.items()))
        notes.append(f"shared, consumes {taken}" if taken else "shared")
    if result.get("adminAccess"):
        notes.append("admin access")
    return f"{text} ({'; '.join(notes)})" if notes else text


class Simulator:
    def __init__(self, allocator: Allocator, nodes: Sequence[Node], explain: bool = True) -> None:
        self.allocator = allocator
        self.nodes: list[Node | None] = [*nodes] if nodes else [None]
        self.explain = explain
        self._next = 0
        self._positions = {id(node): i for i, node in enumerate(self.nodes)}
        # Claims allocated during this run, by namespace/name, so pods sharing them see it.
        self.allocated: dict[str, dict[str, Any]] = {}

    def _rotation(self) -> list[Node | None]:
        count = len(self.nodes)
        return [self.nodes[(self._next + i) % count] for i in range(count)]

    def _advance_past(self, node: Node | None) -> None:
        # By identity first: the chosen node is one of self.nodes (a scan of 1,000 nodes per claim
        # compared dataclasses field by field).
        index = self._positions.get(id(node))
        if index is None and node in self.nodes:
            index = self.nodes.index(node)
        if index is not None:
            self._next = (index + 1) % len(self.nodes)

    def _try(
        self, claims: Sequence[JSON], candidates: Sequence[Node | None], start: int = 0
    ) -> tuple[AllocationOutcome, Node | None]:
        """Filter the candidates (from `start` on, wrapping around) as kube-scheduler does before
        it picks a node: the first feasible one wins, unless a Filter error on any of them fails
        the whole attempt (`first_fit`: past the first feasible node, only nodes where the Filter
        may err)."""
        filtered = first_fit(self.allocator, claims, candidates, start=start)
        chosen = filtered.chosen
        if chosen is not None:
            return chosen.outcome, chosen.node
        node_name = filtered.error.node_name if filtered.error is not None else None
        return AllocationOutcome(failure=filtered.failure, node=node_name), None

    def place(self, claim: JSON, only: Node | None = None) -> tuple[AllocationOutcome, Node | None]:
        """One claim on its own: on `only`, on the node its pre-allocation annotation names, or on
        the first node in rotating order that fits."""
        pinned = _pinned_node(claim)
        if only is not None:
            return self._try([claim], [only])
        if pinned is not None:
            candidates = [n for n in self.nodes if n is not None and n.name == pinned] or [Node(pinned)]
            return self._try([claim], candidates)
        outcome, node = self._try([claim], self.nodes, self._next)  # in rotating order
        if outcome.ok:
            self._advance_past(node)
        return outcome, node

    def _record(
        self, result: ClaimResult, claim: JSON, outcome: AllocationOutcome, index: int, node: Node | None
    ) -> None:
        allocation = outcome.allocations[index]
        self.allocator.commit(claim, allocation)
        self.allocated[claim_ref(claim)] = allocation
        result.allocated = True
        result.allocation = allocation
        result.node_name = node.name if node is not None else None
        result.results = _result_json(allocation)

    def _reason(self, claim: JSON, failure: Failure | None, nodes: Sequence[Node | None]) -> str:
        assert failure is not None
        if not self.explain or failure.error:
            return failure.message
        known = [n for n in nodes if n is not None]
        return explain_claim(self.allocator, claim, known or None).summary

    def run(self, claims: Sequence[JSON], only: Node | None = None) -> list[ClaimResult]:
        """Each claim on its own, in order (claims no pod uses, pre-allocated claims)."""
        results: list[ClaimResult] = []
        for claim in claims:
            meta = claim.get("metadata") or {}
            outcome, node = self.place(claim, only)
            result = ClaimResult(
                namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), allocated=False
            )
            if outcome.ok:
                self._record(result, claim, outcome, 0, node)
            else:
                pinned = _pinned_node(claim)
                nodes: list[Node | None] = (
                    [only] if only is not None else ([Node(pinned)] if pinned else list(self.nodes))
                )
                result.reason = self._reason(claim, outcome.failure, nodes)
            results.append(result)
        return results

    def _current(self, claim: JSON) -> JSON:
        """The claim with an allocation made earlier in this run, if any."""
        allocation = self.allocated.get(claim_ref(claim))
        if allocation is None:
            return claim
        return {**claim, "status": {**(claim.get("status") or {}), "allocation": allocation}}

    def run_pod(self, pod: PodClaims, only: Node | None = None) -> list[ClaimResult]:
        """A pod's pending claims, together, on one node the pod and its allocated claims fit.

        Returns one result per pending claim, and one per claim that is missing (not found, or
        its template not found); allocated claims only narrow the nodes.
        """
        current = [(entry, self._current(entry.claim)) for entry in pod.claims if entry.claim is not None]
        allocated = [claim for _, claim in current if (claim.get("status") or {}).get("allocation")]
        pending = [
            (entry, claim) for entry, claim in current if not (claim.get("status") or {}).get("allocation")
        ]
        missing = [entry for entry in pod.claims if entry.problem]
        results = {
            entry.pod_claim_name: ClaimResult(
                namespace=pod.namespace,
                name=entry.claim_name,
                allocated=False,
                pod=pod.name,
                template=entry.template if entry.generated else None,
                reason=entry.problem,
                extended=describe_extended(entry.extended) if entry.extended else None,
            )
            for entry in [*missing, *(e for e, _ in pending)]
        }
        waiting = [results[entry.pod_claim_name] for entry, _ in pending]
        if missing:
            # The scheduler does not consider a pod until every claim it names exists.
            reason = f"pod {pod.ref} waits for: " + "; ".join(str(e.problem) for e in missing)
            self._fail(waiting, reason)
        elif pending:
            self._schedule(pod, allocated, pending, waiting, only)
        return list(results.values())

    @staticmethod
    def _fail(results: Sequence[ClaimResult], reason: str) -> None:
        for result in results:
            result.reason = reason

    def _schedule(
        self,
        pod: PodClaims,
        allocated: Sequence[JSON],
        pending: Sequence[tuple[PodClaim, JSON]],
        results: Sequence[ClaimResult],
        only: Node | None,
    ) -> None:
        try:
            reachable = self._pod_nodes(pod, allocated, only)
        except NodeSelectorError as err:
            self._fail(results, f"pod {pod.ref}: {err}")
            return
        candidates = [n for n in reachable if allocations_fit_node(allocated, n)] if allocated else reachable
        claims = [claim for _, claim in pending]
        if allocated:
            filtered = filter_nodes(
                self.allocator, claims, reachable, lambda n: allocations_fit_node(allocated, n)
            )
        else:
            filtered = filter_nodes(self.allocator, claims, reachable)  # every node is available
        try:
            choice = (
                choose_node(filtered.feasible, claims, self.allocator.features, allocated=len(allocated))
                if filtered.error is None
                else None
            )
        except ScoreError as err:
            self._fail(results, str(err))
            return
        if choice is not None:
            node = choice.chosen.node
            if only is None:
                self._advance_past(node)
            described = choice.describe(len(filtered.feasible))
            for index, (claim, result) in enumerate(zip(claims, results, strict=True)):
                self._record(result, claim, choice.chosen.outcome, index, node)
                result.node_choice = described
                result.possible_nodes = choice.candidate_names if not choice.deterministic else []
            return
        node_name = filtered.error.node_name if filtered.error is not None else None
        outcome = AllocationOutcome(failure=filtered.failure, node=node_name)
        assert outcome.failure is not None
        if not candidates and not outcome.failure.error:
            self._fail(results, no_node_reason(pod, allocated, [n for n in self.nodes if n is not None]))
            return
        for claim, result in zip(claims, results, strict=True):
            reason = self._reason(claim, outcome.failure, candidates)
            if len(claims) > 1 and " can be allocated on: " in reason:
                # Each claim fits somewhere on its own, but not all of them on one node.
                reason = f"the claims of pod {pod.ref} do not fit together on one node ({reason})"
            result.reason = reason

    def _pod_nodes(self, pod: PodClaims, allocated: Sequence[JSON], only: Node | None) -> list[Node | None]:
        """The nodes the pod may run on, in rotating order: those the scheduler's DRA Filter sees."""
        if only is not None:
            return [*reachable_nodes(pod.pod, [only], named_node=False)]
        if self.nodes == [None] and not pod_node_constraints(pod.pod) and not allocated:
            return [None]  # no node is known and the pod names none: allocate without a node
        return [*reachable_nodes(pod.pod, [n for n in self._rotation() if n is not None])]


def simulate(
    objects: ClusterObjects,
    allocator: Allocator,
    nodes: Sequence[Node],
    only: Node | None = None,
    *,
    extended_resources: bool = True,
) -> list[ClaimResult]:
    """Claims no pod uses and pre-allocated claims first, each alone; then every pod's claims.

    With `extended_resources` (the DRAExtendedResource gate), a pod's extended resources that a
    DeviceClass maps are one more claim of the pod, as kube-scheduler allocates them.
    """
    classes = objects.device_classes if extended_resources else ()
    pods = resolve_pods(objects.pods, objects.claims, objects.claim_templates, classes)
    used_by_pods = {
        claim_ref(c.claim) for p in pods for c in p.claims if c.claim is not None and not c.generated
    }
    alone = [
        c
        for c in pending_claims(objects.claims)
        if claim_ref(c) not in used_by_pods or _preallocate_value(c) is not None
    ]
    simulator = Simulator(allocator, nodes)
    results = simulator.run(alone, only)
    for pod in pods:
        results.extend(simulator.run_pod(pod, only))
    return results


def _label(r: ClaimResult) -> str:
    name = f"{r.namespace}/{r.name}"
    if r.extended is not None:
        return f"{name} (the implicit claim for the extended resources of pod {r.pod}: {r.extended})"
    if r.template is not None:
        return f"{name} (generated from ResourceClaimTemplate {r.template} for pod {r.pod})"
    if r.pod is not None:
        return f"{name} (pod {r.pod})"
    return name


def to_text(results: Sequence[ClaimResult]) -> str:
    lines = []
    for r in results:
        if r.allocated:
            devices = ", ".join(_result_text(d) for d in r.results)
            line = f"{_label(r)}: allocated on {r.node_name or '(any node)'}: {devices}"
            lines.append(f"{line} ({r.node_choice})" if r.node_choice else line)
        else:
            lines.append(f"{_label(r)}: not allocated: {r.reason}")
    return "\n".join(lines) if lines else "no pending claims"


# ----- the `simulate` subcommand -----------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    # -n: only that namespace's pending claims and pods are allocated; allocated claims of every
    # namespace still hold their devices.
    add_namespace_arguments(parser, every_by_default=True)
    parser.add_argument(
        "--node", help="allocate every claim on this node (default: the first node that fits)"
    )


@with_objects
def run(args: argparse.Namespace, objects: ClusterObjects) -> int:
    allocator = build_allocator(objects, release_of(args), gates_of(args))
    nodes = cluster_nodes(objects, allocator)
    only = find_node(objects, args.node) if args.node else None
    pending = in_namespace(objects, chosen_namespace(args))
    results = simulate(pending, allocator, nodes, only, extended_resources=extended_resources_enabled(args))
    emit(args, {"claims": [r.to_json() for r in results]}, lambda: to_text(results))
    return EXIT_OK if all(r.allocated for r in results) else EXIT_FAILURE


register_subcommand(
    Subcommand(
        name="simulate",
        help="allocate pending ResourceClaims (standalone, and those pods make from ResourceClaimTemplates) "
        "in order, as kube-scheduler would, and print each result",
        add_arguments=add_arguments,
        handler=run,
    )
)
