"""resource.k8s.io/v1 fields of Kubernetes 1.36 and 1.37 that the allocator does not model yet.

Each of these changes which devices kube-scheduler may allocate, or what the allocation
result holds, when its (alpha, default-off) feature gate is on (k8s.io/api v0.37.2
`resource/v1/types.go`, k8s.io/kubernetes v1.37.2 `pkg/features`). Rather than
silently reading such an object as if the field were absent, the allocator refuses
any allocation that reads it, naming the field, its gate and the release that added
it: `simulate`, `explain` and the controller's pre-allocation all allocate through
`Allocator.allocate`, so all of them stop with that error.

Binding conditions (`bindingConditions`, `bindingFailureConditions`, `bindsToNode`,
DRADeviceBindingConditions) are modelled, not refused: see `Features.binding_conditions`.

Pure: API objects (JSON dicts) in, problems out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JSON = Mapping[str, Any]


@dataclass(frozen=True)
class Field:
    """A field the allocator does not model: where it sits, its feature gate, the release that added it."""

    path: str
    gate: str
    release: str


LIST_ATTRIBUTE_KEYS = ("ints", "bools", "strings", "versions")  # DeviceAttribute list values

LIST_TYPE_ATTRIBUTES = Field(
    "list-typed device attribute (ints/bools/strings/versions)", "DRAListTypeAttributes", "1.36"
)
NODE_ALLOCATABLE_RESOURCES = Field("device nodeAllocatableResources", "DRANodeAllocatableResources", "1.36")
COMPATIBILITY_GROUPS = Field("consumesCounters[].compatibilityGroups", "DRADeviceCompatibilityGroups", "1.37")
PARTITION_TYPE_ATTRIBUTE = Field(
    "ResourceSlice spec.partitionTypeAttribute", "DRAPartitionableDevicesType", "1.37"
)
SKIP_NODE_OPERATIONS = Field("ResourceSlice spec.skipNodeOperations", "DRAOptionalNodeOperations", "1.37")
DERIVED_ATTRIBUTES = Field("request derivedAttributes", "DRADerivedAttributes", "1.37")

FIELDS = (
    LIST_TYPE_ATTRIBUTES,
    NODE_ALLOCATABLE_RESOURCES,
    COMPATIBILITY_GROUPS,
    PARTITION_TYPE_ATTRIBUTE,
    SKIP_NODE_OPERATIONS,
    DERIVED_ATTRIBUTES,
)


@dataclass(frozen=True)
class Unsupported:
    """One use of an unsupported field in one object."""

    field: Field
    where: str  # the object and the exact spot, e.g. `ResourceSlice s1: device gpu-0, attribute model`

    @property
    def message(self) -> str:
        field = self.field
        return f"not supported yet: {field.path} ({field.gate}, Kubernetes {field.release}) in {self.where}"


def _name(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def _may_hold_list_keys(attributes: JSON) -> bool:
    """False when no attribute value that is a mapping has a list-typed key: the keys of every
    value gathered in one C-level union (iterating a mapping yields its keys). A value of
    another kind can only add false alarms (a list holding "ints") or fail the union; either
    way the exact per-attribute check decides."""
    try:
        return not _NO_KEYS.union(*attributes.values()).isdisjoint(LIST_ATTRIBUTE_KEYS)
    except (TypeError, AttributeError):  # a value that cannot be iterated: the exact check tells
        return True


_NO_KEYS: frozenset[object] = frozenset()


def common_device(device: JSON) -> bool:
    """True when the device holds none of FIELDS, told as `slice_problems` tells its common case
    (without a Python step per attribute); False: `slice_problems` looks closer."""
    return (
        not _may_hold_list_keys(device.get("attributes") or {})
        and not device.get("nodeAllocatableResources")
        and not device.get("consumesCounters")
    )


def common_slice(spec: JSON) -> bool:
    """True when the slice's spec has none of FIELDS' slice-level fields (its devices aside)."""
    return not spec.get("partitionTypeAttribute") and not spec.get("skipNodeOperations")


def slice_problems(slice_obj: JSON) -> list[Unsupported]:
    """Uses of unsupported fields in a ResourceSlice."""
    spec = slice_obj.get("spec") or {}
    where = f"ResourceSlice {_name(slice_obj)}"
    problems: list[Unsupported] = []
    if spec.get("partitionTypeAttribute"):
        problems.append(Unsupported(PARTITION_TYPE_ATTRIBUTE, where))
    if spec.get("skipNodeOperations"):
        problems.append(Unsupported(SKIP_NODE_OPERATIONS, where))
    for device in spec.get("devices") or []:
        attributes = device.get("attributes") or {}
        if (
            not _may_hold_list_keys(attributes)
            and not device.get("nodeAllocatableResources")
            and not device.get("consumesCounters")
        ):
            continue  # the common case, told without a Python step per attribute
        listed = [
            name
            for name, value in attributes.items()
            # dict first: an ABC isinstance per attribute was most of this function's time
            if (type(value) is dict or isinstance(value, Mapping))
            and not value.keys().isdisjoint(LIST_ATTRIBUTE_KEYS)
        ]
        consumptions = device.get("consumesCounters") or []
        if not listed and not device.get("nodeAllocatableResources") and not consumptions:
            continue  # the common case, without building the messages (8,000 devices at fleet size)
        at = f"{where}, device {device.get('name', '')}"
        for attribute in sorted(listed):
            problems.append(Unsupported(LIST_TYPE_ATTRIBUTES, f"{at}, attribute {attribute}"))
        if device.get("nodeAllocatableResources"):
            problems.append(Unsupported(NODE_ALLOCATABLE_RESOURCES, at))
        for consumption in consumptions:
            if consumption.get("compatibilityGroups"):
                counter_set = consumption.get("counterSet", "")
                problems.append(Unsupported(COMPATIBILITY_GROUPS, f"{at}, counter set {counter_set}"))
    return problems


def claim_problems(claim: JSON) -> list[Unsupported]:
    """Uses of unsupported fields in a ResourceClaim (or the claim spec a template holds)."""
    devices = (claim.get("spec") or {}).get("devices") or {}
    where = f"ResourceClaim {_name(claim)}"
    problems: list[Unsupported] = []
    for request in devices.get("requests") or []:
        name = str(request.get("name", ""))
        if (request.get("exactly") or {}).get("derivedAttributes"):
            problems.append(Unsupported(DERIVED_ATTRIBUTES, f"{where}, request {name}"))
        for sub in request.get("firstAvailable") or []:
            if sub.get("derivedAttributes"):
                problems.append(
                    Unsupported(DERIVED_ATTRIBUTES, f"{where}, request {name}/{sub.get('name', '')}")
                )
    return problems


__all__ = [
    "FIELDS",
    "Field",
    "Unsupported",
    "claim_problems",
    "common_device",
    "common_slice",
    "slice_problems",
]
