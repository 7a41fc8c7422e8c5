"""The implicit claim kube-scheduler makes for a pod's extended resources that a DeviceClass maps.

KEP-5004 (`DRAExtendedResource`: alpha in 1.34, on by default from 1.36, GA in
1.37): a DeviceClass with `spec.extendedResourceName: nvidia.com/gpu`, and every
DeviceClass under its implicit name `deviceclass.resource.kubernetes.io/<class>`,
lets an unmodified pod with `limits: {nvidia.com/gpu: 2}` get devices through
DRA. The scheduler's dynamicresources plugin (extendeddynamicresources.go,
v1.37.2) then allocates one in-memory claim per pod, written to the API at
PreBind as `<pod>-extended-resources-<random>`, annotated
`resource.kubernetes.io/extended-resource-claim: "true"`, owned by the pod and
recorded in `pod.status.extendedResourceClaimStatus`. Its requests, built here
the same way:

* per mapped resource (in name order) and per container that requests it
  (`requests`, which the API server defaults from `limits`): a request
  `container-<i>-request-<j>` (i: index in initContainers + containers, j: the
  resource's index among the container's sorted request names) for that count of
  devices of the class, ExactCount;
* init containers that are not sidecars run before the others and may reuse
  the devices of long-lived containers after them; of what they still need, only
  the largest request is kept;
* requests sorted by name.

Which class a name maps to: the class whose `extendedResourceName` it is
(several: the newest by creationTimestamp, then the lower name), or the class
named by the implicit prefix. A node whose allocatable already has the resource
(a device plugin serves it there) gets no DRA request for it: the scheduler
prefers the device plugin, and so does `device_plugin_nodes` for messages.

Pure: API objects in, claim and mapping out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dracommon.quantity import Quantity, QuantityError

JSON = Mapping[str, Any]

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
# The offline name: upstream's generateName without the random suffix.
CLAIM_SUFFIX = "-extended-resources"
# Resource names in these namespaces are native, not extended (k8s.io/api helper IsExtendedResourceName).
_NATIVE_SUFFIXES = ("kubernetes.io",)
_RELEASE_ON_BY_DEFAULT = 36


def enabled_in(minor: int) -> bool:
    """Whether the DRAExtendedResource gate is on by default in Kubernetes 1.<minor>."""
    return minor >= _RELEASE_ON_BY_DEFAULT


def is_extended_resource_name(name: str) -> bool:
    """A domain-prefixed name outside *kubernetes.io (not `requests.`-prefixed), or an implicit class name."""
    if name.startswith(IMPLICIT_PREFIX):
        return True
    domain, slash, _ = name.partition("/")
    if not slash or name.startswith("requests."):
        return False
    return not any(domain == s or domain.endswith("." + s) for s in _NATIVE_SUFFIXES)


@dataclass(frozen=True, slots=True)
class ClassMapping:
    device_class: str
    # "its spec.extendedResourceName", or "the implicit name deviceclass.resource.kubernetes.io/<class>"
    why: str


def class_mappings(device_classes: Sequence[JSON]) -> dict[str, ClassMapping]:
    """Extended resource name -> the DeviceClass the scheduler maps it to."""
    explicit: dict[str, JSON] = {}
    mappings: dict[str, ClassMapping] = {}
    for cls in device_classes:
        meta = cls.get("metadata") or {}
        name = str(meta.get("name", ""))
        mappings[IMPLICIT_PREFIX + name] = ClassMapping(name, f"the implicit name {IMPLICIT_PREFIX}<class>")
        resource = (cls.get("spec") or {}).get("extendedResourceName")
        if not resource:
            continue
        current = explicit.get(resource)
        if current is None or _newer(cls, current):
            explicit[resource] = cls
    for resource, cls in explicit.items():
        others = [
            str((c.get("metadata") or {}).get("name"))
            for c in device_classes
            if (c.get("spec") or {}).get("extendedResourceName") == resource and c is not cls
        ]
        why = "its spec.extendedResourceName"
        if others:
            why += f" (also set by {', '.join(sorted(others))}: the newest class wins, then the lower name)"
        mappings[resource] = ClassMapping(str((cls.get("metadata") or {}).get("name", "")), why)
    return mappings


def _newer(candidate: JSON, current: JSON) -> bool:
    """Upstream's tie-break: the later creationTimestamp wins; equal times, the lower name."""
    a = str((candidate.get("metadata") or {}).get("creationTimestamp") or "")
    b = str((current.get("metadata") or {}).get("creationTimestamp") or "")
    if a != b:
        return a > b  # RFC 3339 UTC timestamps order as text
    return str(candidate["metadata"].get("name", "")) < str(current["metadata"].get("name", ""))


