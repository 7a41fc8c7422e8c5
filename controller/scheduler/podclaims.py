"""The ResourceClaims a Pod uses, resolved the way kube-controller-manager and kube-scheduler see them.

A Pod names its claims in `spec.resourceClaims[]`: either a standalone claim
(`resourceClaimName`) or a ResourceClaimTemplate (`resourceClaimTemplateName`)
from which kube-controller-manager creates one claim per pod (name
`<pod>-<podClaimName>-<random suffix>`, owned by the pod, annotated
`resource.kubernetes.io/pod-claim-name`) and records it in
`pod.status.resourceClaimStatuses`.

The controller's generateName is `<pod>-<podClaimName>-`; when that is longer
than 57 characters it cuts both names in proportion to their lengths and joins
them with one hyphen (no trailing one), and the apiserver appends 5 random
characters (`claim_generate_name`, upstream pkg/controller/resourceclaim
`handleClaim`, the same in 1.34 and 1.37).

A claim is looked up as upstream does (`resourceclaim.Name`, then the
controller's `findPodResourceClaim`): the name in `pod.status.resourceClaimStatuses`
first (such a claim must be controlled by the pod and not being deleted, or the
scheduler refuses it), else a claim controlled by the pod whose
`resource.kubernetes.io/pod-claim-name` annotation names the entry (made but not
yet recorded; the controller adopts it). Offline, nobody has created those
claims: `resolve_pod` makes them here, named after the generateName without the
random suffix (`offline_claim_name`: `<pod>-<podClaimName>` while short) and
`generated=True`.

Pure: API objects (JSON dicts) in, resolved claims out; no I/O.

Size: naming, lookup and node reach of a pod's claims follow one upstream flow and share its rules.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.nodes import Node, NodeSelectorError, selector_matches
from controller.scheduler.extendedclaim import (
    ClassMapping,
    Mapped,
    build_extended_claim,
    class_mappings,
    existing_extended_claim,
)

JSON = Mapping[str, Any]

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True)
class PodClaim:
    """One entry of a pod's `spec.resourceClaims`, with the claim it stands for."""

    pod_claim_name: str
    claim_name: str
    claim: JSON | None  # None when the claim cannot be found or made (see `problem`)
    template: str | None = None  # the ResourceClaimTemplate, for template entries
    generated: bool = False  # made here from the template: no such object exists yet
    problem: str | None = None
    # The scheduler's implicit claim for the pod's extended resources: what maps to which class.
    extended: tuple[Mapped, ...] = ()

    @property
    def allocated(self) -> bool:
        return self.claim is not None and bool((self.claim.get("status") or {}).get("allocation"))


@dataclass(frozen=True)
class PodClaims:
    """A pod and the claims it needs, in `spec.resourceClaims` order."""

    pod: JSON
    claims: list[PodClaim] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return str((self.pod.get("metadata") or {}).get("namespace") or "default")

    @property
    def name(self) -> str:
        return str((self.pod.get("metadata") or {}).get("name", ""))

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def _meta(obj: JSON) -> JSON:
    meta: JSON = obj.get("metadata") or {}
    return meta


def _key(obj: JSON) -> tuple[str, str]:
    meta = _meta(obj)
    return str(meta.get("namespace") or "default"), str(meta.get("name", ""))


def is_schedulable_pod(pod: JSON) -> bool:
    """Pods that still wait for, or hold, claims: not being deleted and not finished."""
    if _meta(pod).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in FINISHED_PHASES


