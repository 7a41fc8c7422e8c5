"""Why a claim cannot be allocated: per request, per node and pool, which filter removed
how many devices (and which claims hold the devices in use).

The filters are the allocator's own checks, applied device by device without
the search; what is left over and still fails is a constraint conflict.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.capacity import CapacityRequestError, request_fits
from controller.allocation.nodes import Node
from controller.allocation.pools import DeviceID, pool_generation, pool_key
from controller.allocation.requests import ALL, alternatives, blocking_taint, claim_ref, claim_requests
from controller.allocation.search import Candidate, RequestPlan, Search
from controller.allocation.selectors import SelectorError, SelectorStep, request_steps
from controller.scheduler.allocator import SELECTOR_ERRS, Allocator, Prepared, RequestOption
from controller.scheduler.nodefilter import scheduling_error_message

JSON = Mapping[str, Any]

# Nodes listed one by one in text output by default (JSON lists every node).
NODE_LIMIT = 20
# Filter keys, in the order they are applied, with the words used in text output.
FILTERS: dict[str, str] = {
    "incomplete-pool": "incomplete pool",
    "invalid-pool": "invalid pool",
    "cel-error": "CEL error",
    "class-selector": "class selector",
    "request-selector": "request selector",
    "node-selection": "per-device node selection",
    "in-use": "in use",
    "capacity": "not enough capacity",
    "counters": "shared counters exhausted",
    "taint": "untolerated taint",
}


@dataclass
class PoolReport:
    pool: str
    devices: int = 0
    usable: int = 0
    removed: Counter[str] = field(default_factory=Counter)
    holders: Counter[str] = field(default_factory=Counter)
    cel_errors: list[str] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "devices": self.devices,
            "usable": self.usable,
            "removed": dict(self.removed),
            "inUseBy": dict(self.holders),
            "celErrors": self.cel_errors[:3],
            **({"note": self.note} if self.note else {}),
        }


@dataclass
class RequestReport:
    request: str
    device_class: str
    needed: str  # a count, or "all"
    pools: list[PoolReport] = field(default_factory=list)

    @property
    def usable(self) -> int:
        return sum(p.usable for p in self.pools)

    @property
    def removed(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for pool in self.pools:
            total.update(pool.removed)
        return total

    def to_json(self) -> dict[str, Any]:
        return {
            "request": self.request,
            "deviceClassName": self.device_class,
            "needed": self.needed,
            "usable": self.usable,
            "pools": [p.to_json() for p in self.pools],
        }


@dataclass
class NodeReport:
    node: str | None
    allocatable: bool
    verdict: str
    requests: list[RequestReport] = field(default_factory=list)
    # kube-scheduler's Filter errs here (not "unschedulable"): that fails the pod on every node.
    error: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "allocatable": self.allocatable,
            "verdict": self.verdict,
            "error": self.error,
            "requests": [r.to_json() for r in self.requests],
        }


@dataclass
class Explanation:
    claim: str
    allocated: bool
    nodes: list[NodeReport] = field(default_factory=list)

    @property
    def error_node(self) -> NodeReport | None:
        """The first node whose Filter errs: then the claim is allocated nowhere."""
        return next((n for n in self.nodes if n.error), None)

    @property
    def usable(self) -> bool:
        """Allocated, or kube-scheduler would allocate it now (some node fits and none errs)."""
        return self.allocated or (self.error_node is None and any(n.allocatable for n in self.nodes))

    @property
    def summary(self) -> str:
        """One line for an Event: the most telling node's verdict and filters."""
        if self.allocated:
            return f"claim {self.claim} is allocated"
        failed = self.error_node
        if failed is not None:
            reason = scheduling_error_message(failed.node or "(no node)", failed.verdict)
            return f"claim {self.claim} cannot be allocated: {reason}"
        if any(n.allocatable for n in self.nodes):
            nodes = ", ".join(str(n.node) for n in self.nodes if n.allocatable)
            return f"claim {self.claim} can be allocated on: {nodes}"
        if not self.nodes:
            return f"claim {self.claim}: no node offers devices"
        parts: list[str] = []
        totals: dict[str, Counter[str]] = {}
        # Pool by pool, as `RequestReport.removed` adds them, without a Counter per node.
        for node in self.nodes:
            for request in node.requests:
                total = totals.setdefault(request.request, Counter())
                for pool in request.pools:
                    total.update(pool.removed)
        for request_name, removed in totals.items():
            filters = ", ".join(f"{FILTERS[k]} removed {v}" for k, v in removed.most_common() if v)
            parts.append(f"request {request_name}: {filters or 'no devices published'}")
        verdicts = sorted({n.verdict for n in self.nodes})
        return (
            f"claim {self.claim} cannot be allocated on {len(self.nodes)} node(s): "
            + "; ".join(parts)
            + f" ({'; '.join(verdicts[:2])})"
        )

    def to_json(self) -> dict[str, Any]:
        failed = self.error_node
        return {
            "claim": self.claim,
            "allocated": self.allocated,
            "summary": self.summary,
            "schedulingError": {"node": failed.node, "message": failed.verdict} if failed else None,
            "nodes": [n.to_json() for n in self.nodes],
        }

    def to_text(self, node_limit: int | None = NODE_LIMIT) -> str:
        """The summary, then node by node; past `node_limit` nodes (None: no limit) one line
        counts the rest by verdict, so 1,000 nodes read as a page, not 3,000 lines."""
        lines = [self.summary]
        shown = self.nodes if node_limit is None else self.nodes[:node_limit]
        for node in shown:
            error = " (Filter error: fails the pod on every node)" if node.error else ""
            lines.append(f"node {node.node or '(none)'}: {node.verdict}{error}")
            for request in node.requests:
                lines.append(
                    f"  request {request.request} (class {request.device_class}, needs {request.needed}): "
                    f"{request.usable} usable"
                )
                for pool in request.pools:
                    removed = ", ".join(f"{FILTERS[k]}: {v}" for k, v in pool.removed.items() if v)
                    lines.append(
                        f"    pool {pool.pool}: {pool.devices} devices, {pool.usable} usable; "
                        f"{removed or '-'}"
                    )
                    if pool.holders:
                        lines.append(
                            "      in use by " + ", ".join(f"{c} ({n})" for c, n in pool.holders.items())
                        )
                    for message in pool.cel_errors[:3]:
                        lines.append(f"      {message}")
                    if pool.note:
                        lines.append(f"      {pool.note}")
        left_out = self.nodes[len(shown) :]
        if left_out:
            lines.append(left_out_line(left_out))
        return "\n".join(lines)


