"""One device-plugin-era object in, its claim-based equivalent out (pure: dicts in, dicts out).

For each container that asks for a mapped extended resource (`nvidia.com/gpu`,
`nvidia.com/mig-<profile>`, or a name given with `--map`), the resource leaves
`limits`/`requests`, the pod spec gains a `resourceClaims` entry made from a
ResourceClaimTemplate (one template per distinct need: class, count and
selectors, shared by every object of the namespace that needs the same), and
the container names that entry in `resources.claims`. Node selection on GPU
Feature Discovery labels becomes the CEL selectors of the template's request
(`controller.migrate.gfd`); whatever has no device equivalent stays node
selection. Everything else in the object is left as it was.

Tolerations: the ExtendedResourceToleration admission plugin adds a toleration
for `<resource>:NoSchedule` to pods that ask for an extended resource. A
converted pod no longer asks, so the toleration is written out here unless the
pod already has one; pods keep landing on GPU nodes tainted `nvidia.com/gpu`.

Size: one conversion of a pod template, whose steps share the same report.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.migrate import gfd
from controller.migrate.workloads import POD_SPEC_PATHS, pod_spec_of
from dracommon.quantity import Quantity, QuantityError

GPU_CLASS = "gpu.draplugin.dev"
MIG_CLASS = "mig.gpu.draplugin.dev"
GPU_RESOURCE = "nvidia.com/gpu"
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(?P<profile>[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)?)$")
PROFILE_PREFIX = "profile:"
CONTAINER_LISTS = ("initContainers", "containers")
MAX_NAME = 63


class MappingError(ValueError):
    """A `--map` value that cannot be used."""


@dataclass(frozen=True, slots=True)
class ResourceMapping:
    """An extended resource and the devices that stand for it."""

    resource: str
    device_class: str
    selectors: tuple[str, ...] = ()


def mig_profile_selector(profile: str) -> str:
    return f"{gfd.ATTRIBUTES}.profile == {json.dumps(profile)}"


def parse_mapping(text: str) -> ResourceMapping:
    """`RESOURCE=DEVICECLASS` or `RESOURCE=profile:PROFILE` (a MIG profile of the MIG class)."""
    resource, sep, target = text.partition("=")
    resource, target = resource.strip(), target.strip()
    if not sep or not resource or not target:
        raise MappingError(f"--map {text!r}: expected RESOURCE=DEVICECLASS or RESOURCE=profile:PROFILE")
    if target.startswith(PROFILE_PREFIX):
        profile = target[len(PROFILE_PREFIX) :]
        if not re.fullmatch(r"[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)?", profile):
            raise MappingError(f"--map {text!r}: {profile!r} is not a MIG profile name such as 1g.10gb")
        return ResourceMapping(resource, MIG_CLASS, (mig_profile_selector(profile),))
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", target):
        raise MappingError(f"--map {text!r}: {target!r} is not a DeviceClass name (a DNS subdomain)")
    return ResourceMapping(resource, target)


def mapping_for(resource: str, explicit: Mapping[str, ResourceMapping]) -> ResourceMapping | None:
    """`--map` first; then nvidia.com/gpu (whole GPUs) and nvidia.com/mig-<profile> (that profile)."""
    if resource in explicit:
        return explicit[resource]
    if resource == GPU_RESOURCE:
        return ResourceMapping(resource, GPU_CLASS)
    match = _MIG_RESOURCE.match(resource)
    if match:
        return ResourceMapping(resource, MIG_CLASS, (mig_profile_selector(match["profile"]),))
    return None


@dataclass
class Conversion:
    """The result for one object: what to write (templates first) and what to report."""

    objects: list[dict[str, Any]]
    changed: bool
    messages: list[str] = field(default_factory=list)


@dataclass
class _Ask:
    container: dict[str, Any]
    container_name: str
    resource: str
    count: int
    mapping: ResourceMapping


@dataclass
class _NodeSelection:
    terms: list[str] = field(default_factory=list)
    mig: bool = False
    messages: list[str] = field(default_factory=list)


def _dns_label(text: str) -> str:
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return re.sub(r"-{2,}", "-", label)[:MAX_NAME].strip("-") or "gpu"


def _dict_at(parent: Mapping[str, Any], key: str) -> dict[str, Any]:
    """parent[key] when it is a mapping we may edit, else an empty (detached) one."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _count(value: object) -> int:
    """A whole, non-negative device count; ValueError saying why not."""
    try:
        quantity = Quantity.from_json(value)
    except QuantityError as err:
        raise ValueError(f"{value!r} is not a quantity: {err}") from None
    if not quantity.is_integer() or quantity.sign() < 0:
        raise ValueError(f"{value!r} is not a whole number of devices")
    return quantity.as_integer()


