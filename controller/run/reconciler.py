"""The controller's decisions: pre-allocate annotated claims, repair double
allocations, release what it allocated, and explain claims that stay stuck.

One `reconcile()` pass works on a snapshot of the watch caches and decides
everything from scratch (level-triggered): a missed event, a crash or a new
leader costs nothing but the next pass.

Pre-allocation
    A standalone ResourceClaim annotated `<driver>/preallocate` (the configured
    driver name, `gpu.draplugin.dev/preallocate` by default) with
    a node name (or `any` / `true`: the first node that fits, unless a Filter
    error on any node would fail the scheduler's attempt, see
    `controller.scheduler.nodefilter`) is allocated by us before any pod exists, with
    our copy of kube-scheduler's allocator, treating every claim that already
    has `status.allocation` as in use. Pods that reference the claim then share
    it: the scheduler reuses an allocated claim as is and only adds the pod to
    `status.reservedFor`, on a node that fits `allocation.nodeSelector`.

    Writes, each with the resourceVersion the decision was based on (409 →
    re-read, decide again):
      1. metadata: annotation `<driver>/allocated-by: dra-controller`
         and upstream's finalizer `resource.kubernetes.io/delete-protection`,
         as kube-scheduler adds before it writes an allocation;
      2. status: `status.allocation`.
    Marking first makes a crash between the two harmless: a marked claim
    without allocation is either allocated on the next pass or unmarked.

    Upstream's finalizer (not one of our own) keeps the claim's lifecycle
    working without this controller: kube-controller-manager protects a claim
    that pods use from deletion, clears the allocation of a deleted claim
    nobody uses and removes the finalizer. Uninstalling the controller never
    leaves claims (or namespaces) stuck in deletion.

Deallocation rules (claims we allocated, recognised by the annotation)
    - Reservations dropped to empty (the last pod using the claim is gone):
      kube-controller-manager clears the allocation, as for any claim with
      upstream's finalizer. While the claim is still annotated we allocate it
      again on the next pass, on the named node, so it stays pinned between
      pods except for that moment.
    - The user released the pin (removed the `preallocate` annotation): we
      clear the allocation and remove annotation and finalizer, once
      `status.reservedFor` is empty and no pending pod references the claim
      (the scheduler may be about to reserve it).
    - Deletion is kube-controller-manager's: it waits for the consumers, then
      clears the allocation and the finalizer.

Double allocation
    If a device of a claim we allocated is also allocated (whole, not as a
    share, not admin access) to another claim, and our claim is not reserved,
    we deallocate ours; the same pass allocates it again elsewhere. If our
    claim is already in use the conflict is logged and counted for a human.

Events
    A claim that stays unallocated for `event_after_s` while a pending pod
    references it gets a `CannotAllocate` Warning whose note is explain's
    one-line summary (which filter removed how many devices); at most one per
    claim per `event_interval_s`.

Size: one module because the decisions of one pass share one snapshot; API writes live in api.py.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from controller.allocation.features import Features
from controller.allocation.nodes import Node
from controller.allocation.pools import DeviceID
from controller.allocation.requests import claim_ref, claim_requests
from controller.cel import compile_selector
from controller.explain.explanation import explain_claim
from controller.run.api import ClaimApi, Conflict, NotFound
from controller.run.events import REASON, EventLimiter, cannot_allocate_event
from controller.run.metrics import ControllerMetrics
from controller.run.preallocation import ANY_NODE_SYNONYMS, preallocate_annotation
from controller.scheduler.allocator import Allocator
from controller.scheduler.nodefilter import filter_nodes, first_fit
from controller.scheduler.nodescore import choose_node
from dracommon.drivername import DEFAULT_DRIVER_NAME, annotation_key, reporting_controller
from dracommon.kubeversion import NEWEST_KNOWN, KubernetesVersion

log = logging.getLogger(__name__)

JSON = dict[str, Any]

ALLOCATED_BY = "dra-controller"
FINALIZER = "resource.kubernetes.io/delete-protection"  # upstream's, handled by kube-controller-manager
MAX_CONFLICT_RETRIES = 3


@dataclass(frozen=True)
class Snapshot:
    """What one pass decides on: the caches' contents at one moment."""

    device_classes: Sequence[JSON] = ()
    slices: Sequence[JSON] = ()
    claims: Sequence[JSON] = ()
    pending_pods: Sequence[JSON] = ()
    # DeviceTaintRules, where the API server serves them; the allocator applies them only
    # where the release's device-taint rules are on, as kube-scheduler does.
    taint_rules: Sequence[JSON] = ()


