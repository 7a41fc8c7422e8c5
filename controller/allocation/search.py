"""The structured allocator's depth-first search with backtracking.

Claims are allocated together on one node: claim by claim, request by
request, device by device, trying candidates in pool → slice → device order
and taking the first complete solution, exactly like kube-scheduler. Devices
chosen for one request are searched in increasing position, so the same set
is never tried twice in another order.

Size: one module because the search, its backtracking and its undo share one state
and mirror one upstream file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.capacity import CapacityRequestError, consumed_capacity, request_fits
from controller.allocation.constraints import Constraint, build_constraints
from controller.allocation.features import Features
from controller.allocation.nodes import Node, node_matches
from controller.allocation.pools import DeviceID, Pool
from controller.allocation.requests import ALL, EXACT_COUNT, Request, alternatives, blocking_taint, claim_ref
from controller.allocation.result import ChosenDevice
from controller.allocation.selectors import SelectorCache, request_steps, step_expressions
from controller.allocation.state import AllocatedState
from dracommon.quantity import Quantity, QuantityError

JSON = Mapping[str, Any]

MAX_RESULTS = 32  # AllocationResultsMaxSize


class AllocationError(Exception):
    """Allocation cannot proceed: the scheduler reports an error (and retries) instead
    of "unschedulable". Examples: CEL errors, All-mode on an incomplete pool."""


class _MaxResultsExceeded(Exception):
    pass


@dataclass(frozen=True)
class Candidate:
    device_id: DeviceID
    device: JSON
    slice: JSON
    pool: Pool
    # Facts about the device that every Filter call asks, read once (`candidate`).
    consumes_counters: bool
    per_device_node_selection: bool
    plain_capacity: bool  # see `has_plain_capacity`
    allows_multiple: bool  # allowMultipleAllocations (sharing, under DRAConsumableCapacity)
    tainted: bool  # has taints (which a request may not tolerate)
    # Selector outcomes on this device by the expressions evaluated (a request's steps): CEL
    # is pure over the device, so a node's cached candidates need each verdict only once.
    # Errors are not kept: they abort the attempt, and the next one evaluates (and fails) again.
    selected: dict[tuple[str, ...], bool] = field(default_factory=dict, compare=False)


@dataclass
class RequestPlan:
    request: Request
    device_class: JSON
    num_devices: int
    all_devices: list[Candidate] | None = None  # only for allocationMode All
    expressions: tuple[str, ...] | None = None  # step_expressions, the key of Candidate.selected


@dataclass
class ClaimPlan:
    claim: JSON
    # per main request: its alternatives (one, or the firstAvailable subrequests)
    requests: list[list[RequestPlan]]
    constraints: list[Constraint]
    chosen: list[ChosenDevice] = field(default_factory=list)
    selected: dict[int, int] = field(default_factory=dict)  # request index -> alternative index


def random_share_id() -> str:
    """A new share ID as kube-scheduler makes one: a random UUID."""
    import uuid  # here: its import (with `platform`, ~2 ms) is for the few searches that share

    return str(uuid.uuid4())


def has_plain_capacity(device: JSON) -> bool:
    """No capacity has a requestPolicy and every value parses: then a request without capacity
    requests fits while nothing of the device is allocated or being allocated (each capacity is
    taken whole, which equals its value), exactly what `request_fits` finds the long way."""
    capacities = device.get("capacity") or {}
    try:
        for capacity in capacities.values():
            if capacity.get("requestPolicy") is not None:
                return False
            Quantity.from_json(capacity.get("value", "0"))
    except (QuantityError, AttributeError, TypeError):
        return False  # the general path reports it as it always did
    return True


_new_object = object.__new__
_new_tuple = tuple.__new__


def candidate_of(pool: Pool, slice_obj: JSON, device: JSON, per_device: bool | None = None) -> Candidate:
    """The device as a candidate; `per_device`: the slice's perDeviceNodeSelection, where the
    caller read it once for all of the slice's devices."""
    if per_device is None:
        per_device = bool((slice_obj.get("spec") or {}).get("perDeviceNodeSelection"))
    # Built without the frozen dataclass's __init__, whose object.__setattr__ per field was
    # most of a node view's cost at fleet size (8,000 devices); the fields are the same.
    candidate: Candidate = _new_object(Candidate)
    candidate.__dict__.update(
        device_id=_new_tuple(DeviceID, (pool.driver, pool.name, str(device.get("name", "")))),
        device=device,
        slice=slice_obj,
        pool=pool,
        consumes_counters=bool(device.get("consumesCounters")),
        per_device_node_selection=per_device,
        plain_capacity=has_plain_capacity(device),
        allows_multiple=bool(device.get("allowMultipleAllocations")),
        tainted=bool(device.get("taints")),
        selected={},
    )
    return candidate


