"""Which optional DRA features the allocator honours, and which release's rules apply."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class DistinctRule(Enum):
    """How a `distinctAttribute` constraint compares the devices it covers.

    Upstream's rule changed twice (k8s.io/dynamic-resource-allocation, structured allocator):

    * `EVERY_DEVICE` (1.37): every chosen device's value is kept, so all values differ.
    * `LATEST_PER_REQUEST` (1.35, 1.36): one value is kept per request, the one of its most
      recently chosen device, and a new device is checked against those only; dropping a device
      forgets its request's value. Two devices of one request may share a value when another
      device of that request was chosen in between.
    * `SAME_DEVICE_ONLY` (1.34): as `LATEST_PER_REQUEST`, but values are compared by identity
      (pointers) rather than content, so two different devices never conflict; only a device
      chosen twice (a multi-allocatable device) does. The constraint then only asks that each
      device has the attribute.
    """

    EVERY_DEVICE = "every-device"
    LATEST_PER_REQUEST = "latest-per-request"
    SAME_DEVICE_ONLY = "same-device-only"


# Upstream feature gate names -> our field names.
GATES: Mapping[str, str] = {
    "DRAAdminAccess": "admin_access",
    "DRAPrioritizedList": "prioritized_list",
    "DRAPartitionableDevices": "partitionable_devices",
    "DRADeviceTaints": "device_taints",
    "DRAConsumableCapacity": "consumable_capacity",
    "DRADeviceBindingConditions": "binding_conditions",
}


@dataclass(frozen=True)
class Features:
    """Feature gates as kube-scheduler sees them. The defaults are Kubernetes 1.37's.

    Besides the gates, these behaviours differ between releases and alter results:
    `skip_unusable_pools` (from 1.35 on, incomplete and invalid pools are skipped for
    allocation; 1.34 still allocated from incomplete pools (ExactCount) and failed hard
    when the search reached an invalid pool), `distinct_rule` (see `DistinctRule`), and
    two rules for `firstAvailable` subrequests with allocationMode All that 1.34 and 1.35
    had and 1.36 dropped:

    * `all_subrequest_selects_as_previous`: while sizing All subrequests, upstream caches
      "device matches request" per (device, claim, request, subrequest index) but still had
      the previous subrequest's index at hand (index 0 for the first). So an All subrequest
      at index 1 after an All subrequest at index 0 gets the devices that index 0's class
      and selectors accept (its own capacity requests still apply). The cache is emptied
      before the search, so nothing else is affected.
    * `all_subrequest_continues_with_first`: after each device of an All subrequest the
      search went on with the next device of the request's *first* subrequest (the index
      was dropped), until that subrequest's device count: e.g. All after a count-1
      subrequest ends after its first device, and after a count-3 one adds two devices
      chosen for (and named after) the first subrequest.
    """

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    binding_conditions: bool = True
    skip_unusable_pools: bool = True
    distinct_rule: DistinctRule = DistinctRule.EVERY_DEVICE
    all_subrequest_selects_as_previous: bool = False
    all_subrequest_continues_with_first: bool = False
    # The DynamicResources plugin's Score (kubernetes#134711, in 1.35; 1.34.4 has none): with
    # DRAPrioritizedList on, nodes where better-ranked firstAvailable subrequests fit score higher.
    prioritized_list_scoring: bool = True
    # 1.35 (up to 1.35.4) and 1.36.0/1.36.1 pair the pod's claims by index with the allocations
    # of its pending claims only, so a pod that also has an allocated claim fails Score with an
    # error wherever more than one node fits; 1.36.3 and 1.37 fixed it (see controller.scheduler.nodescore).
    score_fails_with_allocated_claims: bool = False
    # Up to 1.36 a device that a taint or a constraint rejects after its counters were
    # checked keeps them taken for the rest of the search (its counters leak); 1.37.2's
    # allocateDevice rolls them back (`rollbackDevice`). Found by the differential.
    rejected_device_keeps_counters: bool = False
    # 1.34.4's allocator looks for each next device of a request from the pool's first device
    # again (every order of the devices); the allocators 1.36/1.37 use with beta/alpha features
    # on go on after the device just taken (`startLocation`: every set once). The result differs
    # only where a rejection leaves state behind (leaked counters, the per-request distinct
    # rules). 1.35 not checked; taken as 1.36. Found by the differential.
    search_restarts_per_device: bool = False
    # 1.34.4 with DRAConsumableCapacity: allocateDevice re-checks capacity on the device at the
    # position `r.deviceIndex` (the how-many-th device of the request) of the candidate's slice,
    # not on the candidate; so a capacity request fails where that other device lacks the
    # capacity, and the scheduler panics where the slice has fewer devices. Found by the differential.
    capacity_check_at_result_index: bool = False
    # Up to 1.36 allocateDevice checks capacity last, after marking the device in use for the
    # claim and adding it to the claim's constraints, and a failed check undoes neither (1.37.2's
    # rollbackDevice does). The search's own capacity filter makes the check fail only where
    # 1.34.4 checks the wrong device (above), so the leak shows on 1.34 alone: the rejected
    # device is skipped as in use by every later (sub)request of the pod on that node. Found by
    # the differential.
    capacity_rejection_keeps_device: bool = False
    # A DeviceTaintRule without `spec.deviceSelector`: 1.34.4's ResourceSlice tracker applies it
    # to every device (kubernetes#141620); 1.37.2's to none, as the API documents (kubernetes#141648).
    # 1.35 and 1.36 not checked; taken as 1.34 (the fix came after them).
    taint_rule_without_selector_matches_all: bool = False

    @classmethod
    def for_release(cls, minor: int) -> Features:
        """Default-on gates and the rules of Kubernetes 1.<minor> (1.34 or later)."""
        if minor >= 37:
            return cls()
        if minor == 36:
            return cls(
                distinct_rule=DistinctRule.LATEST_PER_REQUEST,
                rejected_device_keeps_counters=True,
                capacity_rejection_keeps_device=True,
                taint_rule_without_selector_matches_all=True,
            )
        # 1.34/1.35: taints, partitionable devices, consumable capacity and
        # binding conditions were alpha (off by default).
        return cls(
            device_taints=False,
            partitionable_devices=False,
            consumable_capacity=False,
            binding_conditions=False,
            skip_unusable_pools=minor >= 35,
            distinct_rule=DistinctRule.LATEST_PER_REQUEST if minor >= 35 else DistinctRule.SAME_DEVICE_ONLY,
            all_subrequest_selects_as_previous=True,
            all_subrequest_continues_with_first=True,
            prioritized_list_scoring=minor >= 35,
            score_fails_with_allocated_claims=minor == 35,
            rejected_device_keeps_counters=True,
            search_restarts_per_device=minor <= 34,
            capacity_check_at_result_index=minor <= 34,
            capacity_rejection_keeps_device=True,
            taint_rule_without_selector_matches_all=True,
        )

    def with_gates(self, gates: Mapping[str, bool]) -> Features:
        """These features with upstream feature gates switched as given (`--feature-gates`).

        Gates we do not model are ignored: they do not change allocation results.
        """
        changes: dict[str, Any] = {GATES[name]: enabled for name, enabled in gates.items() if name in GATES}
        return dataclasses.replace(self, **changes)


def parse_feature_gates(text: str) -> dict[str, bool]:
    """`Name=true,Other=false` (the components' --feature-gates syntax) as a dict; ValueError if malformed."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or value.strip().lower() not in ("true", "false"):
            raise ValueError(f"feature gate {item!r}: expected Name=true or Name=false")
        gates[name.strip()] = value.strip().lower() == "true"
    return gates
