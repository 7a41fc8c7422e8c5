"""kube-scheduler's Filter phase for a pod's pending claims, across nodes.

The scheduler runs the DynamicResources Filter on every node it considers
before it picks one, and a Filter *error* on any node (as opposed to
"unschedulable") fails the pod's whole scheduling attempt, whatever other
nodes offer: the pod is not bound, its PodScheduled condition says
`SchedulerError` with `running "DynamicResources" filter plugin: <error>`,
and it is retried with backoff. Upstream (1.34 to 1.37, `schedule_one.go`
`findNodesThatPassFilters` and the plugin's `Filter`):

- Errors are what the structured allocator returns as errors: CEL runtime
  errors in a class or request selector, All mode over an incomplete (or, in
  1.34, invalid) pool, a request the allocator cannot handle, a bad node
  selector. From 1.37 on the allocator marks "invalid resource pools were
  encountered" as a per-node failure, which Filter reports as unschedulable;
  `Allocator.allocate` already sets `Failure.error` per release, so here an
  error is simply `outcome.failure.error`. (Filter's allocation timeout is an
  error from 1.37 on and unschedulable in 1.34; we have no timeout.)
- Filter runs the allocator for the claims still to allocate even on a node
  where one of the pod's *allocated* claims is not available, and only then
  rejects that node; so an error there fails the pod too (`available`).
- Nodes that earlier Filter plugins reject (NodeName, NodeAffinity, ...) never
  reach DynamicResources: callers pass only the nodes the pod may run on.
- Below 100 nodes the scheduler filters every node. From 100 on it stops, in
  parallel, once it has found enough feasible nodes, so whether it meets a
  failing node is chance; we filter all nodes, the answer that never places a
  claim the scheduler might refuse.

Pure: no I/O. Which of the feasible nodes the scheduler then picks is up to
its scoring; `FilterResult.feasible` keeps them in the order given.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.nodes import Node
from controller.scheduler.allocator import (
    CANNOT_ALLOCATE,
    CANNOT_FIT,
    FITS,
    AllocationOutcome,
    Allocator,
    Failure,
)

JSON = Mapping[str, Any]

# The prefix kube-scheduler's framework puts before a Filter plugin's error.
FILTER_ERROR_PREFIX = 'running "DynamicResources" filter plugin: '


class NodeOutcome:
    """One node's Filter outcome; `outcome` may be computed on first use (`lazy`), for a node
    known to be feasible (`Screen.certainly_fits`) whose allocation only matters if it is chosen."""

    __slots__ = ("_compute", "_outcome", "node")

    def __init__(
        self,
        node: Node | None,
        outcome: AllocationOutcome | None = None,
        *,
        lazy: Callable[[], AllocationOutcome] | None = None,
    ) -> None:
        assert (outcome is None) != (lazy is None)
        self.node = node
        self._outcome = outcome
        self._compute = lazy

    @property
    def outcome(self) -> AllocationOutcome:
        if self._outcome is None:
            assert self._compute is not None
            self._outcome = self._compute()
            self._compute = None
        return self._outcome

    @property
    def node_name(self) -> str:
        return self.node.name if self.node is not None else "(no node)"


@dataclass
class FilterResult:
    """Every filtered node's outcome, sorted into feasible, rejected and the first error."""

    feasible: list[NodeOutcome] = field(default_factory=list)
    rejected: list[NodeOutcome] = field(default_factory=list)
    error: NodeOutcome | None = None  # the first node (in the given order) whose Filter errs

    @property
    def chosen(self) -> NodeOutcome | None:
        """The first feasible node, unless an error fails the attempt."""
        if self.error is not None or not self.feasible:
            return None
        return self.feasible[0]

    @property
    def failure(self) -> Failure:
        """Why nothing is chosen: the error, else the last rejection."""
        if self.error is not None:
            assert self.error.outcome.failure is not None
            message = scheduling_error_message(self.error.node_name, self.error.outcome.failure.message)
            return Failure(message, error=True)
        if self.rejected and self.rejected[-1].outcome.failure is not None:
            return self.rejected[-1].outcome.failure
        return Failure("no candidate node")


