"""The few API calls the publisher makes (`SliceApi`), and their implementation on the shared client.

Every failure is a `dracommon.kubeapi.ApiError` (`Gone` when a watch's
resourceVersion is too old), so the publisher has one exception to retry on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import KubernetesVersion, VersionError, server_version

RESOURCE_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class SliceApi(Protocol):
    """The few API calls the publisher makes, on raw JSON dicts."""

    def server_version(self) -> KubernetesVersion:
        """The API server's release (`GET /version`)."""
        ...

    def get_node_uid(self, name: str) -> str: ...

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion."""
        ...

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        """Delete with preconditions; a missing object is not an error."""
        ...

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, object) pairs until the server ends the watch; `Gone` when the version is too old."""
        ...


class KubeSliceApi:
    """`SliceApi` over the API server."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    def server_version(self) -> KubernetesVersion:
        try:
            return server_version(self._api)
        except VersionError as err:
            raise ApiError(0, f"GET /version: {err}") from err

    def get_node_uid(self, name: str) -> str:
        node = self._api.get(f"/api/v1/nodes/{name}")
        return str(node["metadata"]["uid"])

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        return self._api.list(RESOURCE_PATH, query={"fieldSelector": field_selector})

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._api.create(RESOURCE_PATH, body)

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._api.replace(f"{RESOURCE_PATH}/{name}", body)

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        try:
            self._api.delete(f"{RESOURCE_PATH}/{name}", options)
        except ApiError as err:
            if err.status != 404:
                raise

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        query = {"fieldSelector": field_selector}
        for event in self._api.watch(RESOURCE_PATH, resource_version, query=query, timeout_s=timeout_s):
            yield str(event["type"]), dict(event.get("object") or {})
