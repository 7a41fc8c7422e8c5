"""Allocate pending claims one after the other, as the scheduler would place pods using them.

Without a fixed node, each claim goes to the first node (in name order,
starting after the node used last, like the scheduler's rotating start)
where it fits. Claims annotated for pre-allocation to a node only try that node.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.nodes import Node
from controller.allocator import AllocationOutcome, Allocator
from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.commands_common import (
    InputError,
    add_source_arguments,
    build_allocator,
    cluster_nodes,
    emit,
    find_node,
    load_objects,
    release_of,
)
from controller.explain import explain_claim

JSON = Mapping[str, Any]
PREALLOCATE_ANNOTATION = "gpu.draplugin.dev/preallocate"


@dataclass
class ClaimResult:
    namespace: str
    name: str
    allocated: bool
    results: list[dict[str, str]] = field(default_factory=list)
    node_name: str | None = None
    reason: str | None = None
    allocation: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "allocated": self.allocated,
            "results": self.results,
            "nodeName": self.node_name,
            "reason": self.reason,
        }


def pending_claims(claims: Sequence[JSON]) -> list[JSON]:
    return [c for c in claims if not (c.get("status") or {}).get("allocation")]


def _pinned_node(claim: JSON) -> str | None:
    value = ((claim.get("metadata") or {}).get("annotations") or {}).get(PREALLOCATE_ANNOTATION, "")
    value = str(value).strip()
    return value if value and value != "any" else None


class Simulator:
    def __init__(self, allocator: Allocator, nodes: Sequence[Node], explain: bool = True) -> None:
        self.allocator = allocator
        self.nodes: list[Node | None] = [*nodes] if nodes else [None]
        self.explain = explain
        self._next = 0

    def place(self, claim: JSON, only: Node | None = None) -> tuple[AllocationOutcome, Node | None]:
        """Try nodes in rotating order; the first success wins, an error stops (as in a Filter)."""
        pinned = _pinned_node(claim)
        candidates: list[Node | None]
        if only is not None:
            candidates = [only]
        elif pinned is not None:
            candidates = [n for n in self.nodes if n is not None and n.name == pinned] or [Node(pinned)]
        else:
            count = len(self.nodes)
            candidates = [self.nodes[(self._next + i) % count] for i in range(count)]
        last: AllocationOutcome | None = None
        for index, node in enumerate(candidates):
            outcome = self.allocator.allocate([claim], node)
            if outcome.ok:
                if only is None and pinned is None:
                    self._next = (self._next + index + 1) % len(self.nodes)
                return outcome, node
            last = outcome
            if outcome.failure is not None and outcome.failure.error:
                break
        assert last is not None
        return last, None

    def run(self, claims: Sequence[JSON], only: Node | None = None) -> list[ClaimResult]:
        results: list[ClaimResult] = []
        for claim in claims:
            meta = claim.get("metadata") or {}
            outcome, node = self.place(claim, only)
            result = ClaimResult(
                namespace=str(meta.get("namespace", "")), name=str(meta.get("name", "")), allocated=False
            )
            if outcome.ok:
                allocation = outcome.allocations[0]
                self.allocator.commit(claim, allocation)
                result.allocated = True
                result.allocation = allocation
                result.node_name = node.name if node is not None else None
                result.results = [
                    {k: r[k] for k in ("request", "driver", "pool", "device")}
                    for r in allocation["devices"]["results"]
                ]
            else:
                assert outcome.failure is not None
                result.reason = outcome.failure.message
                if self.explain and not outcome.failure.error:
                    nodes = [only] if only is not None else [n for n in self.nodes if n is not None]
                    result.reason = explain_claim(self.allocator, claim, nodes or None).summary
            results.append(result)
        return results


def to_text(results: Sequence[ClaimResult]) -> str:
    lines = []
    for r in results:
        if r.allocated:
            devices = ", ".join(f"{d['request']}={d['pool']}/{d['device']}" for d in r.results)
            lines.append(f"{r.namespace}/{r.name}: allocated on {r.node_name or '(any node)'}: {devices}")
        else:
            lines.append(f"{r.namespace}/{r.name}: not allocated: {r.reason}")
    return "\n".join(lines) if lines else "no pending claims"


# ----- the `simulate` subcommand -----------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument(
        "--node", help="allocate every claim on this node (default: the first node that fits)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        objects = load_objects(args)
    except InputError as err:
        sys.stderr.write(f"error: {err}\n")
        return EXIT_USAGE
    allocator = build_allocator(objects, release_of(args))
    nodes = cluster_nodes(objects, allocator)
    only = find_node(objects, args.node) if args.node else None
    results = Simulator(allocator, nodes).run(pending_claims(objects.claims), only)
    emit(args, {"claims": [r.to_json() for r in results]}, lambda: to_text(results))
    return EXIT_OK if all(r.allocated for r in results) else EXIT_FAILURE


register_subcommand(
    Subcommand(
        name="simulate",
        help="allocate pending ResourceClaims in order, as kube-scheduler would, and print each result",
        add_arguments=add_arguments,
        handler=run,
    )
)
