"""Watch cache: list then watch from the list's version, bookmarks, relist on 410 Gone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from controller.run.watchcache import WatchCache
from dracommon.kubeapi import Gone

JSON = dict[str, Any]


def obj(name: str, rv: str, **extra: Any) -> JSON:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, **extra}


class FakeListWatch:
    """Scripted lists and watches; stops the cache when the script runs out."""

    def __init__(self, lists: list[tuple[list[JSON], str]], watches: list[list[JSON] | Exception]) -> None:
        self.lists = lists
        self.watches = watches
        self.stop = threading.Event()
        self.list_calls = 0
        self.watch_versions: list[str] = []

    def list(self) -> tuple[list[JSON], str]:
        self.list_calls += 1
        return self.lists.pop(0)

    def watch(self, resource_version: str) -> Iterator[JSON]:
        self.watch_versions.append(resource_version)
        if not self.watches:
            self.stop.set()
            return
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step


def run(source: FakeListWatch) -> tuple[WatchCache, list[float]]:
    waits: list[float] = []
    changes: list[int] = []
    cache = WatchCache("claims", source, on_size=changes.append, sleep=waits.append)
    cache.run(source.stop)
    return cache, waits


def names(cache: WatchCache) -> list[str]:
    return sorted(o["metadata"]["name"] for o in cache.snapshot())


def test_watches_from_the_list_version_and_applies_events() -> None:
    source = FakeListWatch(
        lists=[([obj("a", "5"), obj("b", "6")], "10")],
        watches=[[
            {"type": "ADDED", "object": obj("c", "11")},
            {"type": "MODIFIED", "object": obj("a", "12", status={"x": 1})},
            {"type": "DELETED", "object": obj("b", "13")},
        ]],
    )  # fmt: skip
    cache, _ = run(source)
    assert source.watch_versions == ["10", "13"]  # resumed from the last event after the server ended it
    assert names(cache) == ["a", "c"]
    assert cache.get("ns/a") == obj("a", "12", status={"x": 1})
    assert cache.synced.is_set()
    assert source.list_calls == 1


def test_bookmarks_move_the_version_without_changing_objects() -> None:
    source = FakeListWatch(
        lists=[([obj("a", "5")], "10")],
        watches=[[{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "42"}}}]],
    )
    cache, _ = run(source)
    assert source.watch_versions == ["10", "42"]
    assert names(cache) == ["a"]
    assert source.list_calls == 1


@pytest.mark.parametrize(
    "gone",
    [
        Gone(410, "Gone"),  # the watch request itself answered 410
        None,  # an ERROR event with code 410 inside the stream
    ],
)
def test_relists_on_410_and_drops_objects_deleted_meanwhile(gone: Exception | None) -> None:
    expired: list[JSON] | Exception = (
        gone
        if gone is not None
        else [
            {
                "type": "ERROR",
                "object": {"kind": "Status", "code": 410, "message": "too old resource version"},
            }
        ]
    )
    source = FakeListWatch(
        lists=[([obj("a", "5"), obj("b", "6")], "10"), ([obj("b", "20"), obj("d", "21")], "25")],
        watches=[expired],
    )
    cache, _ = run(source)
    assert source.list_calls == 2
    assert source.watch_versions == ["10", "25"]  # after the relist, watch from the new list's version
    assert names(cache) == ["b", "d"]
    assert cache.get("ns/b") == obj("b", "20")
    assert cache.relists == 2


def test_other_watch_errors_back_off_and_resume_without_relisting() -> None:
    source = FakeListWatch(
        lists=[([obj("a", "5")], "10")],
        watches=[
            [{"type": "ADDED", "object": obj("b", "11")}, {"type": "ERROR", "object": {"code": 500}}],
            ConnectionError("reset"),
        ],
    )
    cache, waits = run(source)
    assert source.list_calls == 1
    assert source.watch_versions == ["10", "11", "11"]
    assert waits == [0.5, 1.0]  # exponential back-off
    assert names(cache) == ["a", "b"]


def test_snapshot_is_a_stable_copy_of_the_membership() -> None:
    source = FakeListWatch(lists=[([obj("a", "5")], "10")], watches=[])
    cache, _ = run(source)
    snapshot = cache.snapshot()
    cache.apply({"type": "ADDED", "object": obj("z", "30")})
    assert [o["metadata"]["name"] for o in snapshot] == ["a"]
    assert names(cache) == ["a", "z"]
    assert cache.resource_version == "30"