# kube-controller-manager's limit for the claim's generateName: "Leave space for hyphen and 5 random
# characters in a name with 63 characters" (pkg/controller/resourceclaim/controller.go).
GENERATE_NAME_MAX_BASE = 57
# The apiserver's name generator (apiserver/pkg/storage/names): base cut to 63 - 5, then 5 random
# characters from this alphabet.
API_MAX_GENERATED_BASE = 58
RANDOM_SUFFIX_LENGTH = 5
RANDOM_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def claim_generate_name(pod_name: str, pod_claim_name: str) -> str:
    """The generateName kube-controller-manager gives the claim it makes for a template entry.

    `<pod>-<podClaimName>-`; longer than 57 characters, both parts are cut in proportion to their
    lengths (upstream: "we would loose everything from the pod claim name when the pod name is
    long"), joined by one hyphen and without the trailing one. Go slices bytes, Python code points:
    the same for the ASCII that object names are.
    """
    generate_name = f"{pod_name}-{pod_claim_name}-"
    if len(generate_name) > GENERATE_NAME_MAX_BASE:
        total = len(generate_name)
        generate_name = (
            pod_name[: len(pod_name) * GENERATE_NAME_MAX_BASE // total]
            + "-"
            + pod_claim_name[: len(pod_claim_name) * GENERATE_NAME_MAX_BASE // total]
        )
    return generate_name[:API_MAX_GENERATED_BASE]  # the apiserver's cut; never reached from 57


def is_generated_name(name: str, generate_name: str) -> bool:
    """`name` is what the apiserver makes of `generate_name`: it plus 5 characters of its alphabet."""
    suffix = name[len(generate_name) :]
    return (
        name.startswith(generate_name)
        and len(suffix) == RANDOM_SUFFIX_LENGTH
        and all(c in RANDOM_SUFFIX_ALPHABET for c in suffix)
    )


def offline_claim_name(pod_name: str, pod_claim_name: str) -> str:
    """The name used offline for a claim not created yet: its generateName without the random
    suffix, and without the trailing hyphen the controller adds when it does not truncate
    (`<pod>-<podClaimName>` for short names)."""
    generate_name = claim_generate_name(pod_name, pod_claim_name)
    untruncated = f"{pod_name}-{pod_claim_name}-"
    return generate_name[:-1] if generate_name == untruncated else generate_name


def claim_from_template(template: JSON, namespace: str, name: str) -> dict[str, Any]:
    """A ResourceClaim with the template's labels, annotations and spec (a deep copy)."""
    spec = template.get("spec") or {}
    template_meta = spec.get("metadata") or {}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if template_meta.get("labels"):
        metadata["labels"] = dict(template_meta["labels"])
    if template_meta.get("annotations"):
        metadata["annotations"] = dict(template_meta["annotations"])
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": metadata,
        "spec": copy.deepcopy(dict(spec.get("spec") or {})),
    }


def generated_claim(pod: JSON, pod_claim_name: str, template: JSON, name: str) -> dict[str, Any]:
    """The claim kube-controller-manager would create for the pod from `template`."""
    pod_meta = _meta(pod)
    claim = claim_from_template(template, str(pod_meta.get("namespace") or "default"), name)
    metadata = claim["metadata"]
    metadata["annotations"] = {**metadata.get("annotations", {}), POD_CLAIM_NAME_ANNOTATION: pod_claim_name}
    owner: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": str(pod_meta.get("name", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }
    if pod_meta.get("uid"):
        owner["uid"] = pod_meta["uid"]
    metadata["ownerReferences"] = [owner]
    metadata["generateName"] = claim_generate_name(owner["name"], pod_claim_name)
    return claim


def _owned_by(claim: JSON, pod: JSON) -> bool:
    """The pod controls the claim (upstream `metav1.IsControlledBy`: by UID; offline manifests
    often have no UIDs, then by name)."""
    pod_meta = _meta(pod)
    for owner in _meta(claim).get("ownerReferences") or []:
        if owner.get("kind") != "Pod" or owner.get("apiVersion", "v1") != "v1" or not owner.get("controller"):
            continue
        if pod_meta.get("uid") and owner.get("uid"):
            if owner["uid"] == pod_meta["uid"]:
                return True
        elif owner.get("name") == pod_meta.get("name"):
            return True
    return False


class ClaimIndex:
    """Claims and templates by (namespace, name), plus names handed out to generated claims."""

    def __init__(self, claims: Iterable[JSON], templates: Iterable[JSON]) -> None:
        self.claims: dict[tuple[str, str], JSON] = {_key(c): c for c in claims}
        self.templates: dict[tuple[str, str], JSON] = {_key(t): t for t in templates}
        self._taken: set[tuple[str, str]] = set(self.claims)

    def unique_name(self, namespace: str, base: str) -> str:
        """`base`, or `base-2`, `base-3`... when a claim of that name exists (the random suffix
        upstream avoids such clashes; offline names must stay distinct too)."""
        name, counter = base, 1
        while (namespace, name) in self._taken:
            counter += 1
            name = f"{base}-{counter}"
        self._taken.add((namespace, name))
        return name

    def adoptable(self, pod: JSON, namespace: str, pod_claim_name: str) -> JSON | None:
        """A claim the controller already made for this pod entry but has not recorded yet."""
        for (claim_namespace, _), claim in self.claims.items():
            annotations = _meta(claim).get("annotations") or {}
            if (
                claim_namespace == namespace
                and annotations.get(POD_CLAIM_NAME_ANNOTATION) == pod_claim_name
                and _owned_by(claim, pod)
            ):
                return claim
        return None


def _recorded_status(pod: JSON, pod_claim_name: str) -> JSON | None:
    for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if status.get("name") == pod_claim_name:
            recorded: JSON = status
            return recorded
    return None


def _unusable(pod: JSON, namespace: str, name: str, claim: JSON | None, *, check_owner: bool) -> str | None:
    """Why kube-scheduler's PreFilter refuses the claim a pod entry names (the pod is then
    unschedulable), in its words (`foreachPodResourceClaim`, `resourceclaim.IsForPod`); None if usable.
    A claim recorded for a template entry must be controlled by the pod."""
    if claim is None:
        return f"resource claim {namespace}/{name} not found"
    if _meta(claim).get("deletionTimestamp"):
        return f'resourceclaim "{name}" is being deleted'
    if check_owner and not _owned_by(claim, pod):
        pod_ref = f"{namespace}/{_meta(pod).get('name', '')}"
        return f"ResourceClaim {namespace}/{name} was not created for Pod {pod_ref} (Pod is not owner)"
    return None


def _resolve_entry(pod: JSON, namespace: str, entry: JSON, index: ClaimIndex) -> PodClaim | None:
    pod_name = str(_meta(pod).get("name", ""))
    pod_claim_name = str(entry.get("name", ""))
    claim_name = entry.get("resourceClaimName")
    template_name = entry.get("resourceClaimTemplateName")
    if bool(claim_name) == bool(template_name):
        return PodClaim(
            pod_claim_name,
            offline_claim_name(pod_name, pod_claim_name),
            None,
            problem=f"pod {namespace}/{pod_name}: resourceClaims entry {pod_claim_name!r} must set exactly "
            "one of resourceClaimName and resourceClaimTemplateName",
        )
    if claim_name:
        claim = index.claims.get((namespace, str(claim_name)))
        problem = _unusable(pod, namespace, str(claim_name), claim, check_owner=False)
        return PodClaim(pod_claim_name, str(claim_name), claim, problem=problem)
    template = str(template_name)
    recorded = _recorded_status(pod, pod_claim_name)
    if recorded is not None:
        if not recorded.get("resourceClaimName"):
            return None  # the controller decided that no claim is needed for this entry
        existing_name = str(recorded["resourceClaimName"])
        existing = index.claims.get((namespace, existing_name))
        problem = _unusable(pod, namespace, existing_name, existing, check_owner=True)
        return PodClaim(pod_claim_name, existing_name, existing, template=template, problem=problem)
    adopted = index.adoptable(pod, namespace, pod_claim_name)
    if adopted is not None:
        return PodClaim(pod_claim_name, str(_meta(adopted).get("name", "")), adopted, template=template)
    name = index.unique_name(namespace, offline_claim_name(pod_name, pod_claim_name))
    template_obj = index.templates.get((namespace, template))
    if template_obj is None:
        return PodClaim(
            pod_claim_name,
            name,
            None,
            template=template,
            generated=True,
            problem=f"resource claim template {namespace}/{template} not found",
        )
    claim = generated_claim(pod, pod_claim_name, template_obj, name)
    return PodClaim(pod_claim_name, name, claim, template=template, generated=True)


EXTENDED_POD_CLAIM_NAME = "<extended-resources>"  # upstream's in-memory name; no spec entry has it


def _extended_entry(pod: JSON, index: ClaimIndex, mappings: Mapping[str, ClassMapping]) -> PodClaim | None:
    """The implicit claim for the pod's mapped extended resources: the one the scheduler already
    wrote, else one made here (named `<pod>-extended-resources`)."""
    built = build_extended_claim(pod, mappings)
    if built is None:
        return None
    existing = existing_extended_claim(pod, list(index.claims.values()))
    if existing is not None:
        return PodClaim(
            EXTENDED_POD_CLAIM_NAME, str(_meta(existing).get("name", "")), existing, extended=built.mapped
        )
    namespace = str(_meta(pod).get("namespace") or "default")
    name = index.unique_name(namespace, str(built.claim["metadata"]["name"]))
    claim = {**built.claim, "metadata": {**built.claim["metadata"], "name": name}}
    return PodClaim(EXTENDED_POD_CLAIM_NAME, name, claim, generated=True, extended=built.mapped)


def resolve_pod(
    pod: JSON, index: ClaimIndex, mappings: Mapping[str, ClassMapping] | None = None
) -> PodClaims:
    """The pod's claims in spec order; with `mappings` (extended resource -> DeviceClass), then the
    implicit claim for its mapped extended resources, as the scheduler adds it."""
    namespace = str(_meta(pod).get("namespace") or "default")
    resolved = PodClaims(pod)
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        claim = _resolve_entry(pod, namespace, entry, index)
        if claim is not None:
            resolved.claims.append(claim)
    if mappings:
        extended = _extended_entry(pod, index, mappings)
        if extended is not None:
            resolved.claims.append(extended)
    return resolved


def resolve_pods(
    pods: Sequence[JSON],
    claims: Sequence[JSON],
    templates: Sequence[JSON],
    device_classes: Sequence[JSON] = (),
) -> list[PodClaims]:
    """Every pod that is not finished or being deleted, with its claims; pods without claims left out.

    With `device_classes` (pass them where the DRAExtendedResource gate is on), a pod's extended
    resources that a class maps become its implicit claim (`controller.scheduler.extendedclaim`).
    """
    index = ClaimIndex(claims, templates)
    mappings = class_mappings(device_classes) if device_classes else None
    resolved = [resolve_pod(pod, index, mappings) for pod in pods if is_schedulable_pod(pod)]
    return [p for p in resolved if p.claims]


# ----- where a pod may run ---------------------------------------------------------------


def pod_fits_node(pod: JSON, node: Node) -> bool:
    """spec.nodeName, spec.nodeSelector and required node affinity, as the scheduler filters nodes.

    Raises NodeSelectorError for an affinity term the scheduler would refuse.
    """
    spec = pod.get("spec") or {}
    if spec.get("nodeName") and spec["nodeName"] != node.name:
        return False
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return not required or selector_matches(required, node)


def pod_node_constraints(pod: JSON) -> str:
    """The pod's node constraints in words, for messages; "" when it has none."""
    spec = pod.get("spec") or {}
    parts = []
    if spec.get("nodeName"):
        parts.append(f"nodeName {spec['nodeName']}")
    if spec.get("nodeSelector"):
        labels = ",".join(f"{k}={v}" for k, v in sorted(spec["nodeSelector"].items()))
        parts.append(f"nodeSelector {labels}")
    if ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ):
        parts.append("required node affinity")
    return ", ".join(parts)


