"""Publishing this node's devices as ResourceSlices.

Model: one pool, named after the node, holding every device of this driver on
the node. `plan_slices` (pure) cuts the devices into slices within API
limits; `SlicePublisher.sync` makes the API match the plan with the fewest
writes; `SlicePublisher.run` keeps it that way, watching our slices so a
deletion (the kubelet deletes all of a node's slices when it starts) is
repaired within a second.

Rules, following the upstream ResourceSlice controller:

- Devices keep discovery order (first-fit allocation depends on it). A slice
  holds at most 128 devices, 64 when the pool uses taints or counters.
- Where shared counter sets go depends on the server's release (`SliceLayout`,
  discovered once with `GET /version`): from Kubernetes 1.35 on they go in
  slices of their own; 1.34 only accepts a device whose counter set is defined
  in the same slice, and its scheduler scopes counter sets to their slice, so
  each counter set shares one slice with every device that consumes it.
- `pool.generation` increases when the pool's layout changes: a slice is
  added or removed, or more than one slice changes at once (consumers combine
  slices of the newest generation only, so they never mix two states). A
  change confined to one slice, such as a device's health taint, is an
  in-place update at the same generation.
- Slice names are deterministic: `<node>-<driver>-<index>` (node part
  shortened with a hash when the name would exceed 253 characters). A create
  that races an earlier one then fails with 409 instead of leaving a duplicate
  slice, which `generateName` would do.
- The Node owns every slice (garbage collection removes them with the Node).
- Nothing changed → no write. Writes send raw JSON built here; existing objects
  are read as raw dicts, never round-tripped through typed models (which drop
  fields they do not know).
- Stale slices (a higher index no longer needed, or from an old layout) are
  deleted first, with UID and resourceVersion preconditions.
- Conflicts (409), vanished objects (404) and API errors are retried with
  exponential backoff after a fresh list.
"""

from __future__ import annotations

import collections
import enum
import hashlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from dracommon.kubeversion import KubernetesVersion, VersionError, format_version, version_from_info
from draplugin.devices.model import (
    CounterSet,
    Device,
    DeviceBackend,
    DeviceValidationError,
    validate_devices,
)

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"
RESOURCE_PATH = "/apis/resource.k8s.io/v1/resourceslices"
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_NAME_LENGTH = 253
# Kubernetes 1.34 limits for a slice that holds counter sets and their consumers:
# counters summed over all of the slice's sets, and over all of its devices.
MAX_SHARED_COUNTERS_PER_SLICE_1_34 = 32
MAX_DEVICE_COUNTERS_PER_SLICE_1_34 = 1024


class SliceLayout(enum.Enum):
    """Where a pool's shared counter sets are published."""

    # Kubernetes 1.35 and later: counter sets in slices of their own, before the devices.
    SEPARATE_COUNTER_SLICES = "separate-counter-slices"
    # Kubernetes 1.34: each counter set in the slice of the devices that consume it.
    COUNTERS_WITH_DEVICES = "counters-with-devices"


def layout_for(version: KubernetesVersion) -> SliceLayout:
    """The layout the API server of that release accepts."""
    return SliceLayout.COUNTERS_WITH_DEVICES if version < (1, 35) else SliceLayout.SEPARATE_COUNTER_SLICES


# --- planning (pure) ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlannedSlice:
    """The spec content of one slice, without pool generation/count (those are decided at sync)."""

    devices: tuple[dict[str, Any], ...] = ()
    shared_counters: tuple[dict[str, Any], ...] = ()


