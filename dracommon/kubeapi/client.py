"""`KubeApi`: every request to the API server, as raw JSON dicts in and out.

Built on a `RestClient` (dracommon.kubeapi.rest: urllib3 with the credentials
`load_api_client` read), or on a `kubernetes` package ApiClient where one is
handed in (the dev cluster and tests build those; `load_api_client` falls back
to one for kubeconfig users only that package serves), never on its typed
models: those drop fields a newer server sends, and a read-modify-write would
lose them. A
failure is always an `ApiError` (`Gone` for 410): an HTTP error answer with
the server's metav1.Status, or status 0 when no answer came (connection
refused, TLS, timeout, a stream broken midway). What to do about it is each
caller's policy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from dracommon.kubeapi.errors import ApiError, error_from_response
from dracommon.kubeapi.rest import RestClient
from dracommon.kubeapi.watch import watch_events

JSON = dict[str, Any]
Query = Mapping[str, str]
Timeout = float | tuple[float, float]
T = TypeVar("T")

JSON_TYPE: Final = "application/json"
MERGE_PATCH: Final = "application/merge-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"
# A list answered with each item's metadata only (PartialObjectMetadataList): names, uids and
# resourceVersions at a fraction of the size, for a client that keeps the full objects itself.
METADATA_LIST: Final = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
DEFAULT_TIMEOUT_S: Final = 30.0
PAGE_SIZE: Final = 500
WATCH_CONNECT_TIMEOUT_S: Final = 10.0
# The server ends a watch after its timeoutSeconds; the client waits this much longer before giving up.
WATCH_READ_SLACK_S: Final = 30.0


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What the HTTP stack raises when no answer came."""
    from urllib3.exceptions import HTTPError

    return HTTPError, OSError