def allocation_fits_node(claim: JSON, node: Node) -> bool:
    """An allocated claim can only be used on the nodes its `allocation.nodeSelector` selects."""
    selector = ((claim.get("status") or {}).get("allocation") or {}).get("nodeSelector")
    return not selector or selector_matches(selector, node)


def reachable_nodes(pod: JSON, nodes: Sequence[Node], *, named_node: bool = True) -> list[Node]:
    """`nodes` (in the given order) the pod may run on: those kube-scheduler's DynamicResources
    Filter runs on (NodeName and NodeAffinity come first and reject the others).

    With `named_node`, a pod's spec.nodeName that is not among `nodes` still counts: node-local
    slices name nodes that have no Node object (offline, or before the Node exists).
    Raises NodeSelectorError for an affinity term the scheduler would refuse.
    """
    pool = list(nodes)
    node_name = (pod.get("spec") or {}).get("nodeName")
    if named_node and node_name and not any(n.name == node_name for n in pool):
        pool.append(Node(str(node_name)))
    if not pod_node_constraints(pod):
        return pool  # every node, without asking each (1,000 per pod at fleet size)
    return [n for n in pool if pod_fits_node(pod, n)]


def allocations_fit_node(allocated: Sequence[JSON], node: Node | None) -> bool:
    """Every allocated claim of a pod can be used on `node` (no node: nothing to check)."""
    return node is None or all(allocation_fits_node(c, node) for c in allocated)


