"""Claim reads against an API server that stalls, drops, fails or sends awkward JSON: each claim gets a
specific answer within its deadline, over the real request path (kubernetes ApiClient, urllib3)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubeapi import ApiError, AsyncKubeApi, KubeApi
from draplugin.kubelet.dra import ClaimRunner
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.prepare.api import ApiDeadlineExceeded, KubeClaimReader
from tests.unit.test_kubeapi import FakeApiServer, Reply, api_client, server  # noqa: F401 (fixture)
from tests.unit.test_prepare_driver import Node
from tests.unit.test_prepare_plan import claim_doc, config, gpu_config, result

CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/claim"
REF = ClaimRef("ns", "uid-1", "claim")


class Listener:
    """A loopback port that accepts connections and then does one thing: `stall` (read the request,
    never answer) or `drop` (close at once). Counts the connections it got."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.mode == "drop":
                conn.close()
            else:
                self._open.append(conn)

    def close(self) -> None:
        self._sock.close()
        for conn in self._open:
            conn.close()


@pytest.fixture
def stalled() -> Iterator[Listener]:
    listener = Listener("stall")
    yield listener
    listener.close()


@pytest.fixture
def dropping() -> Iterator[Listener]:
    listener = Listener("drop")
    yield listener
    listener.close()


def reader(port: int, **options: Any) -> KubeClaimReader:
    # The production shape: a long per-request timeout, the client's retries bounded to none.
    return KubeClaimReader(AsyncKubeApi(KubeApi(api_client(port), timeout_s=20.0), 4, retries=0), **options)


async def test_a_stalled_api_server_gets_a_timely_specific_error(stalled: Listener) -> None:
    claims = reader(stalled.port)
    started = time.monotonic()
    with pytest.raises(ApiDeadlineExceeded, match="the API server did not answer in time"):
        await claims.get_claim("ns", "claim", deadline=started + 1.0)
    assert time.monotonic() - started < 1.8
    claims.close()


async def test_every_claim_of_a_burst_is_answered_by_the_deadline_not_the_pool(stalled: Listener) -> None:
    # 4 worker threads, 20 claims: the ones still queued for a thread are answered at the deadline too.
    claims = reader(stalled.port)
    started = time.monotonic()
    results = await asyncio.gather(
        *(claims.get_claim("ns", f"c{i}", deadline=started + 1.0) for i in range(20)), return_exceptions=True
    )
    assert all(isinstance(r, ApiDeadlineExceeded) for r in results)
    assert time.monotonic() - started < 1.8
    claims.close()


async def test_the_clients_own_retries_are_bounded(dropping: Listener) -> None:
    # urllib3 would retry a dropped connection three times inside one call; ours retries with backoff.
    claims = reader(dropping.port, backoff_s=0.3)
    with pytest.raises(ApiDeadlineExceeded, match=r"after \d+ attempts"):
        await claims.get_claim("ns", "claim", deadline=time.monotonic() + 1.0)
    assert 2 <= dropping.connections <= 5
    claims.close()


async def test_a_transient_server_error_is_retried_within_the_deadline(server: FakeApiServer) -> None:  # noqa: F811
    doc = claim_doc(results=[result("gpu", "gpu-0")])
    server.reply("GET", CLAIM_PATH, Reply(503, b"etcd leader changed"), Reply(body=doc))
    claims = reader(server.port, backoff_s=0.05)
    assert await claims.get_claim("ns", "claim", deadline=time.monotonic() + 5) == doc
    assert len(server.seen) == 2
    claims.close()


async def test_a_client_error_is_not_retried(server: FakeApiServer) -> None:  # noqa: F811
    server.reply("GET", CLAIM_PATH, Reply(403, {"kind": "Status", "message": "forbidden", "code": 403}))
    claims = reader(server.port, backoff_s=0.05)
    with pytest.raises(ApiError, match="HTTP 403: forbidden"):
        await claims.get_claim("ns", "claim", deadline=time.monotonic() + 5)
    assert len(server.seen) == 1
    claims.close()


def test_names_are_escaped_as_whole_path_segments() -> None:
    seen: list[str] = []

    class Recording:
        async def get_bytes(self, path: str, request_timeout: float) -> bytes:
            seen.append(path)
            return json.dumps(claim_doc()).encode()

        def close(self) -> None:
            pass

    claims = KubeClaimReader(Recording())  # type: ignore[arg-type]
    asyncio.run(claims.get_claim("ns", "a/../b", deadline=time.monotonic() + 5))
    assert seen == ["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/a%2F..%2Fb"]


