"""Lint findings about where a request can be placed, with the allocator's own rules:

* untolerated-taint: every device a request matches carries a NoSchedule/NoExecute taint
  (from its slice or a DeviceTaintRule) that it does not tolerate (`blocking_taint`), on
  releases where the scheduler honours device taints;
* all-mode-incomplete-pool: an `allocationMode: All` request on a node with an incomplete
  or invalid pool (`gather_pools`, `all_mode_blocker`): the scheduler's Filter returns an
  error there, and an error on any node fails the pod's whole scheduling attempt;
* no-device-on-pod-nodes: a pod with node constraints (nodeName, nodeSelector, required
  node affinity) whose request matches devices only on other nodes (`candidate_nodes`,
  per-node pools, `available_on_node`). Labels come from Node objects; nodes known only
  from slices have none, so a label constraint fits all of them (then lint judges a
  superset of the pod's nodes) or none (then it says nothing; simulate reports it).

A request of a claim that is already allocated is placed already, and skipped. For a
firstAvailable request, taints and pod nodes are reported when no subrequest can be used.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from controller.allocation.nodes import Node, NodeSelectorError
from controller.allocation.pools import DeviceID, Pool
from controller.allocation.requests import ALL, blocking_taint
from controller.allocation.search import all_mode_blocker, available_on_node, pool_candidates
from controller.lint.model import Finding, PublishedDevice, RequestOutcome
from controller.lint.workloads import pod_subject
from controller.objects import ClusterObjects
from controller.options import cluster_nodes
from controller.scheduler.allocator import Allocator
from controller.scheduler.podclaims import candidate_nodes, pod_node_constraints, resolve_pods

JSON = Mapping[str, Any]
_SHOWN = 3  # devices or nodes named in a message before "..."


def _listed(names: Sequence[str]) -> str:
    return ", ".join(names[:_SHOWN]) + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


class NodeView:
    """The known nodes, and which devices the allocator can use on each."""

    def __init__(self, allocator: Allocator, nodes: Sequence[Node]) -> None:
        self.allocator = allocator
        self.nodes = list(nodes)
        self._devices: dict[str, set[DeviceID]] = {}

    def pools(self, node: Node) -> list[Pool]:
        try:
            return self.allocator.pools(node)
        except NodeSelectorError:
            return []  # a slice node selector the scheduler refuses: nothing is usable there

    def devices_on(self, node: Node) -> set[DeviceID]:
        cached = self._devices.get(node.name)
        if cached is None:
            cached = set()
            for pool in self.pools(node):
                for candidate in pool_candidates(pool):
                    try:
                        if available_on_node(candidate, node):
                            cached.add(candidate.device_id)
                    except NodeSelectorError:
                        continue  # a device node selector the scheduler refuses: not usable there
            self._devices[node.name] = cached
        return cached

    def nodes_of(self, devices: Iterable[PublishedDevice], among: Sequence[Node]) -> list[str]:
        ids = {d.id for d in devices}
        return [n.name for n in among if ids & self.devices_on(n)]


def _taint_text(taint: JSON) -> str:
    value = f"={taint['value']}" if taint.get("value") else ""
    return f"{taint.get('key', '')}{value}:{taint.get('effect', '')}"


def _taint_blocked(outcome: RequestOutcome) -> list[str] | None:
    """`taint on device` for the devices the request matches, when every one is blocked."""
    blocked = []
    for device in outcome.matched:
        taint = blocking_taint(device.device, outcome.request)
        if taint is None:
            return None
        blocked.append(f"{_taint_text(taint)} on {device.id.device}")
    return blocked or None


def _grouped(outcomes: Sequence[RequestOutcome]) -> dict[tuple[str, str], list[RequestOutcome]]:
    """Outcomes of unallocated claims by (subject, request name): a firstAvailable request's
    subrequests together."""
    groups: dict[tuple[str, str], list[RequestOutcome]] = {}
    for outcome in outcomes:
        if (outcome.claim.get("status") or {}).get("allocation"):
            continue
        groups.setdefault((outcome.subject, outcome.request.base_name), []).append(outcome)
    return groups


def _taint_findings(groups: Mapping[tuple[str, str], list[RequestOutcome]]) -> list[Finding]:
    findings = []
    for (subject, request), group in groups.items():
        blocked = [_taint_blocked(o) for o in group]
        if not all(blocked):
            continue
        parts = [
            f"{'subrequest ' + o.request.name + ': ' if o.request.parent else ''}"
            f"{'the 1 device' if len(o.matched) == 1 else f'all {len(o.matched)} devices'} it matches "
            f"carr{'ies' if len(o.matched) == 1 else 'y'} a taint it does not tolerate ({_listed(b or [])})"
            for o, b in zip(group, blocked, strict=True)
        ]
        findings.append(
            Finding(
                "warning",
                "untolerated-taint",
                subject,
                f"request {request}",
                "; ".join(parts) + ". It cannot be allocated until the taint is removed from the "
                "device (or its DeviceTaintRule deleted); add a toleration to the request if it may use "
                "such devices",
            )
        )
    return findings


def _all_mode_findings(view: NodeView, outcome: RequestOutcome, nodes: Sequence[Node]) -> list[Finding]:
    if outcome.request.allocation_mode != ALL:
        return []
    blockers: dict[str, list[str]] = {}
    for node in nodes:
        for pool in view.pools(node):
            reason = all_mode_blocker(pool)
            if reason is not None:
                blockers.setdefault(reason, []).append(node.name)
    if not blockers:
        return []
    reasons = "; ".join(f"{reason} (node {_listed(names)})" for reason, names in blockers.items())
    return [
        Finding(
            "warning",
            "all-mode-incomplete-pool",
            outcome.subject,
            f"request {outcome.request.result_name}",
            f"allocationMode All, and {reasons}. Until that pool is complete and valid the scheduler "
            "fails every attempt to schedule a pod with this claim with an error (an error on one node "
            "fails the pod on all nodes), even where another node has all the devices; wait for the "
            "driver to publish the whole pool, or delete its stale slices",
        )
    ]


def _pod_subject(namespace: str, claim_name: str, template: str | None, generated: bool) -> str:
    if template is not None and generated:
        return f"ResourceClaimTemplate/{namespace}/{template}"
    return f"ResourceClaim/{namespace}/{claim_name}"


def _pod_nodes(pod: JSON, view: NodeView, allocated: Sequence[JSON]) -> list[Node] | None:
    """The nodes the pod may run on, or None when it has no node constraints of its own (or
    one the scheduler refuses). Nodes known only from slices have no labels, so a label
    constraint matches all of them or none: the finding can only be true either way."""
    if not pod_node_constraints(pod):
        return None
    try:
        return candidate_nodes(pod, view.nodes, allocated)
    except NodeSelectorError:
        return None


def _pod_node_finding(
    view: NodeView, pod_label: str, constraints: str, nodes: Sequence[Node], group: Sequence[RequestOutcome]
) -> Finding | None:
    if any(view.nodes_of(o.matched, nodes) for o in group) or not any(o.matched for o in group):
        return None  # usable on a pod node, or matching nothing at all (a no-match finding)
    names = [n.name for n in nodes]
    parts = []
    for outcome in group:
        label = f"subrequest {outcome.request.name}: " if outcome.request.parent else ""
        device_class = outcome.request.device_class_name
        if not view.nodes_of(outcome.class_matched, nodes):
            where = view.nodes_of(outcome.class_matched, view.nodes)
            parts.append(
                f"{label}class {device_class} selects devices only on "
                f"{'node ' + _listed(where) if where else 'no known node'}"
            )
        else:
            where = view.nodes_of(outcome.matched, view.nodes)
            parts.append(
                f"{label}class {device_class} has devices there, but the request's selectors match "
                f"only devices on {'node ' + _listed(where) if where else 'no known node'}"
            )
    return Finding(
        "warning",
        "no-device-on-pod-nodes",
        group[0].subject,
        f"request {group[0].request.base_name}, {pod_label}",
        f"the pod can run only on node {_listed(names)} ({constraints}); "
        + "; ".join(parts)
        + ". Change the pod's node constraints or the selectors, or publish matching devices there",
    )


def placement_findings(
    objects: ClusterObjects, allocator: Allocator, outcomes: Sequence[RequestOutcome]
) -> list[Finding]:
    view = NodeView(allocator, cluster_nodes(objects, allocator))
    groups = _grouped(outcomes)
    findings = _taint_findings(groups) if allocator.features.device_taints else []

    # Nodes each subject may be scheduled to: those of the pods that use it, else all known nodes.
    pod_nodes: dict[str, list[Node]] = {}
    for pod in resolve_pods(objects.pods, objects.claims, objects.claim_templates):
        allocated = [c.claim for c in pod.claims if c.claim is not None and c.allocated]
        nodes = _pod_nodes(pod.pod, view, allocated)
        for pod_claim in pod.claims:
            if pod_claim.claim is None or pod_claim.allocated:
                continue
            subject = _pod_subject(
                pod.namespace, pod_claim.claim_name, pod_claim.template, pod_claim.generated
            )
            known = pod_nodes.setdefault(subject, [])
            known.extend(n for n in (view.nodes if nodes is None else nodes) if n not in known)
            if not nodes:
                continue  # unconstrained, unknowable, or no node at all (simulate says why)
            for (group_subject, _), group in groups.items():
                if group_subject == subject:
                    finding = _pod_node_finding(
                        view, pod_subject(pod.pod), pod_node_constraints(pod.pod), nodes, group
                    )
                    if finding is not None:
                        findings.append(finding)

    for group in groups.values():
        for outcome in group:
            nodes = pod_nodes.get(outcome.subject, view.nodes)
            findings.extend(_all_mode_findings(view, outcome, nodes))
    return findings
