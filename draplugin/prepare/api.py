"""Raw JSON access to the API server for the prepare path.

Claims are read as plain JSON, never through the generated models: those drop
fields they do not know, and a newer API server's allocation fields must not
vanish between the wire and our planning code. Calls run on a small thread
pool because the client is synchronous and the kubelet sends many claims at
once.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import quote

from kubernetes.client import ApiClient

from dracommon.kube import send_raw

# Enough parallel GETs for a burst of pods; beyond this the API server is the limit anyway.
DEFAULT_WORKERS = 16
REQUEST_TIMEOUT_S = 20.0


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ClaimReader(Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim as JSON, or None if it does not exist."""
        ...


class RawApi:
    """GET and POST JSON through a configured `kubernetes.client.ApiClient`."""

    def __init__(self, api_client: ApiClient, workers: int = DEFAULT_WORKERS) -> None:
        self._client = api_client
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube-api")
        # One pooled connection per worker, so parallel requests do not open and drop sockets.
        pool_size = getattr(api_client.configuration, "connection_pool_maxsize", 0) or 0
        if pool_size < workers:
            api_client.configuration.connection_pool_maxsize = workers

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        response = send_raw(self._client, method, path, body=body, timeout=REQUEST_TIMEOUT_S)
        data: bytes | None = response.read()
        return int(response.status), bytes(data or b"")

    async def arequest(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self.request, method, path, body)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        status, data = await self.arequest("GET", path)
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise ApiError(status, _status_message(data))
        doc = json.loads(data)
        if not isinstance(doc, dict):
            raise ApiError(status, "response is not a JSON object")
        return doc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _status_message(data: bytes) -> str:
    """The `message` of a metav1.Status body, else the start of the body."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data[:200].decode(errors="replace")
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return str(doc["message"])
    return data[:200].decode(errors="replace")
