"""Checks of the CEL selectors in DeviceClasses, ResourceClaims and ResourceClaimTemplates,
judged the way kube-scheduler evaluates them.

Selectors run through the allocator's own code (`request_steps` and
`SelectorCache.first_non_match`): a request's DeviceClass selectors first, then its own,
stopping at the first that does not match. So a selector is only judged on the devices the
selectors before it let through: a request selector reading `profile` is never evaluated on
a whole GPU that its MIG-only class already turned away, and is not faulted for it.

Findings (errors fail `dra-controller lint`; warnings too with --strict):
* compile-error (with line and column) and cost, for the chosen release's CEL environment;
* runtime-error: evaluation fails on devices the selector is really evaluated on (the
  scheduler treats that as an allocation error, not as a non-match);
* unguarded-attribute (warning): the read behind such a failure, and how to guard it;
* unknown-attribute (warning): an attribute or capacity no published device has;
* no-match (warning): the class, or the class with the request's selectors, selects nothing;
* unknown-class (error): the request names a DeviceClass that is not there;
* untolerated-taint, all-mode-incomplete-pool, no-device-on-pod-nodes (warnings): where the
  scheduler cannot place a request on the objects given (`controller.lint.placement`);
* untolerated-node-taint (warning): a class whose devices are all on nodes with taints the pods
  using it do not tolerate (`controller.lint.node_taints`);
* sharing-conflict (error): allocated claims whose sharing mechanisms the node plugin refuses
  to mix on one GPU, or a claim's MPS shares on several GPUs (`controller.lint.sharing`).

Pod-level findings judge Pods and the pod templates of Deployments, StatefulSets, DaemonSets,
ReplicaSets, Jobs and CronJobs alike, naming the workload (`controller.lint.workloads`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.allocation.requests import Request, alternatives, claim_ref, claim_requests
from controller.allocation.selectors import SelectorCache, SelectorError, SelectorStep, request_steps
from controller.cel.selector import MAX_COST
from controller.lint.model import (
    Finding,
    PublishedDevice,
    Report,
    RequestOutcome,
    published_devices,
)
from controller.lint.node_taints import node_taint_findings
from controller.lint.placement import NodeView, placement_findings
from controller.lint.reads import attribute_reads, device_has, is_guarded
from controller.lint.sharing import sharing_findings
from controller.lint.workloads import with_template_pods
from controller.objects import ClusterObjects
from controller.options import build_allocator, cluster_nodes
from controller.scheduler.allocator import Allocator
from controller.scheduler.podclaims import claim_from_template

JSON = Mapping[str, Any]

__all__ = ["Finding", "Report", "lint"]

_NO_REQUEST = Request(name="", parent="", spec={})  # request_steps of a class alone


@dataclass
class Trace:
    """How the allocator's evaluation of one sequence of selectors went, device by device."""

    steps: Sequence[SelectorStep]
    evaluated: list[list[PublishedDevice]]  # per step: the devices it ran on
    failed: list[list[tuple[PublishedDevice, str]]]  # per step: devices it failed on, and why
    matched: list[PublishedDevice]  # devices every step selected


def trace(
    selectors: SelectorCache, steps: Sequence[SelectorStep], devices: Sequence[PublishedDevice]
) -> Trace:
    result = Trace(steps, [[] for _ in steps], [[] for _ in steps], [])
    for device in devices:
        try:
            stop = selectors.first_non_match(steps, device.id.driver, device.device)
        except SelectorError as err:
            assert err.step is not None  # first_non_match always says which step
            stop = err.step
            cause = err.__cause__
            result.failed[stop].append((device, str(getattr(cause, "cause", cause or err.message))))
        else:
            if stop is None:
                result.matched.append(device)
                stop = len(steps) - 1
        for index in range(stop + 1):
            result.evaluated[index].append(device)
    return result


