"""The DRA node service (v1 and v1beta1) on top of one version-neutral `ClaimRunner`.

The kubelet sends a batch of claim references and expects one answer per claim
UID. A bad reference, a duplicate, or a driver failure becomes that claim's
`error`; the RPC itself only fails when the request cannot be answered at all.
Claims of one batch run concurrently, bounded so thousands of claims do not
flood the driver; prepares and unprepares have separate bounds, so an
unprepare (which needs no API server) never waits behind prepares stuck on
one. A call runs at most `MAX_CLAIMS_PER_CALL` claims (one pod's); each claim
past them is answered with a short error at once, and so is each claim past
`MAX_CLAIMS_IN_FLIGHT` admitted across calls (BUSY, for the kubelet to retry), so
a flood of calls never queues work in front of a pod's. Claim references are checked
against Kubernetes' name rules before any use. With a gRPC deadline, every
claim is answered before it: one still running then gets an error saying so
and finishes in the background.

Size: both servicer versions sit beside the one runner they share, so a wire change is seen in one place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter as Tally
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import grpc

from dracommon.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2 as v1beta1
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from draplugin.kubelet.deadline import CALL_DEADLINE, CALL_STARTED, deadline_from_remaining
from draplugin.kubelet.interface import ClaimError, ClaimRef, Driver, PreparedDevice
from draplugin.kubelet.metrics import kubelet_metrics
from draplugin.kubelet.nodestate import NodeStateLock
from draplugin.kubelet.pending import PendingDriver
from draplugin.kubelet.serialize import CallSerializer

# Claims in flight at once: a node-wide burst of pods (the kubelet sends one call per pod) is all
# admitted, as the Go plugins' HTTP/2 clients admit it; the prepare reader has a GET worker for each.
DEFAULT_MAX_CONCURRENT_CLAIMS: Final = 64

# Claims one call may carry; the rest of a longer call are each answered with TOO_MANY_CLAIMS and
# cost nothing more. The kubelet sends one call per pod and driver, with that pod's claims of this
# driver, so this is a bound on one pod: each claim prepared here holds devices of this node, and even
# a node of 8 GPUs split into 7 MIG devices each has 56. Without a bound, one call of 40,000 claims
# (2.2 MiB, under gRPC's 4 MiB message cap) started 40,000 claim tasks at once and got the plugin's
# container OOM-killed, and 10,000-claim calls held up other callers for 19-45 s.
MAX_CLAIMS_PER_CALL: Final = 128
# Short on purpose: it is repeated for every claim past the bound and the answer must still fit the
# kubelet's 4 MiB message cap (40,000 of them are about 3 MiB with their UIDs).
TOO_MANY_CLAIMS: Final = f"not run: over {MAX_CLAIMS_PER_CALL} claims in one call"

# Claims admitted at once across calls, per operation (running or waiting for one of the
# `max_concurrent_claims` slots): a node's burst of pods starting together fits (four full calls),
# a flood does not queue. Past it each claim is answered at once with BUSY, and the kubelet retries
# the call. Without it, 60 concurrent calls of 128 claims queued 7,680: one pod's single claim
# waited p50 28.5 s (at most 44.5 s, the kubelet's deadline is 45 s) and RSS grew by 74 MiB.
MAX_CLAIMS_IN_FLIGHT: Final = 4 * MAX_CLAIMS_PER_CALL
BUSY: Final = f"not run: {MAX_CLAIMS_IN_FLIGHT} claims of this operation are in flight on the node; retry"

log = logging.getLogger(__name__)


class ClaimMessage(Protocol):
    """The `Claim` message of either API version."""

    @property
    def namespace(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def name(self) -> str: ...


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """One claim's answer: devices on success, or a non-empty error."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


def _name_problem(claim: ClaimMessage) -> str | None:
    """Why a reference cannot name a real ResourceClaim (the API server enforces these rules)."""
    for field, value, problem in (
        ("namespace", claim.namespace, dns_label_problem(claim.namespace)),
        ("name", claim.name, dns_subdomain_problem(claim.name)),
        ("uid", claim.uid, uid_problem(claim.uid)),
    ):
        if problem is not None:
            shown = value if len(value) <= 80 else value[:80] + "..."
            return f"{field} {shown!r} {problem}"
    return None


