"""The shared API client over real HTTP: a scripted server on 127.0.0.1 answers, the real request
path carries it: our RestClient (urllib3), and a kubernetes ApiClient as the dev cluster hands in
(every test runs with both). Errors, verbs, pagination, server-side apply, watches."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from kubernetes import client as k8s

from dracommon.kubeapi import (
    APPLY_PATCH,
    MERGE_PATCH,
    ApiError,
    AsyncKubeApi,
    Gone,
    KubeApi,
    error_from_status,
    watch_events,
)
from dracommon.kubeapi.credentials import Credentials
from dracommon.kubeapi.rest import RestClient

TOKEN = "test-token"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # a dict or list is sent as JSON, bytes as they are
    chunks: list[bytes] | None = None  # sent one by one with chunked encoding, as a watch is
    cut: bool = False  # drop the connection before the last chunk (a stream broken midway)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: bytes


@dataclass
class FakeApiServer:
    port: int = 0
    replies: dict[tuple[str, str], list[Reply]] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)

    def reply(self, method: str, path: str, *replies: Reply) -> None:
        self.replies.setdefault((method, path), []).extend(replies)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def serve(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.seen.append(
                    Seen(
                        self.command,
                        url.path,
                        dict(parse_qsl(url.query)),
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                )
                queue = server.replies.get((self.command, url.path)) or [Reply(404, b"no route")]
                self.answer(queue.pop(0) if len(queue) > 1 else queue[0])

            def answer(self, reply: Reply) -> None:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                if reply.chunks is None:
                    data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                    data = b"" if reply.body is None else data
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in reply.chunks:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    time.sleep(0.02)  # arrive separately, so lines really are split across reads
                if reply.cut:
                    self.close_connection = True
                    return
                self.wfile.write(b"0\r\n\r\n")

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = serve

        return Handler


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    fake = FakeApiServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    fake.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    httpd.shutdown()
    httpd.server_close()


def api_client(port: int) -> Any:
    """A kubernetes ApiClient to the scripted server (other tests' clients, as before)."""
    return library_client(port)


def library_client(port: int) -> Any:
    configuration = k8s.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.api_key = {"BearerToken": TOKEN}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return k8s.ApiClient(configuration)


def rest_client(port: int) -> Any:
    return RestClient(Credentials(server=f"http://127.0.0.1:{port}", token=TOKEN))


@pytest.fixture(params=[rest_client, library_client], ids=["rest", "kubernetes"])
def make_client(request: pytest.FixtureRequest) -> Callable[[int], Any]:
    made: Callable[[int], Any] = request.param
    return made


@pytest.fixture
def api(server: FakeApiServer, make_client: Callable[[int], Any]) -> Iterator[KubeApi]:
    with make_client(server.port) as client:
        yield KubeApi(client, timeout_s=5)


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip


def events(*docs: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(d).encode() + b"\n" for d in docs)


# ---------------------------------------------------------------- requests and errors


def test_get_sends_credentials_and_query_and_returns_the_object(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", "/api/v1/nodes/n1", Reply(body={"kind": "Node", "metadata": {"name": "n1"}}))
    assert api.get("/api/v1/nodes/n1", {"pretty": "false"}) == {"kind": "Node", "metadata": {"name": "n1"}}
    (seen,) = server.seen
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["accept"] == "application/json"
    assert seen.query == {"pretty": "false"}


def test_a_status_answer_becomes_an_api_error_with_code_reason_and_message(
    server: FakeApiServer, api: KubeApi
) -> None:
    body = status(404, "NotFound", 'nodes "n1" not found')
    server.reply("GET", "/api/v1/nodes/n1", Reply(404, body))
    with pytest.raises(ApiError) as caught:
        api.get("/api/v1/nodes/n1")
    err = caught.value
    assert (err.status, err.reason, err.message) == (404, "NotFound", 'nodes "n1" not found')
    assert str(err) == 'HTTP 404: nodes "n1" not found'
    assert json.loads(err.body) == body
    assert not isinstance(err, Gone)


def test_a_non_json_error_body_is_kept_and_quoted(server: FakeApiServer, api: KubeApi) -> None:
    page = b"<html>bad gateway</html>" + b"x" * 2000
    server.reply("GET", "/version", Reply(502, page))
    with pytest.raises(ApiError) as caught:
        api.get("/version")
    assert caught.value.status == 502 and caught.value.reason == ""
    assert caught.value.message.startswith("<html>bad gateway</html>") and len(caught.value.message) == 500
    assert caught.value.body == page.decode()


def test_an_empty_error_body_falls_back_to_the_http_reason(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", "/version", Reply(503))
    with pytest.raises(ApiError, match="HTTP 503: Service Unavailable"):
        api.get("/version")


def test_410_is_gone(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", SLICES, Reply(410, status(410, "Expired", "continue token expired")))
    with pytest.raises(Gone, match="continue token expired"):
        api.list(SLICES)


def test_no_answer_is_status_zero(api: KubeApi, make_client: Callable[[int], Any]) -> None:
    with make_client(1) as client, pytest.raises(ApiError) as caught:
        KubeApi(client, timeout_s=2).get("/version")
    assert caught.value.status == 0 and "GET /version" in str(caught.value)


def test_an_answer_that_is_not_a_json_object_is_an_error(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", "/a", Reply(body=[1, 2]))
    server.reply("GET", "/b", Reply(body=b"not json"))
    with pytest.raises(ApiError, match="not a JSON object"):
        api.get("/a")
    with pytest.raises(ApiError, match="not JSON"):
        api.get("/b")


def test_verbs_send_their_method_body_and_content_type(server: FakeApiServer, api: KubeApi) -> None:
    path = f"{SLICES}/s1"
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        server.reply(method, SLICES if method == "POST" else path, Reply(body={"ok": method}))
    server.reply("PATCH", f"{path}/status", Reply(body={"ok": "status"}))
    assert api.create(SLICES, {"metadata": {"name": "s1"}}) == {"ok": "POST"}
    assert api.replace(path, {"metadata": {"name": "s1", "resourceVersion": "7"}}) == {"ok": "PUT"}
    assert api.merge_patch(path, {"metadata": {"labels": {"a": "b"}}}) == {"ok": "PATCH"}
    assert api.patch_status(path, {"status": {"x": 1}}) == {"ok": "status"}
    assert api.delete(path, {"preconditions": {"uid": "u1"}}) == {"ok": "DELETE"}
    create, replace, patch, patch_status, delete = server.seen
    assert json.loads(create.body) == {"metadata": {"name": "s1"}}
    assert create.headers["content-type"] == "application/json"
    assert json.loads(replace.body)["metadata"]["resourceVersion"] == "7"
    assert patch.headers["content-type"] == MERGE_PATCH
    assert (patch_status.path, patch_status.headers["content-type"]) == (f"{path}/status", MERGE_PATCH)
    assert json.loads(delete.body) == {"preconditions": {"uid": "u1"}}


def test_server_side_apply_names_the_field_manager_and_force(server: FakeApiServer, api: KubeApi) -> None:
    path = f"{SLICES}/s1"
    server.reply("PATCH", path, Reply(body={"metadata": {"name": "s1"}}))
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s1"}}
    api.apply(path, body, field_manager="draplugin")
    api.apply(path, body, field_manager="draplugin", force=True)
    plain, forced = server.seen
    assert plain.headers["content-type"] == APPLY_PATCH == "application/apply-patch+yaml"
    assert plain.query == {"fieldManager": "draplugin"}
    assert forced.query == {"fieldManager": "draplugin", "force": "true"}
    assert json.loads(plain.body) == body  # JSON is YAML: the server reads it as the applied config


def test_list_follows_continue_pages_and_fills_in_kind(server: FakeApiServer, api: KubeApi) -> None:
    server.reply(
        "GET",
        SLICES,
        Reply(body={"metadata": {"resourceVersion": "10", "continue": "tok"}, "items": [{"metadata": {}}]}),
        Reply(body={"metadata": {"resourceVersion": "10"}, "items": [{"metadata": {}}, {"kind": "X"}]}),
    )
    items, version = api.list(
        SLICES, kind="ResourceSlice", query={"fieldSelector": "spec.nodeName=n1"}, page_size=1
    )
    assert version == "10"
    assert [i.get("kind") for i in items] == ["ResourceSlice", "ResourceSlice", "X"]
    first, second = server.seen
    assert first.query == {"fieldSelector": "spec.nodeName=n1", "limit": "1"}
    assert second.query == {"fieldSelector": "spec.nodeName=n1", "limit": "1", "continue": "tok"}


# ---------------------------------------------------------------- watches


def test_watch_reads_events_split_across_chunks_and_asks_for_bookmarks(
    server: FakeApiServer, api: KubeApi
) -> None:
    stream = events(
        {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "11"}}},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
        {"type": "DELETED", "object": {"metadata": {"name": "a", "resourceVersion": "13"}}},
    )
    server.reply("GET", SLICES, Reply(chunks=[stream[:30], stream[30:95], stream[95:]]))
    got = list(api.watch(SLICES, "10", query={"fieldSelector": "spec.driver=d"}, timeout_s=60))
    assert [(e["type"], e["object"]["metadata"]["resourceVersion"]) for e in got] == [
        ("ADDED", "11"),
        ("BOOKMARK", "12"),
        ("DELETED", "13"),
    ]
    assert server.seen[0].query == {
        "fieldSelector": "spec.driver=d",
        "watch": "true",
        "timeoutSeconds": "60",
        "allowWatchBookmarks": "true",
        "resourceVersion": "10",
    }


def test_watch_error_event_410_raises_gone_after_the_events_before_it(
    server: FakeApiServer, api: KubeApi
) -> None:
    stream = events(
        {"type": "ADDED", "object": {"metadata": {"name": "a"}}},
        {"type": "ERROR", "object": status(410, "Expired", "too old resource version: 5 (9)")},
    )
    server.reply("GET", SLICES, Reply(chunks=[stream]))
    seen: list[str] = []
    with pytest.raises(Gone) as caught:
        for event in api.watch(SLICES, "5"):
            seen.append(event["type"])
    assert seen == ["ADDED"]
    assert (caught.value.status, caught.value.reason) == (410, "Expired")


def test_watch_other_error_events_and_a_410_answer(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", SLICES, Reply(chunks=[events({"type": "ERROR", "object": status(500, "", "etcd")})]))
    with pytest.raises(ApiError) as caught:
        list(api.watch(SLICES, "5"))
    assert caught.value.status == 500 and not isinstance(caught.value, Gone)
    server.replies.clear()
    server.reply("GET", SLICES, Reply(410, status(410, "Expired", "too old")))
    with pytest.raises(Gone):
        list(api.watch(SLICES, "5"))


def test_a_watch_broken_midway_is_status_zero(server: FakeApiServer, api: KubeApi) -> None:
    server.reply("GET", SLICES, Reply(chunks=[events({"type": "ADDED", "object": {}})], cut=True))
    got: list[dict[str, Any]] = []
    with pytest.raises(ApiError, match=r"watch of .* broke") as caught:
        got.extend(api.watch(SLICES, ""))
    assert caught.value.status == 0 and [e["type"] for e in got] == ["ADDED"]
    assert "resourceVersion" not in server.seen[0].query  # "" watches from now


def test_watch_events_skips_blank_lines_and_refuses_garbage() -> None:
    assert list(watch_events(["", "  ", '{"type": "ADDED", "object": {}}'])) == [
        {"type": "ADDED", "object": {}}
    ]
    with pytest.raises(ApiError, match="malformed watch event"):
        list(watch_events(["{not json"]))
    with pytest.raises(ApiError, match="not an event object"):
        list(watch_events(['{"object": {}}']))


def test_error_from_status_uses_the_status_code_when_no_http_status() -> None:
    err = error_from_status({"code": 410, "reason": "Expired"})
    assert isinstance(err, Gone) and err.message == "Expired (no message)"
    assert error_from_status({"code": 500, "message": "x"}, http_status=503).status == 503


# ---------------------------------------------------------------- asyncio callers


def test_async_calls_run_on_the_pool_with_one_connection_per_worker(server: FakeApiServer) -> None:
    server.reply("GET", "/version", Reply(body={"gitVersion": "v1.37.2"}))
    with library_client(server.port) as client:
        client.configuration.connection_pool_maxsize = 2
        aapi = AsyncKubeApi(KubeApi(client), workers=8)
        try:

            async def burst() -> list[dict[str, Any]]:
                return await asyncio.gather(*(aapi.get("/version") for _ in range(8)))

            assert asyncio.run(burst()) == [{"gitVersion": "v1.37.2"}] * 8
            assert client.configuration.connection_pool_maxsize == 8
            assert client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 8
        finally:
            aapi.close()


def test_a_rest_client_gets_a_pooled_connection_per_worker_and_the_retries_asked(
    server: FakeApiServer,
) -> None:
    server.reply("GET", "/version", Reply(body={"gitVersion": "v1.37.2"}))
    with rest_client(server.port) as client:
        client.pool_size = 2
        aapi = AsyncKubeApi(KubeApi(client), workers=8, retries=0)
        try:

            async def burst() -> list[dict[str, Any]]:
                return await asyncio.gather(*(aapi.get("/version") for _ in range(8)))

            assert asyncio.run(burst()) == [{"gitVersion": "v1.37.2"}] * 8
            assert (client.pool_size, client.retries) == (8, 0)
            assert client._manager().connection_pool_kw["maxsize"] == 8
            assert client._manager().connection_pool_kw["retries"].total == 0
        finally:
            aapi.close()