def allocated_by_annotation(driver_name: str) -> str:
    """`<driver>/allocated-by`: marks the claims the controller allocated (and so may release)."""
    return annotation_key(driver_name, "allocated-by")


@dataclass(frozen=True)
class ReconcilerSettings:
    identity: str = "dra-controller"
    namespace: str | None = None  # only claims in this namespace; None = all
    event_after_s: float = 60.0
    event_interval_s: float = 600.0
    # Annotation keys and the Events' reportingController follow it (dracommon.drivername).
    driver_name: str = DEFAULT_DRIVER_NAME
    # The cluster's release and its kube-scheduler's non-default feature gates: we allocate
    # by that release's rules and CEL environment, as its scheduler would.
    release: KubernetesVersion = NEWEST_KNOWN
    feature_gates: Mapping[str, bool] = field(default_factory=dict)


@dataclass
class PassReport:
    """What one pass did (for logs and tests)."""

    allocated: list[str] = field(default_factory=list)
    unschedulable: list[str] = field(default_factory=list)
    deallocated: list[str] = field(default_factory=list)
    unmarked: list[str] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    skipped: bool = False


# ------------------------------------------------------------------ claim helpers


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _annotations(claim: Mapping[str, Any]) -> Mapping[str, str]:
    annotations: Mapping[str, str] = _meta(claim).get("annotations") or {}
    return annotations


def _status(claim: Mapping[str, Any]) -> Mapping[str, Any]:
    status: Mapping[str, Any] = claim.get("status") or {}
    return status


def is_allocated(claim: Mapping[str, Any]) -> bool:
    return bool(_status(claim).get("allocation"))


def is_reserved(claim: Mapping[str, Any]) -> bool:
    return bool(_status(claim).get("reservedFor"))


def is_deleting(claim: Mapping[str, Any]) -> bool:
    return bool(_meta(claim).get("deletionTimestamp"))


def claim_key(claim: Mapping[str, Any]) -> str:
    meta = _meta(claim)
    return f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"


