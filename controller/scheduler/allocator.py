"""Structured allocation, pure: API objects (JSON dicts) in, `status.allocation` out.

Semantics follow kube-scheduler's structured allocator (Kubernetes 1.37;
`Features.for_release` selects the rules of older releases). The search is in
`controller.allocation.search`; this module is the entry point:

    allocator = Allocator(device_classes=classes, slices=slices, allocated_claims=done)
    outcome = allocator.allocate([claim], Node("node-1"))
    outcome.allocations[0]  # {"devices": {"results": [...], "config": [...]}, "nodeSelector": ...}
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.constraints import SCALAR_TYPES, lookup_attribute
from controller.allocation.features import Features
from controller.allocation.nodes import Node
from controller.allocation.pools import Pool, gather_pools
from controller.allocation.requests import EXACT_COUNT, Request, alternatives, claim_ref, claim_requests
from controller.allocation.result import allocation_config, device_result
from controller.allocation.search import (
    Candidate,
    Search,
    has_plain_capacity,
    pool_candidates,
    random_share_id,
)
from controller.allocation.selectors import (
    Compiler,
    SelectorCache,
    SelectorError,
    SelectorStep,
    request_steps,
    step_expressions,
)
from controller.allocation.state import AllocatedState, allocated_state, apply_taint_rules
from controller.allocation.unsupported import (
    Unsupported,
    claim_problems,
    common_device,
    common_slice,
    slice_problems,
)
from controller.scheduler.outcome import (
    CANNOT_ALLOCATE,
    CANNOT_FIT,
    FITS,
    UNKNOWN,
    AllocationOutcome,
    Failure,
)
from controller.scheduler.prepared import Prepared

JSON = Mapping[str, Any]

__all__ = [
    "CANNOT_ALLOCATE",
    "CANNOT_FIT",
    "FITS",
    "UNKNOWN",
    "AllocationOutcome",
    "Allocator",
    "Failure",
    "Features",
    "Node",
    "Prepared",
    "Screen",
]


# A selector step errs on the device (kept apart from "fails at step i": an error is never a verdict).
SELECTOR_ERRS = _ERRS = -1
# A claim's requests, each as its alternatives (the firstAvailable subrequests, or the one request),
# each with its DeviceClass and selector expressions: what screening (`cannot_fit`, `cannot_err`)
# looks at.
_Option = tuple[Request, JSON, tuple[str, ...]]
RequestOption = _Option
_Shape = tuple[tuple[_Option, ...], ...]
_SHAPE_CACHE_SIZE = 4096
_RISKY_CACHE_SIZE = 256


@dataclass
class _NodeView:
    """What the allocator searches on one node, built once per node from the slices: the pools,
    their candidate devices (with their per-device facts and selector verdicts) and the first
    unsupported field in the pools' slices (`problem_known` once looked for).

    `first_failing`: per selector expressions (a request's `step_expressions`), each candidate's
    first failing step (None: every step matches; _ERRS: a step errs), pool by pool; CEL is pure
    over the device, so it is evaluated once per device for all claims of that shape. `plain`:
    nothing on the node makes a search err or fail other than by its devices' selectors, use and
    counts (see `Allocator._plain`)."""

    pools: list[Pool]
    # Each pool's devices, in the candidates' order (`pool_candidates`).
    devices: list[list[JSON]]
    problem: Unsupported | None = None
    problem_known: bool = False
    first_failing: dict[tuple[str, ...], list[list[int | None]]] = field(default_factory=dict)
    plain: bool | None = None
    untainted: bool | None = None  # no device with taints or binding conditions
    # Per matched attributes (Screen's matchAttribute counting), each candidate's values of
    # them (`_match_values`), pool by pool: the devices do not change while the view lives.
    match_values: dict[tuple[str, ...], list[list[tuple[object, ...] | None]]] = field(default_factory=dict)
    # Until the candidates are built: per selector expression, each device's verdict (None: not
    # evaluated), pool by pool; the candidates' memos (`Candidate.selected`) take them over.
    step_verdicts: dict[str, list[list[bool | None] | None]] = field(default_factory=dict)
    built: list[list[Candidate]] | None = None

    @property
    def candidates(self) -> list[list[Candidate]]:
        """The pools' candidates, built on first use: a node whose devices the selectors all
        refuse (most nodes for most claims at fleet size) is screened from its devices alone,
        and 8,000 candidates were a third of the per-node work of an explain at 1,000 nodes.
        The verdicts found before are kept in their memos, as if found on the candidates."""
        if self.built is None:
            built = [pool_candidates(pool) for pool in self.pools]
            for expression, pools in self.step_verdicts.items():
                key = (expression,)
                for candidates, verdicts in zip(built, pools, strict=True):
                    for candidate, verdict in zip(candidates, verdicts or (), strict=False):
                        if verdict is not None:
                            candidate.selected[key] = verdict
            for expressions, failing in self.first_failing.items():
                for candidates, firsts in zip(built, failing, strict=True):
                    for candidate, failed in zip(candidates, firsts, strict=True):
                        if failed != _ERRS:
                            candidate.selected[expressions] = failed is None
            self.built = built
        return self.built


def _pool_devices(pool: Pool) -> list[JSON]:
    """The pool's devices on the node, in `pool_candidates`' order."""
    return [
        device
        for slice_obj in pool.slices_on_node
        for device in (slice_obj.get("spec") or {}).get("devices") or []
    ]


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
        self.selectors = SelectorCache(compiler)
        # 1.34's v1alpha3 rules may select by class and CEL: the same classes and programs.
        self.slices: list[JSON] = apply_taint_rules(
            slices,
            rules,
            classes=self.classes,
            selectors=self.selectors,
            nil_selector_matches_all=self.features.taint_rule_without_selector_matches_all,
        )
        self.state: AllocatedState = allocated_state(allocated_claims)
        self.new_share_id = new_share_id or random_share_id
        self.commits = 0  # `commit` calls: a pending feasible node's allocation checks it (Prepared)
        self._slices_by_node: dict[str, list[JSON]] = {}
        self._shared_slices: list[JSON] = []
        self._indexed: list[JSON] | None = None
        self._views: dict[tuple[str, tuple[tuple[str, str], ...]] | None, _NodeView] = {}
        # Claims screened lately, by id (the claim is kept so that its id is not reused).
        self._shapes: dict[int, tuple[JSON, _Shape | None]] = {}
        # Screen.cannot_err's answers by the claims' expressions, then by node (kept, as above):
        # a Filter over 1,000 nodes asks each of them, claim after claim.
        self._error_free: dict[tuple[tuple[str, ...], ...], dict[int, tuple[Node | None, bool]]] = {}
        self._index_slices()

    def _index_slices(self) -> None:
        """Slices by node, and a fresh cache of node views. Slices are a snapshot: the views
        are rebuilt when `self.slices` is replaced (a list changed in place is not noticed)."""
        self._indexed = self.slices
        self._slices_by_node = {}
        self._shared_slices = []
        self._views = {}
        self._view_of_node: dict[int, tuple[Node | None, _NodeView]] = {}
        self._error_free = {}
        self._risky: dict[
            tuple[tuple[tuple[str, ...], ...], int], tuple[Sequence[Node | None], list[int]]
        ] = {}
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
        # By the Node object first (kept, so its id is not reused; Node is frozen): simulate and
        # explain ask for the same 1,000 nodes claim after claim.
        known = self._view_of_node.get(id(node))
        if known is not None and known[0] is node:
            return known[1]
        key = None if node is None else (node.name, tuple(sorted(node.labels.items())))
        view = self._views.get(key)
        if view is None:
            local = self._slices_by_node.get(node.name, []) if node is not None else []
            pools = gather_pools([*local, *self._shared_slices], self.slices, node, self.features)
            view = _NodeView(pools, [_pool_devices(p) for p in pools])
            self._views[key] = view
        if len(self._view_of_node) >= _SHAPE_CACHE_SIZE * 16:
            self._view_of_node.clear()
        self._view_of_node[id(node)] = (node, view)
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

    def prefilter(self, claims: Sequence[JSON]) -> Prepared:
        """The claims of one pod (allocated together), prepared once for Filter calls on many
        nodes (kube-scheduler's PreFilter); see `Prepared`."""
        return Prepared(self, claims)

    def allocate(self, claims: Sequence[JSON], node: Node | None) -> AllocationOutcome:
        """Allocate all `claims` together on `node` (all or nothing), like one scheduler Filter
        call. For many nodes, `prefilter(claims)` once and its `allocate(node)` per node."""
        return Prepared(self, claims).allocate(node)

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

    # ----- screening: Filter outcomes known without a search (see Screen) --------------------------

    def first_failing(
        self, node: Node | None, request: Request, option: RequestOption | None = None
    ) -> list[list[int | None]]:
        """For each of `pools(node)`'s candidates (`search(...).candidates`, pool by pool), the first
        selector step of `request` (its class's, then its own) the device fails: None when all
        match, SELECTOR_ERRS when one errs (evaluate again for the message). Kept per node view.
        `option`: `request_option(request)`, where the caller asks for many nodes."""
        return self._first_failing(self._view(node), option or self._option(request))

    def request_option(self, request: Request) -> RequestOption:
        """The request with its class and selector expressions, as `first_failing` keys it."""
        return self._option(request)

    def screen(self, claims: Sequence[JSON]) -> Screen:
        """Screening of `claims` (together) node by node; see `Screen`."""
        return Screen(self, claims)

    def cannot_fit(self, claims: Sequence[JSON], node: Node | None) -> bool:
        return self.screen(claims).cannot_fit(node)

    def cannot_err(self, claims: Sequence[JSON], node: Node | None) -> bool:
        return self.screen(claims).cannot_err(node)

    def _shape(self, claim: JSON) -> _Shape | None:
        """The claim's requests for screening, or None when screening does not cover it: a
        missing class, a field we do not model, an All request, or anything `prepare` refuses
        (those answers are the same on every node, and `allocate` gives them)."""
        cached = self._shapes.get(id(claim))
        if cached is not None and cached[0] is claim:
            return cached[1]
        shape: _Shape | None = None
        if not self._missing_class([claim]) and not claim_problems(claim):
            try:
                Search(
                    claims=[claim], node=None, pools=[], classes=self.classes, state=self.state,
                    features=self.features, selectors=self.selectors, candidates=[],
                ).prepare()  # fmt: skip
                options = [alternatives(request) for request in claim_requests(claim)]
                if all(option.allocation_mode == EXACT_COUNT for group in options for option in group):
                    shape = tuple(tuple(self._option(option) for option in group) for group in options)
            except Exception:  # prepare's refusals (and malformed fields): allocate reports them
                shape = None
        if len(self._shapes) >= _SHAPE_CACHE_SIZE:
            self._shapes.clear()
        self._shapes[id(claim)] = (claim, shape)
        return shape

    def _option(self, request: Request) -> _Option:
        device_class = self.classes[request.device_class_name]
        return request, device_class, step_expressions(device_class, request)

    def _first_failing(self, view: _NodeView, option: _Option) -> list[list[int | None]]:
        request, device_class, expressions = option
        found = view.first_failing.get(expressions)
        if found is None:
            # Step names only word error messages, which are not kept: any claim's will do.
            steps = request_steps(device_class, request, "")
            unbuilt = None
            if view.built is None:
                unbuilt = [
                    self._devices_first_failing(view, index, steps) for index in range(len(view.pools))
                ]
            if unbuilt is not None and all(f is not None for f in unbuilt):
                found = [f for f in unbuilt if f is not None]
            else:
                found = [self._pool_first_failing(candidates, steps) for candidates in view.candidates]
            view.first_failing[expressions] = found
        return found

    def _devices_first_failing(
        self, view: _NodeView, pool_index: int, steps: Sequence[SelectorStep]
    ) -> list[int | None] | None:
        """`_pool_first_failing` of one pool from its devices, before its candidates are built,
        each step's verdicts kept in `view.step_verdicts`; None where a step has no fast function
        or a device is undecided by it (the candidates then take over, with what was found)."""
        devices = view.devices[pool_index]
        if not devices:
            return []
        driver = view.pools[pool_index].driver
        checks: list[tuple[list[bool | None], Callable[[Mapping[str, Any]], bool]]] = []
        for step in steps:
            function = self.selectors.fast_function(step.expression, driver)
            if function is None:
                return None
            pools = view.step_verdicts.get(step.expression)
            if pools is None:
                pools = view.step_verdicts[step.expression] = [None] * len(view.pools)
            verdicts = pools[pool_index]
            if verdicts is None:
                verdicts = pools[pool_index] = [None] * len(devices)
            checks.append((verdicts, function))
        # Step by step over the devices that passed the steps before (a device's later steps run
        # only where its earlier ones matched, as device by device): a step not yet evaluated on
        # any of them runs over all of them in one `map`, and a step that all pass or all fail
        # is told by two scans in C. Pure functions: the order of the calls changes nothing.
        count = len(devices)
        found: list[int | None] = [None] * count
        passing: list[int] | range = range(count)
        try:
            for index, (verdicts, function) in enumerate(checks):
                if len(passing) == count and verdicts.count(None) == count:
                    verdicts[:] = map(bool, map(function, devices))
                else:
                    for offset in passing:
                        if verdicts[offset] is None:
                            verdicts[offset] = bool(function(devices[offset]))
                if len(passing) == count and False not in verdicts:
                    continue  # every device passes this step
                if len(passing) == count and True not in verdicts:
                    return [index] * count  # every device fails here
                still: list[int] = []
                for offset in passing:
                    if verdicts[offset]:
                        still.append(offset)
                    else:
                        found[offset] = index
                passing = still
                if not passing:
                    break
        except Exception:  # undecided here: the general path gives the verdict or the error
            return None
        return found

    def _pool_first_failing(
        self, candidates: Sequence[Candidate], steps: Sequence[SelectorStep]
    ) -> list[int | None]:
        """`_first_failing_step` of each of one pool's candidates (one driver). Where every step
        has a fast function (`SelectorCache.fast_function`), it is called on the devices directly:
        at 1,000 nodes the dispatch of `SelectorCache.matches` per device and step was most of
        this. A device it does not decide (it raises) takes `_first_failing_step`, which evaluates
        the same steps the general way (the verdicts kept so far are the same either way)."""
        if not candidates:
            return []
        driver = candidates[0].device_id.driver
        checks = []
        for step in steps:
            function = self.selectors.fast_function(step.expression, driver)
            if function is None:
                return [self._first_failing_step(c, steps) for c in candidates]
            checks.append(((step.expression,), function))
        whole = tuple(step.expression for step in steps)
        found: list[int | None] = []
        for candidate in candidates:
            memo, device = candidate.selected, candidate.device
            failed: int | None = None
            try:
                for index, (key, function) in enumerate(checks):
                    matched = memo.get(key)
                    if matched is None:
                        matched = memo[key] = bool(function(device))
                    if not matched:
                        failed = index
                        break
            except Exception:  # undecided here: the general path gives the verdict or the error
                found.append(self._first_failing_step(candidate, steps))
                continue
            memo[whole] = failed is None
            found.append(failed)
        return found

    def _first_failing_step(self, candidate: Candidate, steps: Sequence[SelectorStep]) -> int | None:
        """`first_non_match(steps)` on the device (_ERRS for an error), each step's verdict kept on
        the candidate under the one-expression key `(expression,)`: the class selector that every
        claim of a class shares then runs once per device, not once per claim shape. That key is
        also what the search's memo would use for a request with that one step, and means the same."""
        memo = candidate.selected
        failed: int | None = None
        for index, step in enumerate(steps):
            key = (step.expression,)
            matched = memo.get(key)
            if matched is None:
                try:
                    matched = self.selectors.matches(
                        step.expression, candidate.device_id.driver, candidate.device, step.where
                    )
                except SelectorError:
                    return _ERRS  # not kept: the next attempt evaluates (and fails) again
                memo[key] = matched
            if not matched:
                failed = index
                break
        # The search's own memo of the whole request's verdict (Search.selectable).
        memo[tuple(step.expression for step in steps)] = failed is None
        return failed

    def _plain(self, view: _NodeView) -> bool:
        """Complete, valid pools of node-local slices, no unsupported field, and devices with no
        per-device node selection, shared counters, sharing, or unparsed capacity: then a search
        there fails only for want of devices and cannot err (see `cannot_fit`, `cannot_err`)."""
        unknown = view.plain is None and not view.problem_known and view.built is None
        if unknown and all(_common_plain_pool(pool) for pool in view.pools):
            # One pass over the devices told both: no unmodelled field, plain devices.
            view.problem_known = True  # and view.problem stays None
            view.plain = all(
                not pool.incomplete
                and not pool.invalid
                and all((s.get("spec") or {}).get("nodeName") for s in pool.slices_on_node)
                for pool in view.pools
            )
        if view.plain is None:
            view.plain = self._unsupported([], view) is None and all(
                not pool.incomplete
                and not pool.invalid
                and all((s.get("spec") or {}).get("nodeName") for s in pool.slices_on_node)
                and _plain_devices(pool, None if view.built is None else view.built[index])
                for index, pool in enumerate(view.pools)
            )
        return view.plain

    def commit(self, claim: JSON, allocation: JSON) -> None:
        """Mark the devices of a new allocation as in use for later calls."""
        self.commits += 1
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

    def _allocation(
        self, claim_index: int, search: Search, selector: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The claim's `status.allocation` from a finished search; `selector`: `node_selector` of
        its chosen devices."""
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
        if selector is not None:
            allocation["nodeSelector"] = selector
        return allocation


class Screen:
    """Filter outcomes of some claims (allocated together) known without a search, node by node.

    At fleet size most Filter calls are on nodes that cannot fit the claim (no device of the
    model, or all in use); `Allocator.allocate` asks `cannot_fit` first, and a Filter over many
    nodes that only needs the first feasible one skips the nodes that `cannot_err` after it. Both
    are exact (never True where the search would say otherwise) and conservative (False in any
    case they do not cover). The per-claim work (shapes) is done once per Screen.
    """

    def __init__(self, allocator: Allocator, claims: Sequence[JSON]) -> None:
        self.allocator = allocator
        shapes = [allocator._shape(claim) for claim in claims]
        self.shapes: list[_Shape] | None = (
            None if not shapes or any(s is None for s in shapes) else [s for s in shapes if s is not None]
        )
        self.key = (
            tuple(option[2] for shape in self.shapes for options in shape for option in options)
            if self.shapes is not None
            else ()
        )
        # The one request `certainly_fits` counts devices for, when the claims are that simple,
        # and the attributes its devices must share (matchAttribute constraints on it).
        self._counted: _Option | None = None
        self._match: tuple[str, ...] = ()
        if self.shapes is not None and len(self.shapes) == 1:
            requests = self.shapes[0]
            if len(requests) == 1 and len(requests[0]) == 1:
                request = requests[0][0][0]
                simple = not request.admin_access and not request.tolerations
                match = _matched_attributes(claims[0], request)
                if simple and request.capacity_requests is None and match is not None:
                    self._counted, self._match = requests[0][0], match
        self._count = self._counted[0].count if self._counted is not None else 0
        if allocator._indexed is not allocator.slices:
            allocator._index_slices()  # new slices: the answers kept for the old ones go
        self._error_free = allocator._error_free.setdefault(self.key, {})

    def cannot_fit(self, node: Node | None) -> bool:
        """True when `allocate(claims, node)` fails with CANNOT_ALLOCATE (no error): no device of
        the node that is free (or any, for admin access) passes the selectors of any alternative of
        the first claim's first request, and nothing else there could err first."""
        if self.shapes is None or not self.shapes[0]:
            return False  # not covered, or a first claim without requests (allocated trivially)
        allocator = self.allocator
        view = allocator._view(node)
        if not allocator._plain(view):
            return False
        in_use = allocator.state.devices
        for option in self.shapes[0][0]:
            admin = option[0].admin_access
            failing_steps = allocator._first_failing(view, option)
            for pool_index, failing in enumerate(failing_steps):
                if None not in failing and _ERRS not in failing:
                    continue  # a selector refuses every device of the pool (two scans in C)
                for candidate, failed in zip(view.candidates[pool_index], failing, strict=True):
                    if failed is not None and failed != _ERRS:
                        continue
                    if not admin and candidate.device_id in in_use:
                        continue  # the search skips it before its selectors
                    return False  # a free device passes (or errs): only a search can tell
        return True

    def certainly_fits(self, node: Node | None) -> bool:
        """True when `allocate(claims, node)` succeeds: one claim of one ExactCount request (no
        firstAvailable, admin access, capacity requests or tolerations; constraints only
        matchAttribute) on a node where `cannot_err` holds, no device has taints or binding
        conditions, and at least the request's count of free devices pass its selectors (and,
        under matchAttribute, share one scalar value of each matched attribute): the search,
        which tries every combination before it gives up, finds them."""
        return self._counted is not None and self.classify(node) == FITS

    def classify(self, node: Node | None) -> int:
        """FITS where `certainly_fits`, CANNOT_FIT where `cannot_fit`, else UNKNOWN: both
        answers from one pass over the node's devices (a Filter over 1,000 nodes per pod)."""
        option = self._counted
        if option is None:
            return CANNOT_FIT if self.cannot_fit(node) else UNKNOWN
        allocator = self.allocator
        view = allocator._view(node)
        if not allocator._plain(view):
            return UNKNOWN
        in_use, shared = allocator.state.devices, allocator.state.capacity
        passing, errs, count, match = 0, False, self._count, self._match
        enough = False  # `count` free passing devices (that share the matched attributes' values)
        groups: dict[tuple[object, ...], int] = {}
        failing_steps = allocator._first_failing(view, option)
        match_values: list[list[tuple[object, ...] | None]] = []
        if match:
            known = view.match_values.get(match)
            if known is None:
                known = [[_match_values(c, match) for c in pool] for pool in view.candidates]
                view.match_values[match] = known
            match_values = known
        for pool_index, failing in enumerate(failing_steps):
            if None not in failing and _ERRS not in failing:
                continue  # a selector refuses every device of the pool: nothing counts there
            for offset, (candidate, failed) in enumerate(
                zip(view.candidates[pool_index], failing, strict=True)
            ):
                if failed is None:
                    if candidate.device_id not in in_use and candidate.device_id not in shared:
                        passing += 1
                        if not match:
                            enough = passing >= count
                        else:
                            values = match_values[pool_index][offset]
                            if values is not None:
                                groups[values] = members = groups.get(values, 0) + 1
                                enough = members >= count
                        if enough:
                            break
                    elif candidate.device_id not in in_use:
                        errs = True  # shared: only a search can tell
                elif failed == _ERRS and candidate.device_id not in in_use:
                    errs = True
            if enough and count > 0:
                break  # enough to tell: the rest of the node cannot make it CANNOT_FIT
        if passing == 0 and not errs:
            return CANNOT_FIT  # as cannot_fit: no free device passes (none errs)
        if (enough or (passing >= count and not match)) and self.cannot_err(node):
            if view.untainted is None:
                view.untainted = not any(
                    c.device.get("taints") or c.device.get("bindingConditions")
                    for candidates in view.candidates
                    for c in candidates
                )
            if view.untainted:
                return FITS
        return UNKNOWN

    def cannot_err(self, node: Node | None) -> bool:
        """True when `allocate(claims, node)` returns no error, whatever it allocates: claims of
        ExactCount requests that prepare cleanly, a plain node (devices consume no counters and
        are not shared, slices node-local), and every selector evaluating cleanly on every device."""
        if self.shapes is None:
            return False
        by_node = self._error_free
        found = by_node.get(id(node))
        if found is not None and found[0] is node:
            return found[1]
        allocator = self.allocator
        features = allocator.features
        if features.consumable_capacity and features.capacity_check_at_result_index:
            return False  # 1.34.4 checks capacity on another device of the slice, and may crash
        view = allocator._view(node)
        known = allocator._plain(view) and not any(
            _ERRS in failing
            for shape in self.shapes
            for options in shape
            for option in options
            for failing in allocator._first_failing(view, option)
        )
        if len(by_node) >= _SHAPE_CACHE_SIZE * 16:
            by_node.clear()
        by_node[id(node)] = (node, known)
        return known

    def risky_positions(self, nodes: Sequence[Node | None]) -> list[int]:
        """The positions in `nodes` where `cannot_err` is False (all of them for claims screening
        does not cover), kept per node list (by identity: a simulation asks with its one list)."""
        if self.shapes is None:
            return list(range(len(nodes)))
        cache = self.allocator._risky
        found = cache.get((self.key, id(nodes)))
        if found is not None and found[0] is nodes:
            return found[1]
        positions = [i for i, node in enumerate(nodes) if not self.cannot_err(node)]
        if len(cache) >= _RISKY_CACHE_SIZE:
            cache.clear()  # callers with a fresh list each time (the reconciler) gain nothing here
        cache[(self.key, id(nodes))] = (nodes, positions)
        return positions


def _common_plain_pool(pool: Pool) -> bool:
    """True when no slice of the pool (on the node or elsewhere) holds a field we do not model,
    told the cheap way (`common_slice`, `common_device`), and the devices on the node are plain
    (`_plain_devices`); False: the exact checks decide, one by one."""
    for slice_obj in pool.slices_on_node:
        spec = slice_obj.get("spec") or {}
        if not common_slice(spec):
            return False
        devices = spec.get("devices") or []
        if devices and spec.get("perDeviceNodeSelection"):
            return False
        for device in devices:
            if (
                not common_device(device)
                or device.get("allowMultipleAllocations")
                or not has_plain_capacity(device)
            ):
                return False
    for slice_obj in pool.slices_elsewhere:
        spec = slice_obj.get("spec") or {}
        if not common_slice(spec) or not all(common_device(d) for d in spec.get("devices") or []):
            return False
    return True


def _plain_devices(pool: Pool, candidates: Sequence[Candidate] | None) -> bool:
    """No device of the pool has per-device node selection, consumes counters, has a capacity
    that is not plain (`has_plain_capacity`) or allows multiple allocations: from the built
    candidates' facts, else from the slices and devices themselves (the same facts)."""
    if candidates is not None:
        return all(
            not c.per_device_node_selection
            and not c.consumes_counters
            and c.plain_capacity
            and not c.device.get("allowMultipleAllocations")
            for c in candidates
        )
    for slice_obj in pool.slices_on_node:
        spec = slice_obj.get("spec") or {}
        devices = spec.get("devices") or []
        if devices and spec.get("perDeviceNodeSelection"):
            return False
        for device in devices:
            if (
                device.get("consumesCounters")
                or not has_plain_capacity(device)
                or device.get("allowMultipleAllocations")
            ):
                return False
    return True


def _matched_attributes(claim: JSON, request: Request) -> tuple[str, ...] | None:
    """The attributes of the claim's matchAttribute constraints that cover `request` (its only
    request, or the one subrequest of its firstAvailable list), or None when it has a
    constraint of another kind (which the counting of `Screen.classify` does not model)."""
    attributes: list[str] = []
    for constraint in ((claim.get("spec") or {}).get("devices") or {}).get("constraints") or []:
        names = constraint.get("requests") or []
        attribute = constraint.get("matchAttribute")
        if not attribute or constraint.get("distinctAttribute"):
            return None
        # As the constraint's own check: the request's name, or "request/subrequest".
        if not names or request.base_name in names or (request.parent and request.result_name in names):
            attributes.append(str(attribute))
    return tuple(attributes)


def _match_values(candidate: Candidate, attributes: tuple[str, ...]) -> tuple[object, ...] | None:
    """The device's values of the matched attributes, None where one is missing or not a plain
    scalar: MatchAttribute then refuses the device (or, alone, may take it; the search tells)."""
    values: list[object] = []
    for name in attributes:
        value = lookup_attribute(candidate.device, candidate.device_id, name)
        if value is None or value[0] not in SCALAR_TYPES or type(value[1]) not in (str, int, bool):
            return None
        values.append(value)
    return tuple(values)


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
