"""ResourceSlice planning and publishing against an in-memory API that enforces what the server does."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import queue
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from draplugin.devices.fake import FakeBackend, config_from_flags, parse_config
from draplugin.devices.health import HealthTracker
from draplugin.devices.model import CounterConsumption, CounterSet, Device, DeviceTaint, DeviceValidationError
from draplugin.slices import (
    MAX_NAME_LENGTH,
    ApiError,
    NodeRef,
    SliceLayout,
    SliceMetrics,
    SlicePublisher,
    backend_source,
    layout_for,
    plan_slices,
    render_pool,
    slice_name,
    wait_for,
)

DRIVER = "gpu.draplugin.dev"
NODE = "node-a"


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


def fake_devices(n: int, model: str = "L4") -> list[Device]:
    return FakeBackend(NODE, config_from_flags(n, model)).discover()


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


def test_chunking_128_without_taints_and_64_with() -> None:
    plan = plan_slices(fake_devices(300))
    assert [len(p.devices) for p in plan] == [128, 128, 44]
    plan = plan_slices(fake_devices(300), expect_taints=True)
    assert [len(p.devices) for p in plan] == [64, 64, 64, 64, 44]
    devices = fake_devices(130)
    devices[0] = Device(
        **{**_fields(devices[0]), "taints": (DeviceTaint("gpu.draplugin.dev/x", "NoSchedule"),)}
    )
    assert [len(p.devices) for p in plan_slices(devices)] == [64, 64, 2]


def _fields(d: Device) -> dict[str, Any]:
    return {f: getattr(d, f) for f in d.__dataclass_fields__}


def test_counter_sets_get_their_own_slice_and_empty_pool_one_empty_slice() -> None:
    backend = FakeBackend(NODE, parse_config({"gpus": [{"model": "A100-SXM4-40GB"}], "partitionable": True}))
    plan = plan_slices(backend.discover(), backend.shared_counters())
    assert plan[0].shared_counters and not plan[0].devices
    assert all(p.devices and not p.shared_counters for p in plan[1:])
    empty = plan_slices([])
    assert len(empty) == 1 and not empty[0].devices and not empty[0].shared_counters


def test_rendered_slices_keep_device_order_and_owner() -> None:
    devices = fake_devices(200)
    slices = render_pool(devices, [], node=NodeRef(NODE, "u1"), driver=DRIVER)
    names = [d["name"] for s in slices for d in s["spec"]["devices"]]
    assert names == [f"gpu-{i}" for i in range(200)]
    for i, s in enumerate(slices):
        assert s["metadata"]["name"] == f"{NODE}-{DRIVER}-{i}"
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "u1", "controller": True}
        ]
        assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER


def test_long_node_names_still_give_valid_unique_slice_names() -> None:
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    name_a, name_b = slice_name(long_a, DRIVER, 3), slice_name(long_b, DRIVER, 3)
    assert len(name_a) <= MAX_NAME_LENGTH and len(name_b) <= MAX_NAME_LENGTH
    assert name_a != name_b and name_a.endswith(f"-{DRIVER}-3")


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
        **{**_fields(devices[1]), "taints": (DeviceTaint("gpu.draplugin.dev/x", "NoSchedule"),)}
    )
    pub, _ = publisher(api, devices)
    pub.sync()
    assert pub.sync().writes == 0


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
        assert wait_for(lambda: len(api.objects) == 2, 5)
        api.remove_all()
        assert wait_for(lambda: len(api.objects) == 2 and pub.writes["create"] == 4, 5)
    finally:
        pub.stop(delete=True)
    assert api.objects == {}


def test_background_loop_backs_off_on_api_errors() -> None:
    api = MemoryApi()
    api.fail_next = [ApiError(0, "connection refused"), ApiError(500, "etcd timeout")]
    pub, _ = publisher(api, fake_devices(1), settle_s=0.01)
    pub.start()
    try:
        assert wait_for(lambda: len(api.objects) == 1, 10)
    finally:
        pub.stop()
    assert api.calls[:3] == ["list", "list", "list"]


# ----- shared counters on Kubernetes 1.34: in the slice of their consumers -----------------------


def _consumers_by_set(planned: Sequence[Any]) -> dict[str, set[int]]:
    """Counter set name -> indices of the planned slices whose devices consume it."""
    where: dict[str, set[int]] = {}
    for index, p in enumerate(planned):
        for device in p.devices:
            for consumption in device.get("consumesCounters", []):
                where.setdefault(consumption["counterSet"], set()).add(index)
    return where


def test_layout_follows_the_server_release() -> None:
    assert layout_for((1, 34)) is SliceLayout.COUNTERS_WITH_DEVICES
    assert layout_for((1, 35)) is SliceLayout.SEPARATE_COUNTER_SLICES
    assert layout_for((1, 37)) is SliceLayout.SEPARATE_COUNTER_SLICES


def test_1_34_layout_puts_each_counter_set_with_all_its_consumers() -> None:
    backend = FakeBackend(
        NODE, parse_config({"gpus": [{"model": "H100-80GB-HBM3", "count": 2}], "partitionable": True})
    )
    devices, sets = backend.discover(), backend.shared_counters()
    plan = plan_slices(devices, sets, layout=SliceLayout.COUNTERS_WITH_DEVICES)
    # Two GPUs (15 shared counters each) fit the 1.34 limit of 32 shared counters per slice.
    assert len(plan) == 1
    assert [c["name"] for c in plan[0].shared_counters] == ["gpu-0-counters", "gpu-1-counters"]
    assert [d["name"] for d in plan[0].devices] == [d.name for d in devices]


def test_1_34_layout_starts_a_new_slice_when_shared_counters_run_out() -> None:
    config = parse_config({"gpus": [{"model": "H100-80GB-HBM3", "count": 5}], "partitionable": True})
    backend = FakeBackend(NODE, config)
    devices, sets = backend.discover(), backend.shared_counters()
    plan = plan_slices(devices, sets, layout=SliceLayout.COUNTERS_WITH_DEVICES)
    assert [len(p.shared_counters) for p in plan] == [2, 2, 1]
    for p in plan:
        assert sum(len(c["counters"]) for c in p.shared_counters) <= 32
        defined = {c["name"] for c in p.shared_counters}
        used = {c["counterSet"] for d in p.devices for c in d.get("consumesCounters", [])}
        assert used <= defined, "every device's counter set is defined in its own slice"
    assert all(len(slices) == 1 for slices in _consumers_by_set(plan).values())
    # Discovery order is kept across the whole pool.
    assert [d["name"] for p in plan for d in p.devices] == [d.name for d in devices]


def test_1_34_layout_keeps_interleaved_consumers_together() -> None:
    sets = [CounterSet("a", {"mem": "10"}), CounterSet("b", {"mem": "10"})]
    backend = FakeBackend(NODE, config_from_flags(4, "L4"))
    plain = backend.discover()

    def consuming(device: Device, set_name: str) -> Device:
        return dataclasses.replace(device, consumes_counters=(CounterConsumption(set_name, {"mem": "1"}),))

    devices = [consuming(plain[0], "a"), consuming(plain[1], "b"), consuming(plain[2], "a"), plain[3]]
    plan = plan_slices(devices, sets, layout=SliceLayout.COUNTERS_WITH_DEVICES)
    assert len(plan) == 1
    assert {c["name"] for c in plan[0].shared_counters} == {"a", "b"}


def test_1_34_layout_rejects_a_counter_set_whose_consumers_exceed_one_slice() -> None:
    counter_set = CounterSet("big", {"mem": "1000"})
    backend = FakeBackend(NODE, config_from_flags(65, "L4"))
    devices = [
        dataclasses.replace(d, consumes_counters=(CounterConsumption("big", {"mem": "1"}),))
        for d in backend.discover()
    ]
    with pytest.raises(DeviceValidationError, match=r"1\.34 needs a counter set and all its consumers"):
        plan_slices(devices, [counter_set], layout=SliceLayout.COUNTERS_WITH_DEVICES)
    # 1.35+ has no such limit: the set has a slice of its own and devices spread over two.
    assert len(plan_slices(devices, [counter_set])) == 3


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
