"""The slice publisher against an in-memory API that enforces what the server does: writes, generations,
conflicts, the watch and the background loop."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import logging
import queue
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, Gone
from draplugin.devices.fake import FakeBackend, config_from_flags, parse_config
from draplugin.devices.health import HealthTracker
from draplugin.devices.model import CounterSet, Device, DeviceTaint, DeviceValidationError
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.plan import SliceLayout
from draplugin.slices.publisher import SlicePublisher, backend_source
from draplugin.slices.render import slice_name
from tests.unit.test_slices_plan import DRIVER, NODE, fake_devices, fields_of


class MemoryApi:
    """ResourceSlices kept in memory with resourceVersions, preconditions and 409s like the API server."""

    def __init__(self, version: tuple[int, int] = (1, 37)) -> None:
        self.version = version
        self.version_reads = 0
        self.objects: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)
        self.calls: list[str] = []
        self.fail_next: list[ApiError] = []

    def _maybe_fail(self, op: str) -> None:
        self.calls.append(op)
        if self.fail_next:
            raise self.fail_next.pop(0)

    def server_version(self) -> tuple[int, int]:
        self.version_reads += 1
        return self.version

    def get_node_uid(self, name: str) -> str:
        return f"uid-of-{name}"

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        self._maybe_fail("list")
        wanted = dict(part.split("=", 1) for part in field_selector.split(","))
        items = [
            copy.deepcopy(o)
            for o in self.objects.values()
            if o["spec"]["driver"] == wanted["spec.driver"]
            and o["spec"]["nodeName"] == wanted["spec.nodeName"]
        ]
        return items, str(next(self._rv))

    def _store(self, body: dict[str, Any], uid: str) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        obj["metadata"]["uid"] = uid
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        for device in obj["spec"].get("devices", []):
            for taint in device.get("taints", []):
                taint.setdefault("timeAdded", "2026-01-01T00:00:00Z")  # the server stamps taints
        self.objects[obj["metadata"]["name"]] = obj
        return copy.deepcopy(obj)

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("create")
        if body["metadata"]["name"] in self.objects:
            raise ApiError(409, "already exists")
        return self._store(body, f"uid-{next(self._uid)}")

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("update")
        current = self.objects.get(name)
        if current is None:
            raise ApiError(404, "not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified")
        return self._store(body, current["metadata"]["uid"])

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        self._maybe_fail("delete")
        current = self.objects.get(name)
        if current is None:
            return
        if current["metadata"]["uid"] != uid or current["metadata"]["resourceVersion"] != resource_version:
            raise ApiError(409, "precondition failed")
        del self.objects[name]

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())

    def writes(self) -> int:
        return sum(1 for c in self.calls if c in ("create", "update", "delete"))


def publisher(
    api: MemoryApi, devices: list[Device], counters: Sequence[CounterSet] = (), **kw: Any
) -> tuple[SlicePublisher, list[list[Device]]]:
    state = [devices]
    pub = SlicePublisher(
        api,
        node_name=NODE,
        driver=DRIVER,
        source=lambda: (state[0], counters),
        metrics=SliceMetrics(CollectorRegistry()),
        **kw,
    )
    return pub, state


def test_invalid_device_is_rejected_before_any_write() -> None:
    api = MemoryApi()
    bad = Device(name="gpu-0", kind="gpu", uuid="u", index=0, minor=0, attributes={"productName": "x" * 65})
    pub, _ = publisher(api, [bad])
    with pytest.raises(DeviceValidationError, match=r"gpu-0.*attributes\[productName\]"):
        pub.sync()
    assert api.writes() == 0


def test_first_sync_creates_then_nothing_changed_means_zero_writes() -> None:
    api = MemoryApi()
    pub, _ = publisher(api, fake_devices(300))
    first = pub.sync()
    assert (first.created, first.generation, first.slices) == (3, 1, 3)
    writes = api.writes()
    for _ in range(3):
        assert pub.sync().writes == 0
    assert api.writes() == writes
    assert pub.writes == {"create": 3}


def test_device_set_change_bumps_generation_and_deletes_stale_slices() -> None:
    api = MemoryApi()
    pub, state = publisher(api, fake_devices(300))
    pub.sync()
    state[0] = fake_devices(100)
    result = pub.sync()
    assert result.generation == 2 and result.deleted == 2 and result.updated == 1
    assert list(api.objects) == [f"{NODE}-{DRIVER}-0"]
    assert api.objects[f"{NODE}-{DRIVER}-0"]["spec"]["pool"] == {
        "name": NODE,
        "generation": 2,
        "resourceSliceCount": 1,
    }


def test_growing_pool_bumps_generation_on_every_slice() -> None:
    api = MemoryApi()
    pub, state = publisher(api, fake_devices(100))
    pub.sync()
    state[0] = fake_devices(200)
    result = pub.sync()
    assert result.generation == 2 and (result.created, result.updated) == (1, 1)
    assert {o["spec"]["pool"]["generation"] for o in api.objects.values()} == {2}


def test_single_slice_change_updates_in_place_without_bump() -> None:
    api = MemoryApi()
    tracker = HealthTracker(DRIVER)
    backend = FakeBackend(NODE, config_from_flags(130, "L4"))
    pub = SlicePublisher(
        api,
        node_name=NODE,
        driver=DRIVER,
        source=backend_source(backend, tracker.apply),
        expect_taints=True,
        metrics=SliceMetrics(CollectorRegistry()),
    )
    pub.sync()
    tracker.report_unhealthy(["gpu-70"], "NoExecute", "xid-79", "fell off the bus")
    result = pub.sync()
    assert (result.generation, result.updated, result.created, result.deleted) == (1, 1, 0, 0)
    device = next(d for d in api.objects[f"{NODE}-{DRIVER}-1"]["spec"]["devices"] if d["name"] == "gpu-70")
    assert device["taints"][0] == {
        "key": f"{DRIVER}/unhealthy",
        "value": "xid-79",
        "effect": "NoExecute",
        "timeAdded": "2026-01-01T00:00:00Z",
    }
    # The server-stamped timeAdded must not make the unchanged taint look different.
    assert pub.sync().writes == 0
    tracker.report_healthy(["gpu-70"])
    assert pub.sync().updated == 1


def test_deleted_slice_is_recreated_with_a_new_generation() -> None:
    api = MemoryApi()
    pub, _ = publisher(api, fake_devices(200))
    pub.sync()
    api.objects.clear()  # what the kubelet does at start-up
    result = pub.sync()
    assert result.created == 2 and len(api.objects) == 2


def test_foreign_slice_of_same_node_and_driver_is_stale() -> None:
    api = MemoryApi()
    api.objects["leftover"] = {
        "metadata": {"name": "leftover", "uid": "x", "resourceVersion": "1"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": {"name": NODE, "generation": 7}},
    }
    pub, _ = publisher(api, fake_devices(2))
    result = pub.sync()
    assert result.deleted == 1 and result.generation == 8 and "leftover" not in api.objects


def test_conflict_is_raised_for_retry_and_next_sync_converges() -> None:
    api = MemoryApi()
    pub, state = publisher(api, fake_devices(2))
    pub.sync()
    state[0] = fake_devices(3)
    api.fail_next.append(ApiError(409, "the object has been modified"))
    with pytest.raises(ApiError):
        pub.sync()
    assert pub.sync().writes == 1
    assert len(api.objects[f"{NODE}-{DRIVER}-0"]["spec"]["devices"]) == 3


def test_fields_dropped_by_the_server_do_not_cause_rewrites() -> None:
    class DroppingApi(MemoryApi):
        def _store(self, body: dict[str, Any], uid: str) -> dict[str, Any]:
            body = copy.deepcopy(body)
            for device in body["spec"].get("devices", []):
                device.pop("taints", None)  # DRADeviceTaints off
            return super()._store(body, uid)

    api = DroppingApi()
    devices = fake_devices(2)
    devices[1] = Device(
        **{**fields_of(devices[1]), "taints": (DeviceTaint("gpu.draplugin.dev/x", "NoSchedule"),)}
    )
    pub, _ = publisher(api, devices)
    pub.sync()
    assert pub.sync().writes == 0


def test_resync_trusts_a_slice_at_the_resource_version_it_verified() -> None:
    api = MemoryApi()
    pub, _ = publisher(api, fake_devices(200))
    pub.sync()
    name = f"{NODE}-{DRIVER}-1"
    # Not a real server's doing (every write gets a new resourceVersion): shows the stored spec is not
    # compared again while the resourceVersion is the one our write got.
    api.objects[name]["spec"]["devices"][0]["attributes"] = {}
    assert pub.sync().writes == 0


def test_slice_edited_by_someone_else_is_repaired_in_place() -> None:
    api = MemoryApi()
    pub, state = publisher(api, fake_devices(200))
    pub.sync()
    wanted = copy.deepcopy(api.objects)
    name = f"{NODE}-{DRIVER}-1"
    api.objects[name]["spec"]["devices"][0]["attributes"] = {}
    api.objects[name]["metadata"]["resourceVersion"] = "5000"  # what any write does
    result = pub.sync()
    assert (result.updated, result.created, result.deleted, result.generation) == (1, 0, 0, 1)
    assert api.objects[name]["spec"] == wanted[name]["spec"]
    assert pub.sync().writes == 0
    # A device change after that still reaches the slice it is in.
    last = fake_devices(200)[199]
    state[0] = [
        *fake_devices(200)[:199],
        dataclasses.replace(last, capacity={**last.capacity, "memory": "1Gi"}),
    ]
    assert pub.sync().updated == 1
    assert api.objects[name]["spec"]["devices"][-1]["capacity"]["memory"] == {"value": "1Gi"}


def test_delete_all_removes_only_our_slices() -> None:
    api = MemoryApi()
    pub, _ = publisher(api, fake_devices(200))
    pub.sync()
    other = copy.deepcopy(next(iter(api.objects.values())))
    other["metadata"]["name"] = "other"
    other["spec"]["nodeName"] = "node-b"
    api.objects["other"] = other
    assert pub.delete_all() == 2
    assert list(api.objects) == ["other"]


def test_watch_events_from_our_writes_are_not_foreign() -> None:
    api = MemoryApi()
    pub, _ = publisher(api, fake_devices(1))
    pub.sync()
    obj = next(iter(api.objects.values()))
    assert not pub._is_foreign("MODIFIED", obj["metadata"])
    assert pub._is_foreign("MODIFIED", {**obj["metadata"], "resourceVersion": "999999"})
    assert pub._is_foreign("DELETED", obj["metadata"])


class WatchingApi(MemoryApi):
    """Feeds DELETED events to the publisher's watch when a test deletes objects behind its back."""

    def __init__(self) -> None:
        super().__init__()
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def remove_all(self) -> None:
        for obj in list(self.objects.values()):
            del self.objects[obj["metadata"]["name"]]
            self.events.put(("DELETED", obj))

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        try:
            yield self.events.get(timeout=0.2)
        except queue.Empty:
            return


