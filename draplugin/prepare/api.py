"""Reading ResourceClaims for the prepare path, within a deadline.

Claims are read as plain JSON, never through the generated models: those drop
fields they do not know, and a newer API server's allocation fields must not
vanish between the wire and our planning code. The kubelet sends many claims at
once, and their GETs go out at once on the event loop, each on a keep-alive
connection of its own (`draplugin.prepare.claimpool`), with the shared client's
server, TLS settings and credentials (its bearer token read per request, so a
refreshed service account token is used as the client would use it). A client
set up in a way the pool does not cover (a proxy, a custom hostname check)
reads on the shared client's thread pool (`AsyncKubeApi`) instead, as
`list_claims` at start-up always does.

Every read has a deadline (the kubelet's, handed down, or the plugin's own
setting): transient failures are retried with backoff inside it, and when it
passes the claim gets `ApiDeadlineExceeded`, a clean per-claim error, instead
of the kubelet's call expiring first. The client's own hidden retries are
switched off (`AsyncKubeApi(retries=0)`) so one attempt never outlasts it; the
pool's one hidden retry is of a kept-alive connection the server had closed.

Bodies are decoded with bounded nesting (`decode_json`): opaque parameters of
other drivers may be nested deeper than Python's parser recurses, and must not
stop a claim whose config of ours is fine.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from typing import Any, Final, Protocol
from urllib.parse import quote

from dracommon.kubeapi import ApiError, AsyncKubeApi
from dracommon.kubeapi.errors import error_from_response
from draplugin.prepare.claimpool import ClaimPool, claim_pool
from draplugin.prepare.httpget import HttpUnavailable

REQUEST_TIMEOUT_S: Final = 20.0
# The longest a prepare waits for the API server (`--prepare-api-deadline`): a few seconds under the
# kubelet's 45 s for NodePrepareResources, so the kubelet gets our specific error, not its timeout.
DEFAULT_API_DEADLINE_S: Final = 40.0
# Backoff between attempts of one read, doubling up to the cap, always inside the deadline.
RETRY_BACKOFF_S: Final = 0.2
RETRY_BACKOFF_MAX_S: Final = 2.0
# Answers worth another attempt: no answer at all, throttling, and the server's transient failures.
_RETRYABLE: Final = frozenset({0, 429, 500, 502, 503, 504})
CLAIMS_PATH: Final = "/apis/resource.k8s.io/v1/resourceclaims"
LIST_PAGE_SIZE: Final = 500

# Deeper than anything this driver reads (a claim's config of ours is about ten levels), far below
# the parser's recursion limit. Anything deeper is replaced by TOO_DEEP when decoding.
MAX_JSON_DEPTH: Final = 200
TOO_DEEP: Final = "\x00draplugin: nested too deep\x00"
_TOO_DEEP_JSON: Final = json.dumps(TOO_DEEP).encode()
_TOKEN: Final = re.compile(rb'["\[\]{}]')
_STRING_REST: Final = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)


class ApiDeadlineExceeded(ApiError):
    """The API server did not answer (successfully) before the claim's deadline."""

    def __init__(self, message: str) -> None:
        super().__init__(0, message, reason="Timeout")