def _requirement_text(key: str, operator: str, values: Sequence[str]) -> str:
    if operator == gfd.EQUALS:
        return f"nodeSelector {key}={values[0]}"
    return f"node affinity {key} {operator} {list(values)}" if values else f"node affinity {key} {operator}"


def _translate_requirement(
    key: str, operator: str, values: Sequence[str], out: _NodeSelection
) -> tuple[bool, str | None]:
    """(translated, CEL or None when always true); records a report line either way."""
    text = _requirement_text(key, operator, values)
    try:
        term = gfd.translate(key, operator, values)
    except gfd.LabelError as err:
        out.messages.append(f"kept {text} as node selection: {err}")
        return False, None
    if term is None:
        out.messages.append(f"dropped {text}: every device of the class has it")
        return True, None
    out.mig = out.mig or term.mig
    out.messages.append(
        f"{text} became the device selector {term.cel}" + (f" ({term.note})" if term.note else "")
    )
    return True, term.cel


def _translate_node_selector(spec: dict[str, Any], out: _NodeSelection) -> None:
    selector = spec.get("nodeSelector")
    if not isinstance(selector, dict):
        return
    for key, value in list(selector.items()):
        if not gfd.is_gfd_label(str(key)):
            continue
        done, cel = _translate_requirement(str(key), gfd.EQUALS, [str(value)], out)
        if done:
            del selector[key]
            if cel:
                out.terms.append(cel)
    if not selector:
        del spec["nodeSelector"]


def _gfd_expressions(term: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in term.get("matchExpressions") or [] if gfd.is_gfd_label(str(e.get("key", "")))]


def _translate_single_term(term: dict[str, Any], out: _NodeSelection) -> None:
    kept = []
    for expression in term.get("matchExpressions") or []:
        key, operator = str(expression.get("key", "")), str(expression.get("operator", ""))
        values = [str(v) for v in expression.get("values") or []]
        if gfd.is_gfd_label(key):
            done, cel = _translate_requirement(key, operator, values, out)
            if done:
                if cel:
                    out.terms.append(cel)
                continue
        kept.append(expression)
    if kept:
        term["matchExpressions"] = kept
    else:
        term.pop("matchExpressions", None)


def _translate_terms(terms: list[dict[str, Any]], out: _NodeSelection) -> bool:
    """Several ORed terms: translated as one `(a && b) || (c)` selector only if every requirement
    of every term is a GFD label with a device equivalent; True when done."""
    trial = _NodeSelection()
    ored = []
    for term in terms:
        expressions = term.get("matchExpressions") or []
        if term.get("matchFields") or len(_gfd_expressions(term)) != len(expressions):
            return False
        cels = []
        for expression in expressions:
            values = [str(v) for v in expression.get("values") or []]
            done, cel = _translate_requirement(
                str(expression["key"]), str(expression.get("operator", "")), values, trial
            )
            if not done:
                return False
            if cel:
                cels.append(cel)
        ored.append(" && ".join(f"({c})" for c in cels) if cels else "true")
    out.messages.extend(trial.messages)
    out.mig = out.mig or trial.mig
    out.terms.append(" || ".join(f"({c})" for c in ored))
    return True


def _translate_affinity(spec: dict[str, Any], out: _NodeSelection) -> None:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    if not isinstance(node_affinity, dict):
        return
    preferred = node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    if any(_gfd_expressions(p.get("preference") or {}) for p in preferred if isinstance(p, Mapping)):
        out.messages.append(
            "kept preferred node affinity on GPU Feature Discovery labels: a claim has no soft selectors "
            "(a firstAvailable list of requests can express a preference; write it by hand)"
        )
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not any(_gfd_expressions(t) for t in terms if isinstance(t, Mapping)):
        return
    if len(terms) == 1:
        _translate_single_term(terms[0], out)
        if not terms[0]:
            del node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    elif _translate_terms(terms, out):
        del node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        out.messages.append(
            f"kept required node affinity as it is: its {len(terms)} terms are ORed and not every "
            "requirement in them has a device equivalent, so no device selector means the same"
        )
        return
    if not node_affinity:
        del spec["affinity"]["nodeAffinity"]
    if not spec["affinity"]:
        del spec["affinity"]


