"""The one client both plugins are driven by: the kubelet's DRA v1 calls over the plugin's Unix socket.

Our own generated stubs (draplugin/kubelet/_proto), one claim per call as the kubelet sends
for a pod with one claim, every answer checked (a claim error fails the benchmark rather than
being timed as a fast answer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet.interface import ClaimRef

# The kubelet's own deadline for these calls.
CALL_TIMEOUT_S = 45.0


class PrepareFailed(Exception):
    """A plugin answered a prepare or unprepare with an error (or not at all)."""


class DraClient:
    def __init__(self, dra_socket: Path) -> None:
        self._channel = grpc.aio.insecure_channel(f"unix://{dra_socket}")
        self._stub = v1_grpc.DRAPluginStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def prepare(self, claim: ClaimRef) -> str:
        """The claim's error ('' when prepared)."""
        request = v1.NodePrepareResourcesRequest(claims=[_claim(claim)])
        answer = await self._stub.NodePrepareResources(request, timeout=CALL_TIMEOUT_S)
        entry = answer.claims.get(claim.uid)
        if entry is None:
            raise PrepareFailed(f"prepare of {claim.name}: no answer for its UID")
        if not entry.error and not entry.devices:
            raise PrepareFailed(f"prepare of {claim.name}: no error and no devices")
        return str(entry.error)

    async def unprepare(self, claim: ClaimRef) -> None:
        request = v1.NodeUnprepareResourcesRequest(claims=[_claim(claim)])
        answer = await self._stub.NodeUnprepareResources(request, timeout=CALL_TIMEOUT_S)
        entry = answer.claims.get(claim.uid)
        if entry is None or entry.error:
            raise PrepareFailed(f"unprepare of {claim.name}: {entry.error if entry else 'no answer'}")

    async def timed_prepare(self, claim: ClaimRef) -> float:
        start = time.perf_counter()
        error = await self.prepare(claim)
        elapsed = time.perf_counter() - start
        if error:
            raise PrepareFailed(f"prepare of {claim.name}: {error}")
        return elapsed


def _claim(claim: ClaimRef) -> v1.Claim:
    return v1.Claim(namespace=claim.namespace, uid=claim.uid, name=claim.name)


@dataclass(frozen=True)
class Batch:
    latencies: list[float]
    wall_s: float
    cpu_s: float  # the plugin's CPU over the prepares, every thread (0.0 without `cpu_s`)
    loop_cpu_s: float  # the same for its main thread alone (0.0 without `loop_cpu_s`)


async def run_batch(
    client: DraClient,
    claims: Sequence[ClaimRef],
    concurrency: int,
    *,
    cpu_s: Callable[[], float] | None = None,
    loop_cpu_s: Callable[[], float] | None = None,
) -> Batch:
    """Prepare every claim, at most `concurrency` in flight: the latencies, the wall time, and the
    plugin's CPU seconds over the prepares (by `cpu_s`, its CPU so far, and `loop_cpu_s`, its main
    thread's). Then unprepare them all (neither timed nor counted), so the devices are free for the
    next batch."""
    gate = asyncio.Semaphore(concurrency)

    async def one(claim: ClaimRef) -> float:
        async with gate:
            return await client.timed_prepare(claim)

    def now(read: Callable[[], float] | None) -> float:
        return read() if read is not None else 0.0

    cpu_before, loop_before = now(cpu_s), now(loop_cpu_s)
    start = time.perf_counter()
    latencies = list(await asyncio.gather(*(one(c) for c in claims)))
    wall = time.perf_counter() - start
    batch = Batch(latencies, wall, now(cpu_s) - cpu_before, now(loop_cpu_s) - loop_before)
    await asyncio.gather(*(client.unprepare(c) for c in claims))
    return batch


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