def left_out_line(nodes: Sequence[NodeReport]) -> str:
    """`... and 980 more node(s), not listed (--every-node lists them): 975 cannot allocate all
    claims; 5 allocatable`: the nodes past the limit, counted by verdict, most first."""
    verdicts = Counter(n.verdict + (" (Filter error)" if n.error else "") for n in nodes)
    counted = "; ".join(f"{count} {verdict}" for verdict, count in verdicts.most_common())
    return f"... and {len(nodes)} more node(s), not listed (--every-node lists them): {counted}"


def _pool_device_count(allocator: Allocator, driver: str, pool: str, generation: int) -> int:
    return sum(
        len((s.get("spec") or {}).get("devices") or [])
        for s in allocator.slices
        if pool_key(s) == (driver, pool) and pool_generation(s) == generation
    )


@dataclass(frozen=True)
class _Asked:
    """One alternative of one request of the claim, as every node's explanation reads it (built
    once per claim: at 1,000 nodes rebuilding it per node was most of explain's own work)."""

    key: tuple[int, int, int]  # (claim, request, alternative), as the search numbers them
    plan: RequestPlan | None  # None: no such class
    steps: list[SelectorStep]
    class_steps: int
    needed: str
    option: RequestOption | None = None  # Allocator.request_option of the plan's request


