"""`status.devices` on prepared ResourceClaims (KEP-4817): what each of our devices is, and that it is ready.

After a prepare succeeds the plugin writes, for each of its devices in the
claim, one `AllocatedDeviceStatus` entry: `driver`/`pool`/`device` (and
`shareID` for a share of a consumable device), `data` (the GPU's `uuid`,
`model`, `driverVersion`, the `sharing` strategy, and `migUUID`/`migProfile`
for a MIG device, the one created at prepare included) and a `Ready`
condition. Unprepare removes them.

How it writes: server-side apply on the status subresource under a field
manager of our own (one per driver name). The server merges our entries into
the list by its keys (driver, pool, device, shareID), so entries of other
drivers, owned by their managers, are never read, sent or dropped; entries we
stop applying are removed. No resourceVersion is sent, so there is no
read-modify-write to lose a race; `force` takes over only the entries we send,
which are our driver's by construction. `metadata.uid` is sent so an entry is
never written onto a new claim that took a deleted one's name.

Never on the prepare path (a decision): writes run in the background after
the kubelet has its answer, and a failed write is a logged warning and a
`draplugin_claim_status_writes_total{result="error"}` count, nothing more. The
status is information for people and tools (`kubectl describe`, `dra-controller
top`); neither the kubelet nor the pod waits for it, so it must not add an API
round trip to pod start-up nor fail a claim whose devices are ready. Transient
failures (no answer, 409, 429, 5xx) are retried with backoff; writes of one
claim run in order, and one overtaken by a later write (unprepare right after
prepare) is skipped. A repeated prepare whose entries are already on the claim
(as read by that prepare) writes nothing. Writes also yield to prepares: one waits
until no prepare has run for `QUIET_S` (at most `DEFER_MAX_S` after it was asked
for), so a burst of pod starts does not find the API server busy with our status
writes while its claim GETs wait; a write overtaken meanwhile (the claim was
unprepared) is never sent. They have their own API workers and connections too
(`draplugin.prepare.wiring`), so a prepare's GET never queues behind one.

Where it is on (`--device-status`, `draplugin.config`): `auto` writes on
Kubernetes 1.36+, where granular status authorization lets RBAC narrow the
grant to the plugin's own node and driver (`resourceclaims/driver`,
`associated-node:patch`); on 1.34/1.35 the only grant that allows it is
`resourceclaims/status` for every claim of the cluster, so `auto` is off there
and the chart refuses to grant it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from dracommon.kubeapi import ApiError
from dracommon.kubeversion import KubernetesVersion
from draplugin.devices.schema import KIND_MIG
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.api import claim_path
from draplugin.prepare.plan import ClaimPlan, PlannedDevice

# The release from which the server narrows status.devices writes per node and driver.
NARROW_GRANT_SINCE: Final = (1, 36)
READY: Final = "Ready"
API_VERSION: Final = "resource.k8s.io/v1"
# Answers worth another attempt: no answer, a conflict the server gave up retrying, throttling, 5xx.
RETRYABLE: Final = frozenset({0, 409, 429, 500, 502, 503, 504})
DEFAULT_ATTEMPTS: Final = 5
DEFAULT_BACKOFF_S: Final = 0.5
BACKOFF_MAX_S: Final = 8.0
RESULTS: Final = ("success", "unchanged", "superseded", "gone", "error")
# A status write waits until no prepare has run for this long, but never longer than DEFER_MAX_S.
QUIET_S: Final = 0.05
DEFER_MAX_S: Final = 3.0

log = logging.getLogger(__name__)


class StatusApi(Protocol):
    """The one call this module makes (`dracommon.kubeapi.AsyncKubeApi.apply`)."""

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> dict[str, Any]: ...


def enabled_for(mode: str, version: KubernetesVersion | None) -> bool:
    """Whether to write status.devices: `on`, `off`, or `auto` (only where a narrow grant exists)."""
    if mode == "auto":
        return version is not None and version >= NARROW_GRANT_SINCE
    return mode == "on"


def field_manager_for(driver_name: str) -> str:
    # One manager per driver: two drivers built from this code must never remove each other's entries.
    return f"{driver_name}/kubelet-plugin"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_data(planned: PlannedDevice) -> dict[str, Any]:
    """What the entry's `data` says about one device: `uuid` is always the physical GPU's."""
    device = planned.device
    attributes = device.attributes
    data: dict[str, Any] = {
        "uuid": device.parent_uuid or device.uuid,
        "model": str(attributes.get("productName", "")),
        "driverVersion": str(attributes.get("driverVersion", "")),
        "sharing": planned.config.sharing.strategy.value,
    }
    if device.kind == KIND_MIG:
        # Empty only for a partitionable placement not created yet; prepare fills it in.
        if device.uuid:
            data["migUUID"] = device.uuid
        data["migProfile"] = str(attributes.get("profile", ""))
    return data


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (
        str(entry.get("driver", "")),
        str(entry.get("pool", "")),
        str(entry.get("device", "")),
        str(entry.get("shareID") or ""),
    )


def _existing_entries(
    doc: Mapping[str, Any], driver: str
) -> dict[tuple[str, str, str, str], Mapping[str, Any]]:
    status = doc.get("status")
    devices = status.get("devices") if isinstance(status, Mapping) else None
    if not isinstance(devices, list):
        return {}
    return {_key(e): e for e in devices if isinstance(e, Mapping) and e.get("driver") == driver}


def _ready_since(entry: Mapping[str, Any] | None) -> str | None:
    """When the entry's Ready condition last became True, to keep it across repeated prepares."""
    conditions = entry.get("conditions") if entry is not None else None
    for condition in conditions if isinstance(conditions, list) else []:
        if (
            isinstance(condition, Mapping)
            and condition.get("type") == READY
            and condition.get("status") == "True"
        ):
            since = condition.get("lastTransitionTime")
            return since if isinstance(since, str) else None
    return None