def _tolerates(spec: Mapping[str, Any], key: str) -> bool:
    for toleration in spec.get("tolerations") or []:
        if not isinstance(toleration, Mapping):
            continue
        key_ok = toleration.get("key") == key or (
            not toleration.get("key") and toleration.get("operator") == "Exists"
        )
        if key_ok and toleration.get("effect") in (None, "", "NoSchedule"):
            return True
    return False


def _template_name(ask: _Ask, device_class: str, selectors: Sequence[str]) -> str:
    base = _dns_label(ask.resource.rpartition("/")[2])
    name = f"{base}-{ask.count}"
    if selectors or device_class != ask.mapping.device_class:
        digest = hashlib.sha256(json.dumps([device_class, *selectors]).encode()).hexdigest()[:8]
        name = f"{name}-{digest}"
    return name


def _template(
    name: str, namespace: str | None, device_class: str, count: int, selectors: Sequence[str]
) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    metadata: dict[str, Any] = {"name": name}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


class Converter:
    """Converts objects one by one; templates are shared across the objects of one run."""

    def __init__(self, mappings: Mapping[str, ResourceMapping] | None = None) -> None:
        self.mappings = dict(mappings or {})
        self._templates: set[tuple[str, str]] = set()

    def convert(self, obj: Mapping[str, Any]) -> Conversion:
        kind = str(obj.get("kind", ""))
        if kind not in POD_SPEC_PATHS:
            return Conversion([dict(obj)], False, self._passed_through(obj, kind))
        result = copy.deepcopy(dict(obj))
        spec = pod_spec_of(result)
        if spec is None:
            return Conversion([result], False, [f"{kind} has no pod spec at the usual place: left as is"])
        messages: list[str] = []
        namespace = (result.get("metadata") or {}).get("namespace")
        asks = self._asks(spec, messages)
        if not asks:
            if _mentions_gfd(spec):
                messages.append(
                    "selects nodes by GPU Feature Discovery labels but asks for no GPU: left as is"
                )
            return Conversion([result], bool(messages and _resources_changed(obj, result)), messages)
        if spec.get("resourceClaims"):
            names = ", ".join(str(c.get("name")) for c in spec["resourceClaims"] if isinstance(c, Mapping))
            messages.append(
                f"already uses resource claims ({names}): kept; the GPU claims are added next to them"
            )
        selection = _NodeSelection()
        _translate_node_selector(spec, selection)
        _translate_affinity(spec, selection)
        messages.extend(selection.messages)
        templates = self._claims(spec, asks, selection, str(namespace) if namespace else None, messages)
        return Conversion([*templates, result], True, messages)

    def _passed_through(self, obj: Mapping[str, Any], kind: str) -> list[str]:
        if GPU_RESOURCE in json.dumps(obj):
            return [
                f"kind {kind or '(none)'} is not a workload migrate knows, yet it mentions {GPU_RESOURCE}: "
                "passed through unchanged, convert it by hand"
            ]
        return [f"kind {kind or '(none)'} has no pod template: passed through unchanged"]

    def _asks(self, spec: dict[str, Any], messages: list[str]) -> list[_Ask]:
        asks: list[_Ask] = []
        for list_name in CONTAINER_LISTS:
            for container in spec.get(list_name) or []:
                if not isinstance(container, dict):
                    continue
                asks.extend(self._container_asks(container, messages))
        return asks

    def _container_asks(self, container: dict[str, Any], messages: list[str]) -> list[_Ask]:
        name = str(container.get("name", ""))
        resources = container.get("resources")
        if not isinstance(resources, dict):
            return []
        limits = _dict_at(resources, "limits")
        requests = _dict_at(resources, "requests")
        asks = []
        for resource in sorted({*limits, *requests}):
            mapping = mapping_for(str(resource), self.mappings)
            if mapping is None:
                if str(resource).startswith("nvidia.com/"):
                    messages.append(
                        f"container {name}: kept {resource}: no DeviceClass is mapped to it (use --map "
                        f"{resource}=DEVICECLASS)"
                    )
                continue
            raw = limits.get(resource, requests.get(resource))
            if (
                resource in limits
                and resource in requests
                and str(limits[resource]) != str(requests[resource])
            ):
                messages.append(
                    f"container {name}: kept {resource}: requests {requests[resource]!r} and limits "
                    f"{limits[resource]!r} differ (the API server refuses that for extended resources)"
                )
                continue
            try:
                count = _count(raw)
            except ValueError as err:
                messages.append(f"container {name}: kept {resource}: the count {err}")
                continue
            for part in (limits, requests):
                part.pop(resource, None)
            for part_name in ("limits", "requests"):
                if part_name in resources and not resources[part_name]:
                    del resources[part_name]
            if count == 0:
                messages.append(f"container {name}: removed {resource}: 0 asks for no device")
                continue
            asks.append(_Ask(container, name, str(resource), count, mapping))
        return asks

    def _claims(
        self,
        spec: dict[str, Any],
        asks: Sequence[_Ask],
        selection: _NodeSelection,
        namespace: str | None,
        messages: list[str],
    ) -> list[dict[str, Any]]:
        templates = []
        taken = {str(c.get("name")) for c in spec.get("resourceClaims") or [] if isinstance(c, Mapping)}
        for ask in asks:
            device_class = ask.mapping.device_class
            if selection.mig and device_class == GPU_CLASS:
                device_class = MIG_CLASS  # `<product>-MIG-<profile>`: nvidia.com/gpu meant a MIG device
            selectors = [*ask.mapping.selectors, *selection.terms]
            name = _template_name(ask, device_class, selectors)
            key = (namespace or "", name)
            if key not in self._templates:
                self._templates.add(key)
                templates.append(_template(name, namespace, device_class, ask.count, selectors))
            claim_name = self._pod_claim_name(ask, len(asks), taken)
            spec.setdefault("resourceClaims", []).append(
                {"name": claim_name, "resourceClaimTemplateName": name}
            )
            ask.container.setdefault("resources", {}).setdefault("claims", []).append({"name": claim_name})
            messages.append(
                f"container {ask.container_name}: {ask.resource}: {ask.count} became claim {claim_name} from "
                f"ResourceClaimTemplate {name} ({ask.count} x {device_class}"
                + (f", {len(selectors)} selector(s)" if selectors else "")
                + ")"
            )
        for resource in sorted({ask.resource for ask in asks}):
            if _tolerates(spec, resource):
                messages.append(f"kept the toleration for {resource}")
                continue
            spec.setdefault("tolerations", []).append(
                {"key": resource, "operator": "Exists", "effect": "NoSchedule"}
            )
            messages.append(
                f"added toleration {resource}:NoSchedule (Exists): the ExtendedResourceToleration admission "
                f"plugin added it for pods asking for {resource}; harmless where GPU nodes are not tainted"
            )
        return templates

    @staticmethod
    def _pod_claim_name(ask: _Ask, asks: int, taken: set[str]) -> str:
        base = _dns_label(ask.resource.rpartition("/")[2])
        if asks > 1:
            base = _dns_label(f"{base}-{ask.container_name}")
        name, counter = base, 1
        while name in taken:
            counter += 1
            name = f"{base[: MAX_NAME - 4]}-{counter}"
        taken.add(name)
        return name


def _mentions_gfd(spec: Mapping[str, Any]) -> bool:
    if any(gfd.is_gfd_label(str(k)) for k in (spec.get("nodeSelector") or {})):
        return True
    return "nvidia.com/gpu." in json.dumps(spec.get("affinity") or {})


def _resources_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    return json.dumps(before, sort_keys=True) != json.dumps(after, sort_keys=True)


__all__ = [
    "GPU_CLASS",
    "GPU_RESOURCE",
    "MIG_CLASS",
    "Conversion",
    "Converter",
    "MappingError",
    "ResourceMapping",
    "mapping_for",
    "parse_mapping",
]
