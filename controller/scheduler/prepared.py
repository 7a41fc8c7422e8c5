"""A pod's claims prepared once per scheduling cycle, then allocated node by node.

kube-scheduler's DynamicResources plugin does its per-claim work once per pod (PreFilter: one
`NewAllocator` over the claims) and runs only the search in each node's Filter. `Prepared` is
that split: what depends on the claims alone (their classes, the fields we do not model, the
request plans and their checks, the screening shapes) is worked out once, and
`allocate(node)` / `filter(node)` search one node with it. The answers are those of
`Allocator.allocate(claims, node)`, in the same order of checks, which is one `Prepared` per call.

A `Prepared` reads the allocator's state at each call, so allocations committed between two
calls are seen; it is bound to the allocator's slices and classes, as the scheduling cycle is.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from controller.allocation.nodes import Node, NodeSelectorError
from controller.allocation.result import NodeSelectorConflict, node_selector
from controller.allocation.search import AllocationError, ClaimPlan, Search
from controller.allocation.selectors import SelectorError
from controller.allocation.unsupported import claim_problems
from controller.scheduler.outcome import (
    CANNOT_ALLOCATE,
    CANNOT_FIT,
    FITS,
    AllocationOutcome,
    Allocations,
    Failure,
)
from dracommon.quantity import QuantityError

JSON = Mapping[str, Any]


# What a Prepared uses of the allocator that made it, as protocols: the allocator module
# imports this one, and the import graph stays free of circles (tests/unit/test_import_graph.py).
class Screen(Protocol):
    def classify(self, node: Node | None) -> int: ...

    def cannot_fit(self, node: Node | None) -> bool: ...

    def risky_positions(self, nodes: Sequence[Node | None]) -> list[int]: ...


class Allocator(Protocol):
    commits: int

    def _missing_class(self, claims: Sequence[JSON]) -> str: ...

    def screen(self, claims: Sequence[JSON]) -> Screen: ...

    def search(self, claims: Sequence[JSON], node: Node | None) -> Search: ...

    def _unsupported(self, claims: Sequence[JSON], view: Any) -> Any: ...

    def _view(self, node: Node | None) -> Any: ...

    def _allocation(
        self, claim_index: int, search: Search, selector: dict[str, Any] | None
    ) -> dict[str, Any]: ...


class StaleAllocation(RuntimeError):
    """A feasible node's allocation was read after the allocated state changed: it was known
    to fit when filtered, and its devices are chosen when first read, so that must happen
    before any other allocation is committed (as the scheduler reserves the node it filtered)."""


class Prepared:
    """The claims of one pod (allocated together), prepared for Filter calls on many nodes."""

    def __init__(self, allocator: Allocator, claims: Sequence[JSON]) -> None:
        self.allocator = allocator
        self.claims = list(claims)
        self.missing = allocator._missing_class(self.claims)
        self._screen: Screen | None = None
        problems = [problem for claim in self.claims for problem in claim_problems(claim)[:1]]
        self._problem = problems[0].message if problems else None
        # The request plans of one `prepare` where they do not depend on the node, or the
        # message of the AllocationError it raised; None until the first search prepares.
        self._template: list[ClaimPlan] | None = None
        self._template_error: str | None = None
        self._template_known = False

    @property
    def screen(self) -> Screen:
        if self._screen is None:
            self._screen = self.allocator.screen(self.claims)
        return self._screen

    def filter(self, node: Node | None) -> AllocationOutcome:
        """`allocate(node)`'s answer; on a node that screening knows to fit (`Screen.classify`)
        without a search: the devices are chosen when the allocations are first read, which
        must be before the next `commit` (else StaleAllocation)."""
        name = node.name if node is not None else None
        if self.missing:
            return AllocationOutcome(failure=Failure(self.missing), node=name)
        known = self.screen.classify(node)
        if known == CANNOT_FIT:
            return AllocationOutcome(failure=Failure(CANNOT_ALLOCATE), node=name)
        if known == FITS:
            commits = self.allocator.commits
            return AllocationOutcome(node=name, pending=functools.partial(self._fitting, node, commits))
        # classify's UNKNOWN already rules out what cannot_fit would find.
        return self.allocate(node, screened=True)

    def _fitting(self, node: Node | None, commits: int) -> Allocations:
        if self.allocator.commits != commits:
            raise StaleAllocation(
                f"allocations were committed since node {node.name if node else '(none)'} was filtered"
            )
        outcome = self.allocate(node, screened=True)
        if outcome.failure is not None:
            raise AssertionError(f"screening said the claims fit, the search says: {outcome.failure}")
        return outcome.allocations

    def allocate(self, node: Node | None, *, screened: bool = False) -> AllocationOutcome:
        """Allocate the claims together on `node` (all or nothing), like one Filter call.
        `screened`: `Screen.cannot_fit(node)` is already known to be False."""
        allocator = self.allocator
        name = node.name if node is not None else None
        if self.missing:
            return AllocationOutcome(failure=Failure(self.missing), node=name)
        if not screened and self.screen.cannot_fit(node):
            # What the search would conclude, known from the devices' selector verdicts alone.
            return AllocationOutcome(failure=Failure(CANNOT_ALLOCATE), node=name)
        try:
            search = allocator.search(self.claims, node)
            if self._problem is not None:
                # An error, not "unschedulable": we cannot tell what the scheduler would decide.
                return AllocationOutcome(failure=Failure(self._problem, error=True), node=name)
            unsupported = allocator._unsupported((), allocator._view(node))
            if unsupported is not None:
                return AllocationOutcome(failure=Failure(unsupported.message, error=True), node=name)
            self._prepare(search)
            if not search.run():
                if any(p.invalid for p in search.pools):
                    return AllocationOutcome(
                        failure=Failure("invalid resource pools were encountered"), node=name
                    )
                return AllocationOutcome(failure=Failure(CANNOT_ALLOCATE), node=name)
            # The node selectors now (merging them may fail, which is this call's error); the
            # rest of `status.allocation` when it is read.
            selectors = [node_selector(plan.chosen, node) for plan in search.plans]
        except SelectorError as err:
            return AllocationOutcome(failure=Failure(err.message, error=True), node=name)
        except (AllocationError, NodeSelectorError, NodeSelectorConflict, QuantityError) as err:
            return AllocationOutcome(failure=Failure(str(err), error=True), node=name)
        pending = functools.partial(_allocations, allocator, search, selectors)
        return AllocationOutcome(node=name, pending=pending)

    def _prepare(self, search: Search) -> None:
        """`search.prepare()`, from the plans of the first one where they serve every node."""
        if self._template_known:
            if self._template_error is not None:
                raise AllocationError(self._template_error)
            if self._template is not None:
                search.prepared_on(self._template)
            else:
                search.prepare()
            return
        if not search.node_independent():
            self._template_known = True
            search.prepare()
            return
        try:
            search.prepare()
        except AllocationError as err:
            self._template_error, self._template_known = str(err), True
            raise
        # Taken before the search changes its plans (chosen devices, constraint values).
        self._template = [ClaimPlan(claim=p.claim, requests=p.requests, constraints=[]) for p in search.plans]
        self._template_known = True


def _allocations(allocator: Allocator, search: Search, selectors: list[dict[str, Any] | None]) -> Allocations:
    return [allocator._allocation(index, search, selector) for index, selector in enumerate(selectors)]


__all__ = ["Prepared", "StaleAllocation"]