def plan_slices(
    devices: Sequence[Device],
    counter_sets: Sequence[CounterSet] = (),
    *,
    expect_taints: bool = False,
    layout: SliceLayout = SliceLayout.SEPARATE_COUNTER_SLICES,
) -> list[PlannedSlice]:
    """Cut the pool into slices: counter-set slices first, then devices in order.

    The per-slice device limit is chosen for the whole pool, not per slice, so a
    device gaining a taint changes one slice rather than shifting every boundary.
    `expect_taints` (set when health monitoring is on) picks the lower limit up
    front for the same reason. With `SliceLayout.COUNTERS_WITH_DEVICES` each
    counter set travels with its consumers instead (`_plan_counters_with_devices`).
    Raises `DeviceValidationError` for invalid input.
    """
    validate_devices(devices, counter_sets)
    small = expect_taints or bool(counter_sets) or any(d.needs_small_slice for d in devices)
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS if small else MAX_DEVICES_PER_SLICE
    if layout is SliceLayout.COUNTERS_WITH_DEVICES and counter_sets:
        return _plan_counters_with_devices(devices, counter_sets, limit)
    slices: list[PlannedSlice] = []
    rendered_sets = [c.to_api() for c in counter_sets]
    for start in range(0, len(rendered_sets), MAX_COUNTER_SETS_PER_SLICE):
        slices.append(
            PlannedSlice(shared_counters=tuple(rendered_sets[start : start + MAX_COUNTER_SETS_PER_SLICE]))
        )
    rendered = [d.to_api() for d in devices]
    for start in range(0, len(rendered), limit):
        slices.append(PlannedSlice(devices=tuple(rendered[start : start + limit])))
    if not slices:
        # An empty pool is published as one empty slice: "no devices" differs from "no pool".
        slices.append(PlannedSlice())
    return slices


@dataclass(slots=True)
class _Group:
    """Devices tied together by the counter sets they share, and those sets."""

    device_indices: list[int] = field(default_factory=list)
    set_names: list[str] = field(default_factory=list)


def _plan_counters_with_devices(
    devices: Sequence[Device], counter_sets: Sequence[CounterSet], limit: int
) -> list[PlannedSlice]:
    """The 1.34 layout: every counter set in one slice with all of its consumers.

    Devices sharing a counter set (directly or through a chain of sets) form a
    group that must not be split; groups are packed into slices in the order of
    their first device, so devices keep discovery order unless consumers of one
    set are interleaved with other devices. A group that cannot fit one slice is
    a DeviceValidationError: 1.34 has no way to publish it.
    """
    parent: dict[str, str] = {c.name: c.name for c in counter_sets}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for device in devices:
        names = [c.counter_set for c in device.consumes_counters]
        for other in names[1:]:
            parent[root(other)] = root(names[0])

    groups: dict[str, _Group] = {}
    ordered: list[_Group] = []
    for index, device in enumerate(devices):
        if not device.consumes_counters:
            ordered.append(_Group(device_indices=[index]))
            continue
        key = root(device.consumes_counters[0].counter_set)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
            ordered.append(group)
        group.device_indices.append(index)
    for counter_set in counter_sets:  # unused sets still get published, with their group or alone
        key = root(counter_set.name)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
            ordered.append(group)
        group.set_names.append(counter_set.name)

    rendered_sets = {c.name: c.to_api() for c in counter_sets}
    rendered = [d.to_api() for d in devices]

    def size(group: _Group) -> tuple[int, int, int, int]:
        shared = sum(len(rendered_sets[n]["counters"]) for n in group.set_names)
        consumed = sum(
            len(c["counters"]) for i in group.device_indices for c in rendered[i].get("consumesCounters", [])
        )
        return len(group.device_indices), len(group.set_names), shared, consumed

    maxima = (
        limit,
        MAX_COUNTER_SETS_PER_SLICE,
        MAX_SHARED_COUNTERS_PER_SLICE_1_34,
        MAX_DEVICE_COUNTERS_PER_SLICE_1_34,
    )
    slices: list[list[_Group]] = []
    used: tuple[int, ...] = (0, 0, 0, 0)
    for group in ordered:
        need = size(group)
        if any(n > m for n, m in zip(need, maxima, strict=True)):
            raise DeviceValidationError(
                f"counter sets {', '.join(group.set_names)}",
                "sharedCounters",
                f"{need[0]} devices, {need[1]} counter sets, {need[2]} shared and {need[3]} consumed "
                f"counters exceed one ResourceSlice (limits {maxima[0]}, {maxima[1]}, {maxima[2]}, "
                f"{maxima[3]}); Kubernetes 1.34 needs a counter set and all its consumers in one slice",
            )
        total = tuple(u + n for u, n in zip(used, need, strict=True))
        if not slices or any(t > m for t, m in zip(total, maxima, strict=True)):
            slices.append([])
            total = need
        slices[-1].append(group)
        used = total
    return [
        PlannedSlice(
            devices=tuple(rendered[i] for i in sorted(i for g in members for i in g.device_indices)),
            shared_counters=tuple(rendered_sets[n] for g in members for n in g.set_names),
        )
        for members in slices
    ]