class Linter:
    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.selectors = allocator.selectors
        self.devices = published_devices(allocator.slices)
        self.report = Report()
        # Per class name: its trace, or None when one of its selectors does not compile.
        self.class_traces: dict[str, Trace | None] = {}

    def add(self, severity: str, code: str, obj: str, where: str, message: str, **position: Any) -> None:
        self.report.findings.append(Finding(severity, code, obj, where, message, **position))

    def lint_class(self, device_class: JSON) -> None:
        name = str((device_class.get("metadata") or {}).get("name", ""))
        obj = f"DeviceClass/{name}"
        steps = request_steps(device_class, _NO_REQUEST, "")
        labels = [f"selector #{i}" for i in range(len(steps))]
        if not self._compiles(obj, labels, steps):
            self.class_traces[name] = None
            return
        class_trace = trace(self.selectors, steps, self.devices)
        self.class_traces[name] = class_trace
        self._evaluation_findings(obj, class_trace, 0, labels)
        if self.devices and not class_trace.matched and not any(class_trace.failed):
            self.add(
                "warning",
                "no-match",
                obj,
                "selectors",
                f"match none of the {len(self.devices)} published devices",
            )

    def lint_request(self, subject: str, claim: JSON, option: Request) -> RequestOutcome | None:
        """Selector findings of one request; its outcome for the placement checks, or None when
        it cannot be evaluated (no such class, or a selector that does not compile)."""
        where = f"request {option.result_name}"
        device_class = self.allocator.classes.get(option.device_class_name)
        if device_class is None:
            self.add(
                "error",
                "unknown-class",
                subject,
                where,
                f"device class {option.device_class_name} does not exist",
            )
            return None
        steps = request_steps(device_class, option, claim_ref(claim))
        first = len(steps) - len(option.selectors)
        labels = [f"{where}, selector #{i}" for i in range(len(option.selectors))]
        own_compile = self._compiles(subject, labels, steps[first:])
        class_trace = self.class_traces.get(option.device_class_name)
        if not own_compile or class_trace is None:
            return None  # a class that does not compile is reported on the class
        request_trace = trace(self.selectors, steps, self.devices)
        self._evaluation_findings(subject, request_trace, first, labels)
        if class_trace.matched and not request_trace.matched and not any(request_trace.failed[first:]):
            self.add(
                "warning",
                "no-match",
                subject,
                f"{where}, selectors",
                f"match none of the {len(class_trace.matched)} devices that class "
                f"{option.device_class_name} selects",
            )
        return RequestOutcome(subject, claim, option, class_trace.matched, request_trace.matched)

    def _compiles(self, obj: str, labels: Sequence[str], steps: Sequence[SelectorStep]) -> bool:
        compiled = True
        for label, step in zip(labels, steps, strict=True):
            program = self.selectors.program(step.expression)
            if isinstance(program, Exception):
                compiled = False
                message = str(getattr(program, "message", program))
                line, column = getattr(program, "line", None), getattr(program, "column", None)
                self.add("error", "compile-error", obj, label, message, line=line, column=column)
                continue
            cost = getattr(program, "estimated_cost", None)
            if isinstance(cost, int) and cost > MAX_COST:
                self.add(
                    "error", "cost", obj, label, f"estimated cost {cost} exceeds the limit of {MAX_COST}"
                )
        return compiled

    def _evaluation_findings(self, obj: str, steps_trace: Trace, first: int, labels: Sequence[str]) -> None:
        """Findings for steps first.. of the trace (the others belong to the class)."""
        for offset, label in enumerate(labels):
            index = first + offset
            evaluated, failed = steps_trace.evaluated[index], steps_trace.failed[index]
            self._read_findings(obj, label, steps_trace.steps[index].expression, evaluated, failed)
            if failed:
                device, cause = failed[0]
                self.add(
                    "error",
                    "runtime-error",
                    obj,
                    label,
                    f"evaluation fails on {len(failed)} of the {len(evaluated)} devices it is evaluated on, "
                    f"first on device {device}: {cause}; the scheduler treats this as an allocation error "
                    "for every pod with this claim, not as a non-match",
                )

    def _read_findings(
        self,
        obj: str,
        label: str,
        expression: str,
        evaluated: Sequence[PublishedDevice],
        failed: Sequence[tuple[PublishedDevice, str]],
    ) -> None:
        failed_ids = {device.id for device, _ in failed}
        for kind, domain, name in dict.fromkeys(attribute_reads(expression)):
            singular = "attribute" if kind == "attributes" else kind
            if self.devices and not any(
                device_has(d.id.driver, d.device, kind, domain, name) for d in self.devices
            ):
                self.add(
                    "warning",
                    "unknown-attribute",
                    obj,
                    label,
                    f"{singular} {domain}/{name} is not published by any device",
                )
                continue
            if is_guarded(expression, kind, domain, name):
                continue
            lacking = [d for d in evaluated if not device_has(d.id.driver, d.device, kind, domain, name)]
            # Only where the read really failed: a device the expression turns away before the read
            # (another guard, such as a type check) is not at risk.
            if not any(d.id in failed_ids for d in lacking):
                continue
            self.add(
                "warning",
                "unguarded-attribute",
                obj,
                label,
                f"{singular} {domain}/{name} exists on {len(evaluated) - len(lacking)} of the "
                f"{len(evaluated)} devices this selector is evaluated on; guard it "
                f'(has(device.{kind}["{domain}"].{name}) or "{name}" in device.{kind}["{domain}"]): '
                "on the others the read is a runtime error that blocks allocation",
            )


def _subjects(objects: ClusterObjects) -> list[tuple[str, JSON]]:
    """(finding object name, claim) of every claim, and of the claim each template stands for."""
    subjects: list[tuple[str, JSON]] = [(f"ResourceClaim/{claim_ref(c)}", c) for c in objects.claims]
    for template in objects.claim_templates:
        meta = template.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name", ""))
        subjects.append(
            (f"ResourceClaimTemplate/{namespace}/{name}", claim_from_template(template, namespace, name))
        )
    return subjects


def lint(
    objects: ClusterObjects, allocator: Allocator | None = None, *, extended_resources: bool = True
) -> Report:
    """Lint the DeviceClasses, ResourceClaims and ResourceClaimTemplates of `objects` against its
    ResourceSlices (and DeviceTaintRules, Nodes, Pods and workloads' pod templates, where given).
    `allocator` carries the
    release's CEL environment and feature gates (default: `build_allocator(objects)`);
    `extended_resources`: the DRAExtendedResource gate (pods' mapped extended resources count as
    claims)."""
    allocator = allocator or build_allocator(objects)
    objects = with_template_pods(objects)
    linter = Linter(allocator)
    for device_class in objects.device_classes:
        linter.lint_class(device_class)
    outcomes: list[RequestOutcome] = []
    for subject, claim in _subjects(objects):
        for request in claim_requests(claim):
            for option in alternatives(request):
                outcome = linter.lint_request(subject, claim, option)
                if outcome is not None:
                    outcomes.append(outcome)
    linter.report.findings.extend(placement_findings(objects, allocator, outcomes))
    class_matches = {name: t.matched for name, t in linter.class_traces.items() if t is not None}
    view = NodeView(allocator, cluster_nodes(objects, allocator))
    linter.report.findings.extend(
        node_taint_findings(objects, view, class_matches, extended_resources=extended_resources)
    )
    linter.report.findings.extend(sharing_findings(objects.claims))
    return linter.report
