"""Lint finding untolerated-node-taint: a DeviceClass whose devices all sit on tainted nodes that
the pods using it do not tolerate.

The device plugin's pattern taints GPU nodes (`nvidia.com/gpu=present:NoSchedule`) and lets the
ExtendedResourceToleration admission plugin add the toleration to every pod that asks for
`nvidia.com/gpu`. A pod that gets its GPU through a claim gets no such toleration, and a pod whose
`nvidia.com/gpu` is served through DRA (KEP-5004) does, but only for the name it asks for. Such a
pod waits Pending with "untolerated taint" from the scheduler, far from the claim that caused it.

Judged from the objects given: Node objects (their `spec.taints`), ResourceSlices (which node
has which device, with the allocator's per-node pools), DeviceClasses and Pods (workloads' pod
templates among them, `controller.lint.workloads`). For each pod
that is not bound yet, each unallocated claim it uses (claims, templates, and the scheduler's
implicit claim for mapped extended resources) and each request: when every node that has a
device the request's class selects carries a NoSchedule/NoExecute taint the pod does not
tolerate, the class is reported for that pod. A firstAvailable request is reported when none of
its subrequests' classes has an untainted or tolerated node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.allocation.requests import alternatives, claim_requests, tolerates
from controller.lint.model import Finding, PublishedDevice
from controller.lint.placement import NodeView
from controller.lint.workloads import pod_noun, pod_subject
from controller.objects import ClusterObjects
from controller.scheduler.extendedclaim import container_requests, is_extended_resource_name
from controller.scheduler.podclaims import resolve_pods

JSON = Mapping[str, Any]
SCHEDULING_EFFECTS = ("NoSchedule", "NoExecute")
_SHOWN = 3


def _taint_text(taint: JSON) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key', '')}{value}:{taint.get('effect', '')}"


def node_taints(nodes: Sequence[JSON]) -> dict[str, list[JSON]]:
    """Node name → its taints that keep pods away (NoSchedule, NoExecute)."""
    result: dict[str, list[JSON]] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        taints = (node.get("spec") or {}).get("taints") or []
        result[name] = [t for t in taints if isinstance(t, Mapping) and t.get("effect") in SCHEDULING_EFFECTS]
    return result


def pod_tolerations(pod: JSON) -> list[JSON]:
    """The pod's tolerations, plus the ones the ExtendedResourceToleration admission plugin adds at
    create (`<resource>:Exists:NoSchedule` per extended resource a container asks for): a manifest
    read offline has not been through admission yet, a pod read from a cluster has them already."""
    spec = pod.get("spec") or {}
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    names = {str(n) for c in containers if isinstance(c, Mapping) for n in container_requests(c)}
    implied = [
        {"key": name, "operator": "Exists", "effect": "NoSchedule"}
        for name in sorted(names)
        if is_extended_resource_name(name)
    ]
    return tolerations + implied


def untolerated(pod: JSON, taints: Sequence[JSON]) -> list[JSON]:
    """The taints no toleration of the pod (with admission's, see `pod_tolerations`) matches."""
    tolerations = pod_tolerations(pod)
    return [taint for taint in taints if not any(tolerates(t, taint) for t in tolerations)]


def _listed(items: Sequence[str]) -> str:
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


def node_taint_findings(
    objects: ClusterObjects,
    view: NodeView,
    class_matches: Mapping[str, Sequence[PublishedDevice]],
    *,
    extended_resources: bool = True,
) -> list[Finding]:
    """untolerated-node-taint warnings; none without Node objects (taints live on them)."""
    if not objects.nodes:
        return []
    taints_by_node = node_taints(objects.nodes)
    classes = objects.device_classes if extended_resources else ()
    findings: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for pod in resolve_pods(objects.pods, objects.claims, objects.claim_templates, classes):
        if (pod.pod.get("spec") or {}).get("nodeName"):
            continue  # bound already: taints with NoSchedule no longer apply to it
        for pod_claim in pod.claims:
            if pod_claim.claim is None or pod_claim.allocated:
                continue
            for request in claim_requests(pod_claim.claim):
                blocked: list[str] = []
                for option in alternatives(request):
                    reason = _blocked_class(
                        pod.pod, option.device_class_name, view, class_matches, taints_by_node
                    )
                    if reason is None:
                        blocked = []
                        break
                    blocked.append(reason)
                if not blocked:
                    continue
                for option, reason in zip(alternatives(request), blocked, strict=True):
                    key = (option.device_class_name, pod_subject(pod.pod))
                    if key in seen:
                        continue
                    seen.add(key)
                    findings.append(_finding(option.device_class_name, pod.pod, pod_claim.claim_name, reason))
    return findings


def _blocked_class(
    pod: JSON,
    class_name: str,
    view: NodeView,
    class_matches: Mapping[str, Sequence[PublishedDevice]],
    taints_by_node: Mapping[str, Sequence[JSON]],
) -> str | None:
    """Why every node with a device of the class is closed to the pod; None when one is open
    (or the class selects nothing, or devices only on nodes we have no object for)."""
    matched = class_matches.get(class_name) or ()
    nodes = [n for n in view.nodes_of(matched, view.nodes) if n in taints_by_node]
    if not nodes:
        return None
    closed: list[str] = []
    for node in nodes:
        left = untolerated(pod, taints_by_node[node])
        if not left:
            return None
        closed.append(f"{node} ({', '.join(_taint_text(t) for t in left)})")
    return _listed(closed)


def _finding(class_name: str, pod: JSON, claim_name: str, reason: str) -> Finding:
    # A workload's template names the workload: its pods are the ones that would wait.
    noun = pod_noun(pod)
    pending = "Its pods stay Pending" if noun != "the pod" else "The pod stays Pending"
    return Finding(
        "warning",
        "untolerated-node-taint",
        f"DeviceClass/{class_name}",
        f"{pod_subject(pod)}, claim {claim_name}",
        f"the class selects devices only on nodes whose taints {noun} does not tolerate: {reason}. "
        f"{pending}; add a matching toleration to {noun} (the ExtendedResourceToleration "
        "admission plugin adds one only for the extended resources a pod asks for, never for a claim), "
        "or remove the taint from those nodes",
    )