class _KubernetesTransport:
    """`RestClient.urlopen` over a `kubernetes` package ApiClient (its server, credentials and pool)."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    def urlopen(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]],
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: Timeout,
    ) -> Any:
        from kubernetes.client.exceptions import ApiException  # the library's wrapper of TLS errors
        from urllib3.exceptions import HTTPError

        try:
            method, url, sent, _, _ = self.api_client.param_serialize(
                method=method,
                resource_path=path,
                query_params=list(query),
                header_params=dict(headers),
                auth_settings=["BearerToken"],
            )
            # The library serializes JSON bodies itself (all of ours are JSON).
            obj = json.loads(body) if body is not None else None
            return self.api_client.call_api(
                method, url, header_params=sent, body=obj, _request_timeout=timeout
            ).response
        except ApiException as err:
            raise HTTPError(str(err)) from err


class KubeApi:
    """Raw-JSON requests with one client's server and credentials (`RestClient`, or a `kubernetes`
    ApiClient)."""

    def __init__(self, api_client: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.api_client = api_client
        self.timeout_s = timeout_s
        self._transport: RestClient | _KubernetesTransport = (
            api_client if isinstance(api_client, RestClient) else _KubernetesTransport(api_client)
        )

    # ---------------------------------------------------------------- the one request path

    def _send(
        self,
        method: str,
        path: str,
        body: Any,
        query: Query | None,
        content_type: str,
        timeout: Timeout | None,
        accept: str = JSON_TYPE,
    ) -> Any:
        """One request; returns the unread 2xx response (`status`, `read()`, `response` to stream),
        raises `ApiError` for any other outcome."""
        headers = {"Accept": accept}
        payload = None
        if body is not None:
            headers["Content-Type"] = content_type
            # JSON for every content type: an apply patch's YAML may be JSON, as kubectl sends it.
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        try:
            response = self._transport.urlopen(
                method,
                path,
                query=list((query or {}).items()),
                headers=headers,
                body=payload,
                timeout=timeout or self.timeout_s,
            )
            if 200 <= response.status < 300:
                return response
            data = response.read()
        except _transport_errors() as err:
            raise ApiError(0, f"{method} {path}: {err}") from err
        raise error_from_response(int(response.status), bytes(data or b""), str(response.reason or ""))

    def get_bytes(self, path: str, query: Query | None = None, *, timeout: Timeout | None = None) -> bytes:
        """The raw body of a GET, for callers that decode it themselves (bounded nesting, say)."""
        response = self._send("GET", path, None, query, JSON_TYPE, timeout)
        try:
            return bytes(response.read() or b"")
        except _transport_errors() as err:
            raise ApiError(0, f"GET {path}: reading the answer: {err}") from err

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Query | None = None,
        content_type: str = JSON_TYPE,
        timeout: Timeout | None = None,
        accept: str = JSON_TYPE,
    ) -> JSON:
        """One request; the answer's JSON object ({} for an empty body), or `ApiError`."""
        response = self._send(method, path, body, query, content_type, timeout, accept)
        try:
            data = response.read()
        except _transport_errors() as err:
            raise ApiError(0, f"{method} {path}: reading the answer: {err}") from err
        if not data:
            return {}
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than the parser goes
            raise ApiError(int(response.status), f"{method} {path}: answer is not JSON: {err}") from err
        if not isinstance(doc, dict):
            raise ApiError(int(response.status), f"{method} {path}: answer is not a JSON object")
        return doc

    # ---------------------------------------------------------------- verbs

    def get(self, path: str, query: Query | None = None, *, accept: str = JSON_TYPE) -> JSON:
        return self.request("GET", path, query=query, accept=accept)

    def create(self, path: str, body: Mapping[str, Any], query: Query | None = None) -> JSON:
        """POST to a collection."""
        return self.request("POST", path, dict(body), query=query)

    def replace(self, path: str, body: Mapping[str, Any]) -> JSON:
        """PUT: the whole object, with its resourceVersion (409 Conflict when it changed since)."""
        return self.request("PUT", path, dict(body))

    def delete(
        self,
        path: str,
        options: Mapping[str, Any] | None = None,
        *,
        query: Query | None = None,
        timeout: Timeout | None = None,
    ) -> JSON:
        """DELETE an object, or a collection with a selector in `query`; `options` is a DeleteOptions
        (preconditions, grace period)."""
        body = dict(options) if options is not None else None
        return self.request("DELETE", path, body, query=query, timeout=timeout)

    def merge_patch(self, path: str, patch: Mapping[str, Any], *, timeout: Timeout | None = None) -> JSON:
        """A JSON merge patch (RFC 7386): only the fields named change."""
        return self.request("PATCH", path, dict(patch), content_type=MERGE_PATCH, timeout=timeout)

    def patch_status(self, path: str, patch: Mapping[str, Any], *, timeout: Timeout | None = None) -> JSON:
        """A JSON merge patch of the object's status subresource."""
        return self.merge_patch(f"{path}/status", patch, timeout=timeout)

    def apply(self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False) -> JSON:
        """Server-side apply of the object at `path`: the fields in `body` become owned by
        `field_manager`; `force` takes over fields another manager owns instead of a 409."""
        query = {"fieldManager": field_manager}
        if force:
            query["force"] = "true"
        return self.request("PATCH", path, dict(body), query=query, content_type=APPLY_PATCH)

    def list(
        self,
        path: str,
        *,
        kind: str | None = None,
        query: Query | None = None,
        page_size: int = PAGE_SIZE,
        accept: str = JSON_TYPE,
    ) -> tuple[list[JSON], str]:
        """Every item of a collection, following `continue` pages, and the list's resourceVersion.

        Items of a list carry no `kind`; `kind` fills it in for code that tells objects apart by it.
        `accept` asks for another representation, such as `METADATA_LIST` (metadata only).
        """
        items: list[JSON] = []
        params = {**(query or {}), "limit": str(page_size)}
        while True:
            page = self.get(path, params, accept=accept)
            for item in page.get("items") or []:
                if kind is not None:
                    item.setdefault("kind", kind)
                items.append(item)
            meta = page.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = str(meta["continue"])

    def watch(
        self,
        path: str,
        resource_version: str,
        *,
        query: Query | None = None,
        timeout_s: int = 300,
        bookmarks: bool = True,
    ) -> Iterator[JSON]:
        """Events (`{"type": ..., "object": ...}`, BOOKMARKs included) from `resource_version` ("": from
        now) until the server ends the watch after `timeout_s`. Raises `Gone` when the version is too
        old, `ApiError` for other failures, including a stream that breaks."""
        params = {**(query or {}), "watch": "true", "timeoutSeconds": str(timeout_s)}
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = (WATCH_CONNECT_TIMEOUT_S, timeout_s + WATCH_READ_SLACK_S)
        raw = self._send("GET", path, None, params, JSON_TYPE, timeout)
        try:
            yield from watch_events(_lines(raw))
        except _transport_errors() as err:
            raise ApiError(0, f"watch of {path} broke: {err}") from err
        finally:
            raw.close()  # a watch left midway has unread data: never hand that connection out again
            raw.release_conn()