def _asked(allocator: Allocator, claim: JSON) -> list[_Asked | RequestReport]:
    """The claim's requests in order: what to explain, or the report of a missing class."""
    asked: list[_Asked | RequestReport] = []
    ref = claim_ref(claim)
    for request_index, request in enumerate(claim_requests(claim)):
        for alt_index, option in enumerate(alternatives(request)):
            device_class = allocator.classes.get(option.device_class_name)
            if device_class is None:
                asked.append(
                    RequestReport(
                        option.result_name,
                        option.device_class_name,
                        "-",
                        [PoolReport("-", note="no such class")],
                    )
                )
                continue
            plan = RequestPlan(request=option, device_class=device_class, num_devices=option.count)
            asked.append(
                _Asked(
                    key=(0, request_index, alt_index),
                    plan=plan,
                    steps=request_steps(device_class, option, ref),
                    class_steps=len((device_class.get("spec") or {}).get("selectors") or []),
                    needed="all" if option.allocation_mode == ALL else str(option.count),
                    option=allocator.request_option(option),
                )
            )
    return asked


class _NodeSearch:
    """The allocator's search on one node, made when a device needs looking at (a search holds
    the node's candidates, which a node whose devices the selectors all refuse never builds)."""

    def __init__(self, allocator: Allocator, claim: JSON, node: Node | None) -> None:
        self.allocator, self.claim, self.node = allocator, claim, node
        self.pools = allocator.pools(node)
        self._search: Search | None = None

    @property
    def search(self) -> Search:
        if self._search is None:
            self._search = self.allocator.search([self.claim], self.node)
        return self._search


def _explain_request(allocator: Allocator, on_node: _NodeSearch, asked: _Asked) -> RequestReport:
    plan, key, steps, class_steps = asked.plan, asked.key, asked.steps, asked.class_steps
    assert plan is not None
    request = plan.request
    report = RequestReport(
        request=request.result_name, device_class=request.device_class_name, needed=asked.needed
    )
    # Each device's first failing selector, kept by the allocator per node and selector
    # expressions: CEL runs once per device for every claim and node that asks.
    failing = allocator.first_failing(on_node.node, request, asked.option)
    for pool_index, pool in enumerate(on_node.pools):
        pool_report = PoolReport(pool=pool.id)
        report.pools.append(pool_report)
        if pool.incomplete or pool.invalid:
            generations = [
                pool_generation(s) for s in allocator.slices if pool_key(s) == (pool.driver, pool.name)
            ]
            count = _pool_device_count(allocator, pool.driver, pool.name, max(generations, default=0))
            pool_report.devices = count
            reason = "incomplete-pool" if pool.incomplete else "invalid-pool"
            pool_report.removed[reason] = count
            pool_report.note = pool.invalid_reason
            continue
        removed = pool_report.removed
        pool_failing = failing[pool_index]
        first = pool_failing[0] if pool_failing else None
        if first is not None and first != SELECTOR_ERRS and pool_failing.count(first) == len(pool_failing):
            # One selector step refuses every device (most pools at fleet size): counted in C.
            pool_report.devices = len(pool_failing)
            removed["class-selector" if first < class_steps else "request-selector"] = len(pool_failing)
            continue
        search = on_node.search
        for candidate, failed in zip(search.candidates[pool_index], pool_failing, strict=True):
            pool_report.devices += 1
            if failed is not None and failed != SELECTOR_ERRS:  # most devices: a selector said no
                removed["class-selector" if failed < class_steps else "request-selector"] += 1
                continue
            verdict = _device_verdict(search, key, plan, candidate, pool_report, steps, class_steps, failed)
            if verdict is None:
                pool_report.usable += 1
            else:
                removed[verdict] += 1
    return report


