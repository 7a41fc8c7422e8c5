"""Reading ResourceClaims for the prepare path.

Claims are read as plain JSON through the shared client, never through the
generated models: those drop fields they do not know, and a newer API
server's allocation fields must not vanish between the wire and our planning
code. Reads run on a thread pool (`AsyncKubeApi`) because the client is
synchronous and the kubelet sends many claims at once.
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import quote

from dracommon.kubeapi import ApiError, AsyncKubeApi

# Enough parallel GETs for a burst of pods; beyond this the API server is the limit anyway.
DEFAULT_WORKERS = 16
REQUEST_TIMEOUT_S = 20.0


class ClaimReader(Protocol):
    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ResourceClaim as JSON, or None if it does not exist."""
        ...


class KubeClaimReader:
    """`ClaimReader` over the API server; other failures raise `ApiError`."""

    def __init__(self, api: AsyncKubeApi) -> None:
        self._api = api

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{quote(namespace)}/resourceclaims/{quote(name)}"
        try:
            return await self._api.get(path)
        except ApiError as err:
            if err.status == 404:  # deleted (or never created): the driver reports the claim missing
                return None
            raise

    def close(self) -> None:
        self._api.close()
