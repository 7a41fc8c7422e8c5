"""Resource pools as the allocator sees them for one node.

A pool is (driver, pool name). Only the slices of its newest generation count;
the pool is complete when that generation has `resourceSliceCount` slices
somewhere in the cluster, and invalid when device names repeat or counters are
consumed from sets that do not exist.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from controller.allocation.features import Features
from controller.allocation.nodes import Node, node_matches
from dracommon.quantity import Quantity, QuantityError

JSON = Mapping[str, Any]


class DeviceID(NamedTuple):
    # A NamedTuple, not a dataclass: it keys every per-device dict of the search, and a
    # tuple's hash and equality run in C (a frozen dataclass hashes in Python on each lookup).
    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass
class Pool:
    driver: str
    name: str
    generation: int = 0
    incomplete: bool = False
    invalid: bool = False
    invalid_reason: str = ""
    # Sorted by slice name: the publishing side encodes priority in slice names.
    slices_on_node: list[JSON] = field(default_factory=list)
    # Same-generation slices of this pool that target other nodes; their devices
    # still consume the pool's shared counters.
    slices_elsewhere: list[JSON] = field(default_factory=list)
    counter_sets: dict[str, dict[str, Quantity]] = field(default_factory=dict)
    has_binding_conditions: bool = False

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.name}"


def _spec(slice_obj: JSON) -> JSON:
    spec: JSON = slice_obj.get("spec") or {}
    return spec


def slice_name(slice_obj: JSON) -> str:
    return str((slice_obj.get("metadata") or {}).get("name", ""))


def pool_key(slice_obj: JSON) -> tuple[str, str]:
    spec = _spec(slice_obj)
    return str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))


def pool_generation(slice_obj: JSON) -> int:
    return int((_spec(slice_obj).get("pool") or {}).get("generation", 0) or 0)


def pool_slice_count(slice_obj: JSON) -> int:
    return int((_spec(slice_obj).get("pool") or {}).get("resourceSliceCount", 0) or 0)


def _slice_is_relevant(slice_obj: JSON, node: Node | None) -> bool | None:
    """True/False for a known node field, None for a slice with no known one (skipped)."""
    spec = _spec(slice_obj)
    node_name = str(spec.get("nodeName") or "")
    all_nodes = bool(spec.get("allNodes"))
    selector = spec.get("nodeSelector")
    if node_name or all_nodes or selector is not None:
        return node_matches(node, node_name, all_nodes, selector)
    if spec.get("perDeviceNodeSelection"):
        return any(
            node_matches(node, str(d.get("nodeName") or ""), bool(d.get("allNodes")), d.get("nodeSelector"))
            for d in spec.get("devices") or []
        )
    return None


def gather_pools(
    slices_for_node: Sequence[JSON], all_slices: Sequence[JSON], node: Node | None, features: Features
) -> list[Pool]:
    """The pools usable on `node`, in the allocator's search order."""
    newest: dict[tuple[str, str], list[JSON]] = {}
    for slice_obj in slices_for_node:
        spec = _spec(slice_obj)
        if not features.partitionable_devices and (
            spec.get("perDeviceNodeSelection") is not None or spec.get("sharedCounters")
        ):
            continue
        if not _slice_is_relevant(slice_obj, node):
            continue
        key = pool_key(slice_obj)
        current = newest.get(key)
        if current is None or pool_generation(slice_obj) > pool_generation(current[0]):
            newest[key] = [slice_obj]
        elif pool_generation(slice_obj) == pool_generation(current[0]):
            current.append(slice_obj)

    pools: list[Pool] = []
    for (driver, name), node_slices in newest.items():
        generation = pool_generation(node_slices[0])
        wanted = pool_slice_count(node_slices[0])
        same_generation: list[JSON] = []
        if len(node_slices) != wanted:
            obsolete = False
            for other in all_slices:
                if pool_key(other) != (driver, name):
                    continue
                if pool_generation(other) > generation:
                    obsolete = True
                    break
                if pool_generation(other) == generation:
                    same_generation.append(other)
            if obsolete:
                continue
            if len(same_generation) != wanted:
                if features.skip_unusable_pools:
                    pools.append(Pool(driver=driver, name=name, generation=generation, incomplete=True))
                else:
                    # 1.34 still allocated from what it had of an incomplete pool.
                    partial = _build_pool(driver, name, generation, node_slices, same_generation, features)
                    partial.incomplete = True
                    pools.append(partial)
                continue
        pools.append(_build_pool(driver, name, generation, node_slices, same_generation, features))

    pools.sort(key=lambda p: (p.has_binding_conditions, p.driver, p.name))
    return pools


