"""Turning chosen devices into `status.allocation` (results, config, nodeSelector)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.nodes import Node
from controller.allocation.pools import DeviceID
from controller.allocation.requests import Request, claim_requests
from dracommon.quantity import Quantity

JSON = Mapping[str, Any]


class NodeSelectorConflict(ValueError):
    """A slice's node selector has more than one term, which cannot be merged."""


@dataclass
class ChosenDevice:
    request: Request
    device_id: DeviceID
    device: JSON
    slice: JSON
    share_id: str | None = None
    consumed: dict[str, Quantity] = field(default_factory=dict)


def device_result(chosen: ChosenDevice, binding_conditions: bool) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": chosen.request.result_name,
        "driver": chosen.device_id.driver,
        "pool": chosen.device_id.pool,
        "device": chosen.device_id.device,
    }
    if chosen.request.admin_access:
        result["adminAccess"] = True
    if chosen.request.tolerations:
        result["tolerations"] = copy.deepcopy(list(chosen.request.tolerations))
    if binding_conditions:
        if chosen.device.get("bindingConditions"):
            result["bindingConditions"] = list(chosen.device["bindingConditions"])
        if chosen.device.get("bindingFailureConditions"):
            result["bindingFailureConditions"] = list(chosen.device["bindingFailureConditions"])
    if chosen.share_id:
        result["shareID"] = chosen.share_id
    if chosen.consumed:
        result["consumedCapacity"] = {name: str(q) for name, q in chosen.consumed.items()}
    return result


def allocation_config(
    claim: JSON, selected: Mapping[str, Request], classes: Mapping[str, JSON]
) -> list[dict[str, Any]]:
    """Class configs (once per class, naming every request that used it), then claim configs.

    `selected` maps each main request name to the (sub)request that was allocated.
    A config that ends up covering every request of the claim gets no `requests`.
    """
    config: list[dict[str, Any]] = []
    class_ranges: dict[str, tuple[int, int]] = {}
    for request in claim_requests(claim):
        chosen = selected.get(str(request.get("name", "")))
        if chosen is None:
            continue
        class_name = chosen.device_class_name
        if class_name in class_ranges:
            start, end = class_ranges[class_name]
            for existing in config[start:end]:
                existing["requests"].append(chosen.result_name)
            continue
        start = len(config)
        for class_config in (classes.get(class_name, {}).get("spec") or {}).get("config") or []:
            entry: dict[str, Any] = {"source": "FromClass", "requests": [chosen.result_name]}
            entry.update({k: copy.deepcopy(v) for k, v in class_config.items()})
            config.append(entry)
        class_ranges[class_name] = (start, len(config))

    devices = (claim.get("spec") or {}).get("devices") or {}
    for claim_config in devices.get("config") or []:
        names = list(claim_config.get("requests") or [])
        if not names or any(
            request_name in names or (chosen.parent and chosen.result_name in names)
            for request_name, chosen in selected.items()
        ):
            claim_entry: dict[str, Any] = {"source": "FromClaim", "requests": names}
            claim_entry.update({k: copy.deepcopy(v) for k, v in claim_config.items() if k != "requests"})
            config.append(claim_entry)

    for entry in config:
        names = entry["requests"]
        if names and all(
            request_name in names or (chosen.parent and chosen.result_name in names)
            for request_name, chosen in selected.items()
        ):
            entry["requests"] = []
    for entry in config:
        if not entry["requests"]:
            del entry["requests"]
    return config


def node_selector(chosen: Sequence[ChosenDevice], node: Node | None) -> dict[str, Any] | None:
    """Where the allocation is usable: the node for node-local devices, the merged
    single term of node-selected slices, or anywhere (None)."""
    fields: list[JSON] = []
    expressions: list[JSON] = []
    for entry in chosen:
        spec = entry.slice.get("spec") or {}
        if spec.get("perDeviceNodeSelection"):
            node_name, selector = entry.device.get("nodeName"), entry.device.get("nodeSelector")
        else:
            node_name, selector = spec.get("nodeName"), spec.get("nodeSelector")
        if node_name or entry.device.get("bindsToNode"):
            name = node.name if node is not None else str(node_name)
            return {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
                ]
            }
        if selector is None:
            continue
        terms = selector.get("nodeSelectorTerms") or []
        if len(terms) > 1:
            raise NodeSelectorConflict(f"unsupported ResourceSlice.NodeSelector with {len(terms)} terms")
        if terms:
            _merge(terms[0].get("matchFields") or [], fields)
            _merge(terms[0].get("matchExpressions") or [], expressions)
    if not fields and not expressions:
        return None
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = copy.deepcopy(expressions)
    if fields:
        term["matchFields"] = copy.deepcopy(fields)
    return {"nodeSelectorTerms": [term]}


def _merge(source: Sequence[JSON], target: list[JSON]) -> None:
    for requirement in source:
        values = set(requirement.get("values") or [])
        if not any(
            r.get("key") == requirement.get("key")
            and r.get("operator") == requirement.get("operator")
            and set(r.get("values") or []) == values
            for r in target
        ):
            target.append(requirement)