class ClaimReader(Protocol):
    async def get_claim(self, namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
        """The ResourceClaim as JSON, or None if it does not exist. `deadline` is a
        `time.monotonic()` instant: past it, `ApiDeadlineExceeded`; other failures raise `ApiError`."""
        ...

    def list_claims(self, timeout_s: float) -> list[dict[str, Any]]:
        """Every ResourceClaim of the cluster (synchronous: start-up recovery); raises `ApiError`."""
        ...


def claim_path(namespace: str, name: str) -> str:
    # safe="": a '/' in either part is escaped, never a path separator (defence in depth; the
    # protocol layer already refuses names that break Kubernetes' rules).
    segments = quote(namespace, safe=""), quote(name, safe="")
    return "/apis/resource.k8s.io/v1/namespaces/{}/resourceclaims/{}".format(*segments)


class KubeClaimReader:
    """`ClaimReader` over the API server."""

    def __init__(self, api: AsyncKubeApi, *, backoff_s: float = RETRY_BACKOFF_S) -> None:
        self._api = api
        self._backoff_s = backoff_s
        # None: the client's set-up is one the pool does not cover; GETs go through `api`.
        self._pool: ClaimPool | None = claim_pool(api)

    async def get_claim(self, namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
        path = claim_path(namespace, name)
        backoff = self._backoff_s
        attempts = 0
        last = "no attempt fitted"
        while (remaining := deadline - time.monotonic()) > 0:
            attempts += 1
            try:
                # wait_for: a request still waiting for a connection or a worker thread is answered
                # at the deadline too; one already running ends by its own timeout, never longer.
                raw = await asyncio.wait_for(self._get_bytes(path, remaining), remaining)
            except TimeoutError:
                last = "no answer"
                break
            except ApiError as err:
                if err.status == 404:  # deleted (or never created): the driver reports the claim missing
                    return None
                if err.status not in _RETRYABLE:
                    raise
                last = str(err)
            else:
                doc = decode_json(raw, f"GET {path}")
                if not isinstance(doc, dict):
                    raise ApiError(200, f"GET {path}: answer is not a JSON object")
                return doc
            await asyncio.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX_S)
        raise ApiDeadlineExceeded(
            f"the API server did not answer in time: GET {path} got no answer before the deadline "
            f"after {attempts} attempts (last: {last})"
        )

    async def _get_bytes(self, path: str, budget_s: float) -> bytes:
        """The body of a 2xx answer; `ApiError` for any other outcome, as `KubeApi.get_bytes`."""
        if self._pool is None:
            return await self._api.get_bytes(path, request_timeout=budget_s)
        try:
            answer = await self._pool.get(path)
        except HttpUnavailable as err:
            raise ApiError(0, f"GET {path}: {err}") from None
        if 200 <= answer.status < 300:
            return answer.body
        raise error_from_response(answer.status, answer.body, answer.reason)

    def list_claims(self, timeout_s: float) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        query = {"limit": str(LIST_PAGE_SIZE)}
        while True:
            raw = self._api.api.get_bytes(CLAIMS_PATH, query, timeout=timeout_s)
            page = decode_json(raw, f"GET {CLAIMS_PATH}")
            if not isinstance(page, dict):
                raise ApiError(200, f"GET {CLAIMS_PATH}: answer is not a JSON object")
            items += [item for item in page.get("items") or [] if isinstance(item, dict)]
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items
            query["continue"] = str(token)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._api.close()


# --- bounded-depth JSON --------------------------------------------------------------------------------


def decode_json(data: bytes, where: str) -> Any:
    """`json.loads`, with every value nested deeper than `MAX_JSON_DEPTH` replaced by `TOO_DEEP`.

    A non-JSON body is an `ApiError` (a proxy's error page, a truncated answer), never an
    internal error.
    """
    try:
        return json.loads(_cap_depth(data, MAX_JSON_DEPTH))
    except (ValueError, RecursionError) as err:
        raise ApiError(200, f"{where}: answer is not JSON: {err}") from None


def _cap_depth(data: bytes, limit: int) -> bytes:
    """The same document with each value that opens at depth `limit + 1` replaced by TOO_DEEP.

    Hand-written because no parser in the standard library stops at a depth; a scan over the
    bracket and quote characters only, iterative, so it cannot recurse. Malformed input is
    passed through for `json.loads` to report.
    """
    if data.count(b"[") + data.count(b"{") <= limit:
        return data  # cannot be deeper than the limit: the common case costs two counts
    out: list[bytes] = []
    copied = depth = 0
    cut_at: int | None = None
    position = 0
    while (token := _TOKEN.search(data, position)) is not None:
        char = data[token.start()]
        position = token.end()
        if char == ord('"'):
            rest = _STRING_REST.match(data, position)
            if rest is None:
                return data
            position = rest.end()
        elif char in b"[{":
            depth += 1
            if depth == limit + 1:
                cut_at = token.start()
        else:
            if depth == limit + 1 and cut_at is not None:
                out += [data[copied:cut_at], _TOO_DEEP_JSON]
                copied, cut_at = token.end(), None
            depth -= 1
    out.append(data[copied:])
    return b"".join(out)


def holds_too_deep(value: Any) -> bool:
    """Whether a decoded value had a part cut off by `decode_json` (iterative: no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item == TOO_DEEP:
            return True
        if isinstance(item, dict):
            stack += item.values()
        elif isinstance(item, list):
            stack += item
    return False


def iter_opaque_configs(doc: dict[str, Any], driver: str) -> Iterator[tuple[str, str, Any]]:
    """(status path, source, parameters) of each of `driver`'s configs in the claim's allocation."""
    allocation = (doc.get("status") or {}).get("allocation") if isinstance(doc.get("status"), dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    entries = devices.get("config") if isinstance(devices, dict) else None
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        opaque = entry.get("opaque") if isinstance(entry, dict) else None
        if isinstance(opaque, dict) and opaque.get("driver") == driver:
            yield (
                f"status.allocation.devices.config[{i}]",
                str(entry.get("source", "")),
                opaque.get("parameters"),
            )
