"""Keeping this node's ResourceSlices equal to its devices: sync, resync, watch, backoff.

Model: one pool, named after the node, holding every device of this driver
on the node. `SlicePublisher.sync` makes the API match the plan
(`slices.plan`, `slices.render`) with the fewest writes; `SlicePublisher.run`
keeps it that way, watching our slices so a deletion (the kubelet deletes all
of a node's slices when it starts) is repaired within a second.

Rules, following the upstream ResourceSlice controller:

- The server's release picks the `SliceLayout`, asked once with `GET /version`.
- `pool.generation` increases when the pool's layout changes: a slice is
  added or removed, or more than one slice changes at once (consumers combine
  slices of the newest generation only, so they never mix two states). A
  change confined to one slice, such as a device's health taint, is an
  in-place update at the same generation.
- Nothing changed → no write. Writes send raw JSON built here; existing objects
  are read as raw dicts, never round-tripped through typed models (which drop
  fields they do not know).
- A resync is cheap when nothing changed, as upstream's informer-backed one
  is: the plan is reused for equal devices (`PlanMemo`), a slice is compared in
  full only when its uid or resourceVersion, or what we plan for it, differs
  from when we last wrote or verified it (`_Verified`), and `KubeSliceApi`
  lists only metadata while every slice is one it has seen. Any write by
  someone else changes the resourceVersion, so it is still found and repaired.
- Stale slices (a higher index no longer needed, or from an old layout) are
  deleted first, with UID and resourceVersion preconditions.
- Conflicts (409), vanished objects (404) and API errors are retried with
  exponential backoff after a fresh list. An API server that does not answer
  (refused, TLS, timeout) gets a log line naming its address and the error's
  class (`slices.reach`), and `state` says why nothing is published (not yet
  reported by the plugin's health service: docs/troubleshooting.md).
- Every slice carries this machine's writer id (`slices.writer`). Once the pool
  has been ours, a slice marked by another writer means a second live
  publisher under our node name: we log it, post a `DuplicateNodeName` Warning
  Event on the Node and stop writing for good (no write loop, no takeover
  back), until the plugin is restarted.

Size: sync, resync, watch and backoff are one loop around one record of what was last verified.
"""

from __future__ import annotations

import collections
import logging
import random
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dracommon.kubeapi import ApiError, Gone
from dracommon.kubeversion import format_version
from draplugin.devices.model import CounterSet, Device, DeviceBackend
from draplugin.events import DUPLICATE_NODE_NAME
from draplugin.slices.api import SliceApi
from draplugin.slices.compare import (
    canonical,
    generation_of,
    keep_taint_times,
    merged_metadata,
    only_taint_times_differ,
)
from draplugin.slices.metrics import SliceMetrics, default_metrics
from draplugin.slices.plan import PlanMemo, PlannedSlice, SliceLayout, layout_for
from draplugin.slices.reach import error_class, unreachable
from draplugin.slices.render import NodeRef, render_slice, slice_name
from draplugin.slices.writer import DuplicateWriter, other_writers, writer_of

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    generation: int
    slices: int
    created: int = 0
    updated: int = 0
    deleted: int = 0

    @property
    def writes(self) -> int:
        return self.created + self.updated + self.deleted


@dataclass
class _Accepted:
    """What the server stored for our last write of a slice, to avoid rewriting fields it drops."""

    desired: str
    stored: str


@dataclass(frozen=True, slots=True)
class _Verified:
    """A stored slice, at one uid and resourceVersion, known to match what we would write.

    Any write to the object (ours, someone else's, a delete and re-create) gives
    it a new resourceVersion or uid, so while both are unchanged and so is what we
    plan for it, a resync can skip rendering and comparing the whole spec.
    """

    uid: str
    resource_version: str
    planned: PlannedSlice
    generation: int
    count: int
    node_uid: str | None

    def still_stored(self, obj: dict[str, Any], generation: int, count: int, node_uid: str | None) -> bool:
        """`obj` is the slice verified, unchanged, and the pool around it too."""
        meta = obj.get("metadata", {})
        return (
            meta.get("uid") == self.uid
            and str(meta.get("resourceVersion")) == self.resource_version
            and (generation, count, node_uid) == (self.generation, self.count, self.node_uid)
        )

    def plans(self, planned: PlannedSlice) -> bool:
        # Identity first: an unchanged pool gets the very same PlannedSlice from the PlanMemo.
        return planned is self.planned or planned == self.planned