def scheduling_error_message(node_name: str, error: str) -> str:
    """Names the node and says why the error matters; ends with the scheduler's own message."""
    return (
        f"kube-scheduler's DynamicResources Filter fails with an error on node {node_name}, "
        "which aborts the pod's whole scheduling attempt whatever other nodes offer "
        f"(PodScheduled: SchedulerError): {FILTER_ERROR_PREFIX}{error}"
    )


def filter_nodes(
    allocator: Allocator,
    claims: Sequence[JSON],
    nodes: Sequence[Node | None],
    available: Callable[[Node | None], bool] = lambda _node: True,
) -> FilterResult:
    """Allocate `claims` together on each of `nodes` (in order), as one Filter call per node.

    `available(node)` is False where an allocated claim of the pod cannot be used: such a
    node is never feasible, but its Filter still runs the allocator first, and may err.
    """
    result = FilterResult()
    prepared = allocator.prefilter(claims)  # PreFilter: the claims' own checks, once
    screen = prepared.screen
    for node in nodes:
        usable = available(node)
        known = screen.classify(node)
        if usable and known == FITS:
            # Feasible: its allocation is made only if this node is chosen (the state does not
            # change before then), as most of 1,000 feasible nodes never are.
            lazy = functools.partial(prepared.allocate, node, screened=True)
            result.feasible.append(NodeOutcome(node, lazy=lazy))
            continue
        if known == CANNOT_FIT:  # what allocate answers there, without a Screen per node
            name = node.name if node is not None else None
            entry = NodeOutcome(node, AllocationOutcome(failure=Failure(CANNOT_ALLOCATE), node=name))
        else:
            # classify's UNKNOWN already rules out what cannot_fit would find.
            entry = NodeOutcome(node, prepared.allocate(node, screened=True))
        failure = entry.outcome.failure
        if failure is not None and failure.error:
            result.error = result.error or entry
        elif not usable:
            # The scheduler's own words for this rejection.
            name = node.name if node is not None else None
            unavailable = Failure("resourceclaim not available on the node")
            rejected = AllocationOutcome(failure=unavailable, node=name)
            result.rejected.append(NodeOutcome(node, rejected))
        elif entry.outcome.ok:
            result.feasible.append(entry)
        else:
            result.rejected.append(entry)
    return result


def first_fit(
    allocator: Allocator, claims: Sequence[JSON], nodes: Sequence[Node | None], *, start: int = 0
) -> FilterResult:
    """`filter_nodes(allocator, claims, rotated)`'s `chosen` and `failure`, where `rotated` is
    `nodes` from position `start` on, wrapping around: for a caller that takes the first
    feasible node (simulate's claims on their own, dra-controller's pre-allocation).

    Past the first feasible node only an error can change the answer, so only the nodes where
    the Filter might err are filtered there (`Screen.risky_positions`, kept per node list), in
    rotating order; the first error ends the scan, as it fails the attempt. `feasible` holds the
    first feasible node only, `rejected` the nodes rejected before it.
    """
    result = FilterResult()
    prepared = allocator.prefilter(claims)  # PreFilter: the claims' own checks, once
    count = len(nodes)
    chosen_at = count
    for offset in range(count):
        node = nodes[(start + offset) % count]
        entry = NodeOutcome(node, prepared.allocate(node))
        failure = entry.outcome.failure
        if failure is not None and failure.error:
            result.error = entry
            return result
        if entry.outcome.ok:
            result.feasible.append(entry)
            chosen_at = offset
            break
        result.rejected.append(entry)
    later = sorted(
        offset
        for offset in ((p - start) % count for p in prepared.screen.risky_positions(nodes))
        if offset > chosen_at
    )
    for offset in later:
        node = nodes[(start + offset) % count]
        outcome = prepared.allocate(node)
        if outcome.failure is not None and outcome.failure.error:
            result.error = NodeOutcome(node, outcome)
            break
    return result


__all__ = [
    "FILTER_ERROR_PREFIX",
    "FilterResult",
    "NodeOutcome",
    "filter_nodes",
    "first_fit",
    "scheduling_error_message",
]
