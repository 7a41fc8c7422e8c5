"""The few API calls the publisher makes (`SliceApi`), and their implementation on the shared client.

Every failure is a `dracommon.kubeapi.ApiError` (`Gone` when a watch's
resourceVersion is too old), so the publisher has one exception to retry on.

`KubeSliceApi` keeps the last full copy it saw of each slice (from a list or
our own write's answer), like an informer's cache: a list first asks for
metadata only and reads the full slices again only when one is new or has
another resourceVersion. A resync with nothing changed then moves a few
kilobytes, not every device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeapi.client import METADATA_LIST
from dracommon.kubeversion import KubernetesVersion, VersionError, server_version

RESOURCE_PATH = "/apis/resource.k8s.io/v1/resourceslices"


class SliceApi(Protocol):
    """The few API calls the publisher makes, on raw JSON dicts."""

    def server_version(self) -> KubernetesVersion:
        """The API server's release (`GET /version`)."""
        ...

    def get_node_uid(self, name: str) -> str: ...

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        """Our slices and the list's resourceVersion (the objects may be shared: do not modify them)."""
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
        # name -> the newest full slice seen; only ever compared by uid and resourceVersion.
        self._seen: dict[str, dict[str, Any]] = {}

    @property
    def address(self) -> str:
        """The API server's URL, for log lines about reaching it."""
        client = self._api.api_client
        server = getattr(client, "server", None) or getattr(
            getattr(client, "configuration", None), "host", ""
        )
        return str(server or "")

    def node_event(self, driver: str, node: str) -> Callable[[str, str], None]:
        """Posts Warning Events on this node's Node object (`draplugin.events`) with our credentials."""
        from draplugin.events import KubeEvents  # only needed once something goes wrong

        events: KubeEvents | None = None

        def post(reason: str, note: str) -> None:
            nonlocal events
            if events is None:
                events = KubeEvents(self._api, driver, node)
            events.node_event(reason, note, action="PublishResourceSlices")

        return post

    def server_version(self) -> KubernetesVersion:
        try:
            return server_version(self._api)
        except VersionError as err:
            raise ApiError(0, f"GET /version: {err}") from err

    def get_node_uid(self, name: str) -> str:
        node = self._api.get(f"/api/v1/nodes/{name}")
        return str(node["metadata"]["uid"])

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        query = {"fieldSelector": field_selector}
        heads, version = self._api.list(RESOURCE_PATH, query=query, accept=METADATA_LIST)
        known = [self._seen.get(str(head.get("metadata", {}).get("name"))) for head in heads]
        if all(obj is not None and _same_version(obj, head) for obj, head in zip(known, heads, strict=True)):
            items = [obj for obj in known if obj is not None]
        else:  # something new or changed: read it all, as a plain list would
            items, version = self._api.list(RESOURCE_PATH, query=query)
        self._seen = {str(obj["metadata"]["name"]): obj for obj in items}
        return items, version

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._saw(self._api.create(RESOURCE_PATH, body))

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._saw(self._api.replace(f"{RESOURCE_PATH}/{name}", body))

    def _saw(self, obj: dict[str, Any]) -> dict[str, Any]:
        self._seen[str(obj.get("metadata", {}).get("name"))] = obj
        return obj

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "preconditions": {"uid": uid, "resourceVersion": resource_version},
        }
        self._seen.pop(name, None)
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


def _same_version(obj: dict[str, Any], head: dict[str, Any]) -> bool:
    """The same object at the same resourceVersion: every write, and a delete and re-create, changes one."""
    ours, theirs = obj.get("metadata", {}), head.get("metadata", {})
    return bool(theirs.get("resourceVersion")) and all(
        ours.get(key) == theirs.get(key) for key in ("uid", "resourceVersion")
    )
