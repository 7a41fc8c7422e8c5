"""Desired ResourceSlices of this node's pool (pure): which devices and counter sets go in which slice.

- Devices keep discovery order (first-fit allocation depends on it). A slice
  holds at most 128 devices, 64 when the pool uses taints or counters.
- Where shared counter sets go depends on the server's release (`SliceLayout`):
  from Kubernetes 1.35 on they go in slices of their own; 1.34 only accepts a
  device whose counter set is defined in the same slice, and its scheduler
  scopes counter sets to their slice, so each counter set shares one slice
  with every device that consumes it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dracommon.kubeversion import KubernetesVersion
from draplugin.devices.model import CounterSet, Device, DeviceValidationError, validate_devices

MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
# Kubernetes 1.34 limits for a slice that holds counter sets and their consumers:
# counters summed over all of the slice's sets, and over all of its devices.
MAX_SHARED_COUNTERS_PER_SLICE_1_34 = 32
MAX_DEVICE_COUNTERS_PER_SLICE_1_34 = 1024


class SliceLayout(enum.Enum):
    """Where a pool's shared counter sets are published."""

    # Kubernetes 1.35 and later: counter sets in slices of their own, before the devices.
    SEPARATE_COUNTER_SLICES = "separate-counter-slices"
    # Kubernetes 1.34: each counter set in the slice of the devices that consume it.
    COUNTERS_WITH_DEVICES = "counters-with-devices"


def layout_for(version: KubernetesVersion) -> SliceLayout:
    """The layout the API server of that release accepts."""
    return SliceLayout.COUNTERS_WITH_DEVICES if version < (1, 35) else SliceLayout.SEPARATE_COUNTER_SLICES


@dataclass(frozen=True, slots=True)
class PlannedSlice:
    """The spec content of one slice, without pool generation/count (those are decided at sync)."""

    devices: tuple[dict[str, Any], ...] = ()
    shared_counters: tuple[dict[str, Any], ...] = ()


def plan_slices(
    devices: Sequence[Device],
    counter_sets: Sequence[CounterSet] = (),
    *,
    expect_taints: bool = False,
    layout: SliceLayout = SliceLayout.SEPARATE_COUNTER_SLICES,
) -> list[PlannedSlice]:
    """Cut the pool into slices: counter-set slices first, then devices in order.

    The per-slice device limit is chosen for the whole pool, not per slice, so a
    device gaining a taint changes one slice rather than shifting every boundary.
    `expect_taints` (set when health monitoring is on) picks the lower limit up
    front for the same reason. With `SliceLayout.COUNTERS_WITH_DEVICES` each
    counter set travels with its consumers instead (`_plan_counters_with_devices`).
    Raises `DeviceValidationError` for invalid input.
    """
    validate_devices(devices, counter_sets)
    return _cut(devices, [d.to_api() for d in devices], counter_sets, expect_taints, layout)


def _cut(
    devices: Sequence[Device],
    rendered: Sequence[dict[str, Any]],
    counter_sets: Sequence[CounterSet],
    expect_taints: bool,
    layout: SliceLayout,
) -> list[PlannedSlice]:
    """`plan_slices` for validated devices, with `rendered[i]` the API form of `devices[i]`."""
    small = expect_taints or bool(counter_sets) or any(d.needs_small_slice for d in devices)
    limit = MAX_DEVICES_PER_SLICE_WITH_TAINTS_OR_COUNTERS if small else MAX_DEVICES_PER_SLICE
    if layout is SliceLayout.COUNTERS_WITH_DEVICES and counter_sets:
        return _plan_counters_with_devices(devices, rendered, counter_sets, limit)
    slices: list[PlannedSlice] = []
    rendered_sets = [c.to_api() for c in counter_sets]
    for start in range(0, len(rendered_sets), MAX_COUNTER_SETS_PER_SLICE):
        slices.append(
            PlannedSlice(shared_counters=tuple(rendered_sets[start : start + MAX_COUNTER_SETS_PER_SLICE]))
        )
    for start in range(0, len(rendered), limit):
        slices.append(PlannedSlice(devices=tuple(rendered[start : start + limit])))
    if not slices:
        # An empty pool is published as one empty slice: "no devices" differs from "no pool".
        slices.append(PlannedSlice())
    return slices


@dataclass(slots=True)
class _Group:
    """Devices tied together by the counter sets they share, and those sets."""

    device_indices: list[int] = field(default_factory=list)
    set_names: list[str] = field(default_factory=list)