def slice_name(node_name: str, driver: str, index: int) -> str:
    suffix = f"-{driver}-{index}"
    name = node_name + suffix
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_NAME_LENGTH - len(suffix) - len(digest) - 1
    return f"{node_name[:keep].rstrip('.-')}-{digest}{suffix}"


@dataclass(frozen=True, slots=True)
class NodeRef:
    name: str
    uid: str | None  # None: render without an owner (dry runs)


def render_slice(
    planned: PlannedSlice, *, node: NodeRef, driver: str, index: int, generation: int, count: int
) -> dict[str, Any]:
    """A complete ResourceSlice object as JSON-ready dict."""
    metadata: dict[str, Any] = {"name": slice_name(node.name, driver, index)}
    if node.uid is not None:
        metadata["ownerReferences"] = [_owner(node)]
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node.name,
        "pool": {"name": node.name, "generation": generation, "resourceSliceCount": count},
    }
    if planned.devices:
        spec["devices"] = list(planned.devices)
    if planned.shared_counters:
        spec["sharedCounters"] = list(planned.shared_counters)
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}


def render_pool(
    devices: Sequence[Device],
    counter_sets: Sequence[CounterSet],
    *,
    node: NodeRef,
    driver: str,
    generation: int = 1,
    expect_taints: bool = False,
    layout: SliceLayout = SliceLayout.SEPARATE_COUNTER_SLICES,
) -> list[dict[str, Any]]:
    """Every slice of the pool as it would be written (used by `draplugin devices`)."""
    planned = plan_slices(devices, counter_sets, expect_taints=expect_taints, layout=layout)
    return [
        render_slice(p, node=node, driver=driver, index=i, generation=generation, count=len(planned))
        for i, p in enumerate(planned)
    ]


def _owner(node: NodeRef) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}


# --- API access ---------------------------------------------------------------------------------------