def desired_entries(
    plan: ClaimPlan, doc: Mapping[str, Any], driver: str, node: str, now: Callable[[], str] = _now
) -> list[dict[str, Any]]:
    """Our entries for the prepared `plan`, one per device (or share), in plan order."""
    existing = _existing_entries(doc, driver)
    meta = doc.get("metadata")
    generation = meta.get("generation") if isinstance(meta, Mapping) else None
    entries: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str, str]] = set()
    for planned in plan.devices:
        entry: dict[str, Any] = {"driver": driver, "pool": planned.pool, "device": planned.device.name}
        if planned.share_id:
            entry["shareID"] = planned.share_id
        key = _key(entry)
        if key in seen:
            continue
        seen.add(key)
        condition: dict[str, Any] = {
            "type": READY,
            "status": "True",
            "reason": "Prepared",
            "message": f"prepared on node {node}: CDI device {planned.cdi_id}",
            "lastTransitionTime": _ready_since(existing.get(key)) or now(),
        }
        if isinstance(generation, int):
            condition["observedGeneration"] = generation
        entry["conditions"] = [condition]
        entry["data"] = device_data(planned)
        entries.append(entry)
    return entries


def _same(existing: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return all(existing.get(field) == wanted[field] for field in ("conditions", "data"))


def up_to_date(doc: Mapping[str, Any], driver: str, entries: Sequence[Mapping[str, Any]]) -> bool:
    """The claim (as read) already carries exactly these entries of our driver."""
    existing = _existing_entries(doc, driver)
    wanted = {_key(e): e for e in entries}
    return existing.keys() == wanted.keys() and all(_same(existing[k], wanted[k]) for k in wanted)


def apply_body(claim: ClaimRef, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The apply configuration: identity, and our entries (none: remove all we own)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
        "status": {"devices": list(entries)},
    }


def _replaced(err: ApiError) -> bool:
    """The server's answer to our `metadata.uid` when the name now belongs to another claim, which no
    retry resolves: server-side apply merges the UID and validation refuses it as immutable (422);
    other write paths check it as a storage precondition (409)."""
    if err.status == 422:
        return "metadata.uid" in err.message and "immutable" in err.message
    return err.status == 409 and "Precondition failed: UID" in err.message


class ClaimStatusWriter:
    """Writes and clears our status.devices entries in the background, one claim at a time in order."""

    def __init__(
        self,
        api: StatusApi,
        *,
        driver_name: str,
        node_name: str,
        registry: CollectorRegistry = REGISTRY,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_s: float = DEFAULT_BACKOFF_S,
        now: Callable[[], str] = _now,
        defer_max_s: float = DEFER_MAX_S,
    ) -> None:
        self._api = api
        self._defer_max_s = defer_max_s
        # Prepares in flight (`preparing`), when the last one ended, and set while none runs.
        self._preparing = 0
        self._last_prepare_end = 0.0
        self._no_prepares = asyncio.Event()
        self._no_prepares.set()
        self.driver_name = driver_name
        self.node_name = node_name
        self.field_manager = field_manager_for(driver_name)
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._now = now
        # Per claim UID: the latest write asked for, and the lock that keeps writes in order.
        self._generation: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._pending: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.writes = Counter(
            "draplugin_claim_status_writes_total",
            "status.devices writes of prepared and unprepared claims, by outcome "
            "(unchanged: already on the claim; superseded: a later write of the claim came first; "
            "gone: the claim no longer exists).",
            ("operation", "result"),
            registry=registry,
        )
        for operation in ("prepare", "unprepare"):
            for result in RESULTS:
                self.writes.labels(operation, result)

    def prepared(self, plan: ClaimPlan, doc: Mapping[str, Any]) -> None:
        """Write our entries for `plan`, prepared from `doc` (the claim prepare read)."""
        if not plan.devices:
            return
        entries = desired_entries(plan, doc, self.driver_name, self.node_name, self._now)
        if up_to_date(doc, self.driver_name, entries):
            if plan.claim.uid in self._pending:
                self._superseding(plan.claim.uid)  # a queued older write must not undo what is there
            self.writes.labels("prepare", "unchanged").inc()
            return
        self._start("prepare", plan.claim, entries)

    def unprepared(self, claim: ClaimRef) -> None:
        """Remove our entries from the claim."""
        self._start("unprepare", claim, [])

    @contextlib.contextmanager
    def preparing(self) -> Iterator[None]:
        """Held by the driver around each prepare: status writes wait while any is held."""
        self._preparing += 1
        self._no_prepares.clear()
        try:
            yield
        finally:
            self._preparing -= 1
            if not self._preparing:
                self._last_prepare_end = time.monotonic()
                self._no_prepares.set()

    async def _yield_to_prepares(self, until: float) -> None:
        """Return once no prepare has run for QUIET_S, or at `until` (monotonic) at the latest."""
        while (left := until - time.monotonic()) > 0:
            if self._preparing:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._no_prepares.wait(), left)
                continue
            quiet_in = self._last_prepare_end + QUIET_S - time.monotonic()
            if quiet_in <= 0:
                return
            await asyncio.sleep(min(quiet_in, left))

    async def idle(self) -> None:
        """Wait until every write asked for so far has finished (tests; orderly shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Stop pending writes: a plugin that stops must not wait out retry backoffs."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- the work ----------------------------------------------------------------------------------

    def _superseding(self, uid: str) -> int:
        generation = self._generation.get(uid, 0) + 1
        self._generation[uid] = generation
        return generation

    def _start(self, operation: str, claim: ClaimRef, entries: list[dict[str, Any]]) -> None:
        generation = self._superseding(claim.uid)
        self._pending[claim.uid] = self._pending.get(claim.uid, 0) + 1
        task = asyncio.get_running_loop().create_task(self._write(operation, claim, entries, generation))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(
        self, operation: str, claim: ClaimRef, entries: list[dict[str, Any]], generation: int
    ) -> None:
        uid = claim.uid
        lock = self._locks.setdefault(uid, asyncio.Lock())
        try:
            async with lock:  # FIFO: writes of one claim land in the order they were asked for
                result = await self._attempt(operation, claim, entries, generation)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # never let a status write escape into the event loop
            log.exception("claim status write failed unexpectedly", extra={"claim": str(claim)})
            result = "error"
            self._warn(operation, claim, str(err))
        finally:
            self._pending[uid] -= 1
            if not self._pending[uid]:
                del self._pending[uid], self._locks[uid], self._generation[uid]
        self.writes.labels(operation, result).inc()

    async def _attempt(
        self, operation: str, claim: ClaimRef, entries: list[dict[str, Any]], generation: int
    ) -> str:
        path = f"{claim_path(claim.namespace, claim.name)}/status"
        body = apply_body(claim, entries)
        delay = self._backoff_s
        until = time.monotonic() + self._defer_max_s
        for attempt in range(1, self._attempts + 1):
            await self._yield_to_prepares(until)
            if self._generation.get(claim.uid) != generation:
                return "superseded"
            try:
                await self._api.apply(path, body, field_manager=self.field_manager, force=True)
            except ApiError as err:
                if err.status == 404 or _replaced(err):
                    return "gone"  # deleted (or replaced by a namesake): nothing of ours to write or clear
                if err.status not in RETRYABLE or attempt == self._attempts:
                    self._warn(operation, claim, str(err))
                    return "error"
                log.debug(
                    "claim status write failed, retrying", extra={"claim": str(claim), "error": str(err)}
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            log.debug("claim status written", extra={"claim": str(claim), "devices": len(entries)})
            return "success"
        return "error"  # attempts < 1: nothing was tried

    def _warn(self, operation: str, claim: ClaimRef, error: str) -> None:
        hint = ""
        if "403" in error or "forbidden" in error.lower():
            hint = (
                "RBAC: the chart grants resourceclaims/status and resourceclaims/driver on Kubernetes "
                "1.36+ only; turn --device-status off where it is not granted"
            )
        log.warning(
            "writing status.devices failed; the claim itself is unaffected",
            extra={
                "claim": f"{claim.namespace}/{claim.name}",
                "uid": claim.uid,
                "operation": operation,
                "error": error,
                **({"hint": hint} if hint else {}),
            },
        )
