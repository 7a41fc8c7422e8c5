"""Workloads' pod templates as pods for lint: Deployments, StatefulSets, DaemonSets, ReplicaSets,
Jobs (`spec.template`) and CronJobs (`spec.jobTemplate.spec.template`).

Admins lint their workload manifests, not bare Pods; every pod-level finding must also fire for
the pods a workload will create. Each template becomes one pod of the workload's namespace and
name that is not bound and has no status (nobody has created or scheduled it), its claims being
the template's `resourceClaimTemplateName` / `resourceClaimName` entries, as in a Pod. The pod
keeps the workload's kind, so findings name the workload (`Deployment/ns/name`), not a pod.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from controller.migrate.workloads import POD_SPEC_PATHS, follow
from controller.objects import WORKLOAD_KINDS, ClusterObjects

JSON = Mapping[str, Any]

# Where each workload kind (controller.objects.WORKLOAD_KINDS) keeps its pod template:
# migrate's table of pod spec paths, less its last step.
TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {kind: POD_SPEC_PATHS[kind][:-1] for kind in WORKLOAD_KINDS}


def pod_template(workload: JSON) -> JSON | None:
    """The workload's pod template; None for another kind or a workload without one."""
    path = TEMPLATE_PATHS.get(str(workload.get("kind", "")))
    if path is None:
        return None
    node = follow(workload, path)
    return node if isinstance(node, Mapping) else None


def template_pod(workload: JSON) -> dict[str, Any] | None:
    """The pod a workload's template stands for: the workload's kind, namespace and name, the
    template's labels and spec, no status."""
    template = pod_template(workload)
    if template is None:
        return None
    meta = workload.get("metadata") or {}
    template_meta = template.get("metadata") or {}
    return {
        "apiVersion": workload.get("apiVersion", ""),
        "kind": workload["kind"],
        "metadata": {
            "name": str(meta.get("name", "")),
            "namespace": str(meta.get("namespace") or "default"),
            "labels": dict(template_meta.get("labels") or {}),
        },
        "spec": copy.deepcopy(dict(template.get("spec") or {})),
    }


def template_pods(workloads: Sequence[JSON]) -> list[dict[str, Any]]:
    return [pod for pod in map(template_pod, workloads) if pod is not None]


def with_template_pods(objects: ClusterObjects) -> ClusterObjects:
    """`objects` with the workloads' template pods after its Pods (a copy; `objects` unchanged)."""
    if not objects.workloads:
        return objects
    return dataclasses.replace(objects, pods=[*objects.pods, *template_pods(objects.workloads)])


def is_template_pod(pod: JSON) -> bool:
    return str(pod.get("kind") or "Pod") != "Pod"


def pod_subject(pod: JSON) -> str:
    """How findings name the pod: `pod ns/name`, or the workload (`Deployment/ns/name`)."""
    meta = pod.get("metadata") or {}
    ref = f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
    return f"{pod['kind']}/{ref}" if is_template_pod(pod) else f"pod {ref}"


def pod_noun(pod: JSON) -> str:
    """The pod in a finding's message: "the pod", or "the Deployment's pod template"."""
    return f"the {pod['kind']}'s pod template" if is_template_pod(pod) else "the pod"
