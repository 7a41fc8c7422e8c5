"""List-and-watch caches of API objects as raw JSON dicts.

Typed client models drop fields they do not know (new DRA fields would be lost
between read and write), so objects stay the JSON the API server sent.

resourceVersion handling follows the API conventions:

- list, then watch from the list's `metadata.resourceVersion`;
- `allowWatchBookmarks=true`: BOOKMARK events only move the version forward,
  so a quiet collection can be re-watched without a relist;
- every event's object carries the version to resume from after the watch
  ends (server timeout, dropped connection);
- 410 Gone (as the watch request's status, or as an ERROR event: "too old
  resource version") means the version was compacted away: relist.

Objects in the cache are replaced, never changed in place, so `snapshot()`
hands out the same dicts without copying; callers must not mutate them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from dracommon.kubeapi import Gone, KubeApi, raise_for_error_event

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class ListWatch(Protocol):
    """One collection: a consistent list, and a watch from a resourceVersion."""

    def list(self) -> tuple[list[JSON], str]: ...

    def watch(self, resource_version: str) -> Iterator[JSON]:
        """Watch events (`{"type": ..., "object": ...}`) until the server ends the watch.
        Raises `Gone` when the version is too old."""
        ...


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


class KubeListWatch:
    """`ListWatch` over the API server for one collection path (optionally filtered)."""

    def __init__(
        self,
        api: KubeApi,
        path: str,
        kind: str,
        *,
        field_selector: str | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self._api = api
        self.path = path
        self.kind = kind
        self._query = {"fieldSelector": field_selector} if field_selector else {}
        self._watch_timeout_s = watch_timeout_s

    def list(self) -> tuple[list[JSON], str]:
        return self._api.list(self.path, kind=self.kind, query=self._query)

    def watch(self, resource_version: str) -> Iterator[JSON]:
        # Spread the server-side timeouts so several caches do not all re-watch at once.
        timeout = int(self._watch_timeout_s * random.uniform(1.0, 1.5))
        return self._api.watch(self.path, resource_version, query=self._query, timeout_s=timeout)


class WatchCache:
    """Keeps one collection in memory; `run()` lists, watches and relists until stopped."""

    def __init__(
        self,
        resource: str,
        source: ListWatch,
        *,
        on_change: Callable[[], None] | None = None,
        on_size: Callable[[int], None] | None = None,
        on_relist: Callable[[], None] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.resource = resource
        self._source = source
        self._on_change = on_change
        self._on_size = on_size
        self._on_relist = on_relist
        self._sleep = sleep
        self._lock = threading.Lock()
        self._objects: dict[str, JSON] = {}
        self._resource_version = ""
        self.synced = threading.Event()
        self.relists = 0

    # ---------------------------------------------------------------- reading

    def snapshot(self) -> list[JSON]:
        with self._lock:
            return list(self._objects.values())

    def get(self, key: str) -> JSON | None:
        with self._lock:
            return self._objects.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    @property
    def resource_version(self) -> str:
        with self._lock:
            return self._resource_version

    # ---------------------------------------------------------------- keeping it current

    def relist(self) -> None:
        items, version = self._source.list()
        with self._lock:
            self._objects = {object_key(item): item for item in items}
            self._resource_version = version
            size = len(self._objects)
        self.relists += 1
        if self._on_relist is not None:
            self._on_relist()
        log.info("listed", extra={"resource": self.resource, "objects": size, "resourceVersion": version})
        self._changed(size)
        self.synced.set()

    def apply(self, event: Mapping[str, Any]) -> None:
        """Apply one watch event. Raises `Gone` for a 410 ERROR event, `ApiError` for other errors."""
        raise_for_error_event(event)
        kind = event.get("type")
        obj = event.get("object") or {}
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            if version:
                self._resource_version = version
            if kind == "BOOKMARK":
                return
            key = object_key(obj)
            if kind == "DELETED":
                self._objects.pop(key, None)
            elif kind in ("ADDED", "MODIFIED"):
                self._objects[key] = dict(obj)
            else:
                log.warning("unknown watch event type", extra={"resource": self.resource, "type": kind})
                return
            size = len(self._objects)
        self._changed(size)

    def run(self, stop: threading.Event) -> None:
        """List, then watch from the list's version; resume or relist until `stop` is set."""
        backoff = 0.5
        need_list = True
        while not stop.is_set():
            try:
                if need_list:
                    self.relist()
                    need_list = False
                for event in self._source.watch(self.resource_version):
                    if stop.is_set():
                        return
                    self.apply(event)
                backoff = 0.5  # the server ended the watch normally: resume from the last version
            except Gone as err:
                log.info(
                    "resource version too old; relisting",
                    extra={"resource": self.resource, "reason": str(err)},
                )
                need_list = True
            except Exception as err:  # connection loss, API errors: back off, keep the cache
                log.warning("watch failed", extra={"resource": self.resource, "error": str(err)})
                self._wait(stop, backoff)
                backoff = min(backoff * 2, 30.0)

    def _wait(self, stop: threading.Event, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
        else:
            stop.wait(seconds)

    def _changed(self, size: int) -> None:
        if self._on_size is not None:
            self._on_size(size)
        if self._on_change is not None:
            self._on_change()


def wait_synced(caches: list[WatchCache], stop: threading.Event, timeout: float | None = None) -> bool:
    """Wait until every cache has listed once (or `stop`/timeout); True when all are synced."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for cache in caches:
        while not cache.synced.wait(0.2):
            if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
    return True
