"""Complete ResourceSlice objects (pure): deterministic names, pool fields, the Node as owner.

Slice names are `<node>-<driver>-<index>` (node part shortened with a hash
when the name would exceed 253 characters). A create that races an earlier
one then fails with 409 instead of leaving a duplicate slice, which
`generateName` would do. The Node owns every slice, so garbage collection
removes them with the Node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from draplugin.devices.model import CounterSet, Device
from draplugin.slices.plan import PlannedSlice, SliceLayout, plan_slices
from draplugin.slices.writer import WRITER_ANNOTATION

API_VERSION = "resource.k8s.io/v1"
MAX_NAME_LENGTH = 253


def slice_name(node_name: str, driver: str, index: int) -> str:
    suffix = f"-{driver}-{index}"
    name = node_name + suffix
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    keep = MAX_NAME_LENGTH - len(suffix) - len(digest) - 1
    return f"{node_name[:keep].rstrip('.-')}-{digest}{suffix}"


def is_our_slice_name(name: str, node_name: str, driver: str) -> bool:
    """Whether `name` is one `slice_name` gives for this node and driver: a slice we wrote. Others
    (upstream's helper names its slices `<index>-<driver>-<node>-<random>`) are another writer's."""
    tail = name.rpartition("-")[2]
    return tail.isdigit() and slice_name(node_name, driver, int(tail)) == name


@dataclass(frozen=True, slots=True)
class NodeRef:
    name: str
    uid: str | None  # None: render without an owner (dry runs)


def render_slice(
    planned: PlannedSlice,
    *,
    node: NodeRef,
    driver: str,
    index: int,
    generation: int,
    count: int,
    writer: str | None = None,
) -> dict[str, Any]:
    """A complete ResourceSlice object as JSON-ready dict; `writer` marks it (`slices.writer`)."""
    metadata: dict[str, Any] = {"name": slice_name(node.name, driver, index)}
    if node.uid is not None:
        metadata["ownerReferences"] = [_owner(node)]
    if writer is not None:
        metadata["annotations"] = {WRITER_ANNOTATION: writer}
    spec: dict[str, Any] = {
        "driver": driver,
        "nodeName": node.name,
        "pool": {"name": node.name, "generation": generation, "resourceSliceCount": count},
    }
    if planned.devices:
        spec["devices"] = list(planned.devices)
    if planned.shared_counters:
        spec["sharedCounters"] = list(planned.shared_counters)
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": metadata, "spec": spec}


def render_pool(
    devices: Sequence[Device],
    counter_sets: Sequence[CounterSet],
    *,
    node: NodeRef,
    driver: str,
    generation: int = 1,
    expect_taints: bool = False,
    layout: SliceLayout = SliceLayout.SEPARATE_COUNTER_SLICES,
) -> list[dict[str, Any]]:
    """Every slice of the pool as it would be written (used by `draplugin devices`)."""
    planned = plan_slices(devices, counter_sets, expect_taints=expect_taints, layout=layout)
    return [
        render_slice(p, node=node, driver=driver, index=i, generation=generation, count=len(planned))
        for i, p in enumerate(planned)
    ]


def _owner(node: NodeRef) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid, "controller": True}