# --- the driver's answers ----------------------------------------------------------------------------


DEEP = "@deep@"


def with_deep(doc: dict[str, Any], levels: int) -> bytes:
    """The claim's JSON with the DEEP placeholder replaced by a value nested `levels` deep (written
    as text: Python's own encoder cannot nest that far either)."""
    value = '{"x": [' * levels + '{"leaf": true}' + "]}" * levels
    return json.dumps(doc).replace(json.dumps(DEEP), value).encode()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


async def test_the_driver_reports_a_stall_as_the_api_server_not_answering_in_time(
    node: Node, stalled: Listener
) -> None:
    driver = node.driver()
    driver.claims = reader(stalled.port)
    driver.api_deadline_s = 1.0
    started = time.monotonic()
    with pytest.raises(ClaimError, match="the API server did not answer in time"):
        await driver.prepare_claim(REF)
    assert time.monotonic() - started < 1.8
    assert node.events.claim_events[0][1] == "APIServerTimeout"


async def test_the_grpc_deadline_is_handed_down_to_the_api_reads(node: Node, stalled: Listener) -> None:
    driver = node.driver()
    driver.claims = reader(stalled.port)  # the setting's 40 s would outlast the kubelet
    runner = ClaimRunner(driver)
    started = time.monotonic()
    answers = await runner.prepare([REF], deadline=started + 1.0)
    assert "the API server did not answer in time" in answers["uid-1"].error
    assert time.monotonic() - started < 1.8


async def test_other_drivers_deep_config_does_not_stop_our_claim(node: Node, server: FakeApiServer) -> None:  # noqa: F811
    foreign = config("FromClaim", DEEP, driver="other.example.com")
    doc = claim_doc(results=[result("gpu", "gpu-0")], configs=[foreign])
    server.reply("GET", CLAIM_PATH, Reply(body=with_deep(doc, 1600)))
    driver = node.driver()
    driver.claims = reader(server.port)
    assert [d.device_name for d in await driver.prepare_claim(REF)] == ["gpu-0"]


async def test_our_deep_config_is_an_invalid_config(node: Node, server: FakeApiServer) -> None:  # noqa: F811
    ours = config("FromClaim", {**gpu_config(), "extra": DEEP})
    doc = claim_doc(results=[result("gpu", "gpu-0")], configs=[ours])
    server.reply("GET", CLAIM_PATH, Reply(body=with_deep(doc, 1600)))
    driver = node.driver()
    driver.claims = reader(server.port)
    with pytest.raises(ClaimError, match=r"invalid claim config: .*nested more than \d+ levels deep"):
        await driver.prepare_claim(REF)
    assert node.events.claim_events[0][1] == "InvalidConfig"


async def test_connection_refused_and_a_non_json_answer_are_api_errors(
    node: Node,
    server: FakeApiServer,  # noqa: F811
) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    driver = node.driver()
    driver.claims = reader(port, backoff_s=0.05)
    driver.api_deadline_s = 0.5
    with pytest.raises(ClaimError, match="did not answer in time"):
        await driver.prepare_claim(REF)
    server.reply("GET", CLAIM_PATH, Reply(body=b"<html>proxy error</html>"))
    driver.claims = reader(server.port)
    with pytest.raises(ClaimError, match=r"reading claim ns/claim from the API server failed: .*not JSON"):
        await driver.prepare_claim(REF)
    assert [reason for _, reason, _ in node.events.claim_events] == ["APIServerTimeout", "APIError"]
    assert "refused" in node.events.claim_events[0][2]  # the last failure is in the message


async def test_claims_queued_for_a_slot_get_no_extra_time(node: Node, stalled: Listener) -> None:
    # The deadline counts from the kubelet's call, not from when a claim got one of the slots.
    driver = node.driver()
    driver.claims = reader(stalled.port)
    driver.api_deadline_s = 1.0
    runner = ClaimRunner(driver, max_concurrent_claims=2)
    started = time.monotonic()
    answers = await runner.prepare([ClaimRef("ns", f"uid-{i}", f"c{i}") for i in range(6)])
    assert all("did not answer in time" in a.error for a in answers.values())
    assert time.monotonic() - started < 1.8
