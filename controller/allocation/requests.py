"""Uniform read access to requests and subrequests of a ResourceClaim (v1 JSON).

Defaults the API server would have applied are applied here too, so manifests
read offline behave like objects read from the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

JSON = Mapping[str, Any]

EXACT_COUNT = "ExactCount"
ALL = "All"


@dataclass(frozen=True)
class Request:
    """One request, or one subrequest of a `firstAvailable` list.

    Its facts are read from the spec once (cached): the search asks them for every device it
    tries, and a prepared claim's requests serve every node of a scheduling cycle. The spec is
    not changed while a Request of it exists."""

    name: str  # the request's or subrequest's own name
    parent: str  # the main request's name for a subrequest, else ""
    spec: JSON  # `exactly` or the subrequest object

    @cached_property
    def result_name(self) -> str:
        """The name used in results and config: "req" or "req/sub"."""
        return f"{self.parent}/{self.name}" if self.parent else self.name

    @cached_property
    def base_name(self) -> str:
        return self.parent or self.name

    @cached_property
    def sub_name(self) -> str:
        return self.name if self.parent else ""

    @cached_property
    def device_class_name(self) -> str:
        return str(self.spec.get("deviceClassName") or "")

    @cached_property
    def allocation_mode(self) -> str:
        return str(self.spec.get("allocationMode") or EXACT_COUNT)

    @cached_property
    def count(self) -> int:
        if self.allocation_mode != EXACT_COUNT:
            return 0
        count = self.spec.get("count")
        return 1 if count is None else int(count)

    @cached_property
    def admin_access(self) -> bool:
        # Subrequests cannot ask for admin access.
        return not self.parent and bool(self.spec.get("adminAccess"))

    @cached_property
    def has_admin_access_field(self) -> bool:
        return not self.parent and self.spec.get("adminAccess") is not None

    @cached_property
    def selectors(self) -> Sequence[JSON]:
        return list(self.spec.get("selectors") or [])

    @cached_property
    def tolerations(self) -> Sequence[JSON]:
        return list(self.spec.get("tolerations") or [])

    @cached_property
    def capacity_requests(self) -> Mapping[str, Any] | None:
        capacity = self.spec.get("capacity")
        if capacity is None:
            return None
        requests: Mapping[str, Any] | None = capacity.get("requests")
        return requests


def claim_requests(claim: JSON) -> list[JSON]:
    return list(((claim.get("spec") or {}).get("devices") or {}).get("requests") or [])


def alternatives(request: JSON) -> list[Request]:
    """The subrequests of a `firstAvailable` request in order, or the single `exactly` request."""
    name = str(request.get("name", ""))
    subrequests = request.get("firstAvailable") or []
    if subrequests:
        return [Request(name=str(sub.get("name", "")), parent=name, spec=sub) for sub in subrequests]
    return [Request(name=name, parent="", spec=request.get("exactly") or {})]


def claim_ref(claim: JSON) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def tolerates(toleration: JSON, taint: JSON) -> bool:
    """A toleration matches a device taint (key, effect, then Equal/Exists)."""
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def blocking_taint(device: JSON, request: Request) -> JSON | None:
    """The first NoSchedule/NoExecute taint the request does not tolerate."""
    for taint in device.get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(tolerates(t, taint) for t in request.tolerations):
            taint_json: JSON = taint
            return taint_json
    return None