def _validate_batch(
    claims: Sequence[ClaimMessage], *, check_names: bool
) -> tuple[list[ClaimRef], dict[str, str]]:
    """Split a request into claims to run and per-UID errors for the ones that cannot run.

    `check_names`: refuse references that break Kubernetes' rules (prepare, which puts them in
    URLs and file names). Unprepare needs neither, and must succeed for anything unknown.
    """
    errors: dict[str, list[str]] = {}
    seen = Tally(c.uid for c in claims)
    runnable: list[ClaimRef] = []
    for claim in claims:
        missing = [f for f in ("namespace", "uid", "name") if not getattr(claim, f)]
        where = f"{claim.namespace or '<no namespace>'}/{claim.name or '<no name>'}"
        if not claim.uid:
            # A map cannot hold an entry without a key: report under "" so the
            # kubelet (which counts entries) still sees an answer for it.
            errors.setdefault("", []).append(
                f"claim {where} has no uid (reported under the empty key); missing: {', '.join(missing)}"
            )
        elif seen[claim.uid] > 1:
            msg = (
                f"claim uid {claim.uid} appears {seen[claim.uid]} times in one request; "
                "each claim must be listed once"
            )
            if msg not in errors.get(claim.uid, []):
                errors.setdefault(claim.uid, []).append(msg)
        elif missing:
            errors[claim.uid] = [f"claim {where} (uid {claim.uid}) is missing {', '.join(missing)}"]
        elif check_names and (problem := _name_problem(claim)) is not None:
            errors[claim.uid] = [f"claim {where[:200]} is not a valid ResourceClaim reference: {problem}"]
        else:
            runnable.append(ClaimRef(namespace=claim.namespace, uid=claim.uid, name=claim.name))
    return runnable, {uid: "; ".join(msgs) for uid, msgs in errors.items()}


def _bounded(
    claims: Sequence[ClaimMessage], bound: int
) -> tuple[Sequence[ClaimMessage], dict[str, ClaimOutcome]]:
    """The first `bound` claims, to run, and an answer for each UID past them.

    A UID both within and past the bound keeps the answer of the one within (an answer is per
    UID). One shared outcome object for all the rest, so a huge call costs a dict entry per UID
    and no task, lock or log line per claim.
    """
    if len(claims) <= bound:
        return claims, {}
    admitted = claims[:bound]
    kept = {c.uid for c in admitted}
    refused = ClaimOutcome(error=TOO_MANY_CLAIMS)
    return admitted, {c.uid: refused for c in claims[bound:] if c.uid not in kept}


def _error_text(exc: Exception) -> str:
    if isinstance(exc, ClaimError):
        return str(exc) or "claim failed"
    # Unexpected failures carry their type: "KeyError: 'x'" says more than "'x'".
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _check_devices(devices: object) -> tuple[PreparedDevice, ...]:
    """The driver's result, validated before it goes on the wire."""
    if not isinstance(devices, Iterable) or isinstance(devices, str | bytes):
        raise ClaimError(f"driver returned {type(devices).__name__}, not a sequence of devices")
    checked = tuple(devices)
    for device in checked:
        if not isinstance(device, PreparedDevice):
            raise ClaimError(f"driver returned {type(device).__name__}, not a PreparedDevice")
        if not device.pool_name or not device.device_name:
            raise ClaimError(f"driver returned a device without pool or device name: {device!r}")
    return checked


