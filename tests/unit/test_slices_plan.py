"""ResourceSlice planning and rendering (pure): chunking, counter-set layouts, names, owner."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from draplugin.devices.fake import FakeBackend, config_from_flags, parse_config
from draplugin.devices.model import CounterConsumption, CounterSet, Device, DeviceTaint, DeviceValidationError
from draplugin.slices.plan import PlanMemo, SliceLayout, layout_for, plan_slices
from draplugin.slices.render import MAX_NAME_LENGTH, NodeRef, render_pool, slice_name

DRIVER = "gpu.draplugin.dev"
NODE = "node-a"


def fake_devices(n: int, model: str = "L4") -> list[Device]:
    return FakeBackend(NODE, config_from_flags(n, model)).discover()


def fields_of(d: Device) -> dict[str, Any]:
    return {f: getattr(d, f) for f in d.__dataclass_fields__}


def test_chunking_128_without_taints_and_64_with() -> None:
    plan = plan_slices(fake_devices(300))
    assert [len(p.devices) for p in plan] == [128, 128, 44]
    plan = plan_slices(fake_devices(300), expect_taints=True)
    assert [len(p.devices) for p in plan] == [64, 64, 64, 64, 44]
    devices = fake_devices(130)
    devices[0] = Device(
        **{**fields_of(devices[0]), "taints": (DeviceTaint("gpu.draplugin.dev/x", "NoSchedule"),)}
    )
    assert [len(p.devices) for p in plan_slices(devices)] == [64, 64, 2]


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


def test_numa_node_renders_as_the_standard_scalar_int_and_keeps_128_per_slice() -> None:
    config = parse_config({"gpus": [{"model": "L4", "count": 129, "numaNode": 1}, {"model": "L4"}]})
    devices = FakeBackend(NODE, config).discover()
    slices = render_pool(devices, [], node=NodeRef(NODE, "u1"), driver=DRIVER)
    rendered = [d for s in slices for d in s["spec"]["devices"]]
    assert rendered[0]["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert "resource.kubernetes.io/numaNode" not in rendered[-1]["attributes"]
    # A scalar attribute, not a list one: the 128-device limit stays.
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 2]


def test_plan_memo_answers_an_equal_pool_from_the_previous_plan() -> None:
    memo = PlanMemo()
    first = memo.plan(fake_devices(300))
    # Equal devices, built anew (as each discovery builds them): the same answer, not a new one.
    assert memo.plan(fake_devices(300)) is first
    assert first == plan_slices(fake_devices(300))
    assert memo.plan(fake_devices(300), expect_taints=True) == plan_slices(
        fake_devices(300), expect_taints=True
    )


def test_plan_memo_renders_only_changed_devices_and_equals_a_fresh_plan() -> None:
    memo = PlanMemo()
    devices = fake_devices(300)
    first = memo.plan(devices)
    changed = list(devices)
    changed[200] = dataclasses.replace(changed[200], capacity={**changed[200].capacity, "memory": "1Gi"})
    second = memo.plan(changed)
    assert second == plan_slices(changed) and second != first
    # Unchanged devices keep their rendered form; the changed one is rendered anew.
    assert second[0].devices[0] is first[0].devices[0]
    assert second[1].devices[200 - 128] is not first[1].devices[200 - 128]
    assert second[1].devices[200 - 128]["capacity"]["memory"] == {"value": "1Gi"}


def test_plan_memo_still_rejects_invalid_and_duplicate_devices_every_time() -> None:
    memo = PlanMemo()
    devices = fake_devices(3)
    memo.plan(devices)
    bad = [*devices[:2], dataclasses.replace(devices[2], attributes={"productName": "x" * 65})]
    for _ in range(2):  # an error is not remembered as a plan
        with pytest.raises(DeviceValidationError, match=r"attributes\[productName\]"):
            memo.plan(bad)
    duplicate = [*devices, dataclasses.replace(devices[1], index=7)]
    with pytest.raises(DeviceValidationError, match="duplicate device name"):
        memo.plan(duplicate)
    assert memo.plan(devices) == plan_slices(devices)


def test_plan_memo_checks_counter_references_again_when_the_counter_sets_change() -> None:
    backend = FakeBackend(NODE, parse_config({"gpus": [{"model": "A100-SXM4-40GB"}], "partitionable": True}))
    devices, sets = backend.discover(), backend.shared_counters()
    memo = PlanMemo()
    assert memo.plan(devices, sets) == plan_slices(devices, sets)
    with pytest.raises(DeviceValidationError, match="unknown counter set"):
        memo.plan(devices, [])
    layout = SliceLayout.COUNTERS_WITH_DEVICES
    assert memo.plan(devices, sets, layout=layout) == plan_slices(devices, sets, layout=layout)
