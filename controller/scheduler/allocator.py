"""Structured allocation, pure: API objects (JSON dicts) in, `status.allocation` out.

Semantics follow kube-scheduler's structured allocator (Kubernetes 1.37;
`Features.for_release` selects the rules of older releases). The search is in
`controller.allocation.search`; this module is the entry point:

    allocator = Allocator(device_classes=classes, slices=slices, allocated_claims=done)
    outcome = allocator.allocate([claim], Node("node-1"))
    outcome.allocations[0]  # {"devices": {"results": [...], "config": [...]}, "nodeSelector": ...}
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.features import Features
from controller.allocation.nodes import Node, NodeSelectorError
from controller.allocation.pools import Pool, gather_pools
from controller.allocation.requests import claim_ref, claim_requests
from controller.allocation.result import NodeSelectorConflict, allocation_config, device_result, node_selector
from controller.allocation.search import AllocationError, Candidate, Search, pool_candidates
from controller.allocation.selectors import Compiler, SelectorCache, SelectorError
from controller.allocation.state import AllocatedState, allocated_state, apply_taint_rules
from controller.allocation.unsupported import Unsupported, claim_problems, slice_problems
from dracommon.quantity import QuantityError

JSON = Mapping[str, Any]

__all__ = [
    "AllocationOutcome",
    "Allocator",
    "Failure",
    "Features",
    "Node",
]


@dataclass(frozen=True)
class Failure:
    """Why claims could not be allocated.

    `error` is True where kube-scheduler reports an error (CEL failure, a
    request it cannot handle) rather than "unschedulable" (no fitting devices).
    """

    message: str
    error: bool = False


@dataclass
class _NodeView:
    """What the allocator searches on one node, built once per node from the slices: the pools,
    their candidate devices (with their per-device facts and selector verdicts) and the first
    unsupported field in the pools' slices (`problem_known` once looked for)."""

    pools: list[Pool]
    candidates: list[list[Candidate]]
    problem: Unsupported | None = None
    problem_known: bool = False


