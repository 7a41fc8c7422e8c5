"""DeviceTaintRules applied to ResourceSlices, as kube-scheduler's ResourceSlice tracker does.

Upstream (k8s.io/dynamic-resource-allocation resourceslice/tracker, `applyPatches`) hands the
scheduler's allocator slices with each matching rule's taint appended to the device's own
taints. A rule's `spec.deviceSelector` narrows the devices:

* `driver`, `pool`, `device`: exact names; one left out matches any.
* `deviceClassName` and `selectors` (CEL), in resource.k8s.io/v1alpha3 of 1.34 only (tombstoned
  in 1.35, kubernetes#134152): the class's CEL selectors, then the rule's, must all accept the
  device. A class that does not exist makes the rule apply to no device. A runtime error in any
  of them leaves the device untainted by that rule (the tracker skips the device; for the rule's
  own selectors it also records a CELRuntimeError Event on the rule). A compile error fails the
  whole slice: the tracker keeps no patched copy of a slice it could not patch, so a new slice
  never reaches the allocator (`SliceLeftOut`). The CEL `device` is the tracker's
  `cel.Device{Driver, Attributes, Capacity}`: `allowMultipleAllocations` reads false.
* no `deviceSelector` at all: 1.34.4's tracker matches every device; 1.37.2's none, as the API
  documents (kubernetes#141620, fixed by kubernetes#141648): `nil_selector_matches_all`
  (`Features.taint_rule_without_selector_matches_all`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.allocation.selectors import SelectorCache, SelectorError, SelectorStep

JSON = Mapping[str, Any]


class SliceLeftOut(Exception):
    """A rule's CEL selector (or its class's) does not compile: upstream drops the slice."""


@dataclass(frozen=True)
class _Rule:
    name: str
    taint: JSON
    driver: str | None
    pool: str | None
    device: str | None
    # The class's selectors then the rule's, in evaluation order.
    steps: tuple[SelectorStep, ...]


def _optional_name(selector: JSON, key: str) -> str | None:
    value = selector.get(key)
    return None if value is None else str(value)


def _cel_steps(selectors: Sequence[JSON], where: str) -> list[SelectorStep]:
    return [
        SelectorStep(str((s.get("cel") or {}).get("expression", "")), f"{where}: selector #{i}")
        for i, s in enumerate(selectors)
        if s.get("cel") is not None
    ]


def _prepare(rule: JSON, classes: Mapping[str, JSON], nil_selector_matches_all: bool) -> _Rule | None:
    """The rule's parts, None for a rule that selects no device at all."""
    spec = rule.get("spec") or {}
    taint = spec.get("taint")
    if not taint:
        return None
    name = str((rule.get("metadata") or {}).get("name", ""))
    selector = spec.get("deviceSelector")
    if selector is None:
        return _Rule(name, taint, None, None, None, ()) if nil_selector_matches_all else None
    steps: list[SelectorStep] = []
    class_name = selector.get("deviceClassName")
    if class_name is not None:
        device_class = classes.get(str(class_name))
        if device_class is None:
            return None
        class_selectors = (device_class.get("spec") or {}).get("selectors") or []
        steps = _cel_steps(class_selectors, f"DeviceTaintRule {name}: class {class_name}")
    steps.extend(_cel_steps(selector.get("selectors") or [], f"DeviceTaintRule {name}"))
    return _Rule(
        name,
        taint,
        _optional_name(selector, "driver"),
        _optional_name(selector, "pool"),
        _optional_name(selector, "device"),
        tuple(steps),
    )


def _selects(rule: _Rule, driver: str, device: JSON, selectors: SelectorCache) -> bool:
    if rule.device is not None and rule.device != device.get("name"):
        return False
    if not rule.steps:
        return True
    view = {
        "name": device.get("name", ""),
        "attributes": device.get("attributes") or {},
        "capacity": device.get("capacity") or {},
    }
    try:
        return selectors.first_non_match(rule.steps, driver, view) is None
    except SelectorError as err:
        if err.compile_error:
            raise SliceLeftOut(err.message) from err
        return False


def apply_taint_rules(
    slices: Iterable[JSON],
    rules: Iterable[JSON],
    *,
    classes: Mapping[str, JSON] | None = None,
    selectors: SelectorCache | None = None,
    nil_selector_matches_all: bool = False,
) -> list[JSON]:
    """Slices with DeviceTaintRule taints added to the devices they select; `classes` by name (for
    v1alpha3's deviceClassName), `selectors` the allocator's compiled CEL. Slices that no rule
    touches are returned as they are (no copy); a slice a rule's CEL fails to compile on is left
    out, as upstream leaves it."""
    prepared = [p for p in (_prepare(r, classes or {}, nil_selector_matches_all) for r in rules) if p]
    if not prepared:
        return list(slices)
    cache = selectors if selectors is not None else SelectorCache()
    result: list[JSON] = []
    for slice_obj in slices:
        spec = slice_obj.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        applying = [r for r in prepared if r.driver in (None, driver) and r.pool in (None, pool)]
        if not applying:
            result.append(slice_obj)
            continue
        try:
            patched = _patched(slice_obj, spec, driver, applying, cache)
        except SliceLeftOut:
            continue
        result.append(patched)
    return result


def _patched(
    slice_obj: JSON, spec: JSON, driver: str, rules: Sequence[_Rule], selectors: SelectorCache
) -> JSON:
    # Rule by rule, device by device, as upstream appends (the order explain names taints in).
    patched: dict[str, Any] | None = None
    for rule in rules:
        for index, device in enumerate(spec.get("devices") or []):
            if not _selects(rule, driver, device, selectors):
                continue
            if patched is None:
                patched = copy.deepcopy(dict(slice_obj))
            patched_device = patched["spec"]["devices"][index]
            patched_device["taints"] = [*(patched_device.get("taints") or []), dict(rule.taint)]
    return patched if patched is not None else slice_obj
