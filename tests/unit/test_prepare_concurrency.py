"""A burst of claims as large as the runner admits runs all at once: no admitted claim queues for a
claim-GET worker (the prepare path's claim reader) or for a runner slot."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence

import kubernetes.client as k8s

from dracommon.kubeapi import KubeApi
from dracommon.kubeapi.client import Query, Timeout
from draplugin.kubelet.dra import DEFAULT_MAX_CONCURRENT_CLAIMS, ClaimRunner
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from draplugin.prepare.wiring import claim_reader

BURST = DEFAULT_MAX_CONCURRENT_CLAIMS


class AllAtOnceApi(KubeApi):
    """Answers a GET only once `BURST` GETs are in flight together (a barrier across worker threads);
    fewer in flight, the barrier times out and the GET fails. Set up with a proxy, which the claim
    GETs' connection pool does not cover: its reads go through the client's threads
    (tests/unit/test_claim_pool.py has the pool's own burst)."""

    def __init__(self) -> None:
        configuration = k8s.Configuration(host="http://127.0.0.1:9")
        configuration.proxy = "http://127.0.0.1:9"
        super().__init__(k8s.ApiClient(configuration))
        self.barrier = threading.Barrier(BURST, timeout=10)

    def get_bytes(self, path: str, query: Query | None = None, *, timeout: Timeout | None = None) -> bytes:
        self.barrier.wait()
        return json.dumps({"metadata": {"name": path.rsplit("/", 1)[-1]}}).encode()


async def test_the_claim_reader_on_the_clients_threads_sends_a_full_burst_at_once() -> None:
    api = AllAtOnceApi()
    reader = claim_reader(api)
    try:
        deadline = time.monotonic() + 20
        docs = await asyncio.gather(*(reader.get_claim("ns", f"c{i}", deadline) for i in range(BURST)))
    finally:
        reader.close()
    assert [doc["metadata"]["name"] for doc in docs if doc is not None] == [f"c{i}" for i in range(BURST)]
    assert not api.barrier.broken


class AllAtOnceDriver:
    """Prepares a claim only once `BURST` prepares are running together."""

    def __init__(self) -> None:
        self.barrier = asyncio.Barrier(BURST)

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        await asyncio.wait_for(self.barrier.wait(), 10)
        return [PreparedDevice(("gpu",), "pool", claim.name, (f"vendor/gpu={claim.uid}",))]

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        return None

    def reload_state(self) -> None:
        return None


async def test_the_runner_admits_a_full_burst_of_claims_at_once() -> None:
    runner = ClaimRunner(AllAtOnceDriver())
    answers = await runner.prepare([ClaimRef("ns", f"uid-{i}", f"c{i}") for i in range(BURST)])
    assert [answers[f"uid-{i}"].error for i in range(BURST)] == [""] * BURST