def _build_pool(
    driver: str,
    name: str,
    generation: int,
    node_slices: list[JSON],
    same_generation: list[JSON],
    features: Features,
) -> Pool:
    pool = Pool(driver=driver, name=name, generation=generation)
    # Counter sets come from slices of their own (1.35+ layout) or from the slice of the
    # devices that consume them (1.34 layout); a slice may hold both, so its devices count too.
    counter_slices: list[JSON] = []
    for slice_obj in sorted(node_slices, key=slice_name):
        if features.partitionable_devices and _spec(slice_obj).get("sharedCounters"):
            counter_slices.append(slice_obj)
        if _spec(slice_obj).get("devices") or not _spec(slice_obj).get("sharedCounters"):
            pool.slices_on_node.append(slice_obj)
    if len(node_slices) < len(same_generation):
        on_node = {slice_name(s) for s in node_slices}
        for other in same_generation:
            if slice_name(other) in on_node:
                continue
            if features.partitionable_devices and _spec(other).get("sharedCounters"):
                counter_slices.append(other)
            if _spec(other).get("devices") or not _spec(other).get("sharedCounters"):
                pool.slices_elsewhere.append(other)
    # One pass over the node's devices: binding conditions, repeated names, counter consumers.
    seen: set[str] = set()
    binding = consumers = False
    for slice_obj in pool.slices_on_node:
        for device in _spec(slice_obj).get("devices") or []:
            binding = binding or bool(device.get("bindingConditions"))
            consumers = consumers or bool(device.get("consumesCounters"))
            device_name = str(device.get("name", ""))
            if device_name in seen:
                return _invalid(pool, f"duplicate device name {device_name}")
            seen.add(device_name)
    pool.has_binding_conditions = binding
    if not features.partitionable_devices:
        return pool

    for slice_obj in counter_slices:
        for counter_set in _spec(slice_obj).get("sharedCounters") or []:
            set_name = str(counter_set.get("name", ""))
            if set_name in pool.counter_sets:
                return _invalid(pool, f"duplicate counter set name {set_name}")
            try:
                pool.counter_sets[set_name] = {
                    counter: Quantity.from_json((value or {}).get("value", "0"))
                    for counter, value in (counter_set.get("counters") or {}).items()
                }
            except QuantityError as err:
                return _invalid(pool, f"counter set {set_name}: {err}")
    for slice_obj in (
        [*pool.slices_on_node, *pool.slices_elsewhere] if consumers or pool.slices_elsewhere else []
    ):
        for device in _spec(slice_obj).get("devices") or []:
            for consumption in device.get("consumesCounters") or []:
                set_name = str(consumption.get("counterSet", ""))
                counters = pool.counter_sets.get(set_name)
                if counters is None:
                    return _invalid(pool, f"counter set {set_name} not found")
                for counter in consumption.get("counters") or {}:
                    if counter not in counters:
                        return _invalid(pool, f"counter {counter} not found in counter set {set_name}")
    return pool


def _invalid(pool: Pool, reason: str) -> Pool:
    return Pool(
        driver=pool.driver, name=pool.name, generation=pool.generation, invalid=True, invalid_reason=reason
    )