def test_background_loop_republishes_after_foreign_delete_and_stops() -> None:
    api = WatchingApi()
    pub, _ = publisher(api, fake_devices(200), settle_s=0.01)
    pub.start()
    try:
        wait_for("the first publish", lambda: len(api.objects) == 2, 5)
        api.remove_all()
        wait_for("the republish", lambda: len(api.objects) == 2 and pub.writes["create"] == 4, 5)
    finally:
        pub.stop(delete=True)
    assert api.objects == {}


def test_background_loop_backs_off_on_api_errors() -> None:
    api = MemoryApi()
    api.fail_next = [ApiError(0, "connection refused"), ApiError(500, "etcd timeout")]
    pub, _ = publisher(api, fake_devices(1), settle_s=0.01)
    pub.start()
    try:
        wait_for("a publish after the errors", lambda: len(api.objects) == 1, 10)
    finally:
        pub.stop()
    assert api.calls[:3] == ["list", "list", "list"]


class ExpiringWatchApi(MemoryApi):
    """The first watch answers 410 Gone (its version was compacted away); later ones end quietly."""

    def __init__(self) -> None:
        super().__init__()
        self.listed_at: list[str] = []
        self.watched_from: list[str] = []

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        items, version = super().list_slices(field_selector)
        self.listed_at.append(version)
        return items, version

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(resource_version)
        if len(self.watched_from) == 1:
            raise Gone(410, "too old resource version")
        time.sleep(0.05)
        return iter(())