def container_requests(container: JSON) -> dict[str, Any]:
    """`resources.requests` after API defaulting: a limit with no request is also the request."""
    resources = container.get("resources") or {}
    requests = dict(resources.get("requests") or {})
    for name, value in (resources.get("limits") or {}).items():
        requests.setdefault(name, value)
    return requests


def _as_int(value: object) -> int:
    """Quantity.AsInt64, 0 when it is not a whole number (upstream then skips the request)."""
    try:
        number = Quantity.from_json(value).as_int64()
    except QuantityError:
        return 0
    return number or 0


@dataclass(frozen=True, slots=True)
class Mapped:
    """One container's ask for one mapped resource, and the request that serves it."""

    container: str
    resource: str
    count: int
    request: str
    device_class: str
    why: str


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    claim: dict[str, Any]
    mapped: tuple[Mapped, ...]
    unmapped: tuple[str, ...]  # extended resources the pod asks for that no DeviceClass maps


def _containers(pod: JSON) -> tuple[list[JSON], int]:
    spec = pod.get("spec") or {}
    init = list(spec.get("initContainers") or [])
    return [*init, *(spec.get("containers") or [])], len(init)


Request = dict[str, Any]


def _request_for(
    index: int, container: JSON, resource: str, device_class: str, reusable: Sequence[Request | None]
) -> tuple[Request | None, list[tuple[str, str]]]:
    """createResourceRequestAndMappings: the request (None if reused or nothing asked) and
    (container, request name) mappings."""
    requests = container_requests(container)
    if resource not in requests:
        return None, []
    wanted = _as_int(requests[resource])
    if wanted == 0:
        return None, []
    name = str(container.get("name", ""))
    mappings: list[tuple[str, str]] = []
    total = 0
    for other in reusable:
        if other is not None:
            total += int(other["exactly"]["count"])
            mappings.append((name, str(other["name"])))
            if total >= wanted:
                return None, mappings
    position = sorted(requests).index(resource)
    request_name = f"container-{index}-request-{position}"
    request = {
        "name": request_name,
        "exactly": {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": wanted - total},
    }
    mappings.append((name, request_name))
    return request, mappings


def _pod_requests(pod: JSON) -> dict[str, int]:
    """Whole-number amounts the pod asks for per resource name (any container), for the mapping test."""
    containers, _ = _containers(pod)
    amounts: dict[str, int] = {}
    for container in containers:
        for name, value in container_requests(container).items():
            amounts[name] = max(amounts.get(name, 0), _as_int(value))
    return amounts


def build_extended_claim(pod: JSON, mappings: Mapping[str, ClassMapping]) -> ExtendedClaim | None:
    """The scheduler's claim for the pod's mapped extended resources; None when it asks for none."""
    asked = {name: n for name, n in _pod_requests(pod).items() if n > 0 and is_extended_resource_name(name)}
    mapped_names = sorted(name for name in asked if name in mappings)
    if not mapped_names:
        return None
    containers, init_count = _containers(pod)
    long_lived = [
        i for i, c in enumerate(containers) if i >= init_count or (c.get("restartPolicy") == "Always")
    ]
    short_lived = [i for i in range(init_count) if i not in long_lived]
    requests: list[dict[str, Any]] = []
    mapped: list[Mapped] = []
    for resource in mapped_names:
        mapping = mappings[resource]
        per_container: list[dict[str, Any] | None] = [None] * len(containers)
        pairs: list[tuple[str, str]] = []
        for i in long_lived:
            request, found = _request_for(i, containers[i], resource, mapping.device_class, [])
            per_container[i] = request
            pairs.extend(found)
        largest: dict[str, Any] | None = None
        short_names: set[str] = set()
        short_pairs: list[tuple[str, str]] = []
        for i in short_lived:
            request, found = _request_for(i, containers[i], resource, mapping.device_class, per_container[i:])
            if request is not None:
                short_names.add(request["name"])
                if largest is None or largest["exactly"]["count"] < request["exactly"]["count"]:
                    largest = request
            short_pairs.extend(found)
        if largest is not None and len(short_names) > 1:
            short_pairs = [(c, largest["name"] if r in short_names else r) for c, r in short_pairs]
        if largest is not None:
            requests.append(largest)
        requests.extend(r for r in per_container if r is not None)
        asks = {str(c.get("name", "")): _as_int(container_requests(c).get(resource, 0)) for c in containers}
        for container, request_name in [*pairs, *short_pairs]:
            mapped.append(
                Mapped(container, resource, asks[container], request_name, mapping.device_class, mapping.why)
            )
    requests.sort(key=lambda r: str(r["name"]))
    meta = pod.get("metadata") or {}
    pod_name = str(meta.get("name", ""))
    owner: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "controller": True}
    if meta.get("uid"):
        owner["uid"] = meta["uid"]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": pod_name + CLAIM_SUFFIX,
            "namespace": str(meta.get("namespace") or "default"),
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [owner],
        },
        "spec": {"devices": {"requests": requests}},
    }
    unmapped = tuple(sorted(name for name in asked if name not in mappings))
    return ExtendedClaim(claim, tuple(mapped), unmapped)


