"""Who holds each device: prepared claims from the checkpoint, their pods from the API server.

The kubelet tells the plugin only claim references at prepare; the
checkpoint records which devices each claim got. A claim's pods are in its
`status.reservedFor` (the scheduler adds each pod that uses the claim before
it runs), and a pod's containers' IDs are in its `status.containerStatuses`.
Both are read with GET and cached: a claim is read again after
`refresh_s`, or sooner (at most once per `miss_s`) when a process shows up
in a pod or container we do not know yet, so a second pod joining a shared
claim is seen within a pass or two, without an API call per pass.
A claim or pod that cannot be read keeps its last known pods; an API
error is logged, never raised into the sampler.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from dracommon.kubeapi import ApiError
from draplugin.checkpoint import ClaimRecord

log = logging.getLogger(__name__)

DEFAULT_REFRESH_S = 60.0
DEFAULT_MISS_S = 10.0


class JsonGetter(Protocol):
    def get(self, path: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class Holder:
    """A prepared claim and the pods reserved for it (possibly none yet)."""

    namespace: str
    name: str
    uid: str
    devices: tuple[str, ...]
    pods: tuple[PodRef, ...] = ()
    # Container ID → container name, and container ID → pod UID, over all of the claim's pods.
    containers: Mapping[str, str] = field(default_factory=dict, hash=False)
    container_pods: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass
class _Cached:
    pods: tuple[PodRef, ...] = ()
    containers: dict[str, str] = field(default_factory=dict)
    container_pods: dict[str, str] = field(default_factory=dict)
    read_at: float = float("-inf")


class HolderDirectory:
    """Claims prepared on this node with their pods; `holders()` is cheap and called every pass."""

    def __init__(
        self,
        records: Callable[[], Iterable[ClaimRecord]],
        api: JsonGetter | None,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        miss_s: float = DEFAULT_MISS_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._records = records
        self._api = api
        self._refresh_s = refresh_s
        self._miss_s = miss_s
        self._clock = clock
        self._cache: dict[str, _Cached] = {}
        # Unknown pod UIDs and container IDs → when they last caused a re-read.
        self._missed: dict[str, float] = {}
        self._lock = threading.Lock()

    def holders(self) -> list[Holder]:
        """Every completed claim of the checkpoint, with its pods as last read."""
        now = self._clock()
        out: list[Holder] = []
        live: set[str] = set()
        for record in self._records():
            if not record.completed or not record.devices:
                continue
            live.add(record.uid)
            cached = self._entry(record, now, force=False)
            out.append(
                Holder(
                    record.namespace,
                    record.name,
                    record.uid,
                    tuple(dict.fromkeys(d.device for d in record.devices)),
                    cached.pods,
                    dict(cached.containers),
                    dict(cached.container_pods),
                )
            )
        with self._lock:  # an unprepared claim's cache entry goes with it
            for uid in set(self._cache) - live:
                del self._cache[uid]
        return out

    def refresh_missing(
        self, holders: Sequence[Holder], pod_uids: Iterable[str], containers: Iterable[str]
    ) -> None:
        """Re-read the claims (rate-limited) when processes name pods or containers not known yet.

        An ID that is still unknown after the re-read it caused (a process of a pod or container
        that holds no claim here) causes no other one until the refresh interval has passed.
        """
        now = self._clock()
        known = {p.uid for h in holders for p in h.pods} | {c for h in holders for c in h.containers}
        with self._lock:
            self._missed = {i: t for i, t in self._missed.items() if now - t < self._refresh_s}
            unknown = (set(pod_uids) | set(containers)) - known - set(self._missed)
        if not unknown:
            return
        read = False
        for holder in holders:
            with self._lock:
                cached = self._cache.get(holder.uid)
            if cached is not None and now - cached.read_at >= self._miss_s:
                self._read(holder.namespace, holder.name, holder.uid, now)
                read = True
        if read:
            with self._lock:
                self._missed.update(dict.fromkeys(unknown, now))

    def _entry(self, record: ClaimRecord, now: float, *, force: bool) -> _Cached:
        with self._lock:
            cached = self._cache.get(record.uid)
        if cached is None or force or now - cached.read_at >= self._refresh_s:
            return self._read(record.namespace, record.name, record.uid, now)
        return cached

    def _read(self, namespace: str, name: str, uid: str, now: float) -> _Cached:
        with self._lock:
            cached = self._cache.setdefault(uid, _Cached())
            cached.read_at = now  # failed reads wait for the next refresh too
        if self._api is None:
            return cached
        ns = quote(namespace, safe="")
        try:
            claim = self._api.get(
                f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{quote(name, safe='')}"
            )
            if _uid(claim) != uid:
                return cached  # deleted and re-created under the same name: not the claim we prepared
            pods = reserved_pods(namespace, claim)
            containers: dict[str, str] = {}
            container_pods: dict[str, str] = {}
            for pod in pods:
                try:
                    doc = self._api.get(f"/api/v1/namespaces/{ns}/pods/{quote(pod.name, safe='')}")
                except ApiError as err:  # gone or unreadable: the pod is known, its containers are not
                    log.debug(
                        "reading a pod failed", extra={"pod": f"{namespace}/{pod.name}", "status": err.status}
                    )
                    continue
                if _uid(doc) == pod.uid:
                    ids = container_ids(doc)
                    containers.update(ids)
                    container_pods.update(dict.fromkeys(ids, pod.uid))
        except ApiError as err:
            log.warning(
                "reading a claim's pods failed", extra={"claim": f"{namespace}/{name}", "status": err.status}
            )
            return cached
        except Exception as err:  # a transport error must not stop sampling
            log.warning(
                "reading a claim's pods failed", extra={"claim": f"{namespace}/{name}", "error": str(err)}
            )
            return cached
        with self._lock:
            cached.pods, cached.containers, cached.container_pods = pods, containers, container_pods
        return cached


def _uid(doc: Any) -> str:
    metadata = doc.get("metadata") if isinstance(doc, dict) else None
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    return uid if isinstance(uid, str) else ""


def reserved_pods(namespace: str, claim: Mapping[str, Any]) -> tuple[PodRef, ...]:
    """The pods in a claim's `status.reservedFor` (other consumer kinds are not pods: skipped)."""
    status = claim.get("status")
    entries = status.get("reservedFor") if isinstance(status, dict) else None
    pods: list[PodRef] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or entry.get("resource") != "pods" or entry.get("apiGroup"):
            continue
        name, uid = entry.get("name"), entry.get("uid")
        if isinstance(name, str) and isinstance(uid, str):
            pods.append(PodRef(namespace, name, uid))
    return tuple(pods)


def container_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container ID (without `containerd://`) → name, for every container the pod's status lists."""
    status = pod.get("status")
    out: dict[str, str] = {}
    if not isinstance(status, dict):
        return out
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or []:
            if not isinstance(entry, dict):
                continue
            raw, name = entry.get("containerID"), entry.get("name")
            if isinstance(raw, str) and isinstance(name, str) and raw:
                out[raw.partition("://")[2] or raw] = name
    return out