@dataclass
class AllocationOutcome:
    """One `status.allocation` per claim, in input order, or a failure for all of them."""

    allocations: list[dict[str, Any]] = field(default_factory=list)
    failure: Failure | None = None
    node: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class Allocator:
    """Allocates claims on one node at a time against a fixed view of the cluster.

    Inputs are API objects as JSON dicts. `commit()` records an allocation so
    that later calls see its devices as in use.
    """

    def __init__(
        self,
        *,
        device_classes: Iterable[JSON],
        slices: Iterable[JSON],
        allocated_claims: Iterable[JSON] = (),
        taint_rules: Iterable[JSON] = (),
        features: Features | None = None,
        compiler: Compiler | None = None,
        new_share_id: Callable[[], str] | None = None,
    ) -> None:
        self.features = features or Features()
        self.classes: dict[str, JSON] = {
            str((c.get("metadata") or {}).get("name", "")): c for c in device_classes
        }
        rules = list(taint_rules) if self.features.device_taints else []
        self.slices: list[JSON] = apply_taint_rules(slices, rules)
        self.state: AllocatedState = allocated_state(allocated_claims)
        self.selectors = SelectorCache(compiler)
        self.new_share_id = new_share_id or (lambda: str(uuid.uuid4()))
        self._slices_by_node: dict[str, list[JSON]] = {}
        self._shared_slices: list[JSON] = []
        self._indexed: list[JSON] | None = None
        self._views: dict[tuple[str, tuple[tuple[str, str], ...]] | None, _NodeView] = {}
        self._index_slices()

    def _index_slices(self) -> None:
        """Slices by node, and a fresh cache of node views. Slices are a snapshot: the views
        are rebuilt when `self.slices` is replaced (a list changed in place is not noticed)."""
        self._indexed = self.slices
        self._slices_by_node = {}
        self._shared_slices = []
        self._views = {}
        for slice_obj in self.slices:
            node_name = (slice_obj.get("spec") or {}).get("nodeName")
            if node_name:
                self._slices_by_node.setdefault(str(node_name), []).append(slice_obj)
            else:
                self._shared_slices.append(slice_obj)

    def node_names(self) -> list[str]:
        """Nodes that have node-local slices, sorted."""
        if self._indexed is not self.slices:
            self._index_slices()
        return sorted(self._slices_by_node)

    def pools(self, node: Node | None) -> list[Pool]:
        """The pools the allocator searches on `node`, in search order."""
        return list(self._view(node).pools)

    def _view(self, node: Node | None) -> _NodeView:
        """The node's view, built on first use. Pools depend on the node only through its name
        and labels (node selectors), so those key the cache; the many Filter calls on one node
        (one per pod) then cost no pool gathering and share the candidates' selector verdicts."""
        if self._indexed is not self.slices:
            self._index_slices()
        key = None if node is None else (node.name, tuple(sorted(node.labels.items())))
        view = self._views.get(key)
        if view is None:
            local = self._slices_by_node.get(node.name, []) if node is not None else []
            pools = gather_pools([*local, *self._shared_slices], self.slices, node, self.features)
            view = _NodeView(pools, [pool_candidates(p) for p in pools])
            self._views[key] = view
        return view

    def search(self, claims: Sequence[JSON], node: Node | None) -> Search:
        """A prepared search (not yet run): explain uses it to look at single devices."""
        view = self._view(node)
        search = Search(
            claims=claims,
            node=node,
            pools=list(view.pools),
            classes=self.classes,
            state=self.state,
            features=self.features,
            selectors=self.selectors,
            new_share_id=self.new_share_id,
            candidates=view.candidates,
        )
        return search

    def allocate(self, claims: Sequence[JSON], node: Node | None) -> AllocationOutcome:
        """Allocate all `claims` together on `node` (all or nothing), like one scheduler Filter call."""
        node_name = node.name if node is not None else None
        missing = self._missing_class(claims)
        if missing:
            return AllocationOutcome(failure=Failure(missing), node=node_name)
        try:
            search = self.search(claims, node)
            unsupported = self._unsupported(claims, self._view(node))
            if unsupported is not None:
                # An error, not "unschedulable": we cannot tell what the scheduler would decide.
                return AllocationOutcome(failure=Failure(unsupported.message, error=True), node=node_name)
            search.prepare()
            done = search.run()
            if not done:
                if any(p.invalid for p in search.pools):
                    return AllocationOutcome(
                        failure=Failure("invalid resource pools were encountered"), node=node_name
                    )
                return AllocationOutcome(failure=Failure("cannot allocate all claims"), node=node_name)
            allocations = [self._allocation(plan_index, search, node) for plan_index in range(len(claims))]
        except SelectorError as err:
            return AllocationOutcome(failure=Failure(err.message, error=True), node=node_name)
        except (AllocationError, NodeSelectorError, NodeSelectorConflict, QuantityError) as err:
            return AllocationOutcome(failure=Failure(str(err), error=True), node=node_name)
        return AllocationOutcome(allocations=allocations, node=node_name)

    def _unsupported(self, claims: Sequence[JSON], view: _NodeView) -> Unsupported | None:
        """The first field we do not model in the claims or in the slices the search reads."""
        for claim in claims:
            found = claim_problems(claim)
            if found:
                return found[0]
        if not view.problem_known:
            view.problem = next(
                (
                    problem
                    for pool in view.pools
                    for slice_obj in (*pool.slices_on_node, *pool.slices_elsewhere)
                    for problem in slice_problems(slice_obj)[:1]
                ),
                None,
            )
            view.problem_known = True
        return view.problem

    def commit(self, claim: JSON, allocation: JSON) -> None:
        """Mark the devices of a new allocation as in use for later calls."""
        self.state.add_claim({"metadata": claim.get("metadata") or {}, "status": {"allocation": allocation}})

    def _missing_class(self, claims: Sequence[JSON]) -> str:
        # The scheduler checks classes before allocating; a missing one makes the
        # pod unschedulable until the class appears (not an error).
        for claim in claims:
            for request in claim_requests(claim):
                names = (
                    [request.get("exactly", {}).get("deviceClassName")]
                    if request.get("exactly")
                    else [sub.get("deviceClassName") for sub in request.get("firstAvailable") or []]
                )
                for name in names:
                    if name and name not in self.classes:
                        return (
                            f"resource claim {claim_ref(claim)}, request {request.get('name')}: "
                            f"device class {name} does not exist"
                        )
        return ""

    def _allocation(self, claim_index: int, search: Search, node: Node | None) -> dict[str, Any]:
        plan = search.plans[claim_index]
        requests = claim_requests(plan.claim)
        selected = {
            str(requests[i].get("name", "")): plan.requests[i][alt].request
            for i, alt in plan.selected.items()
        }
        devices: dict[str, Any] = {
            "results": [device_result(c, self.features.binding_conditions) for c in plan.chosen]
        }
        config = allocation_config(plan.claim, selected, self.classes)
        if config:
            devices["config"] = config
        allocation: dict[str, Any] = {"devices": devices}
        selector = node_selector(plan.chosen, node)
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation


def allocate(
    claims: Sequence[JSON],
    *,
    device_classes: Iterable[JSON],
    slices: Iterable[JSON],
    allocated_claims: Iterable[JSON] = (),
    taint_rules: Iterable[JSON] = (),
    node: Node | None = None,
    features: Features | None = None,
    compiler: Compiler | None = None,
) -> AllocationOutcome:
    """One-shot allocation of `claims` together on `node`."""
    allocator = Allocator(
        device_classes=device_classes,
        slices=slices,
        allocated_claims=allocated_claims,
        taint_rules=taint_rules,
        features=features,
        compiler=compiler,
    )
    return allocator.allocate(claims, node)
