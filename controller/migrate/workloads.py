"""Where the pod spec sits in each workload kind that migrate converts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# kind -> the keys from the object down to its pod spec (apps/v1, batch/v1, core/v1).
POD_SPEC_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def follow(obj: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    """The value at `path` (keys from the object down), or None where a step is missing."""
    node: Any = obj
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
        if node is None:
            return None
    return node


def pod_spec_of(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The (mutable) pod spec of a workload object, or None when its kind has none or it is missing."""
    path = POD_SPEC_PATHS.get(str(obj.get("kind", "")))
    if path is None:
        return None
    node = follow(obj, path)
    return node if isinstance(node, dict) else None


def spec_path(kind: str) -> str:
    """`.spec.template.spec` for messages."""
    return "." + ".".join(POD_SPEC_PATHS.get(kind, ("spec",)))
