"""Static and data-driven checks of CEL selectors in DeviceClasses and ResourceClaims.

Findings, per selector:
* compile errors (with line and column) and estimated cost over the limit;
* selectors that match none of the published devices;
* attributes/capacities the expression reads that no published device has;
* reads of attributes only some devices have, without a guard (`has(...)`,
  `"x" in device.attributes["d"]`, or `.?x`): on the others such a read is a
  runtime error, and a runtime error aborts allocation instead of skipping
  the device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.pools import pool_generation, pool_key
from controller.allocation.requests import alternatives, claim_ref, claim_requests
from controller.allocation.selectors import Compiler, default_compiler

JSON = Mapping[str, Any]
MAX_COST = 1_000_000

_STRING = r'"([^"\\]+)"|\'([^\'\\]+)\''
_READ = re.compile(
    r"device\.(attributes|capacity)\s*\[\s*(?:" + _STRING + r")\s*\]"
    r"\s*(?:\.\??\s*([A-Za-z_][A-Za-z0-9_]*)|\[\s*(?:" + _STRING + r")\s*\])"
)


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    code: str  # compile-error, cost, no-match, unknown-attribute, unguarded-attribute, runtime-error
    object: str  # "DeviceClass/gpu" or "ResourceClaim/ns/name"
    where: str  # "selector #0" or "request gpu, selector #1"
    message: str
    line: int | None = None
    column: int | None = None

    def to_json(self) -> dict[str, Any]:
        result: dict[str, Any] = {
            "severity": self.severity,
            "code": self.code,
            "object": self.object,
            "where": self.where,
            "message": self.message,
        }
        if self.line is not None:
            result["line"] = self.line
            result["column"] = self.column
        return result

    def to_text(self) -> str:
        position = f":{self.line}:{self.column}" if self.line is not None else ""
        return f"{self.severity}: {self.object} {self.where}{position}: [{self.code}] {self.message}"


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(1 for f in self.findings if f.severity == "error")

    def to_json(self) -> dict[str, Any]:
        return {"findings": [f.to_json() for f in self.findings], "errors": self.errors}


def attribute_reads(expression: str) -> list[tuple[str, str, str]]:
    """(field, domain, id) of every literal `device.attributes["d"].id`-style read."""
    reads: list[tuple[str, str, str]] = []
    for match in _READ.finditer(expression):
        kind = match.group(1)
        domain = match.group(2) or match.group(3)
        name = match.group(4) or match.group(5) or match.group(6)
        reads.append((kind, domain, name))
    return reads


def is_guarded(expression: str, kind: str, domain: str, name: str) -> bool:
    base = rf"device\.{kind}\s*\[\s*[\"']{re.escape(domain)}[\"']\s*\]"
    patterns = (
        rf"has\(\s*{base}\s*\.\s*{re.escape(name)}\s*\)",
        rf"[\"']{re.escape(name)}[\"']\s+in\s+{base}",
        rf"{base}\s*\.\?\s*{re.escape(name)}\b",
    )
    return any(re.search(p, expression) for p in patterns)


def _published_devices(slices: Sequence[JSON]) -> list[tuple[str, JSON]]:
    """(driver, device) of the newest generation of every pool."""
    newest: dict[tuple[str, str], int] = {}
    for slice_obj in slices:
        key = pool_key(slice_obj)
        newest[key] = max(newest.get(key, 0), pool_generation(slice_obj))
    devices: list[tuple[str, JSON]] = []
    for slice_obj in slices:
        if pool_generation(slice_obj) != newest[pool_key(slice_obj)]:
            continue
        driver = pool_key(slice_obj)[0]
        devices.extend((driver, d) for d in (slice_obj.get("spec") or {}).get("devices") or [])
    return devices


def _has(driver: str, device: JSON, kind: str, domain: str, name: str) -> bool:
    values = device.get(kind) or {}
    if f"{domain}/{name}" in values:
        return True
    return domain == driver and name in values


class Linter:
    def __init__(self, slices: Sequence[JSON], compiler: Compiler | None = None) -> None:
        self.devices = _published_devices(slices)
        self._compiler = compiler
        self._compiled: dict[str, Any] = {}

    def _compile(self, expression: str) -> Any:
        if expression not in self._compiled:
            compiler: Callable[[str], Any] = self._compiler or default_compiler()
            try:
                self._compiled[expression] = compiler(expression)
            except Exception as err:  # reported as a compile finding
                self._compiled[expression] = err
        return self._compiled[expression]

    def check_selectors(self, obj_name: str, where: str, expressions: Sequence[str], report: Report) -> None:
        """Check a conjunction of selectors (a class's, or a class's plus a request's)."""
        programs: list[Any] = []
        for index, expression in enumerate(expressions):
            program = self._compile(expression)
            label = f"{where}selector #{index}"
            if isinstance(program, Exception):
                report.findings.append(
                    Finding(
                        "error",
                        "compile-error",
                        obj_name,
                        label,
                        str(getattr(program, "message", program)),
                        getattr(program, "line", None),
                        getattr(program, "column", None),
                    )
                )
                return
            cost = getattr(program, "estimated_cost", None)
            if isinstance(cost, int) and cost > MAX_COST:
                report.findings.append(
                    Finding(
                        "error",
                        "cost",
                        obj_name,
                        label,
                        f"estimated cost {cost} exceeds the limit of {MAX_COST}",
                    )
                )
            programs.append(program)
            self._check_reads(obj_name, label, expression, report)
        if not self.devices:
            return
        matched = 0
        for driver, device in self.devices:
            try:
                if all(p.matches(driver, device) for p in programs):
                    matched += 1
            except Exception as err:  # a runtime error on some device is a finding, not a crash
                report.findings.append(
                    Finding(
                        "error",
                        "runtime-error",
                        obj_name,
                        f"{where}selectors",
                        f"evaluation fails on device {device.get('name')} of {driver}: {err}",
                    )
                )
                return
        if matched == 0:
            report.findings.append(
                Finding(
                    "warning",
                    "no-match",
                    obj_name,
                    f"{where}selectors",
                    f"match none of the {len(self.devices)} published devices",
                )
            )

    def _check_reads(self, obj_name: str, label: str, expression: str, report: Report) -> None:
        for kind, domain, name in dict.fromkeys(attribute_reads(expression)):
            having = sum(1 for driver, d in self.devices if _has(driver, d, kind, domain, name))
            in_domain = [
                (driver, d)
                for driver, d in self.devices
                if driver == domain or any(k.startswith(f"{domain}/") for k in (d.get(kind) or {}))
            ]
            singular = kind[:-1] if kind == "attributes" else kind
            if self.devices and having == 0:
                report.findings.append(
                    Finding(
                        "warning",
                        "unknown-attribute",
                        obj_name,
                        label,
                        f"{singular} {domain}/{name} is not published by any device",
                    )
                )
            elif 0 < having < len(in_domain) and not is_guarded(expression, kind, domain, name):
                report.findings.append(
                    Finding(
                        "warning",
                        "unguarded-attribute",
                        obj_name,
                        label,
                        f"{singular} {domain}/{name} exists on {having} of {len(in_domain)} devices of that "
                        f'domain; guard it (has(device.{kind}["{domain}"].{name}) or '
                        f'"{name}" in device.{kind}["{domain}"]): on the others the read is a runtime '
                        "error that blocks allocation",
                    )
                )


def _selector_expressions(selectors: Sequence[JSON]) -> list[str]:
    return [str((s.get("cel") or {}).get("expression", "")) for s in selectors]


def lint(
    device_classes: Sequence[JSON],
    claims: Sequence[JSON],
    slices: Sequence[JSON],
    compiler: Compiler | None = None,
) -> Report:
    linter = Linter(slices, compiler)
    report = Report()
    classes: dict[str, JSON] = {}
    for device_class in device_classes:
        name = str((device_class.get("metadata") or {}).get("name", ""))
        classes[name] = device_class
        expressions = _selector_expressions((device_class.get("spec") or {}).get("selectors") or [])
        linter.check_selectors(f"DeviceClass/{name}", "", expressions, report)
    for claim in claims:
        obj_name = f"ResourceClaim/{claim_ref(claim)}"
        for request in claim_requests(claim):
            for option in alternatives(request):
                request_class = classes.get(option.device_class_name)
                if request_class is None:
                    report.findings.append(
                        Finding(
                            "error",
                            "unknown-class",
                            obj_name,
                            f"request {option.result_name}",
                            f"device class {option.device_class_name} does not exist",
                        )
                    )
                    continue
                own = _selector_expressions(option.selectors)
                if not own:
                    continue
                class_exprs = _selector_expressions((request_class.get("spec") or {}).get("selectors") or [])
                # Compile and read checks for the request's own selectors; the match check
                # combines them with the class selectors, as allocation does.
                before = len(report.findings)
                linter.check_selectors(obj_name, f"request {option.result_name}, ", own, report)
                if len(report.findings) == before or all(
                    f.code != "compile-error" for f in report.findings[before:]
                ):
                    report.findings[before:] = [f for f in report.findings[before:] if f.code != "no-match"]
                    scratch = Report()
                    linter.check_selectors(
                        obj_name, f"request {option.result_name}, ", class_exprs + own, scratch
                    )
                    report.findings.extend(
                        f for f in scratch.findings if f.code in ("no-match", "runtime-error")
                    )
    # A runtime error reported twice (own selectors, then class + own) is one finding.
    report.findings = list(dict.fromkeys(report.findings))
    return report