def pool_candidates(pool: Pool) -> list[Candidate]:
    candidates: list[Candidate] = []
    for slice_obj in pool.slices_on_node:
        spec = slice_obj.get("spec") or {}
        per_device = bool(spec.get("perDeviceNodeSelection"))
        candidates.extend(candidate_of(pool, slice_obj, d, per_device) for d in spec.get("devices") or [])
    return candidates


def available_on_node(candidate: Candidate, node: Node | None) -> bool:
    """Per-device node selection: in a slice with `perDeviceNodeSelection`, each device names
    its own node(s); other slices were already matched to the node as a whole (gather_pools)."""
    if not candidate.per_device_node_selection:
        return True
    device = candidate.device
    return node_matches(
        node, str(device.get("nodeName") or ""), bool(device.get("allNodes")), device.get("nodeSelector")
    )


def all_mode_blocker(pool: Pool) -> str | None:
    """Why this pool stops an `All` request from being sized on its node, or None.

    Any incomplete or invalid pool on the node counts, whatever its devices: "all" is not
    known then, and the scheduler reports an error (not "unschedulable")."""
    if pool.incomplete:
        return f"resource pool {pool.id} is currently being updated"
    if pool.invalid:
        return f"resource pool {pool.id} is currently invalid"
    return None


class Search:
    """One allocation attempt for a set of claims on one node."""

    def __init__(
        self,
        *,
        claims: Sequence[JSON],
        node: Node | None,
        pools: list[Pool],
        classes: Mapping[str, JSON],
        state: AllocatedState,
        features: Features,
        selectors: SelectorCache,
        new_share_id: Callable[[], str] | None = None,
        candidates: list[list[Candidate]] | None = None,
    ) -> None:
        """`candidates`: `pool_candidates` of each of `pools`, when the caller keeps them (the
        Allocator does, per node); the search only reads them (and their selector memo)."""
        self.claims = list(claims)
        self.node = node
        self.pools = pools
        self.classes = classes
        self.state = state
        self.features = features
        self.selectors = selectors
        self.new_share_id = new_share_id or random_share_id
        self.candidates = candidates if candidates is not None else [pool_candidates(p) for p in pools]
        self._matches: dict[tuple[DeviceID, int, int, int], bool] = {}
        # device -> indexes of claims of this search that hold it
        self._allocating: dict[DeviceID, set[int]] = {}
        self._allocating_capacity: dict[DeviceID, dict[str, Quantity]] = {}
        self._available_counters: dict[str, dict[str, dict[str, Quantity]]] = {}
        self._consumed_counters: dict[str, dict[str, dict[str, Quantity]]] = {}
        self.plans: list[ClaimPlan] = []

    # ----- preparation -------------------------------------------------------------

    def prepare(self) -> None:
        """Check every request and size it; raises AllocationError as the scheduler would."""
        for claim_index, claim in enumerate(self.claims):
            ref = claim_ref(claim)
            plans: list[list[RequestPlan]] = []
            minimum = 0
            for request_index, request in enumerate(
                ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
            ):
                options = alternatives(request)
                if options[0].parent and not self.features.prioritized_list:
                    raise AllocationError(
                        f"claim {ref}, request {request.get('name')}: has subrequests, "
                        "but the DRAPrioritizedList feature is disabled"
                    )
                if not self.features.consumable_capacity:
                    for option in options:
                        if option.capacity_requests is not None:
                            raise AllocationError(
                                f"claim {ref}, request {option.result_name}: has capacity requests, "
                                "but the DRAConsumableCapacity feature is disabled"
                            )
                request_plans = [
                    self._plan_request(claim_index, request_index, alt_index, option)
                    for alt_index, option in enumerate(options)
                ]
                plans.append(request_plans)
                minimum += min(p.num_devices for p in request_plans)
            if minimum > MAX_RESULTS:
                raise AllocationError(
                    f"claim {ref}: number of requested devices {minimum} exceeds the claim limit "
                    f"of {MAX_RESULTS}"
                )
            try:
                constraints = build_constraints(claim, self.features)
            except ValueError as err:
                raise AllocationError(f"claim {ref}, {err}") from err
            self.plans.append(ClaimPlan(claim=claim, requests=plans, constraints=constraints))
        # Like kube-scheduler, the search starts with a fresh "device matches request"
        # cache: what sizing All requests cached (under the keys of its release) is not
        # seen by the search.
        self._matches.clear()

    def node_independent(self) -> bool:
        """True when `prepare` reads nothing of the node: no alternative of any request is in
        allocation mode All (sizing one reads the node's devices). Then the plans of one
        `prepare` serve every node (`prepared_on`)."""
        return all(
            option.allocation_mode == EXACT_COUNT
            for claim in self.claims
            for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []
            for option in alternatives(request)
        )

    def prepared_on(self, plans: Sequence[ClaimPlan]) -> None:
        """`prepare`, with the plans of an earlier `prepare` of the same claims (where
        `node_independent`): their request plans are only read by the search, so they are
        shared; what a search changes (the chosen devices, the constraints' values) is new."""
        features = self.features
        self.plans = [
            ClaimPlan(claim=p.claim, requests=p.requests, constraints=build_constraints(p.claim, features))
            for p in plans
        ]
        self._matches.clear()

    def _plan_request(
        self, claim_index: int, request_index: int, alt_index: int, request: Request
    ) -> RequestPlan:
        ref = claim_ref(self.claims[claim_index])
        for i, selector in enumerate(request.selectors):
            if not (selector.get("cel") or {}).get("expression"):
                raise AllocationError(
                    f"claim {ref}, request {request.name}, selector #{i}: CEL expression empty "
                    "(unsupported selector type?)"
                )
        if request.has_admin_access_field and not self.features.admin_access:
            raise AllocationError(
                f"claim {ref}, request {request.name}: admin access is requested, but the feature is disabled"
            )
        if not request.device_class_name:
            raise AllocationError(
                f"claim {ref}, request {request.name}: missing device class name (unsupported request type?)"
            )
        device_class = self.classes.get(request.device_class_name)
        if device_class is None:
            raise AllocationError(
                f"claim {ref}, request {request.name}: could not retrieve device class "
                f"{request.device_class_name}: not found"
            )
        plan = RequestPlan(request=request, device_class=device_class, num_devices=request.count)
        if request.allocation_mode == EXACT_COUNT:
            return plan
        if request.allocation_mode != ALL:
            raise AllocationError(
                f"claim {ref}, request {request.name}: unsupported count mode {request.allocation_mode}"
            )
        devices: list[Candidate] = []
        key = (claim_index, request_index, self._sizing_index(request, alt_index))
        for pool_index, pool in enumerate(self.pools):
            blocker = all_mode_blocker(pool)
            if blocker is not None:
                raise AllocationError(
                    f"claim {ref}, request {request.name}: asks for all devices, but {blocker}"
                )
            for candidate in self.candidates[pool_index]:
                if not self.selectable(key, plan, candidate):
                    continue
                if self.features.consumable_capacity and not self._capacity_fits(plan.request, candidate):
                    continue
                devices.append(candidate)
        plan.all_devices = devices
        plan.num_devices = len(devices)
        return plan

    def _sizing_index(self, request: Request, alt_index: int) -> int:
        """The subrequest index under which sizing an All request caches device selection.

        1.34/1.35 still had the previous subrequest's index at hand while sizing one
        (`Features.all_subrequest_selects_as_previous`); the cache is first-write-wins, so
        an All subrequest at index 1 after one at index 0 gets the devices index 0 selected.
        """
        if request.parent and self.features.all_subrequest_selects_as_previous:
            return max(alt_index - 1, 0)
        return alt_index

    # ----- per-device checks (also used by explain) -------------------------------

    def selectable(self, key: tuple[int, int, int], plan: RequestPlan, candidate: Candidate) -> bool:
        """Class selectors, request selectors and per-device node selection (cached)."""
        device = candidate.device
        if not self.features.binding_conditions and device.get("bindingConditions"):
            return False
        cache_key = (candidate.device_id, *key)
        cached = self._matches.get(cache_key)
        if cached is not None:
            return cached
        if plan.expressions is None:
            plan.expressions = step_expressions(plan.device_class, plan.request)
        result = candidate.selected.get(plan.expressions)
        if result is None:
            steps = request_steps(plan.device_class, plan.request, claim_ref(self.claims[key[0]]))
            result = self.selectors.first_non_match(steps, candidate.device_id.driver, device) is None
            candidate.selected[plan.expressions] = result
        if result:
            result = available_on_node(candidate, self.node)
        self._matches[cache_key] = result
        return result

    def in_use(self, device_id: DeviceID) -> bool:
        return device_id in self.state.devices or bool(self._allocating.get(device_id))

    def _capacity_fits(self, request: Request, candidate: Candidate) -> bool:
        if (
            candidate.plain_capacity
            and not request.capacity_requests
            and candidate.device_id not in self.state.capacity
            and candidate.device_id not in self._allocating_capacity
        ):
            return True  # what request_fits finds for it (has_plain_capacity), without the quantities
        try:
            return request_fits(
                request.capacity_requests,
                candidate.device,
                self.state.capacity.get(candidate.device_id, {}),
                self._allocating_capacity.get(candidate.device_id, {}),
            )
        except CapacityRequestError:
            return False

    def _misindexed_capacity_fits(self, request: Request, candidate: Candidate, device_index: int) -> bool:
        """1.34.4's allocateDevice checks capacity on the device of the candidate's slice at the
        position of this device in the request's results (its `r.deviceIndex`), not on the
        candidate (Features.capacity_check_at_result_index); past the slice's end it panics."""
        if not self.features.capacity_check_at_result_index:
            return True
        devices = (candidate.slice.get("spec") or {}).get("devices") or []
        if device_index >= len(devices):
            raise AllocationError(
                f"kube-scheduler 1.34.4 crashes here (index out of range in CmpRequestOverCapacity): device "
                f"#{device_index} of request {request.name} checked against slice "
                f"{(candidate.slice.get('metadata') or {}).get('name')} of {len(devices)} device(s)"
            )
        return self._capacity_fits(
            request, candidate_of(candidate.pool, candidate.slice, devices[device_index])
        )

    def _allow_multiple(self, candidate: Candidate) -> bool:
        return self.features.consumable_capacity and candidate.allows_multiple

    # ----- shared counters -----------------------------------------------------------

    def _available(self, pool: Pool) -> dict[str, dict[str, Quantity]]:
        available = self._available_counters.get(pool.id)
        if available is None:
            available = {name: dict(counters) for name, counters in pool.counter_sets.items()}
            for slice_obj in [*pool.slices_on_node, *pool.slices_elsewhere]:
                for device in (slice_obj.get("spec") or {}).get("devices") or []:
                    if not self.state.is_allocated(
                        DeviceID(pool.driver, pool.name, str(device.get("name", "")))
                    ):
                        continue
                    self._add_consumption(available, device, sign=-1)
            self._available_counters[pool.id] = available
        return available

    @staticmethod
    def _add_consumption(target: dict[str, dict[str, Quantity]], device: JSON, sign: int) -> None:
        for consumption in device.get("consumesCounters") or []:
            counters = target.setdefault(str(consumption.get("counterSet", "")), {})
            for name, value in (consumption.get("counters") or {}).items():
                amount = Quantity.from_json((value or {}).get("value", "0"))
                if sign < 0:
                    if name in counters:  # counters missing from the set are ignored
                        counters[name] = counters[name] - amount
                else:
                    counters[name] = counters[name] + amount if name in counters else amount

    def _take_counters(self, candidate: Candidate) -> bool:
        available = self._available(candidate.pool)
        consumed = self._consumed_counters.setdefault(candidate.pool.id, {})
        self._add_consumption(consumed, candidate.device, sign=1)
        for set_name, counters in available.items():
            used = consumed.get(set_name, {})
            for name, value in counters.items():
                if name in used and value < used[name]:
                    self._release_counters(candidate)
                    return False
        return True

    def _reject_after_counters(self, candidate: Candidate, counters_taken: bool) -> None:
        if counters_taken and not self.features.rejected_device_keeps_counters:
            self._release_counters(candidate)

    def _release_counters(self, candidate: Candidate) -> None:
        consumed = self._consumed_counters.setdefault(candidate.pool.id, {})
        for consumption in candidate.device.get("consumesCounters") or []:
            counters = consumed.setdefault(str(consumption.get("counterSet", "")), {})
            for name, value in (consumption.get("counters") or {}).items():
                if name in counters:
                    counters[name] = counters[name] - Quantity.from_json((value or {}).get("value", "0"))

    # ----- the search ----------------------------------------------------------------

    def run(self) -> bool:
        """True when all claims got devices (results are in self.plans)."""
        return self._claim(0)

    def _claim(self, claim_index: int) -> bool:
        if claim_index >= len(self.plans):
            return True
        try:
            return self._request(claim_index, 0)
        except _MaxResultsExceeded:
            return False

    def _request(self, claim_index: int, request_index: int) -> bool:
        plan = self.plans[claim_index]
        if request_index >= len(plan.requests):
            return self._claim_next(claim_index)
        options = plan.requests[request_index]
        if not options[0].request.parent:
            return self._device(claim_index, request_index, 0, 0, (0, 0))
        # firstAvailable: the first subrequest that leads to a full solution wins.
        all_exceeded = True
        for alt_index in range(len(options)):
            try:
                success = self._device(claim_index, request_index, alt_index, 0, (0, 0))
            except _MaxResultsExceeded:
                continue
            all_exceeded = False
            if success:
                plan.selected[request_index] = alt_index
                return True
        if all_exceeded:
            raise _MaxResultsExceeded()
        return False

    def _claim_next(self, claim_index: int) -> bool:
        try:
            return self._claim(claim_index + 1)
        except _MaxResultsExceeded:
            return False

    def _device(
        self, claim_index: int, request_index: int, alt_index: int, device_index: int, start: tuple[int, int]
    ) -> bool:
        plan = self.plans[claim_index]
        request_plan = plan.requests[request_index][alt_index]
        request = request_plan.request
        if request.allocation_mode == ALL and not request_plan.all_devices:
            return False
        if device_index >= request_plan.num_devices:
            plan.selected[request_index] = alt_index
            return self._request(claim_index, request_index + 1)
        if len(plan.chosen) + request_plan.num_devices - device_index > MAX_RESULTS:
            raise _MaxResultsExceeded()

        if request_plan.all_devices is not None:
            candidate = request_plan.all_devices[device_index]
            undo = self._take(claim_index, request_plan, candidate, must=True, device_index=device_index)
            if undo is None:
                return False
            next_alt = alt_index
            if request.parent and self.features.all_subrequest_continues_with_first:
                next_alt = 0  # 1.34/1.35 went on with the request's first subrequest here.
            return self._next_device_or_undo(
                undo, claim_index, request_index, next_alt, device_index + 1, start
            )

        key = (claim_index, request_index, alt_index)
        start_pool, start_offset = start
        for pool_index in range(start_pool, len(self.pools)):
            pool = self.pools[pool_index]
            if pool.incomplete and self.features.skip_unusable_pools:
                continue
            if pool.invalid:
                if self.features.skip_unusable_pools:
                    continue
                raise AllocationError(f"resource pool {pool.id} is invalid: {pool.invalid_reason}")
            candidates = self.candidates[pool_index]
            first = start_offset if pool_index == start_pool else 0
            # Hoisted out of the loop, which mostly skips devices in use (same checks as in_use).
            admin_access = request.admin_access
            allocating, allocated = self._allocating, self.state.devices
            for offset in range(first, len(candidates)):
                candidate = candidates[offset]
                device_id = candidate.device_id
                if admin_access:
                    if claim_index in allocating.get(device_id, ()):
                        continue
                elif device_id in allocated or allocating.get(device_id):
                    continue
                if not self.selectable(key, request_plan, candidate):
                    continue
                if self.features.consumable_capacity and not self._capacity_fits(request, candidate):
                    continue
                undo = self._take(claim_index, request_plan, candidate, must=False, device_index=device_index)
                if undo is None:
                    continue
                # The next device: after this one, or from the first again in 1.34
                # (Features.search_restarts_per_device).
                after = (0, 0) if self.features.search_restarts_per_device else (pool_index, offset + 1)
                if self._next_device_or_undo(
                    undo, claim_index, request_index, alt_index, device_index + 1, after
                ):
                    return True
        return False

    def _next_device_or_undo(
        self,
        undo: Callable[[], None],
        claim_index: int,
        request_index: int,
        alt_index: int,
        device_index: int,
        start: tuple[int, int],
    ) -> bool:
        """Search on from the given device; give the last device back unless that found a solution.

        Also when the rest raises: a firstAvailable request that catches
        `_MaxResultsExceeded` tries its next subrequest, which must not see the
        devices of the one that was abandoned (kube-scheduler deallocates then too).
        """
        try:
            done = self._device(claim_index, request_index, alt_index, device_index, start)
        except BaseException:
            undo()
            raise
        if not done:
            undo()
        return done

    def _take(
        self, claim_index: int, request_plan: RequestPlan, candidate: Candidate, must: bool, device_index: int
    ) -> Callable[[], None] | None:
        """Try to add one device to the claim's result; returns how to undo it, or None."""
        plan = self.plans[claim_index]
        request = request_plan.request
        device_id = candidate.device_id
        features = self.features
        multiple = features.consumable_capacity and candidate.allows_multiple
        admin_access = request.admin_access
        if admin_access:
            if not multiple and claim_index in self._allocating.get(device_id, ()):
                return None
        elif device_id in self.state.devices or self._allocating.get(device_id):  # in_use
            return None
        counters_taken = False
        if candidate.consumes_counters:
            if not features.partitionable_devices:
                return None
            capacity_in_use = device_id in self.state.capacity or device_id in self._allocating_capacity
            if not (multiple and capacity_in_use):
                if not self._take_counters(candidate):
                    return None
                counters_taken = True
        # Up to 1.36, as there, counters taken above are not given back when a taint or a
        # constraint rejects the device afterwards (Features.rejected_device_keeps_counters).
        tainted = candidate.tainted and features.device_taints
        if tainted and blocking_taint(candidate.device, request) is not None:
            self._reject_after_counters(candidate, counters_taken)
            return None
        for i, constraint in enumerate(plan.constraints):
            if not constraint.add(request.base_name, request.sub_name, candidate.device, device_id):
                self._reject_after_counters(candidate, counters_taken)
                if must:
                    raise AllocationError(
                        f"claim {claim_ref(plan.claim)}, request {request.name}: cannot add device "
                        f"{device_id} because a claim constraint would not be satisfied"
                    )
                for previous in plan.constraints[:i]:
                    previous.remove(request.base_name, request.sub_name, candidate.device, device_id)
                return None
        holders = self._allocating.setdefault(device_id, set())
        if self.features.consumable_capacity and not (
            self._capacity_fits(request, candidate)
            and self._misindexed_capacity_fits(request, candidate, device_index)
        ):
            if self.features.capacity_rejection_keeps_device:
                # Up to 1.36 allocateDevice checks capacity after it marked the device in use
                # for this claim and added it to the constraints, and returns without undoing
                # either: the device stays taken for the rest of this node's search.
                if not multiple:
                    holders.add(claim_index)
            else:
                for constraint in plan.constraints:
                    constraint.remove(request.base_name, request.sub_name, candidate.device, device_id)
            self._reject_after_counters(candidate, counters_taken)
            return None

        if not multiple:
            holders.add(claim_index)
        chosen = ChosenDevice(
            request=request, device_id=device_id, device=candidate.device, slice=candidate.slice
        )
        # 1.37: an entry, even an empty one, marks the device as shared (a later share skips
        # the counters); backtracking one share keeps the entry while an earlier share holds it.
        entry_existed = device_id in self._allocating_capacity
        if self.features.consumable_capacity and multiple:
            chosen.consumed = consumed_capacity(request.capacity_requests, candidate.device)
            chosen.share_id = self.new_share_id()
            totals = self._allocating_capacity.setdefault(device_id, {})
            for name, amount in chosen.consumed.items():
                totals[name] = totals[name] + amount if name in totals else amount
        plan.chosen.append(chosen)
        position = len(plan.chosen) - 1

        def undo() -> None:
            for constraint in plan.constraints:
                constraint.remove(request.base_name, request.sub_name, candidate.device, device_id)
            self._allocating.get(device_id, set()).discard(claim_index)
            if multiple:
                totals = self._allocating_capacity.get(device_id)
                if totals is not None:
                    for name, amount in chosen.consumed.items():
                        totals[name] = totals[name] - amount
                    if all(q.is_zero() for q in totals.values()) and not (
                        entry_existed and not self.features.rejected_device_keeps_counters
                    ):
                        del self._allocating_capacity[device_id]
            # Up to 1.36 a shareable device's counters stay taken when backtracking drops it.
            keeps = multiple and self.features.rejected_device_keeps_counters
            if counters_taken and self.features.partitionable_devices and not keeps:
                self._release_counters(candidate)
            del plan.chosen[position:]

        return undo