@dataclass
class Backoff:
    initial_s: float = 0.5
    max_s: float = 60.0
    _next: float = field(default=0.0, init=False)

    def next(self) -> float:
        self._next = self.initial_s if self._next == 0 else min(self._next * 2, self.max_s)
        return self._next * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = 0.0


DevicesSource = Callable[[], tuple[Sequence[Device], Sequence[CounterSet]]]
# Posts an Event on this node's Node: (reason, note).
NodeEvent = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class PublishState:
    """Whether the pool is published as the devices are (`ready`), else why not."""

    ready: bool
    reason: str


NOT_YET_PUBLISHED = PublishState(False, "not published yet")
PUBLISHED = PublishState(True, "published")


def backend_source(
    backend: DeviceBackend, transform: Callable[[list[Device]], list[Device]] | None = None
) -> DevicesSource:
    """Devices from a backend, optionally transformed (e.g. `HealthTracker.apply` adds taints)."""

    def source() -> tuple[Sequence[Device], Sequence[CounterSet]]:
        devices = backend.discover()
        return (transform(devices) if transform else devices), backend.shared_counters()

    return source


class SlicePublisher:
    """Keeps this node's ResourceSlices equal to its devices."""

    def __init__(
        self,
        api: SliceApi,
        *,
        node_name: str,
        driver: str,
        source: DevicesSource,
        expect_taints: bool = False,
        layout: SliceLayout | None = None,
        metrics: SliceMetrics | None = None,
        settle_s: float = 0.2,
        resync_s: float = 600.0,
        watch_timeout_s: int = 300,
        writer: str | None = None,
        node_event: NodeEvent | None = None,
    ) -> None:
        self._api = api
        # None: an id of this publisher alone (tests, dry runs); `draplugin run` passes the machine's.
        self._writer = writer if writer is not None else secrets.token_hex(8)
        self._node_event = node_event
        self._address = str(getattr(api, "address", "") or "the API server")
        # Every slice of the pool was ours at least once (a sync completed): from then on another
        # writer's mark is a live second publisher, not a predecessor (`slices.writer`).
        self._claimed = False
        self.duplicate: DuplicateWriter | None = None
        self.state = NOT_YET_PUBLISHED
        self._state_listeners: list[Callable[[PublishState], None]] = []
        self._last_failure_unreachable = False
        self._node_name = node_name
        self._driver = driver
        self._source = source
        self._expect_taints = expect_taints
        # None: chosen from the server's release at the first sync (one GET /version).
        self._layout = layout
        self._metrics = metrics if metrics is not None else default_metrics()
        self._settle_s = settle_s
        self._resync_s = resync_s
        self._watch_timeout_s = watch_timeout_s
        self._selector = f"spec.driver={driver},spec.nodeName={node_name}"
        self._node_uid: str | None = None
        self._accepted: dict[str, _Accepted] = {}
        self._verified: dict[str, _Verified] = {}
        self._plans = PlanMemo()
        # Our own writes, to tell our watch events from other writers'.
        self._own_versions: collections.deque[str] = collections.deque(maxlen=4096)
        self._own_deletes: collections.deque[str] = collections.deque(maxlen=4096)
        self._list_version = ""
        self._lock = threading.Lock()  # one sync at a time
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.writes: collections.Counter[str] = collections.Counter()
        self.last_result: SyncResult | None = None
        self.last_error: str | None = None

    @property
    def field_selector(self) -> str:
        return self._selector

    @property
    def writer(self) -> str:
        return self._writer

    def trigger(self) -> None:
        """Ask for a sync soon (devices or their health changed)."""
        self._dirty.set()

    def add_state_listener(self, listener: Callable[[PublishState], None]) -> None:
        """Call `listener` with the current state and on every change (on the publisher's threads)."""
        self._state_listeners.append(listener)
        listener(self.state)

    def _set_state(self, state: PublishState) -> None:
        if state == self.state:
            return
        self.state = state
        for listener in self._state_listeners:
            try:
                listener(state)
            except Exception:  # a listener must not stop publishing
                log.exception("resourceslice state listener failed")

    # --- one reconcile pass -------------------------------------------------------------------------

    def sync(self) -> SyncResult:
        """Make the API match the devices. Raises ApiError (caller retries) or DeviceValidationError."""
        with self._lock:
            devices, counter_sets = self._source()
            planned = self._plans.plan(
                devices, counter_sets, expect_taints=self._expect_taints, layout=self.layout()
            )
            node = self._node_ref()
            existing_list, list_version = self._api.list_slices(self._selector)
            self._list_version = list_version
            if self.duplicate is not None or self._another_writer(existing_list):
                return self._halted()
            existing = {obj["metadata"]["name"]: obj for obj in existing_list}
            names = [slice_name(self._node_name, self._driver, i) for i in range(len(planned))]
            current_gen = max((generation_of(obj) for obj in existing.values()), default=0)
            count = len(planned)

            stale = [obj for name, obj in existing.items() if name not in names]
            missing = [i for i, name in enumerate(names) if name not in existing]
            changed = [
                i
                for i, name in enumerate(names)
                if name in existing
                and not self._up_to_date(existing[name], planned[i], node, i, current_gen, count)
            ]
            bump = bool(missing or stale) or len(changed) > 1
            result = SyncResult(generation=current_gen, slices=count)
            if not (bump or changed):
                self._record(result, "unchanged")
                self._claimed = True
                return result

            generation = current_gen + 1 if bump else current_gen
            result.generation = generation
            for obj in stale:
                meta = obj["metadata"]
                self._api.delete_slice(meta["name"], meta["uid"], meta["resourceVersion"])
                self._own_deletes.append(meta["uid"])
                self._forget(meta["name"])
                self._count("delete")
                result.deleted += 1
            for i, name in enumerate(names):
                if i in missing or not (bump or i in changed):
                    continue
                old = existing[name]
                body = self._render(planned[i], node, i, generation, count)
                body["metadata"] = merged_metadata(old["metadata"], body["metadata"])
                keep_taint_times(old, body)
                stored = self._api.replace_slice(name, body)
                self._remember(name, body, stored, planned[i])
                self._count("update")
                result.updated += 1
            for i in missing:
                body = self._render(planned[i], node, i, generation, count)
                stored = self._api.create_slice(body)
                self._remember(names[i], body, stored, planned[i])
                self._count("create")
                result.created += 1
            log.info(
                "resourceslices published",
                extra={
                    "node": self._node_name,
                    "generation": generation,
                    "slices": count,
                    "slices_created": result.created,
                    "slices_updated": result.updated,
                    "slices_deleted": result.deleted,
                },
            )
            self._record(result, "written")
            self._claimed = True
            return result

    def _another_writer(self, existing: list[dict[str, Any]]) -> bool:
        """Whether another live writer publishes our pool: then `duplicate` is set, logged and posted."""
        others = other_writers(existing, self._writer)
        if not others:
            return False
        if not self._claimed:  # a predecessor's slices (or a live writer's: then it stops, see above)
            log.info(
                "taking over resourceslices last written by another writer",
                extra={"node": self._node_name, "writer": self._writer, "slices": dict(others)},
            )
            return False
        name, other = others[0]
        self.duplicate = DuplicateWriter(self._node_name, name, other, self._writer)
        note = self.duplicate.note()
        log.error(
            "duplicate node name: another plugin writes this node's resourceslices; stopped writing them",
            extra={
                "node": self._node_name,
                "slice": name,
                "other_writer": other,
                "writer": self._writer,
                "reason": DUPLICATE_NODE_NAME,
            },
        )
        if self._node_event is not None:
            self._node_event(DUPLICATE_NODE_NAME, note)
        return True

    def _halted(self) -> SyncResult:
        """A sync after a duplicate writer was found: nothing is written."""
        assert self.duplicate is not None
        result = SyncResult(generation=0, slices=0)
        self.last_result = result
        self.last_error = self.duplicate.note()
        self._metrics.syncs.labels("duplicate").inc()
        self._set_state(PublishState(False, f"{DUPLICATE_NODE_NAME}: {self.duplicate.note()}"))
        return result

    def delete_all(self) -> int:
        """Delete every slice of ours on this node (shutdown with cleanup); returns how many."""
        with self._lock:
            if self.duplicate is not None:  # the slices are the other writer's now: leave them
                log.warning(
                    "resourceslices not deleted: another plugin publishes this node's pool",
                    extra={"node": self._node_name, "other_writer": self.duplicate.other},
                )
                return 0
            existing, _ = self._api.list_slices(self._selector)
            for obj in existing:
                meta = obj["metadata"]
                self._api.delete_slice(meta["name"], meta["uid"], meta["resourceVersion"])
                self._own_deletes.append(meta["uid"])
                self._count("delete")
            self._accepted.clear()
            self._verified.clear()
            log.info("resourceslices deleted", extra={"node": self._node_name, "count": len(existing)})
            return len(existing)

    def layout(self) -> SliceLayout:
        """Where counter sets go: as configured, else by the server's release (asked once)."""
        if self._layout is None:
            version = self._api.server_version()
            self._layout = layout_for(version)
            log.info(
                "resourceslice layout chosen",
                extra={"kubernetes": format_version(version), "layout": self._layout.value},
            )
        return self._layout

    def _node_ref(self) -> NodeRef:
        if self._node_uid is None:
            self._node_uid = self._api.get_node_uid(self._node_name)
        return NodeRef(self._node_name, self._node_uid)

    def _render(
        self, planned: PlannedSlice, node: NodeRef, index: int, generation: int, count: int
    ) -> dict[str, Any]:
        return render_slice(
            planned,
            node=node,
            driver=self._driver,
            index=index,
            generation=generation,
            count=count,
            writer=self._writer,
        )

    def _up_to_date(
        self,
        obj: dict[str, Any],
        planned: PlannedSlice,
        node: NodeRef,
        index: int,
        generation: int,
        count: int,
    ) -> bool:
        pool = obj.get("spec", {}).get("pool", {})
        if pool.get("generation") != generation or pool.get("resourceSliceCount") != count:
            return False
        name = obj["metadata"]["name"]
        verified = self._verified.get(name)
        if verified is not None and verified.still_stored(obj, generation, count, node.uid):
            # What is stored is what we verified for `verified.planned`: no need to look again.
            return verified.plans(planned)
        body = self._render(planned, node, index, generation, count)
        if not self._matches(obj, body):
            return False
        self._verify(name, obj, planned, generation, count, node.uid)
        return True

    def _matches(self, obj: dict[str, Any], body: dict[str, Any]) -> bool:
        """The full comparison of a stored slice with the one we would write."""
        if writer_of(obj) != writer_of(body):  # another writer's, or unmarked: ours to mark
            return False
        owner = body["metadata"].get("ownerReferences", [])
        if owner and not any(
            ref.get("uid") == owner[0]["uid"] for ref in obj["metadata"].get("ownerReferences", [])
        ):
            return False
        wanted = dict(body["spec"])
        keep_taint_times(obj, {"spec": wanted})
        stored = canonical(obj.get("spec", {}))
        if canonical(wanted) == stored:
            return True
        accepted = self._accepted.get(obj["metadata"]["name"])
        return accepted is not None and accepted.desired == canonical(wanted) and accepted.stored == stored

    def _remember(
        self, name: str, body: dict[str, Any], stored: dict[str, Any], planned: PlannedSlice
    ) -> None:
        """After our write: what the server kept, and that this resourceVersion is ours and up to date."""
        if body["spec"] == stored.get("spec"):  # stored as sent (the usual case): nothing to accept
            self._accepted.pop(name, None)
        else:
            desired, kept = canonical(body["spec"]), canonical(stored.get("spec", {}))
            if desired != kept and not only_taint_times_differ(body["spec"], stored.get("spec", {})):
                log.warning(
                    "api server changed or dropped fields of our slice (a feature gate may be off)",
                    extra={"slice": name},
                )
            self._accepted[name] = _Accepted(desired, kept)
        meta = stored.get("metadata", {})
        version = meta.get("resourceVersion")
        if version:
            self._own_versions.append(str(version))
        pool = body["spec"]["pool"]
        owner = body["metadata"].get("ownerReferences") or [{}]
        generation, count = int(pool["generation"]), int(pool["resourceSliceCount"])
        self._verify(name, stored, planned, generation, count, owner[0].get("uid"))

    def _verify(
        self,
        name: str,
        obj: dict[str, Any],
        planned: PlannedSlice,
        generation: int,
        count: int,
        node_uid: str | None,
    ) -> None:
        """Remember that `obj`, at its uid and resourceVersion, is what we would write for `planned`."""
        meta = obj.get("metadata", {})
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not (uid and version):  # nothing to recognise it by: compare in full next time
            self._verified.pop(name, None)
            return
        self._verified[name] = _Verified(str(uid), str(version), planned, generation, count, node_uid)

    def _forget(self, name: str) -> None:
        self._accepted.pop(name, None)
        self._verified.pop(name, None)

    def _count(self, operation: str) -> None:
        self.writes[operation] += 1
        self._metrics.writes.labels(operation).inc()

    def _record(self, result: SyncResult, outcome: str) -> None:
        self.last_result = result
        self.last_error = None
        self._metrics.syncs.labels(outcome).inc()

    # --- background loop ----------------------------------------------------------------------------

    def start(self) -> None:
        """Run `run_forever` and the watch in daemon threads."""
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self.run_forever, name="slice-publisher", daemon=True),
            threading.Thread(target=self._watch_forever, name="slice-watch", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, *, delete: bool = False, timeout_s: float = 5.0) -> None:
        """Stop the loops; with `delete`, remove our slices (best effort, logged on failure)."""
        self._stop.set()
        self._dirty.set()
        for thread in self._threads:
            if thread.name == "slice-publisher":
                thread.join(timeout_s)
        if delete:
            try:
                self.delete_all()
            except ApiError as err:
                log.error("could not delete resourceslices on shutdown", extra={"error": str(err)})

    def run_forever(self) -> None:
        """Sync now, then whenever triggered (watch event, health change) or every `resync_s`."""
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                self.sync()
                backoff.reset()
                wait = self._resync_s
                if self.duplicate is not None:
                    return  # nothing more to write until a restart; stop() still joins us
                if self._last_failure_unreachable:
                    log.info("api server reachable again", extra={"address": self._address})
                    self._last_failure_unreachable = False
                self._set_state(PUBLISHED)
            except ApiError as err:
                wait = backoff.next()
                self.last_error = str(err)
                self._metrics.syncs.labels("error").inc()
                kind = error_class(err)
                self._last_failure_unreachable = unreachable(err)
                if self._last_failure_unreachable:
                    log.warning(
                        "api server unreachable, retrying",
                        extra={
                            "address": self._address,
                            "error_class": kind,
                            "retry_in_s": round(wait, 1),
                            "error": str(err),
                        },
                    )
                else:
                    log.warning(
                        "resourceslice sync failed, retrying",
                        extra={"error_class": kind, "retry_in_s": round(wait, 1), "error": str(err)},
                    )
                self._set_state(PublishState(False, f"{kind}: {err}"))
            except ValueError as err:  # invalid devices: nothing is written until they change
                wait = self._resync_s
                self.last_error = str(err)
                self._metrics.syncs.labels("invalid").inc()
                log.error("devices cannot be published", extra={"error": str(err)})
                self._set_state(PublishState(False, f"devices cannot be published: {err}"))
            if self._dirty.wait(wait):
                self._stop.wait(self._settle_s)  # let a burst of events settle into one sync
                self._dirty.clear()

    def _watch_forever(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            if self.duplicate is not None:
                return
            version = self._list_version
            if not version:
                self._stop.wait(0.1)
                continue
            try:
                for event_type, obj in self._api.watch_slices(self._selector, version, self._watch_timeout_s):
                    if self._stop.is_set():
                        return
                    if event_type == "BOOKMARK":
                        self._list_version = str(obj.get("metadata", {}).get("resourceVersion", version))
                        continue
                    meta = obj.get("metadata", {})
                    self._list_version = str(meta.get("resourceVersion", version))
                    if self._is_foreign(event_type, meta):
                        log.info(
                            "resourceslice changed by someone else",
                            extra={"event": event_type, "slice": meta.get("name")},
                        )
                        self._dirty.set()
                backoff.reset()
            except Gone:  # too old: relist through a sync, which refreshes the version
                self._list_version = ""
                self._dirty.set()
            except ApiError as err:
                if self._stop.is_set():
                    return
                wait = backoff.next()
                log.warning(
                    "resourceslice watch failed",
                    extra={
                        "address": self._address,
                        "error_class": error_class(err),
                        "retry_in_s": round(wait, 1),
                        "error": str(err),
                    },
                )
                self._dirty.set()
                self._stop.wait(wait)

    def _is_foreign(self, event_type: str, meta: dict[str, Any]) -> bool:
        if event_type == "DELETED":
            return meta.get("uid") not in self._own_deletes
        return str(meta.get("resourceVersion")) not in self._own_versions