def test_watch_too_old_relists_and_watches_from_the_new_list(caplog: pytest.LogCaptureFixture) -> None:
    api = ExpiringWatchApi()
    pub, _ = publisher(api, fake_devices(1), settle_s=0.01)
    with caplog.at_level(logging.WARNING):
        pub.start()
        try:
            wait_for("a watch after the 410", lambda: len(api.watched_from) >= 2, 5)
        finally:
            pub.stop()
    assert api.watched_from[0] == api.listed_at[0]
    assert len(api.listed_at) >= 2, "a 410 makes the publisher list again"
    assert api.watched_from[1] == api.listed_at[1], "the next watch starts from the new list's version"
    assert not [r for r in caplog.records if "watch failed" in r.getMessage()], (
        "a 410 is routine, not a failure"
    )


def test_publisher_asks_the_server_release_once_and_uses_its_layout() -> None:
    backend = FakeBackend(
        NODE, parse_config({"gpus": [{"model": "H100-80GB-HBM3", "count": 2}], "partitionable": True})
    )
    old = MemoryApi(version=(1, 34))
    pub, _ = publisher(old, backend.discover(), backend.shared_counters())
    pub.sync()
    pub.sync()
    assert old.version_reads == 1
    assert len(old.objects) == 1
    (only,) = old.objects.values()
    assert [c["name"] for c in only["spec"]["sharedCounters"]] == ["gpu-0-counters", "gpu-1-counters"]
    assert len(only["spec"]["devices"]) == 38

    new = MemoryApi(version=(1, 37))
    pub, _ = publisher(new, backend.discover(), backend.shared_counters())
    pub.sync()
    assert len(new.objects) == 2
    first = new.objects[slice_name(NODE, DRIVER, 0)]
    assert first["spec"]["sharedCounters"] and "devices" not in first["spec"]


def test_configured_layout_overrides_the_server_release() -> None:
    backend = FakeBackend(
        NODE, parse_config({"gpus": [{"model": "H100-80GB-HBM3", "count": 1}], "partitionable": True})
    )
    api = MemoryApi(version=(1, 37))
    pub, _ = publisher(
        api, backend.discover(), backend.shared_counters(), layout=SliceLayout.COUNTERS_WITH_DEVICES
    )
    pub.sync()
    assert api.version_reads == 0
    assert len(api.objects) == 1