def unmapped_extended_resources(pod: JSON, mappings: Mapping[str, ClassMapping]) -> list[str]:
    """Extended resources the pod asks for that no DeviceClass maps: only a device plugin serves them."""
    return sorted(
        name
        for name, n in _pod_requests(pod).items()
        if n > 0 and is_extended_resource_name(name) and name not in mappings
    )


def existing_extended_claim(pod: JSON, claims: Sequence[JSON]) -> JSON | None:
    """The claim the scheduler already wrote for the pod: named in its status, or annotated and
    owned by it."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    recorded = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    for claim in claims:
        claim_meta = claim.get("metadata") or {}
        if str(claim_meta.get("namespace") or "default") != namespace:
            continue
        if recorded and claim_meta.get("name") == recorded:
            return claim
        if (claim_meta.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) != "true":
            continue
        for owner in claim_meta.get("ownerReferences") or []:
            if (
                owner.get("name") == meta.get("name")
                and owner.get("controller")
                and owner.get("uid") == meta.get("uid")
            ):
                return claim
    return None


def device_plugin_nodes(nodes: Sequence[JSON], resources: Sequence[str]) -> dict[str, list[str]]:
    """Node name -> the given resources its allocatable advertises (a device plugin serves them there)."""
    found: dict[str, list[str]] = {}
    for node in nodes:
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        names = [r for r in resources if r in allocatable and _as_int(allocatable[r]) > 0]
        if names:
            found[str((node.get("metadata") or {}).get("name", ""))] = names
    return found


__all__ = [
    "CLAIM_SUFFIX",
    "EXTENDED_RESOURCE_CLAIM_ANNOTATION",
    "IMPLICIT_PREFIX",
    "ClassMapping",
    "ExtendedClaim",
    "Mapped",
    "build_extended_claim",
    "class_mappings",
    "container_requests",
    "device_plugin_nodes",
    "enabled_in",
    "existing_extended_claim",
    "is_extended_resource_name",
    "unmapped_extended_resources",
]