def _device_verdict(
    search: Search,
    key: tuple[int, int, int],
    plan: RequestPlan,
    candidate: Candidate,
    report: PoolReport,
    steps: list[SelectorStep],
    class_steps: int,
    failed: int | None,
) -> str | None:
    """The first filter that removes the device, or None when it is usable; `failed` is the
    first failing selector step as the allocator keeps it (`Allocator.first_failing`)."""
    device = candidate.device
    if failed == SELECTOR_ERRS:
        try:  # again, for the error's message (errors are not kept)
            failed = search.selectors.first_non_match(steps, candidate.device_id.driver, device)
        except SelectorError as err:
            report.cel_errors.append(err.message)
            return "cel-error"
    if failed is not None:
        return "class-selector" if failed < class_steps else "request-selector"
    if not search.selectable(key, plan, candidate):
        return "node-selection"
    device_id: DeviceID = candidate.device_id
    if not plan.request.admin_access and device_id in search.state.devices:
        report.holders[search.state.devices[device_id]] += 1
        return "in-use"
    if search.features.consumable_capacity:
        try:
            fits = request_fits(
                plan.request.capacity_requests, device, search.state.capacity.get(device_id, {}), {}
            )
        except CapacityRequestError:
            fits = False
        if not fits:
            for holder in search.state.shared.get(device_id, []):
                report.holders[holder] += 1
            return "capacity"
    if device.get("consumesCounters") and not _counters_fit(search, candidate):
        return "counters"
    if search.features.device_taints and blocking_taint(device, plan.request) is not None:
        return "taint"
    return None


def _counters_fit(search: Search, candidate: Candidate) -> bool:
    fits = search._take_counters(candidate)
    if fits:
        search._release_counters(candidate)
    return fits


def explain_on_node(
    allocator: Allocator,
    claim: JSON,
    node: Node | None,
    asked: list[_Asked | RequestReport] | None = None,
    prepared: Prepared | None = None,
) -> NodeReport:
    """The claim on one node; `asked` is `_asked(allocator, claim)` and `prepared`
    `allocator.prefilter([claim])` where the caller kept them (one per claim, for every node)."""
    outcome = (prepared or allocator.prefilter([claim])).allocate(node)
    node_name = node.name if node is not None else None
    if outcome.ok:
        verdict = "allocatable"
    else:
        assert outcome.failure is not None
        verdict = outcome.failure.message
    error = outcome.failure is not None and outcome.failure.error
    report = NodeReport(node=node_name, allocatable=outcome.ok, verdict=verdict, error=error)
    on_node = _NodeSearch(allocator, claim, node)
    for item in _asked(allocator, claim) if asked is None else asked:
        if isinstance(item, RequestReport):  # a missing class: the same report on every node
            report.requests.append(
                RequestReport(
                    item.request, item.device_class, item.needed, [PoolReport("-", note="no such class")]
                )
            )
        else:
            report.requests.append(_explain_request(allocator, on_node, item))
    if not outcome.ok and "cannot allocate" in verdict:
        short = [r for r in report.requests if r.needed != "all" and r.usable < int(r.needed)]
        if not short and report.requests:
            constraints = ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []
            names = ", ".join(
                f"matchAttribute {c['matchAttribute']}"
                if c.get("matchAttribute")
                else f"distinctAttribute {c.get('distinctAttribute')}"
                for c in constraints
            )
            report.verdict = (
                "constraint conflict: enough devices pass the filters, but not together "
                f"({names or 'result limit'})"
            )
    return report


def explain_claim(allocator: Allocator, claim: JSON, nodes: Sequence[Node] | None = None) -> Explanation:
    """Explain `claim` on the given nodes (default: every node that has slices, or no node)."""
    allocated = bool((claim.get("status") or {}).get("allocation"))
    explanation = Explanation(claim=claim_ref(claim), allocated=allocated)
    if allocated:
        return explanation
    candidates: Sequence[Node | None]
    if nodes:
        candidates = nodes
    else:
        names = allocator.node_names()
        candidates = [Node(n) for n in names] if names else [None]
    asked = _asked(allocator, claim)
    prepared = allocator.prefilter([claim])
    for node in candidates:
        explanation.nodes.append(explain_on_node(allocator, claim, node, asked, prepared))
    return explanation
