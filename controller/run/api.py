"""The writes the reconciler makes, behind a small interface (a fake stands in for it in unit tests).

Every write is a JSON merge patch that carries the `resourceVersion` the
decision was based on, so the API server rejects it with 409 Conflict when
the claim changed in the meantime (optimistic concurrency); the reconciler
then re-reads and decides again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from controller.objects import RESOURCE_API
from dracommon.kubeapi import MERGE_PATCH, ApiError, KubeApi

JSON = dict[str, Any]


class Conflict(Exception):
    """409: the object changed since it was read."""


class NotFound(Exception):
    """404: the object is gone."""


class ClaimApi(Protocol):
    def get_claim(self, namespace: str, name: str) -> JSON | None: ...

    def patch_claim(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        """Merge-patch the claim (metadata). Raises Conflict or NotFound."""
        ...

    def patch_claim_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        """Merge-patch the claim's status subresource. Raises Conflict or NotFound."""
        ...

    def get_node(self, name: str) -> JSON | None: ...

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None: ...


class KubeClaimApi:
    """`ClaimApi` over the API server, as raw JSON."""

    def __init__(self, api: KubeApi, timeout_s: float = 15.0) -> None:
        self._api = api
        self._timeout = timeout_s

    def get_claim(self, namespace: str, name: str) -> JSON | None:
        try:
            return self._call("GET", f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}")
        except NotFound:
            return None

    def patch_claim(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}"
        return self._call("PATCH", path, patch, MERGE_PATCH)

    def patch_claim_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims/{name}/status"
        return self._call("PATCH", path, patch, MERGE_PATCH)

    def get_node(self, name: str) -> JSON | None:
        try:
            return self._call("GET", f"/api/v1/nodes/{name}")
        except NotFound:
            return None

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self._call("POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", event)

    def _call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> JSON:
        body = dict(body) if body is not None else None
        try:
            return self._api.request(method, path, body, content_type=content_type, timeout=self._timeout)
        except ApiError as err:
            if err.status == 409:
                raise Conflict(f"{method} {path}: {err.message}") from err
            if err.status == 404:
                raise NotFound(f"{method} {path}: {err.message}") from err
            raise
