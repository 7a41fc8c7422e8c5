"""Counters of a device the search rejects or drops: kept taken up to 1.36, given back in 1.37.

Both cases were found by the scheduler differential (tests/differential/) against kube-scheduler
1.37.2, whose allocateDevice rolls back every mutation of a rejected or backtracked device
(`rollbackDevice`); 1.36's leaves the counters taken (Features.rejected_device_keeps_counters).
"""

from __future__ import annotations

from typing import Any

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
    results_of,
)
from controller.scheduler.allocator import AllocationOutcome, Allocator, Features, Node

D = "gpu.draplugin.dev"
NODE = Node("node-a")
COUNTERS = [{"name": "mem", "counters": {"memory": {"value": "80Gi"}}}]


def consumes(memory: str) -> dict[str, Any]:
    return {"consumesCounters": [{"counterSet": "mem", "counters": {"memory": {"value": memory}}}]}


def allocate(
    devices: list[dict[str, Any]], claim_obj: dict[str, Any], features: Features
) -> AllocationOutcome:
    slices = [
        resource_slice("node-a-0", devices, node="node-a", slice_count=2),
        resource_slice("node-a-counters", [], node="node-a", slice_count=2, sharedCounters=COUNTERS),
    ]
    del slices[1]["spec"]["devices"]
    allocator = Allocator(
        device_classes=[device_class("gpu", [f'device.driver == "{D}"'])], slices=slices, features=features
    )
    return allocator.allocate([claim_obj], NODE)


def test_a_tainted_device_gives_its_counters_back_from_1_37_on() -> None:
    taint = [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]
    devices = [device("gpu-3", taints=taint, **consumes("40Gi")), device("gpu-4", **consumes("80Gi"))]
    one = claim("c", [exactly("gpu")])
    assert results_of(allocate(devices, one, Features()).allocations[0]) == [("gpu", "gpu-4")]
    # 1.36: gpu-3's 40Gi stay taken after its taint rejected it, so gpu-4's 80Gi no longer fit.
    assert not allocate(devices, one, Features.for_release(36)).ok


def test_a_backtracked_share_gives_its_counters_back_from_1_37_on() -> None:
    # gpu-2 is shareable and consumes 40Gi of 80Gi; its full capacity goes to one share. r0/s1
    # takes gpu-0 and gpu-2, r1 then finds gpu-2 full, and the search backtracks to r0/s2.
    devices = [
        device("gpu-0", allowMultipleAllocations=True),
        device("gpu-2", allowMultipleAllocations=True, **consumes("40Gi")),
    ]
    devices[1]["capacity"] = {"memory": {"value": "80Gi"}}
    request = first_available("r0", exactly("s1", count=2), exactly("s2", count=1))
    claim_obj = claim("c", [request, exactly("r1", count=2)])
    outcome = allocate(devices, claim_obj, Features())
    assert results_of(outcome.allocations[0]) == [("r0/s2", "gpu-0"), ("r1", "gpu-0"), ("r1", "gpu-2")]
    assert not allocate(devices, claim_obj, Features.for_release(36)).ok


def test_1_34_looks_for_each_next_device_from_the_first_again() -> None:
    # In the devices' own slice (1.34's layout): gpu-1 is tainted and consumes 40Gi of 80Gi.
    # s0 (two devices, no toleration) fails, leaking gpu-1's counters each time it is tried:
    # 1.34 tries it for the first device and, after gpu-2, for the second again (it starts from
    # the first device each time), so 80Gi leak and s1 can only have gpu-2. Searching on after
    # the device just taken would try gpu-1 once, and s1 would get it.
    taint = [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]
    devices = [device("gpu-1", taints=taint, **consumes("40Gi")), device("gpu-2")]
    slices = [resource_slice("node-a-0", devices, node="node-a", sharedCounters=COUNTERS)]
    tolerate = [{"key": "maintenance", "operator": "Exists"}]
    request = first_available("r0", exactly("s0", count=2), exactly("s1", count=1, tolerations=tolerate))
    features = Features.for_release(34).with_gates({"DRADeviceTaints": True, "DRAPartitionableDevices": True})
    allocator = Allocator(
        device_classes=[device_class("gpu", [f'device.driver == "{D}"'])], slices=slices, features=features
    )
    outcome = allocator.allocate([claim("c", [request])], NODE)
    assert results_of(outcome.allocations[0]) == [("r0/s1", "gpu-2")]


def test_1_34_checks_capacity_on_the_device_at_the_result_index() -> None:
    # 1.34.4's allocateDevice checks the slice's device at the request's result index (here 0,
    # gpu-1, without capacity) instead of the candidate gpu-2: the capacity request fails there.
    devices = [device("gpu-1"), device("gpu-2", capacity={"memory": "80Gi"})]
    slices = [resource_slice("node-a-0", devices, node="node-a")]
    wants = claim("c", [exactly("gpu", capacity={"requests": {"memory": "20Gi"}})])

    def allocator_for(features: Features) -> Allocator:
        classes = [device_class("gpu", [f'device.driver == "{D}"'])]
        return Allocator(device_classes=classes, slices=slices, features=features)

    assert results_of(allocator_for(Features()).allocate([wants], NODE).allocations[0]) == [("gpu", "gpu-2")]
    on_1_34 = Features.for_release(34).with_gates({"DRAConsumableCapacity": True})
    assert not allocator_for(on_1_34).allocate([wants], NODE).ok
