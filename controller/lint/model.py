"""What lint reports (findings) and what its checks share: the published devices and, per
request, the devices its class and its own selectors match."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.pools import DeviceID, pool_generation, pool_key
from controller.allocation.requests import Request

JSON = Mapping[str, Any]


@dataclass(frozen=True)
class Finding:
    severity: str  # "error" | "warning"
    # compile-error, cost, runtime-error, unknown-class (errors); no-match, unknown-attribute,
    # unguarded-attribute, untolerated-taint, all-mode-incomplete-pool, no-device-on-pod-nodes,
    # untolerated-node-taint; sharing-conflict (error)
    code: str
    object: str  # "DeviceClass/gpu", "ResourceClaim/ns/name" or "ResourceClaimTemplate/ns/name"
    where: str  # "selector #0", "request gpu, selector #1", "request gpu, pod ns/name"
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
        # `errors` is a list in every command's JSON (cel: devices, top: endpoints): here the
        # findings of severity error, as they appear in `findings`; count them with `length`.
        return {
            "findings": [f.to_json() for f in self.findings],
            "errors": [f.to_json() for f in self.findings if f.severity == "error"],
        }


@dataclass(frozen=True)
class PublishedDevice:
    id: DeviceID
    device: JSON

    def __str__(self) -> str:
        return f"{self.id.device} of {self.id.driver}"


def published_devices(slices: Sequence[JSON]) -> list[PublishedDevice]:
    """The devices of the newest generation of every pool, on any node: the devices selectors
    are judged on (which node may use which is the allocator's pool gathering, per node)."""
    newest: dict[tuple[str, str], int] = {}
    for slice_obj in slices:
        key = pool_key(slice_obj)
        newest[key] = max(newest.get(key, 0), pool_generation(slice_obj))
    devices: list[PublishedDevice] = []
    for slice_obj in slices:
        driver, pool = pool_key(slice_obj)
        if pool_generation(slice_obj) != newest[(driver, pool)]:
            continue
        devices.extend(
            PublishedDevice(DeviceID(driver, pool, str(d.get("name", ""))), d)
            for d in (slice_obj.get("spec") or {}).get("devices") or []
        )
    return devices


@dataclass(frozen=True)
class RequestOutcome:
    """One request (or firstAvailable subrequest) of a claim or template, as evaluated."""

    subject: str  # the finding object name of its claim or template
    claim: JSON  # the claim (for a template: the claim made from it)
    request: Request
    class_matched: list[PublishedDevice]  # devices its DeviceClass selects
    matched: list[PublishedDevice]  # of those, the devices its own selectors select too
