"""How a stored slice compares with the one we would write (pure), so nothing changed means no write.

The server fills in fields (a taint's `timeAdded`) and may drop ones a
disabled feature gate does not know; these helpers keep such differences
from looking like changes.
"""

from __future__ import annotations

import json
from typing import Any


def generation_of(obj: dict[str, Any]) -> int:
    return int(obj.get("spec", {}).get("pool", {}).get("generation", 0))


def canonical(spec: dict[str, Any]) -> str:
    """A stable text form of a spec for equality, ignoring empty lists/maps the server omits."""
    return json.dumps(_prune(spec), sort_keys=True, separators=(",", ":"))


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in value.items() if v not in (None, [], {})}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    return value


def keep_taint_times(old: dict[str, Any], body: dict[str, Any]) -> None:
    """Carry the server-set `timeAdded` of taints we keep, so an unchanged taint compares equal."""
    old_devices = {d.get("name"): d for d in old.get("spec", {}).get("devices") or []}
    new_devices = body["spec"].get("devices")
    if not new_devices:
        return
    patched = []
    for device in new_devices:
        taints = device.get("taints")
        previous = old_devices.get(device.get("name"), {}).get("taints") or []
        if taints and previous:
            times = {
                (t.get("key"), t.get("value", ""), t.get("effect")): t.get("timeAdded") for t in previous
            }
            device = dict(device)
            device["taints"] = [
                {**t, "timeAdded": times[(t["key"], t.get("value", ""), t["effect"])]}
                if "timeAdded" not in t and times.get((t["key"], t.get("value", ""), t["effect"]))
                else t
                for t in taints
            ]
        patched.append(device)
    body["spec"]["devices"] = patched


def only_taint_times_differ(desired: dict[str, Any], stored: dict[str, Any]) -> bool:
    def strip(spec: dict[str, Any]) -> str:
        copy = json.loads(json.dumps(spec))
        for device in copy.get("devices") or []:
            for taint in device.get("taints") or []:
                taint.pop("timeAdded", None)
        return canonical(copy)

    return strip(desired) == strip(stored)


def merged_metadata(old: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Keep what others put in metadata (labels, annotations, managedFields); set our owner, name and
    our annotations beside theirs."""
    merged = {k: v for k, v in old.items() if k not in ("managedFields",)}
    annotations = {**(old.get("annotations") or {}), **(ours.get("annotations") or {})}
    merged.update(ours)
    if annotations:
        merged["annotations"] = annotations
    return merged