class ClaimLocks:
    """One lock per claim UID, alive only while someone holds or waits for it.

    The only per-claim lock of the node plugin: the `Driver` contract lets
    drivers rely on it instead of keeping their own.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


class ClaimRunner:
    """Runs a batch of per-claim driver calls concurrently and collects one outcome per UID.

    A batch that has started runs to completion even if the kubelet gives up on
    the call (timeout, disconnect): stopping a prepare half-way helps nobody,
    and the kubelet's retry then finds the work done (drivers are idempotent).

    Calls for the same claim UID never overlap, across requests and API
    versions: a retry waits for the attempt still running in the background.

    With a `serializer` (two plugin processes on one node during a rolling
    update) each claim's driver call holds the node-wide lock, shared with the
    other calls of this process and exclusive against the other process, and
    the driver reloads its state whenever the lock is taken afresh; the driver
    steps out of it around its API reads (`draplugin.kubelet.nodestate`), so a
    stalled API server holds up no unprepare and no other process.

    A `PendingDriver` (sockets opened before start-up recovery, `draplugin.kubelet.pending`)
    is waited for before each claim's driver call, outside the node-wide lock.
    """

    def __init__(
        self,
        driver: Driver | PendingDriver,
        max_concurrent_claims: int = DEFAULT_MAX_CONCURRENT_CLAIMS,
        serializer: CallSerializer | None = None,
        max_claims_per_call: int = MAX_CLAIMS_PER_CALL,
        max_claims_in_flight: int = MAX_CLAIMS_IN_FLIGHT,
    ) -> None:
        if max_concurrent_claims < 1:
            raise ValueError("max_concurrent_claims must be at least 1")
        if max_claims_per_call < 1:
            raise ValueError("max_claims_per_call must be at least 1")
        if max_claims_in_flight < 1:
            raise ValueError("max_claims_in_flight must be at least 1")
        self._driver = driver
        self._max_claims = max_claims_per_call
        self._max_in_flight = max_claims_in_flight
        # Admitted claims not yet done, per operation; counted before the first await of a call so
        # that concurrent calls see each other's claims.
        self._in_flight = {"prepare": 0, "unprepare": 0}
        self._serializer = serializer
        # Separate bounds: prepares wait on the API server, unprepares never do.
        self._limits = {
            "prepare": asyncio.Semaphore(max_concurrent_claims),
            "unprepare": asyncio.Semaphore(max_concurrent_claims),
        }
        self._per_claim = ClaimLocks()
        # Per-pod sockets: node-local work excludes the other plugin process's; API reads step out.
        self._node_lock = NodeStateLock(serializer, driver.reload_state) if serializer is not None else None
        self._batches: set[asyncio.Future[list[tuple[str, ClaimOutcome]]]] = set()
        # Claims answered at the deadline whose work goes on; kept so shutdown can wait for them.
        self._background: set[asyncio.Future[tuple[str, ClaimOutcome]]] = set()

    def _node_state(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self._node_lock.hold() if self._node_lock is not None else contextlib.nullcontext()

    async def prepare(
        self, claims: Sequence[ClaimMessage], deadline: float | None = None
    ) -> dict[str, ClaimOutcome]:
        """`deadline`: the `time.monotonic()` instant by which every claim is answered (None: none)."""

        async def one(driver: Driver, claim: ClaimRef) -> ClaimOutcome:
            return ClaimOutcome(devices=_check_devices(await driver.prepare_claim(claim)))

        return await self._run("prepare", claims, one, deadline)

    async def unprepare(
        self, claims: Sequence[ClaimMessage], deadline: float | None = None
    ) -> dict[str, ClaimOutcome]:
        async def one(driver: Driver, claim: ClaimRef) -> ClaimOutcome:
            await driver.unprepare_claim(claim)
            return ClaimOutcome()

        return await self._run("unprepare", claims, one, deadline)

    async def _run(
        self,
        operation: str,
        claims: Sequence[ClaimMessage],
        action: Callable[[Driver, ClaimRef], Awaitable[ClaimOutcome]],
        deadline: float | None,
    ) -> dict[str, ClaimOutcome]:
        admitted, excess = _bounded(claims, self._max_claims)
        runnable, invalid = _validate_batch(admitted, check_names=operation == "prepare")
        limit = self._limits[operation]
        outcomes = {uid: ClaimOutcome(error=msg) for uid, msg in invalid.items()}
        room = max(0, self._max_in_flight - self._in_flight[operation])
        if len(runnable) > room:
            busy = runnable[room:]
            runnable = runnable[:room]
            outcomes.update((claim.uid, ClaimOutcome(error=BUSY)) for claim in busy)
            log.warning(
                "claims in flight at the bound: answered busy, for the kubelet to retry",
                extra={"operation": operation, "claims": len(busy), "bound": self._max_in_flight},
            )
        self._in_flight[operation] += len(runnable)
        for uid, msg in invalid.items():
            log.warning("rejected claim in request", extra={"operation": operation, "uid": uid, "error": msg})
        if excess:
            outcomes.update(excess)
            log.warning(
                "call over the claim bound: only the first claims run",
                extra={"operation": operation, "claims": len(claims), "bound": self._max_claims},
            )

        async def guarded(claim: ClaimRef) -> tuple[str, ClaimOutcome]:
            try:
                return await limited(claim)
            finally:  # also when it finishes in the background, after its call was answered
                self._in_flight[operation] -= 1

        async def limited(claim: ClaimRef) -> tuple[str, ClaimOutcome]:
            # Claim lock first: waiting for the same claim must not occupy a concurrency slot.
            async with self._per_claim.hold(claim.uid), limit:
                try:
                    # Before the node-wide lock: start-up recovery may be waiting to take it.
                    driver = (
                        await self._driver.get() if isinstance(self._driver, PendingDriver) else self._driver
                    )
                    async with self._node_state():
                        return claim.uid, await action(driver, claim)
                except Exception as exc:
                    if not isinstance(exc, ClaimError):
                        log.exception("driver raised", extra={"operation": operation, "claim": str(claim)})
                    return claim.uid, ClaimOutcome(error=_error_text(exc))

        async def answered(claim: ClaimRef) -> tuple[str, ClaimOutcome]:
            work = asyncio.ensure_future(guarded(claim))
            if deadline is None:
                return await work
            done, _ = await asyncio.wait({work}, timeout=max(0.0, deadline - time.monotonic()))
            if work in done:
                return work.result()
            # Stopping it half-way helps nobody: it finishes, and the kubelet's retry (which waits
            # for it on the claim lock) gets its result.
            self._background.add(work)
            work.add_done_callback(self._background.discard)
            log.warning(
                "claim answered at the deadline, still running",
                extra={"operation": operation, "claim": str(claim)},
            )
            return claim.uid, ClaimOutcome(
                error=f"{operation} of claim {claim.namespace}/{claim.name} did not finish before the "
                "kubelet's deadline (waiting for the API server or for an earlier call for the same "
                "claim); it goes on in the background and a retry gets its result"
            )

        async def all_answered() -> list[tuple[str, ClaimOutcome]]:
            if len(runnable) == 1:
                # The kubelet's usual call (one pod's claim): gather would wrap it in a task of
                # its own, one more to create and schedule on the loop for nothing.
                return [await answered(runnable[0])]
            return await asyncio.gather(*(answered(c) for c in runnable))

        # The driver bounds its own API work by this deadline too (tasks copy the context).
        tokens = CALL_DEADLINE.set(deadline), CALL_STARTED.set(time.monotonic())
        try:
            batch: asyncio.Future[list[tuple[str, ClaimOutcome]]] = asyncio.ensure_future(all_answered())
        finally:
            CALL_DEADLINE.reset(tokens[0])
            CALL_STARTED.reset(tokens[1])
        self._batches.add(batch)
        batch.add_done_callback(self._batches.discard)
        try:
            results = await asyncio.shield(batch)
        except asyncio.CancelledError:
            if not batch.done():
                log.warning(
                    "kubelet call ended early; in-flight claims will finish in the background",
                    extra={"operation": operation, "claims": len(runnable)},
                )
            raise
        outcomes.update(results)
        failed = sum(1 for outcome in outcomes.values() if outcome.error)
        answers = kubelet_metrics().claim_results
        answers.labels(operation=operation, result="error").inc(failed)
        answers.labels(operation=operation, result="ok").inc(len(outcomes) - failed)
        return outcomes

    async def aclose(self, grace: float) -> None:
        """Give in-flight batches `grace` seconds to finish, then cancel the rest."""
        pending: list[asyncio.Future[Any]] = [*self._batches, *self._background]
        if not pending:
            return
        _, still_running = await asyncio.wait(pending, timeout=grace)
        for batch in still_running:
            batch.cancel()
        if still_running:
            log.warning(
                "cancelled unfinished claim operations at shutdown", extra={"batches": len(still_running)}
            )
            await asyncio.gather(*still_running, return_exceptions=True)


def _summarize(operation: str, version: str, outcomes: dict[str, ClaimOutcome], started: float) -> None:
    failed = sum(1 for o in outcomes.values() if o.error)
    elapsed = time.monotonic() - started
    kubelet_metrics().request_seconds.labels(operation=operation, api_version=version).observe(elapsed)
    # Debug, as the driver's per-claim lines: the kubelet sends one call per pod, so this is per claim
    # too; failures are logged where they happen, and the request histogram counts every call.
    log.debug(
        "kubelet request done",
        extra={
            "operation": operation,
            "api_version": version,
            "claims": len(outcomes),
            "failed": failed,
            "seconds": round(elapsed, 4),
        },
    )


class DRAPluginV1(v1_grpc.DRAPluginServicer):
    def __init__(self, runner: ClaimRunner) -> None:
        self._runner = runner

    async def NodePrepareResources(
        self,
        request: v1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[v1.NodePrepareResourcesRequest, v1.NodePrepareResourcesResponse],
    ) -> v1.NodePrepareResourcesResponse:
        started = time.monotonic()
        outcomes = await self._runner.prepare(
            request.claims, deadline_from_remaining(context.time_remaining())
        )
        response = v1.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                wire = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
                if device.share_id is not None:
                    wire.share_id = device.share_id
        _summarize("prepare", "v1", outcomes, started)
        return response

    async def NodeUnprepareResources(
        self,
        request: v1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            v1.NodeUnprepareResourcesRequest, v1.NodeUnprepareResourcesResponse
        ],
    ) -> v1.NodeUnprepareResourcesResponse:
        started = time.monotonic()
        outcomes = await self._runner.unprepare(
            request.claims, deadline_from_remaining(context.time_remaining())
        )
        response = v1.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            response.claims[uid].error = outcome.error
        _summarize("unprepare", "v1", outcomes, started)
        return response


class DRAPluginV1Beta1(v1beta1_grpc.DRAPluginServicer):
    """The same service for kubelets that only speak v1beta1; it has no share_id."""

    def __init__(self, runner: ClaimRunner) -> None:
        self._runner = runner

    async def NodePrepareResources(
        self,
        request: v1beta1.NodePrepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            v1beta1.NodePrepareResourcesRequest, v1beta1.NodePrepareResourcesResponse
        ],
    ) -> v1beta1.NodePrepareResourcesResponse:
        started = time.monotonic()
        outcomes = await self._runner.prepare(
            request.claims, deadline_from_remaining(context.time_remaining())
        )
        response = v1beta1.NodePrepareResourcesResponse()
        for uid, outcome in outcomes.items():
            entry = response.claims[uid]
            if outcome.error:
                entry.error = outcome.error
                continue
            for device in outcome.devices:
                entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool_name,
                    device_name=device.device_name,
                    cdi_device_ids=device.cdi_device_ids,
                )
        _summarize("prepare", "v1beta1", outcomes, started)
        return response

    async def NodeUnprepareResources(
        self,
        request: v1beta1.NodeUnprepareResourcesRequest,
        context: grpc.aio.ServicerContext[
            v1beta1.NodeUnprepareResourcesRequest, v1beta1.NodeUnprepareResourcesResponse
        ],
    ) -> v1beta1.NodeUnprepareResourcesResponse:
        started = time.monotonic()
        outcomes = await self._runner.unprepare(
            request.claims, deadline_from_remaining(context.time_remaining())
        )
        response = v1beta1.NodeUnprepareResourcesResponse()
        for uid, outcome in outcomes.items():
            response.claims[uid].error = outcome.error
        _summarize("unprepare", "v1beta1", outcomes, started)
        return response
