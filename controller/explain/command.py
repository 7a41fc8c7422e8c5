"""`dra-controller explain CLAIM|pod/NAME`: why a claim cannot be allocated, filter by filter.

The argument is named as kubectl names objects: `NAME` or `claim/NAME` (also
`resourceclaim/`, `resourceclaims/`) for a claim, `pod/NAME` (also `pods/`, `po/`) for a
pod. The namespace is -n, else the kubeconfig context's (as kubectl), else `default`;
-A looks the name up in every namespace and needs it to be in exactly one.

CLAIM is a ResourceClaim, or the claim a pod makes from a ResourceClaimTemplate.
A pod's template claims are found as kube-scheduler finds them: by the name in
`pod.status.resourceClaimStatuses`, else as the controller adopts them; offline,
where no such claim exists yet, it is named after kube-controller-manager's
generateName without the random suffix (`<pod>-<podClaimName>` for short names;
long names are cut as upstream cuts them, and the uncut `<pod>-<podClaimName>`
finds the claim too; see `controller.scheduler.podclaims`). `pod/NAME` explains every
claim of the pod on the nodes the pod may run on.

JSON: one claim is `Explanation.to_json()` (`claim`, `allocated`, `summary`,
`schedulingError`, `nodes`), plus `pod` and `generatedFrom` for a claim generated
here; a pod is `{"pod", "nodes": [names], "schedulingError", "claims": [one claim
as above, plus "podClaimName"]}`. `schedulingError` (`{"node", "message"}` or
null) is a kube-scheduler Filter error on some node, which fails the pod's whole
scheduling attempt (see `controller.scheduler.nodefilter`). Without one, a pod also has
`nodeChoice` (`{"chosen", "candidates", "deterministic", "scores"}`, see
`controller.scheduler.nodescore`): the node(s) kube-scheduler may pick; more than one
candidate means it picks one of them at random.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from controller.allocation.nodes import Node, NodeSelectorError
from controller.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, Subcommand, register_subcommand
from controller.explain.explanation import NODE_LIMIT, Explanation, explain_claim
from controller.objects import ClusterObjects
from controller.options import (
    add_namespace_arguments,
    add_source_arguments,
    build_allocator,
    cluster_nodes,
    default_namespace,
    emit,
    extended_resources_enabled,
    find_node,
    gates_of,
    release_of,
    with_objects,
)
from controller.scheduler.allocator import Allocator
from controller.scheduler.extendedclaim import (
    class_mappings,
    device_plugin_nodes,
    unmapped_extended_resources,
)
from controller.scheduler.nodefilter import FilterResult, filter_nodes
from controller.scheduler.nodescore import NodeChoice, ScoreError, choose_node
from controller.scheduler.podclaims import (
    PodClaim,
    PodClaims,
    allocations_fit_node,
    candidate_nodes,
    claim_generate_name,
    no_node_reason,
    pod_node_constraints,
    reachable_nodes,
    resolve_pods,
)

JSON = Mapping[str, Any]
# kubectl's names of the two kinds explain takes, as TYPE/NAME ("claim" is ours: short to type).
POD_TYPES = ("pod", "pods", "po")
CLAIM_TYPES = ("claim", "resourceclaim", "resourceclaims", "resourceclaim.resource.k8s.io")


def target_argument(text: str) -> tuple[str, str]:
    """`NAME`, `claim/NAME` or `pod/NAME` (kubectl's TYPE/NAME) as ("claim" or "pod", NAME)."""
    kind, slash, name = text.rpartition("/")
    if not slash:
        return "claim", text
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: no name after the /")
    if kind.lower() in POD_TYPES:
        return "pod", name
    if kind.lower() in CLAIM_TYPES:
        return "claim", name
    raise argparse.ArgumentTypeError(
        f"{text!r}: explain takes a ResourceClaim (NAME, claim/NAME) or a pod (pod/NAME), not {kind!r}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "claim",
        metavar="CLAIM",
        type=target_argument,
        help="name of the ResourceClaim (claim/NAME too; or of the claim a pod makes from a template: "
        "offline <pod>-<podClaimName>, cut like kube-controller-manager's generateName), or pod/NAME for "
        "every claim of a pod",
    )
    add_namespace_arguments(parser, every_by_default=False)
    parser.add_argument("--node", help="explain for this node only (default: every node the claim may use)")
    parser.add_argument(
        "--every-node",
        action="store_true",
        help=f"list every node in text output (default: the first {NODE_LIMIT}, the rest counted by "
        "verdict on one line; JSON and YAML always list every node)",
    )
    add_source_arguments(parser)


class _Explainer:
    """Explains claims against one loaded view of the cluster."""

    def __init__(
        self,
        objects: ClusterObjects,
        allocator: Allocator,
        only: Node | None,
        *,
        extended_resources: bool = True,
        node_limit: int | None = NODE_LIMIT,
    ) -> None:
        self.objects = objects
        self.node_limit = node_limit
        self.allocator = allocator
        self.only = only
        self.known = cluster_nodes(objects, allocator)
        self.extended_resources = extended_resources
        classes = objects.device_classes if extended_resources else ()
        self.pods = resolve_pods(objects.pods, objects.claims, objects.claim_templates, classes)

    def pod_nodes(self, pod: PodClaims) -> list[Node]:
        """--node, else the nodes the pod and its allocated claims allow."""
        if self.only is not None:
            return [self.only]
        allocated = [c.claim for c in pod.claims if c.claim is not None and c.allocated]
        return candidate_nodes(pod.pod, self.known, allocated)

    def pod_claim(self, pod: PodClaims, entry: PodClaim, nodes: Sequence[Node]) -> tuple[dict[str, Any], str]:
        """One claim of a pod as JSON and text."""
        ref = f"{pod.namespace}/{entry.claim_name}"
        extra: dict[str, Any] = {"pod": pod.ref, "generatedFrom": entry.template if entry.generated else None}
        if entry.extended:
            extra["extendedResources"] = [
                {"container": m.container, "resource": m.resource, "count": m.count, "request": m.request,
                 "deviceClass": m.device_class, "why": m.why}
                for m in entry.extended
            ]  # fmt: skip
            made = "made here as kube-scheduler makes it" if entry.generated else "written by kube-scheduler"
            header = f"ResourceClaim {ref}: the implicit claim for the extended resources of pod {pod.ref}"
            header += f" ({made})"
            header += "".join(
                f"\n  {m.resource}: {m.count} for container {m.container} -> request {m.request} "
                f"on DeviceClass "
                f"{m.device_class}, mapped by {m.why}"
                for m in entry.extended
            )
            header += self._device_plugin_note(entry)
        elif entry.generated:
            generate_name = claim_generate_name(pod.name, entry.pod_claim_name)
            header = (
                f"ResourceClaim {ref}: generated here from ResourceClaimTemplate {entry.template} for pod "
                f"{pod.ref} (in a cluster kube-controller-manager names it {generate_name}<5 random "
                "characters>)"
            )
            extra["generateName"] = generate_name
        else:
            header = f"ResourceClaim {ref} (pod {pod.ref})"
        summary = None
        if entry.claim is None or entry.problem:
            # Missing, or one the scheduler refuses (not the pod's own, being deleted).
            summary = f"claim {ref}: {entry.problem}"
        elif not nodes and not entry.allocated:
            allocated = [c.claim for c in pod.claims if c.claim is not None and c.allocated]
            summary = f"claim {ref}: " + no_node_reason(pod, allocated, self.known)
        if entry.claim is None or summary is not None:
            data = {"claim": ref, "allocated": False, "summary": summary, "nodes": [], **extra}
            return data, f"{header}\n{summary}"
        explanation = explain_claim(self.allocator, entry.claim, nodes or None)
        return {**explanation.to_json(), **extra}, f"{header}\n{explanation.to_text(self.node_limit)}"

    def _device_plugin_note(self, entry: PodClaim) -> str:
        """Nodes where a device plugin advertises the resource: the scheduler prefers it there."""
        served = device_plugin_nodes(self.objects.nodes, sorted({m.resource for m in entry.extended}))
        return "".join(
            f"\n  node {node} advertises {', '.join(names)} in its allocatable (a device plugin): there the "
            "scheduler serves the pod from the device plugin, not through this claim"
            for node, names in sorted(served.items())
        )

    def unmapped_note(self, pod: PodClaims) -> str:
        """Extended resources of the pod that no DeviceClass maps (only a device plugin can serve them)."""
        if not self.extended_resources:
            return ""
        names = unmapped_extended_resources(pod.pod, class_mappings(self.objects.device_classes))
        if not names:
            return ""
        return (
            f"pod {pod.ref} also asks for {', '.join(names)}: no DeviceClass maps "
            f"{'it' if len(names) == 1 else 'them'} (spec.extendedResourceName, or the implicit name "
            "deviceclass.resource.kubernetes.io/<class>), so only a device plugin on a node can serve "
            f"{'it' if len(names) == 1 else 'them'}"
        )

    def pod_filter(self, pod: PodClaims) -> tuple[FilterResult, list[JSON]] | None:
        """The scheduler's Filter over the pod's nodes for its pending claims (and those claims),
        or None when nothing is pending or a claim is missing.

        The scheduler allocates a pod's pending claims together on every node the pod may run on
        (even where an allocated claim of the pod is unavailable) before it picks one; an error
        on any of them fails the pod, which the per-claim explanations alone would not show.
        """
        pending = [c.claim for c in pod.claims if c.claim is not None and not c.allocated]
        if not pending or any(c.problem for c in pod.claims):
            return None
        allocated = [c.claim for c in pod.claims if c.claim is not None and c.allocated]
        nodes: list[Node | None]
        if self.only is not None:
            nodes = [*reachable_nodes(pod.pod, [self.only], named_node=False)]
        else:
            nodes = [*reachable_nodes(pod.pod, self.known)]
            if not nodes and not allocated and not pod_node_constraints(pod.pod):
                nodes = [None]  # no node is known: allocate without a node, as simulate does
        filtered = filter_nodes(self.allocator, pending, nodes, lambda n: allocations_fit_node(allocated, n))
        return filtered, pending

    def pod_scheduling(self, pod: PodClaims) -> tuple[dict[str, str] | None, tuple[NodeChoice, int] | None]:
        """What the scheduler makes of the pod: the error that fails its scheduling attempt
        ({"node", "message"}: a Filter error on some node, or a Score error), else the node(s) it
        may pick and how many nodes fit; (None, None) when nothing is pending or a claim is missing."""
        found = self.pod_filter(pod)
        if found is None:
            return None, None
        filtered, pending = found
        if filtered.error is not None:
            return {"node": filtered.error.node_name, "message": filtered.failure.message}, None
        allocated = sum(1 for c in pod.claims if c.claim is not None and c.allocated)
        try:
            choice = choose_node(filtered.feasible, pending, self.allocator.features, allocated=allocated)
        except ScoreError as err:
            return {"node": filtered.feasible[0].node_name, "message": str(err)}, None
        return None, ((choice, len(filtered.feasible)) if choice is not None else None)

    def pod_error(self, pod: PodClaims) -> dict[str, str] | None:
        """The error that fails the pod's scheduling attempt, as {"node", "message"}, or None."""
        return self.pod_scheduling(pod)[0]

    def find_pod(self, namespace: str, name: str) -> PodClaims | None:
        """The pod with its claims; a finished pod or one without claims has none."""
        for pod in self.pods:
            if pod.namespace == namespace and pod.name == name:
                return pod
        for obj in self.objects.pods:
            meta = obj.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                return PodClaims(obj)
        return None

    def find_generated(self, namespace: str, name: str) -> tuple[PodClaims, PodClaim] | None:
        """A claim made here from a template: by its offline name, or by the uncut
        `<pod>-<podClaimName>` when the generateName cut it."""
        for pod in self.pods:
            for entry in pod.claims:
                if pod.namespace != namespace or not entry.generated:
                    continue
                uncut = f"{pod.name}-{entry.pod_claim_name}" if entry.template else None
                if name in (entry.claim_name, uncut):
                    return pod, entry
        return None


def _usable(data: Mapping[str, Any]) -> bool:
    if data.get("schedulingError"):
        return False
    return bool(data["allocated"]) or any(n["allocatable"] for n in data["nodes"])


def _explain_pod(args: argparse.Namespace, explainer: _Explainer, namespace: str, name: str) -> int:
    pod = explainer.find_pod(namespace, name)
    if pod is None:
        sys.stderr.write(f"error: Pod {namespace}/{name} not found\n")
        return EXIT_USAGE
    try:
        nodes = explainer.pod_nodes(pod)
    except NodeSelectorError as err:
        sys.stderr.write(f"error: pod {pod.ref}: {err}\n")
        return EXIT_USAGE
    claims: list[dict[str, Any]] = []
    texts: list[str] = []
    for entry in pod.claims:
        data, text = explainer.pod_claim(pod, entry, nodes)
        claims.append({**data, "podClaimName": entry.pod_claim_name})
        texts.append(text)
    if not pod.claims:
        texts.append(f"pod {pod.ref} has no resource claims to allocate (it names none, or it is finished)")
    unmapped = explainer.unmapped_note(pod)
    if unmapped:
        texts.append(unmapped)
    error, chosen = explainer.pod_scheduling(pod)
    if error is not None:
        texts.insert(0, f"pod {pod.ref} cannot be scheduled: {error['message']}")
    data = {"pod": pod.ref, "nodes": [n.name for n in nodes], "schedulingError": error, "claims": claims}
    if chosen is not None:
        choice, feasible = chosen
        data["nodeChoice"] = choice.to_json()
        described = choice.describe(feasible, continuing=False)
        if described:
            texts.insert(0, f"pod {pod.ref}: {described}")
    emit(args, data, lambda: "\n\n".join(texts))
    return EXIT_OK if error is None and all(_usable(c) for c in claims) else EXIT_FAILURE


def _explain_claim(args: argparse.Namespace, explainer: _Explainer, namespace: str, name: str) -> int:
    claim = explainer.objects.find_claim(name, namespace)
    if claim is not None:
        nodes = [explainer.only] if explainer.only is not None else explainer.known
        explanation: Explanation = explain_claim(explainer.allocator, claim, nodes or None)
        if args.output == "text":  # the JSON of every node (1,000 of them) is not needed for it
            emit(args, None, lambda: explanation.to_text(explainer.node_limit))
            usable = explanation.error_node is None and explanation.usable
            return EXIT_OK if usable else EXIT_FAILURE
        data = explanation.to_json()
        emit(args, data, lambda: "")
        return EXIT_OK if _usable(data) else EXIT_FAILURE
    generated = explainer.find_generated(namespace, name)
    if generated is None:
        sys.stderr.write(
            f"error: ResourceClaim {namespace}/{name} not found (nor generated from a "
            "ResourceClaimTemplate for a pod: offline such a claim is named <pod>-<podClaimName>, cut "
            "like kube-controller-manager's generateName when longer than 57 characters)\n"
        )
        return EXIT_USAGE
    pod, entry = generated
    try:
        nodes = explainer.pod_nodes(pod)
    except NodeSelectorError as err:
        sys.stderr.write(f"error: pod {pod.ref}: {err}\n")
        return EXIT_USAGE
    data, text = explainer.pod_claim(pod, entry, nodes)
    error = explainer.pod_error(pod)
    if error is not None and not data.get("schedulingError"):
        # Another claim of the pod, or a node only the pod as a whole reaches, fails the attempt.
        data = {**data, "schedulingError": error}
        text = f"{text}\npod {pod.ref} cannot be scheduled: {error['message']}"
    emit(args, data, lambda: text)
    return EXIT_OK if _usable(data) else EXIT_FAILURE


@with_objects
def run(args: argparse.Namespace, objects: ClusterObjects) -> int:
    # One explanation builds trees without cycles (node views, candidates, reports: about 100,000
    # objects at 1,000 nodes, nearly all alive until it ends); the collector's passes over them
    # found nothing to free and took about 13 ms of CPU there. Paused for the command only: a
    # caller that runs more in the same process gets the collector back afterwards.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(args, objects)
    finally:
        if enabled:
            gc.enable()


def _run(args: argparse.Namespace, objects: ClusterObjects) -> int:
    allocator = build_allocator(objects, release_of(args), gates_of(args))
    only = find_node(objects, args.node) if args.node else None
    explainer = _Explainer(
        objects,
        allocator,
        only,
        extended_resources=extended_resources_enabled(args),
        node_limit=None if args.every_node else NODE_LIMIT,
    )
    kind, name = args.claim
    if args.all_namespaces:
        found = _namespaces_holding(explainer, kind, name)
        if len(found) != 1:
            what = "Pod" if kind == "pod" else "ResourceClaim"
            where = f"in namespaces {', '.join(found)}: name one with -n" if found else "in any namespace"
            sys.stderr.write(f"error: {what} {name} {'found' if found else 'not found'} {where}\n")
            return EXIT_USAGE
        namespace = found[0]
    else:
        namespace = default_namespace(args)
    if kind == "pod":
        return _explain_pod(args, explainer, namespace, name)
    return _explain_claim(args, explainer, namespace, name)


def _namespaces_holding(explainer: _Explainer, kind: str, name: str) -> list[str]:
    """The namespaces with a pod (kind "pod") or a claim, made here from a template too, of that name."""
    namespaces = sorted(
        {
            (o.get("metadata") or {}).get("namespace") or "default"
            for o in (*explainer.objects.pods, *explainer.objects.claims)
        }
    )
    if kind == "pod":
        return [ns for ns in namespaces if explainer.find_pod(ns, name) is not None]
    return [
        ns
        for ns in namespaces
        if explainer.objects.find_claim(name, ns) is not None
        or explainer.find_generated(ns, name) is not None
    ]


register_subcommand(
    Subcommand(
        name="explain",
        help="explain why a ResourceClaim (or every claim of a pod: pod/NAME) cannot be allocated: devices "
        "per node/pool and what removed them",
        add_arguments=add_arguments,
        handler=run,
    )
)