def _lines(response: Any) -> Iterator[bytes]:
    """The stream's lines as the chunks bring them, a line split across chunks joined."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        *complete, pending = (pending + chunk).split(b"\n")
        yield from complete
    if pending:
        yield pending


class AsyncKubeApi:
    """`KubeApi` calls on a thread pool, for asyncio code: the client is synchronous, and the
    kubelet asks to prepare many claims at once.

    `retries`: how often urllib3 retries a failed request inside one call (None: its default,
    three). Callers with a deadline set 0 and retry themselves: hidden retries multiply the
    timeout (4 x 20 s for one GET) past any deadline.
    """

    def __init__(self, api: KubeApi, workers: int, *, retries: int | None = None) -> None:
        self.api = api
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        _ensure_connections(api.api_client, workers, retries)

    async def request(self, method: str, path: str, body: Any = None, *, query: Query | None = None) -> JSON:
        return await self._run(lambda: self.api.request(method, path, body, query=query))

    async def get(self, path: str, query: Query | None = None) -> JSON:
        return await self._run(lambda: self.api.get(path, query))

    async def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool = False
    ) -> JSON:
        """`KubeApi.apply` (server-side apply) off the event loop."""
        return await self._run(lambda: self.api.apply(path, body, field_manager=field_manager, force=force))

    async def get_bytes(self, path: str, *, request_timeout: Timeout | None = None) -> bytes:
        """The raw body; `request_timeout` bounds the HTTP request (see `KubeApi`), not this await."""
        return await self._run(lambda: self.api.get_bytes(path, timeout=request_timeout))

    async def _run(self, call: Callable[[], T]) -> T:
        import asyncio  # here: asyncio is ~30 ms of start-up for every CLI command reading files

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _ensure_connections(api_client: Any, workers: int, retries: int | None = None) -> None:
    """One pooled connection per worker, so parallel requests do not open and drop sockets, and
    urllib3's retries as asked.

    A kubernetes ApiClient's pool is built with it, so a larger size needs a new one.
    """
    if isinstance(api_client, RestClient):
        api_client.ensure_pool(workers, retries)
        return
    configuration = api_client.configuration
    current = configuration.retries
    same_retries = retries is None or getattr(current, "total", current) == retries
    if (configuration.connection_pool_maxsize or 0) >= workers and same_retries:
        return
    from kubernetes.client.rest import RESTClientObject
    from urllib3 import Retry

    configuration.connection_pool_maxsize = max(workers, configuration.connection_pool_maxsize or 0)
    if retries is not None:
        configuration.retries = Retry(total=retries, redirect=0)
    old = api_client.rest_client
    api_client.rest_client = RESTClientObject(configuration)
    old.pool_manager.clear()