def _plan_counters_with_devices(
    devices: Sequence[Device],
    rendered: Sequence[dict[str, Any]],
    counter_sets: Sequence[CounterSet],
    limit: int,
) -> list[PlannedSlice]:
    """The 1.34 layout: every counter set in one slice with all of its consumers.

    Devices sharing a counter set (directly or through a chain of sets) form a
    group that must not be split; groups are packed into slices in the order of
    their first device, so devices keep discovery order unless consumers of one
    set are interleaved with other devices. A group that cannot fit one slice is
    a DeviceValidationError: 1.34 has no way to publish it.
    """
    parent: dict[str, str] = {c.name: c.name for c in counter_sets}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for device in devices:
        names = [c.counter_set for c in device.consumes_counters]
        for other in names[1:]:
            parent[root(other)] = root(names[0])

    groups: dict[str, _Group] = {}
    ordered: list[_Group] = []
    for index, device in enumerate(devices):
        if not device.consumes_counters:
            ordered.append(_Group(device_indices=[index]))
            continue
        key = root(device.consumes_counters[0].counter_set)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
            ordered.append(group)
        group.device_indices.append(index)
    for counter_set in counter_sets:  # unused sets still get published, with their group or alone
        key = root(counter_set.name)
        group = groups.get(key)
        if group is None:
            group = groups[key] = _Group()
            ordered.append(group)
        group.set_names.append(counter_set.name)

    rendered_sets = {c.name: c.to_api() for c in counter_sets}

    def size(group: _Group) -> tuple[int, int, int, int]:
        shared = sum(len(rendered_sets[n]["counters"]) for n in group.set_names)
        consumed = sum(
            len(c["counters"]) for i in group.device_indices for c in rendered[i].get("consumesCounters", [])
        )
        return len(group.device_indices), len(group.set_names), shared, consumed

    maxima = (
        limit,
        MAX_COUNTER_SETS_PER_SLICE,
        MAX_SHARED_COUNTERS_PER_SLICE_1_34,
        MAX_DEVICE_COUNTERS_PER_SLICE_1_34,
    )
    slices: list[list[_Group]] = []
    used: tuple[int, ...] = (0, 0, 0, 0)
    for group in ordered:
        need = size(group)
        if any(n > m for n, m in zip(need, maxima, strict=True)):
            raise DeviceValidationError(
                f"counter sets {', '.join(group.set_names)}",
                "sharedCounters",
                f"{need[0]} devices, {need[1]} counter sets, {need[2]} shared and {need[3]} consumed "
                f"counters exceed one ResourceSlice (limits {maxima[0]}, {maxima[1]}, {maxima[2]}, "
                f"{maxima[3]}); Kubernetes 1.34 needs a counter set and all its consumers in one slice",
            )
        total = tuple(u + n for u, n in zip(used, need, strict=True))
        if not slices or any(t > m for t, m in zip(total, maxima, strict=True)):
            slices.append([])
            total = need
        slices[-1].append(group)
        used = total
    return [
        PlannedSlice(
            devices=tuple(rendered[i] for i in sorted(i for g in members for i in g.device_indices)),
            shared_counters=tuple(rendered_sets[n] for g in members for n in g.set_names),
        )
        for members in slices
    ]


class PlanMemo:
    """`plan_slices`, reusing what it can of the previous call.

    Comparing two device lists takes a few milliseconds; validating and rendering
    a thousand devices takes a hundred. An equal input gets the previous answer
    (a resync usually finds nothing changed); otherwise devices equal to one of
    the previous call, with the same counter sets, keep their validation and API
    form, and only the others are validated and rendered (one device's health or
    capacity changed). Answers are shared between calls: callers must not modify
    them.
    """

    def __init__(self) -> None:
        self._key: tuple[tuple[Device, ...], tuple[CounterSet, ...], bool, SliceLayout] | None = None
        self._planned: list[PlannedSlice] = []
        # Device name -> the device of the previous call and its API form.
        self._rendered: dict[str, tuple[Device, dict[str, Any]]] = {}

    def plan(
        self,
        devices: Sequence[Device],
        counter_sets: Sequence[CounterSet] = (),
        *,
        expect_taints: bool = False,
        layout: SliceLayout = SliceLayout.SEPARATE_COUNTER_SLICES,
    ) -> list[PlannedSlice]:
        key = (tuple(devices), tuple(counter_sets), expect_taints, layout)
        if key == self._key:
            return self._planned
        previous = self._rendered if self._key is not None and self._key[1] == key[1] else {}
        known = [previous.get(d.name) for d in devices]
        fresh = [d for d, seen in zip(devices, known, strict=True) if seen is None or seen[0] != d]
        if len({d.name for d in devices}) != len(devices):
            fresh = list(devices)  # duplicate names: the full check says which
        # The pool-wide checks (names unique, counter sets resolve) hold for the known devices
        # already; run on the fresh ones they cover their references. Invalid input raises here
        # and is not remembered, so it is reported again next time.
        validate_devices(fresh, counter_sets)
        fresh_names = {d.name for d in fresh}
        rendered = [
            d.to_api() if seen is None or d.name in fresh_names else seen[1]
            for d, seen in zip(devices, known, strict=True)
        ]
        self._planned = _cut(devices, rendered, counter_sets, expect_taints, layout)
        self._key = key
        self._rendered = {d.name: (d, r) for d, r in zip(devices, rendered, strict=True)}
        return self._planned