def whole_devices(claim: Mapping[str, Any]) -> list[DeviceID]:
    """Devices the claim holds exclusively (not admin access, not a share of a device)."""
    allocation = _status(claim).get("allocation") or {}
    return [
        DeviceID(str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in (allocation.get("devices") or {}).get("results") or []
        if not r.get("adminAccess") and not r.get("shareID")
    ]


def pod_claim_names(pod: Mapping[str, Any]) -> list[str]:
    """Names of the ResourceClaims a pod uses (template claims once the controller created them)."""
    generated = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(str(entry.get("name")))
        if name:
            names.append(str(name))
    return names


class Reconciler:
    """Decides and writes; `reconcile()` is one pass. Not thread-safe: one caller."""

    def __init__(
        self,
        api: ClaimApi,
        snapshot: Callable[[], Snapshot],
        *,
        metrics: ControllerMetrics,
        settings: ReconcilerSettings | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
        wall_time: Callable[[], str] = lambda: datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    ) -> None:
        self._api = api
        self._snapshot = snapshot
        self._metrics = metrics
        self.settings = settings or ReconcilerSettings()
        self._is_leader = is_leader
        self._clock = clock
        self._wall_time = wall_time
        self._events = EventLimiter(self.settings.event_after_s, self.settings.event_interval_s)
        self._preallocate_key = preallocate_annotation(self.settings.driver_name)
        self._allocated_by_key = allocated_by_annotation(self.settings.driver_name)
        self._reporting_controller = reporting_controller(self.settings.driver_name)
        # The release's allocation rules and CEL environment, fixed for this reconciler's life.
        release = self.settings.release
        self._features = Features.for_release(release[1]).with_gates(self.settings.feature_gates)
        self._compiler = functools.partial(compile_selector, kubernetes_version=release)
        # Our writes the watch cache may not have delivered yet: key -> (stale versions, object).
        self._written: dict[str, tuple[set[str], JSON]] = {}
        self._invalid_logged: set[str] = set()
        self._any_cursor = ""

    # ---------------------------------------------------------------- one pass

    def reconcile(self) -> PassReport:
        report = PassReport()
        if not self._is_leader():
            report.skipped = True
            self._metrics.reconciles.labels("skipped-not-leader").inc()
            return report
        started = self._clock()
        try:
            self._pass(self._snapshot(), report)
        except Exception:
            self._metrics.reconciles.labels("error").inc()
            raise
        self._metrics.reconciles.labels("success").inc()
        self._metrics.reconcile_duration.observe(max(0.0, self._clock() - started))
        return report

    def _pass(self, snap: Snapshot, report: PassReport) -> None:
        claims = {claim_key(c): c for c in self._with_own_writes(snap.claims) if self._in_scope(c)}
        pending_refs = self._pending_references(snap.pending_pods)

        self._repair_double_allocations(claims, report)
        self._release(claims, pending_refs, report)

        candidates = sorted(
            (c for c in claims.values() if self._wants_allocation(c)),
            key=lambda c: (str(_meta(c).get("creationTimestamp", "")), claim_key(c)),
        )
        waiting = [c for c in claims.values() if claim_key(c) in pending_refs and not is_allocated(c)]
        if not candidates and not waiting:
            self._events.due([], self._clock())
            return
        allocator = Allocator(
            device_classes=snap.device_classes,
            slices=snap.slices,
            allocated_claims=[c for c in claims.values() if is_allocated(c)]
            + [c for c in self._out_of_scope_allocated(snap.claims)],
            taint_rules=snap.taint_rules,
            features=self._features,
            compiler=self._compiler,
        )
        for claim in candidates:
            if not self._is_leader():
                return
            self._preallocate(allocator, claims, claim, report)
        self._post_events(allocator, claims, pending_refs, report)

    # ---------------------------------------------------------------- inputs

    def _is_ours(self, claim: Mapping[str, Any]) -> bool:
        return _annotations(claim).get(self._allocated_by_key) == ALLOCATED_BY

    def _in_scope(self, claim: Mapping[str, Any]) -> bool:
        namespace = self.settings.namespace
        return namespace is None or _meta(claim).get("namespace") == namespace

    def _out_of_scope_allocated(self, claims: Iterable[JSON]) -> list[JSON]:
        # Devices allocated in other namespaces are in use too, whatever our scope.
        if self.settings.namespace is None:
            return []
        return [c for c in claims if not self._in_scope(c) and is_allocated(c)]

    def _with_own_writes(self, claims: Iterable[JSON]) -> list[JSON]:
        """The cached claims, with our recent writes in place of versions the cache still shows.

        A written object replaces the cached one only while the cache shows a
        version from before the write; any other version means the cache has
        caught up (or someone wrote after us), and the entry is dropped. No
        resourceVersion ordering is assumed (versions are opaque).
        """
        result: list[JSON] = []
        seen: set[str] = set()
        for claim in claims:
            key = claim_key(claim)
            seen.add(key)
            written = self._written.get(key)
            if written is not None:
                stale, obj = written
                if str(_meta(claim).get("resourceVersion")) in stale:
                    result.append(obj)
                    continue
                del self._written[key]
            result.append(claim)
        for key in set(self._written) - seen:
            del self._written[key]  # deleted, or not yet in the cache (we never create claims)
        return result

    def _remember(self, before: Mapping[str, Any], after: JSON) -> None:
        key = claim_key(after)
        stale = {str(_meta(before).get("resourceVersion"))}
        previous = self._written.get(key)
        if previous is not None:
            stale |= previous[0]
        self._written[key] = (stale, after)

    def _pending_references(self, pods: Iterable[JSON]) -> set[str]:
        refs: set[str] = set()
        for pod in pods:
            if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            namespace = _meta(pod).get("namespace", "default")
            refs.update(f"{namespace}/{name}" for name in pod_claim_names(pod))
        return refs

    def _wants_allocation(self, claim: Mapping[str, Any]) -> bool:
        return (
            self._preallocate_key in _annotations(claim)
            and not is_allocated(claim)
            and not is_deleting(claim)
        )

    # ---------------------------------------------------------------- double allocation

    def _repair_double_allocations(self, claims: dict[str, JSON], report: PassReport) -> None:
        holders: dict[DeviceID, list[str]] = {}
        for key, claim in claims.items():
            for device in whole_devices(claim):
                holders.setdefault(device, []).append(key)
        for device, keys in holders.items():
            if len(keys) < 2:
                continue
            ours = [k for k in keys if self._is_ours(claims[k])]
            if not ours:
                continue  # not our allocation: the scheduler's business
            self._metrics.double_allocations.inc()
            others = [k for k in keys if k not in ours]
            # Keep one holder: a reserved claim if there is one, else a claim that is not ours.
            keep = next((k for k in keys if is_reserved(claims[k])), others[0] if others else ours[0])
            for key in ours:
                claim = claims[key]
                if key == keep or not is_allocated(claim):
                    continue
                if is_reserved(claim):
                    log.error(
                        "device allocated twice and both claims are in use; not touching either",
                        extra={"device": str(device), "claims": ",".join(keys)},
                    )
                    continue
                log.warning(
                    "device allocated twice; deallocating our unreserved claim to retry",
                    extra={"device": str(device), "claim": key, "kept": keep},
                )
                updated = self._deallocate(claim, "double-allocation", report, unmark=False)
                if updated is not None:
                    claims[key] = updated

    # ---------------------------------------------------------------- release

    def _release(self, claims: dict[str, JSON], pending_refs: set[str], report: PassReport) -> None:
        for key, claim in list(claims.items()):
            if not self._is_ours(claim):
                continue
            # Deleting claims are kube-controller-manager's (upstream's finalizer): no duel over them.
            released = self._preallocate_key not in _annotations(claim) and not is_deleting(claim)
            if not released or is_reserved(claim) or key in pending_refs:
                continue
            if is_allocated(claim):
                updated = self._deallocate(claim, "released", report, unmark=True)
            else:
                updated = self._unmark(claim, report)
            if updated is not None:
                claims[key] = updated

    def _deallocate(self, claim: JSON, reason: str, report: PassReport, *, unmark: bool) -> JSON | None:
        """Clear the allocation if the claim is still unreserved (resourceVersion checked)."""
        namespace, name = str(_meta(claim).get("namespace")), str(_meta(claim).get("name"))
        if not self._is_leader():
            return None
        try:
            updated = self._api.patch_claim_status(
                namespace,
                name,
                {
                    "metadata": {"resourceVersion": _meta(claim).get("resourceVersion")},
                    "status": {"allocation": None},
                },
            )
        except Conflict:
            report.conflicts.append(claim_key(claim))
            return None  # changed meanwhile (maybe reserved): the next pass decides again
        except NotFound:
            return None
        self._remember(claim, updated)
        self._metrics.deallocations.labels(reason).inc()
        report.deallocated.append(claim_key(claim))
        log.info("deallocated claim", extra={"claim": claim_key(claim), "reason": reason})
        if unmark:
            return self._unmark(updated, report) or updated
        return updated

    def _unmark(self, claim: JSON, report: PassReport) -> JSON | None:
        meta = _meta(claim)
        if not self._is_leader():
            return None
        # The finalizer guards an allocation; with none left it goes too (as kube-controller-manager does).
        finalizers = [f for f in meta.get("finalizers") or [] if f != FINALIZER or is_allocated(claim)]
        try:
            updated = self._api.patch_claim(
                str(meta.get("namespace")),
                str(meta.get("name")),
                {
                    "metadata": {
                        "resourceVersion": meta.get("resourceVersion"),
                        "annotations": {self._allocated_by_key: None},
                        "finalizers": finalizers,
                    }
                },
            )
        except (Conflict, NotFound):
            return None
        self._remember(claim, updated)
        report.unmarked.append(claim_key(claim))
        return updated

    # ---------------------------------------------------------------- pre-allocation

    def _target_nodes(self, allocator: Allocator, claim: Mapping[str, Any]) -> list[Node | None] | None:
        """Nodes to try, in order; None when the annotation is not usable (logged once)."""
        value = _annotations(claim).get(self._preallocate_key, "").strip()
        key = claim_key(claim)
        if value in ANY_NODE_SYNONYMS:
            names = allocator.node_names()
            if not names:
                return [None]
            # Start where the last "any" claim fitted: full nodes at the front of the list are not
            # searched again for every claim, and claims pack onto nodes in order.
            start = names.index(self._any_cursor) if self._any_cursor in names else 0
            return [Node(n) for n in names[start:] + names[:start]]
        if not value or len(value) > 253 or not all(c.isalnum() or c in "-." for c in value):
            if key not in self._invalid_logged:
                self._invalid_logged.add(key)
                log.warning(
                    "claim cannot be pre-allocated: annotation value must be a node name or 'any'",
                    extra={"claim": key, "annotation": self._preallocate_key, "value": value},
                )
            self._metrics.allocation_attempts.labels("invalid").inc()
            return None
        node = self._api.get_node(value)
        # An unknown node keeps its name: node-local slices name it even before the Node exists.
        return [Node.from_object(node) if node is not None else Node(value)]

    def _preallocate(
        self, allocator: Allocator, claims: dict[str, JSON], claim: JSON, report: PassReport
    ) -> None:
        key = claim_key(claim)
        nodes = self._target_nodes(allocator, claim)
        if nodes is None:
            return
        # Every target node is filtered, as kube-scheduler does: a Filter error on any of them
        # (e.g. All mode while another node's pool is being updated) means the scheduler would
        # not place this claim anywhere now, so neither do we.
        # Without firstAvailable every feasible node scores alike and the first one wins, so
        # past it only a Filter error matters (first_fit skips the nodes that cannot err).
        if any(request.get("firstAvailable") for request in claim_requests(claim)):
            filtered = filter_nodes(allocator, [claim], nodes)
        else:
            filtered = first_fit(allocator, [claim], nodes)
        chosen = filtered.chosen
        if chosen is not None:
            # Where several nodes fit, the one the scheduler's DynamicResources Score prefers
            # (better-ranked firstAvailable subrequests); ties keep the packing order. A lone
            # claim has no allocated sibling, so 1.35's Score error cannot arise here.
            choice = choose_node(filtered.feasible, [claim], allocator.features)
            if choice is not None:
                chosen = choice.chosen
        if chosen is None:
            failure = filtered.failure
            self._metrics.allocation_attempts.labels("error" if failure.error else "unschedulable").inc()
            report.unschedulable.append(key)
            log.debug("claim cannot be pre-allocated now", extra={"claim": key, "reason": failure.message})
            return
        outcome = chosen.outcome
        # kube-scheduler 1.37 (DRADeviceBindingConditions and DRAResourceClaimDeviceStatus on) sets a
        # missing allocationTimestamp when it reserves an allocated claim, which the API server then
        # rejects (an allocation is immutable): reserving our claim would fail forever. We set it,
        # as the scheduler does for its own allocations; with those gates off the server drops it.
        allocation = {**outcome.allocations[0], "allocationTimestamp": self._wall_time()}
        written = self._write_allocation(claim, allocation, report)
        if written is None:
            return
        if (
            outcome.node is not None
            and _annotations(claim).get(self._preallocate_key, "").strip() in ANY_NODE_SYNONYMS
        ):
            self._any_cursor = outcome.node
        claims[key] = written
        allocator.commit(written, allocation)
        self._metrics.allocation_attempts.labels("allocated").inc()
        report.allocated.append(key)
        log.info(
            "pre-allocated claim",
            extra={
                "claim": key,
                "node": outcome.node or "",
                "devices": len((allocation.get("devices") or {}).get("results") or []),
            },
        )

    def _write_allocation(self, claim: JSON, allocation: JSON, report: PassReport) -> JSON | None:
        """Mark, then write status.allocation; on 409 re-read and retry while the claim still wants it."""
        current: JSON | None = claim
        for _ in range(MAX_CONFLICT_RETRIES):
            if current is None or not self._wants_allocation(current) or not self._is_leader():
                return None
            meta = _meta(current)
            namespace, name = str(meta.get("namespace")), str(meta.get("name"))
            try:
                marked = current
                if not self._is_ours(current) or FINALIZER not in (meta.get("finalizers") or []):
                    finalizers = [*(meta.get("finalizers") or [])]
                    if FINALIZER not in finalizers:
                        finalizers.append(FINALIZER)
                    marked = self._api.patch_claim(namespace, name, {
                        "metadata": {
                            "resourceVersion": meta.get("resourceVersion"),
                            "annotations": {self._allocated_by_key: ALLOCATED_BY},
                            "finalizers": finalizers,
                        }
                    })  # fmt: skip
                    self._remember(current, marked)
                written = self._api.patch_claim_status(namespace, name, {
                    "metadata": {"resourceVersion": _meta(marked).get("resourceVersion")},
                    "status": {"allocation": allocation},
                })  # fmt: skip
            except Conflict:
                self._metrics.allocation_attempts.labels("conflict").inc()
                report.conflicts.append(claim_key(current))
                current = self._api.get_claim(namespace, name)
                continue
            except NotFound:
                return None
            self._remember(marked, written)
            return written
        return None

    # ---------------------------------------------------------------- events

    def _post_events(
        self, allocator: Allocator, claims: dict[str, JSON], pending_refs: set[str], report: PassReport
    ) -> None:
        waiting = {
            str(_meta(c).get("uid")): c
            for key, c in claims.items()
            if key in pending_refs and not is_allocated(c) and not is_deleting(c)
        }
        now = self._clock()
        for uid in self._events.due(waiting, now):
            claim = waiting[uid]
            try:
                note = explain_claim(allocator, claim).summary
            except Exception as err:  # explain must never stop the controller
                note = f"claim {claim_ref(claim)} cannot be allocated (explain failed: {err})"
            try:
                self._api.create_event(
                    str(_meta(claim).get("namespace")),
                    cannot_allocate_event(claim, note, self.settings.identity, self._reporting_controller),
                )
            except Exception as err:  # best effort; retried after the interval
                log.warning("posting event failed", extra={"claim": claim_key(claim), "error": str(err)})
            else:
                self._metrics.events.labels(REASON).inc()
                report.events.append(claim_key(claim))
                log.info("claim cannot be allocated", extra={"claim": claim_key(claim), "summary": note})
            self._events.posted(uid, now)
