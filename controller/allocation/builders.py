"""Small constructors for resource.k8s.io/v1 objects as JSON dicts.

Used by tests, benchmarks and the differential checks against kube-scheduler,
so that scenarios read like the objects they stand for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dracommon.drivername import DEFAULT_DRIVER_NAME

API_VERSION = "resource.k8s.io/v1"


def attr(value: object) -> dict[str, object]:
    """A device attribute value: bool, int, or string ("v1.2.3" stays a string; use version())."""
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": str(value)}


def version(value: str) -> dict[str, object]:
    return {"version": value}


def device(
    name: str,
    attributes: Mapping[str, object] | None = None,
    capacity: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A device; attribute values that are already dicts are taken as they are."""
    result: dict[str, Any] = {"name": name}
    if attributes:
        result["attributes"] = {k: v if isinstance(v, dict) else attr(v) for k, v in attributes.items()}
    if capacity:
        result["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    result.update(extra)
    return result


def resource_slice(
    name: str,
    devices: Sequence[Mapping[str, Any]],
    *,
    node: str | None = None,
    pool: str | None = None,
    driver: str = DEFAULT_DRIVER_NAME,
    generation: int = 1,
    slice_count: int = 1,
    all_nodes: bool = False,
    node_selector: Mapping[str, Any] | None = None,
    **spec_extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool or node or name, "generation": generation, "resourceSliceCount": slice_count},
        "devices": [dict(d) for d in devices],
    }
    if node:
        spec["nodeName"] = node
    elif all_nodes:
        spec["allNodes"] = True
    elif node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    spec.update(spec_extra)
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def device_class(
    name: str, selectors: Sequence[str] = (), config: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if config:
        spec["config"] = [dict(c) for c in config]
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def exactly(
    name: str,
    device_class_name: str = "gpu",
    *,
    count: int | None = None,
    mode: str | None = None,
    selectors: Sequence[str] = (),
    **extra: Any,
) -> dict[str, Any]:
    """An `exactly` request."""
    spec: dict[str, Any] = {"deviceClassName": device_class_name}
    if mode:
        spec["allocationMode"] = mode
    if count is not None:
        spec["count"] = count
    if selectors:
        spec["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    spec.update(extra)
    return {"name": name, "exactly": spec}


def first_available(name: str, *subrequests: Mapping[str, Any]) -> dict[str, Any]:
    """A `firstAvailable` request; subrequests are built with exactly() and unwrapped here."""
    subs = [{"name": s["name"], **s["exactly"]} for s in subrequests]
    return {"name": name, "firstAvailable": subs}


def claim(
    name: str,
    requests: Sequence[Mapping[str, Any]],
    *,
    namespace: str = "default",
    constraints: Sequence[Mapping[str, Any]] = (),
    config: Sequence[Mapping[str, Any]] = (),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    if config:
        devices["config"] = [dict(c) for c in config]
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {"devices": devices},
    }


def opaque(parameters: Mapping[str, Any], driver: str = DEFAULT_DRIVER_NAME) -> dict[str, Any]:
    return {"opaque": {"driver": driver, "parameters": dict(parameters)}}


def with_allocation(claim_obj: Mapping[str, Any], allocation: Mapping[str, Any]) -> dict[str, Any]:
    result = dict(claim_obj)
    result["status"] = {"allocation": dict(allocation)}
    return result


def results_of(allocation: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(request, device) pairs of an allocation, for compact assertions."""
    return [(r["request"], r["device"]) for r in allocation["devices"]["results"]]