def candidate_nodes(
    pod: JSON, nodes: Sequence[Node], allocated: Sequence[JSON] = (), *, named_node: bool = True
) -> list[Node]:
    """`reachable_nodes` that the pod's `allocated` claims can be used on."""
    reachable = reachable_nodes(pod, nodes, named_node=named_node)
    return [n for n in reachable if allocations_fit_node(allocated, n)]


def no_node_reason(pod: PodClaims, allocated: Sequence[JSON], known: Sequence[Node]) -> str:
    """Why no node is left for the pod, naming what narrowed the choice."""
    constraints = pod_node_constraints(pod.pod)
    parts = []
    if constraints:
        parts.append(constraints)
    if allocated:
        refs = ", ".join(f"{_key(c)[0]}/{_key(c)[1]}" for c in allocated)
        parts.append(f"the nodes of its allocated claims {refs}")
    reason = f"pod {pod.ref}: none of {len(known)} node(s) matches " + " and ".join(parts or ["the pod"])
    if constraints and known and not any(n.labels for n in known):
        reason += " (nodes known only from ResourceSlices have no labels: add Node manifests)"
    return reason


__all__ = [
    "EXTENDED_POD_CLAIM_NAME",
    "POD_CLAIM_NAME_ANNOTATION",
    "ClaimIndex",
    "NodeSelectorError",
    "PodClaim",
    "PodClaims",
    "allocation_fits_node",
    "candidate_nodes",
    "claim_from_template",
    "claim_generate_name",
    "generated_claim",
    "is_generated_name",
    "is_schedulable_pod",
    "no_node_reason",
    "offline_claim_name",
    "pod_fits_node",
    "pod_node_constraints",
    "resolve_pod",
    "resolve_pods",
]