class ApiError(Exception):
    """A failed API call: HTTP status (0 for transport errors) and the server's message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message


class SliceApi(Protocol):
    """The few API calls the publisher makes, on raw JSON dicts."""

    def server_version(self) -> KubernetesVersion:
        """The API server's release (`GET /version`)."""
        ...

    def get_node_uid(self, name: str) -> str: ...

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion."""
        ...

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete with preconditions; a missing object is not an error."""
        ...

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) pairs until the server ends the watch."""
        ...


class KubeSliceApi:
    """`SliceApi` over a `kubernetes.client.ApiClient`, sending and receiving raw JSON."""

    def __init__(self, api_client: Any, request_timeout_s: float = 30.0) -> None:
        self._client = api_client
        self._timeout = request_timeout_s

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: dict[str, Any] | None = None,
        timeout: float | tuple[float, float] | None = None,
        stream: bool = False,
    ) -> Any:
        from dracommon.kube import send_raw  # the kubernetes client loads only when talking to a server

        try:
            response = send_raw(
                self._client,
                method,
                path,
                query=query,
                body=body,
                timeout=timeout if timeout is not None else self._timeout,
            )
        except ApiError:
            raise
        except Exception as err:  # transport: connection refused, TLS, timeouts
            raise ApiError(0, f"{method} {path}: {err}") from err
        if not 200 <= response.status < 300:
            data = response.read()
            raise ApiError(response.status, _status_message(data) or str(response.reason))
        if stream:
            return response
        data = response.read()
        return json.loads(data) if data else {}

    def server_version(self) -> KubernetesVersion:
        info = self._call("GET", "/version")
        try:
            return version_from_info(info)
        except VersionError as err:
            raise ApiError(0, f"GET /version: {err}") from err

    def get_node_uid(self, name: str) -> str:
        node = self._call("GET", f"/api/v1/nodes/{name}")
        return str(node["metadata"]["uid"])

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        result = self._call("GET", RESOURCE_PATH, query=[("fieldSelector", field_selector)])
        return list(result.get("items") or []), str(result.get("metadata", {}).get("resourceVersion", ""))

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", RESOURCE_PATH, body=body))

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("PUT", f"{RESOURCE_PATH}/{name}", body=body))

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        try:
            self._call("DELETE", f"{RESOURCE_PATH}/{name}", body=options)
        except ApiError as err:
            if err.status != 404:
                raise

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        query = [
            ("fieldSelector", field_selector),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        response = self._call(
            "GET", RESOURCE_PATH, query=query, timeout=(10.0, timeout_s + 15.0), stream=True
        )
        raw = response.response
        try:
            buffer = b""
            for chunk in raw.stream(65536, decode_content=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = json.loads(line)
                        yield str(event.get("type", "")), dict(event.get("object") or {})
        except Exception as err:
            raise ApiError(0, f"watch of resourceslices broke: {err}") from err
        finally:
            raw.release_conn()


def _status_message(data: bytes | None) -> str:
    if not data:
        return ""
    try:
        status = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:500]
    return str(status.get("message", "")) if isinstance(status, dict) else ""


# --- the publisher ------------------------------------------------------------------------------------


class SliceMetrics:
    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.writes = Counter(
            "draplugin_resourceslice_writes_total",
            "ResourceSlice writes sent to the API server, by operation.",
            ("operation",),
            registry=registry,
        )
        self.syncs = Counter(
            "draplugin_resourceslice_syncs_total",
            "ResourceSlice reconcile passes, by result.",
            ("result",),
            registry=registry,
        )


_default_metrics: SliceMetrics | None = None
_metrics_lock = threading.Lock()


def default_metrics() -> SliceMetrics:
    global _default_metrics
    with _metrics_lock:
        if _default_metrics is None:
            _default_metrics = SliceMetrics()
        return _default_metrics


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
    ) -> None:
        self._api = api
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

    def trigger(self) -> None:
        """Ask for a sync soon (devices or their health changed)."""
        self._dirty.set()

    # --- one reconcile pass -------------------------------------------------------------------------

    def sync(self) -> SyncResult:
        """Make the API match the devices. Raises ApiError (caller retries) or DeviceValidationError."""
        with self._lock:
            devices, counter_sets = self._source()
            planned = plan_slices(
                devices, counter_sets, expect_taints=self._expect_taints, layout=self.layout()
            )
            node = self._node_ref()
            existing_list, list_version = self._api.list_slices(self._selector)
            self._list_version = list_version
            existing = {obj["metadata"]["name"]: obj for obj in existing_list}
            names = [slice_name(self._node_name, self._driver, i) for i in range(len(planned))]
            current_gen = max((_generation(obj) for obj in existing.values()), default=0)
            count = len(planned)

            stale = [obj for name, obj in existing.items() if name not in names]
            missing = [i for i, name in enumerate(names) if name not in existing]
            bodies = [
                render_slice(p, node=node, driver=self._driver, index=i, generation=current_gen, count=count)
                for i, p in enumerate(planned)
            ]
            changed = [
                i
                for i, name in enumerate(names)
                if name in existing and not self._up_to_date(existing[name], bodies[i], current_gen, count)
            ]
            bump = bool(missing or stale) or len(changed) > 1
            result = SyncResult(generation=current_gen, slices=count)
            if not (bump or changed):
                self._record(result, "unchanged")
                return result

            generation = current_gen + 1 if bump else current_gen
            result.generation = generation
            for body in bodies:
                body["spec"]["pool"]["generation"] = generation
            for obj in stale:
                meta = obj["metadata"]
                self._api.delete_slice(meta["name"], meta["uid"], meta["resourceVersion"])
                self._own_deletes.append(meta["uid"])
                self._accepted.pop(meta["name"], None)
                self._count("delete")
                result.deleted += 1
            for i, name in enumerate(names):
                if i in missing or not (bump or i in changed):
                    continue
                old = existing[name]
                body = bodies[i]
                body["metadata"] = _merged_metadata(old["metadata"], body["metadata"])
                _keep_taint_times(old, body)
                stored = self._api.replace_slice(name, body)
                self._remember(name, body, stored)
                self._count("update")
                result.updated += 1
            for i in missing:
                stored = self._api.create_slice(bodies[i])
                self._remember(names[i], bodies[i], stored)
                self._count("create")
                result.created += 1
            log.info(
                "resourceslices published node=%s generation=%d slices=%d created=%d updated=%d deleted=%d",
                self._node_name,
                generation,
                count,
                result.created,
                result.updated,
                result.deleted,
            )
            self._record(result, "written")
            return result

    def delete_all(self) -> int:
        """Delete every slice of ours on this node (shutdown with cleanup); returns how many."""
        with self._lock:
            existing, _ = self._api.list_slices(self._selector)
            for obj in existing:
                meta = obj["metadata"]
                self._api.delete_slice(meta["name"], meta["uid"], meta["resourceVersion"])
                self._own_deletes.append(meta["uid"])
                self._count("delete")
            self._accepted.clear()
            log.info("resourceslices deleted node=%s count=%d", self._node_name, len(existing))
            return len(existing)

    def layout(self) -> SliceLayout:
        """Where counter sets go: as configured, else by the server's release (asked once)."""
        if self._layout is None:
            version = self._api.server_version()
            self._layout = layout_for(version)
            log.info(
                "resourceslice layout chosen kubernetes=%s layout=%s",
                format_version(version),
                self._layout.value,
            )
        return self._layout

    def _node_ref(self) -> NodeRef:
        if self._node_uid is None:
            self._node_uid = self._api.get_node_uid(self._node_name)
        return NodeRef(self._node_name, self._node_uid)

    def _up_to_date(self, obj: dict[str, Any], body: dict[str, Any], generation: int, count: int) -> bool:
        pool = obj.get("spec", {}).get("pool", {})
        if pool.get("generation") != generation or pool.get("resourceSliceCount") != count:
            return False
        owner = body["metadata"].get("ownerReferences", [])
        if owner and not any(
            ref.get("uid") == owner[0]["uid"] for ref in obj["metadata"].get("ownerReferences", [])
        ):
            return False
        wanted = dict(body["spec"])
        _keep_taint_times(obj, {"spec": wanted})
        stored = _canonical(obj.get("spec", {}))
        if _canonical(wanted) == stored:
            return True
        accepted = self._accepted.get(obj["metadata"]["name"])
        return accepted is not None and accepted.desired == _canonical(wanted) and accepted.stored == stored

    def _remember(self, name: str, body: dict[str, Any], stored: dict[str, Any]) -> None:
        desired, kept = _canonical(body["spec"]), _canonical(stored.get("spec", {}))
        if desired != kept and not _only_taint_times_differ(body["spec"], stored.get("spec", {})):
            log.warning(
                "api server changed or dropped fields of our slice (a feature gate may be off) slice=%s", name
            )
        self._accepted[name] = _Accepted(desired, kept)
        version = stored.get("metadata", {}).get("resourceVersion")
        if version:
            self._own_versions.append(str(version))

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
                log.error("could not delete resourceslices on shutdown error=%s", err)

    def run_forever(self) -> None:
        """Sync now, then whenever triggered (watch event, health change) or every `resync_s`."""
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                self.sync()
                backoff.reset()
                wait = self._resync_s
            except ApiError as err:
                wait = backoff.next()
                self.last_error = str(err)
                self._metrics.syncs.labels("error").inc()
                log.warning("resourceslice sync failed, retrying retry_in_s=%.1f error=%s", wait, err)
            except ValueError as err:  # invalid devices: nothing is written until they change
                wait = self._resync_s
                self.last_error = str(err)
                self._metrics.syncs.labels("invalid").inc()
                log.error("devices cannot be published error=%s", err)
            if self._dirty.wait(wait):
                self._stop.wait(self._settle_s)  # let a burst of events settle into one sync
                self._dirty.clear()

    def _watch_forever(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
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
                    if event_type == "ERROR":
                        raise ApiError(int(obj.get("code", 0)), str(obj.get("message", "watch error")))
                    meta = obj.get("metadata", {})
                    self._list_version = str(meta.get("resourceVersion", version))
                    if self._is_foreign(event_type, meta):
                        log.info(
                            "resourceslice changed by someone else event=%s slice=%s",
                            event_type,
                            meta.get("name"),
                        )
                        self._dirty.set()
                backoff.reset()
            except ApiError as err:
                if self._stop.is_set():
                    return
                if err.status == 410:  # too old: relist through a sync, which refreshes the version
                    self._list_version = ""
                    self._dirty.set()
                    continue
                wait = backoff.next()
                log.warning("resourceslice watch failed retry_in_s=%.1f error=%s", wait, err)
                self._dirty.set()
                self._stop.wait(wait)

    def _is_foreign(self, event_type: str, meta: dict[str, Any]) -> bool:
        if event_type == "DELETED":
            return meta.get("uid") not in self._own_deletes
        return str(meta.get("resourceVersion")) not in self._own_versions


# --- comparison helpers -------------------------------------------------------------------------------


def _generation(obj: dict[str, Any]) -> int:
    return int(obj.get("spec", {}).get("pool", {}).get("generation", 0))


def _canonical(spec: dict[str, Any]) -> str:
    """A stable text form of a spec for equality, ignoring empty lists/maps the server omits."""
    return json.dumps(_prune(spec), sort_keys=True, separators=(",", ":"))


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def _keep_taint_times(old: dict[str, Any], body: dict[str, Any]) -> None:
    """Carry the server-set `timeAdded` of taints we keep, so an unchanged taint compares equal."""
    old_devices = {d.get("name"): d for d in old.get("spec", {}).get("devices") or []}
    new_devices = body["spec"].get("devices")
    if not new_devices:
        return
    patched = []
    for device in new_devices:
        taints = device.get("taints")
        previous = old_devices.get(device.get("name"), {}).get("taints") or []
        if taints and previous:
            times = {
                (t.get("key"), t.get("value", ""), t.get("effect")): t.get("timeAdded") for t in previous
            }
            device = dict(device)
            device["taints"] = [
                {**t, "timeAdded": times[(t["key"], t.get("value", ""), t["effect"])]}
                if "timeAdded" not in t and times.get((t["key"], t.get("value", ""), t["effect"]))
                else t
                for t in taints
            ]
        patched.append(device)
    body["spec"]["devices"] = patched


def _only_taint_times_differ(desired: dict[str, Any], stored: dict[str, Any]) -> bool:
    def strip(spec: dict[str, Any]) -> str:
        copy = json.loads(json.dumps(spec))
        for device in copy.get("devices") or []:
            for taint in device.get("taints") or []:
                taint.pop("timeAdded", None)
        return _canonical(copy)

    return strip(desired) == strip(stored)


def _merged_metadata(old: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Keep what others put in metadata (labels, annotations, managedFields); set our owner and name."""
    merged = {k: v for k, v in old.items() if k not in ("managedFields",)}
    merged.update(ours)
    return merged


def wait_for(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll `predicate` until true or timeout (for callers and tests waiting on the background loop)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
