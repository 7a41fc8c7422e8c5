"""Leader election on a `coordination.k8s.io/v1` Lease, so several replicas can run safely.

Ours, not `kubernetes.leaderelection` (37.x): its `run()` cannot be stopped, it never releases the
Lease, replaces a whole typed V1Lease via the global default client and sys.exit()s on bad config.

The rules are client-go's leader election, written for this daemon:

- A replica takes the Lease when it is free (absent, `holderIdentity` empty)
  or expired, and renews it every `renew_interval` seconds while it leads.
- Expiry is judged with the local monotonic clock: a Lease counts as expired
  when its record has not changed for `leaseDurationSeconds` since this replica
  last saw it change. Remote `renewTime` values are written for humans and
  tools, never compared across machines (clocks drift).
- Every write carries the `resourceVersion` that was read (optimistic
  concurrency): of two replicas racing for the Lease, one gets 409 Conflict
  and stays a follower.
- A leader that cannot renew for `renew_deadline` seconds (shorter than the
  lease duration) steps down on its own, before any other replica may take
  over, so two replicas never act as leader at the same time.
- `release()` (on SIGTERM) hands the Lease over at once: empty holder and a
  one-second duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dracommon.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)

JSON = dict[str, Any]
LEASE_API = "/apis/coordination.k8s.io/v1"


class LeaseConflict(Exception):
    """The Lease changed (or was created) since it was read: 409 Conflict."""


class LeaseApi(Protocol):
    """Reads and writes one Lease object."""

    def get(self) -> JSON | None: ...

    def create(self, lease: Mapping[str, Any]) -> JSON: ...

    def replace(self, lease: Mapping[str, Any]) -> JSON: ...


class KubeLeaseApi:
    """`LeaseApi` over the API server, as raw JSON."""

    def __init__(self, api: KubeApi, namespace: str, name: str) -> None:
        self._api = api
        self._collection = f"{LEASE_API}/namespaces/{namespace}/leases"
        self._path = f"{self._collection}/{name}"

    def get(self) -> JSON | None:
        try:
            return self._api.get(self._path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def create(self, lease: Mapping[str, Any]) -> JSON:
        return self._write("POST", self._collection, lease)

    def replace(self, lease: Mapping[str, Any]) -> JSON:
        return self._write("PUT", self._path, lease)

    def _write(self, method: str, path: str, lease: Mapping[str, Any]) -> JSON:
        try:
            return self._api.request(method, path, dict(lease), timeout=10)
        except ApiError as err:
            if err.status == 409:
                raise LeaseConflict(err.message) from err
            raise


@dataclass(frozen=True)
class LeaderConfig:
    lease_duration_s: int = 15
    renew_deadline_s: float = 10.0
    renew_interval_s: float = 5.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_interval_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "leader election needs 0 < renew interval < renew deadline < lease duration, got "
                f"{self.renew_interval_s} / {self.renew_deadline_s} / {self.lease_duration_s}"
            )


def micro_time(moment: datetime | None = None) -> str:
    """A `metav1.MicroTime` string."""
    return (moment or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One replica's side of the election; `step()` is one attempt, `run()` loops."""

    def __init__(
        self,
        api: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        config: LeaderConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.config = config or LeaderConfig()
        self._clock = clock
        self._wall = wall_clock
        self._on_change = on_change
        self._lock = threading.Lock()
        self._leading = False
        self._last_renew: float | None = None  # monotonic time of our last successful write
        self._observed: tuple[str, str, str] | None = None  # holder, renewTime, resourceVersion
        self._observed_at = 0.0
        self.last_attempt_ok = False

    # ---------------------------------------------------------------- state

    def is_leader(self) -> bool:
        """True only while the last successful renewal is within the renew deadline.

        Checked by the reconciler before every write, so a leader whose renew
        thread is stuck stops acting even before the next `step()`.
        """
        with self._lock:
            return self._leading and self._renewed_recently()

    def _renewed_recently(self) -> bool:
        return (
            self._last_renew is not None and self._clock() - self._last_renew < self.config.renew_deadline_s
        )

    def _set_leading(self, leading: bool) -> None:
        with self._lock:
            changed = leading != self._leading
            self._leading = leading
        if changed:
            log.info(
                "leadership changed",
                extra={
                    "leading": leading,
                    "identity": self.identity,
                    "lease": f"{self.namespace}/{self.name}",
                },
            )
            if self._on_change is not None:
                self._on_change(leading)

    # ---------------------------------------------------------------- election

    def step(self) -> bool:
        """Try once to acquire or renew the Lease; return whether we lead afterwards."""
        try:
            acquired = self._try_acquire_or_renew()
        except LeaseConflict:
            log.debug("lease changed concurrently", extra={"identity": self.identity})
            acquired = False
        except Exception as err:  # API unreachable, 5xx: the deadline below decides
            log.warning("lease update failed", extra={"identity": self.identity, "error": str(err)})
            acquired = False
        self.last_attempt_ok = acquired
        if acquired:
            with self._lock:
                self._last_renew = self._clock()
            self._set_leading(True)
            return True
        with self._lock:
            keep = self._leading and self._renewed_recently()
        if not keep:
            self._set_leading(False)
        return keep

    def _try_acquire_or_renew(self) -> bool:
        now = self._clock()
        now_wall = micro_time(self._wall())
        lease = self._api.get()
        if lease is None:
            created = self._api.create(self._new_lease(now_wall))
            self._observe(created, now)
            return True
        spec = dict(lease.get("spec") or {})
        meta = lease.get("metadata") or {}
        holder = str(spec.get("holderIdentity") or "")
        self._observe(lease, now)
        duration = int(spec.get("leaseDurationSeconds") or self.config.lease_duration_s)
        held_by_other = holder not in ("", self.identity)
        if held_by_other and now < self._observed_at + duration:
            return False
        if holder != self.identity:
            spec["acquireTime"] = now_wall
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.config.lease_duration_s,
            renewTime=now_wall,
        )
        updated = self._api.replace({**lease, "metadata": dict(meta), "spec": spec})
        self._observe(updated, now)
        return True

    def _new_lease(self, now_wall: str) -> JSON:
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.config.lease_duration_s,
                "acquireTime": now_wall,
                "renewTime": now_wall,
                "leaseTransitions": 0,
            },
        }

    def _observe(self, lease: Mapping[str, Any], now: float) -> None:
        spec = lease.get("spec") or {}
        record = (
            str(spec.get("holderIdentity") or ""),
            str(spec.get("renewTime") or ""),
            str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )
        if record != self._observed:
            self._observed = record
            self._observed_at = now

    def release(self) -> bool:
        """Give the Lease up if we hold it (empty holder, one-second duration); stop leading."""
        self._set_leading(False)
        with self._lock:
            self._last_renew = None
        try:
            lease = self._api.get()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            now_wall = micro_time(self._wall())
            spec = {
                **(lease.get("spec") or {}),
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": now_wall,
                "acquireTime": now_wall,
            }
            self._api.replace({**lease, "spec": spec})
        except Exception as err:  # the lease then expires on its own after its duration
            log.warning("cannot release the lease", extra={"identity": self.identity, "error": str(err)})
            return False
        log.info("lease released", extra={"identity": self.identity})
        return True

    def run(self, stop: threading.Event) -> None:
        """Acquire and renew until `stop` is set (the caller releases afterwards)."""
        while not stop.is_set():
            self.step()
            # A failed renewal is retried soon: the renew deadline is only two intervals away.
            stop.wait(self.config.renew_interval_s if self.last_attempt_ok else self.config.retry_period_s)
