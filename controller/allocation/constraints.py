"""Claim constraints: `matchAttribute` and `distinctAttribute`.

Both are monotonic (once a device breaks one, adding more devices cannot
repair it), so the search checks them device by device and backtracks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

from controller.allocation.features import DistinctRule, Features
from controller.allocation.pools import DeviceID

JSON = Mapping[str, Any]

# A comparable attribute value: (type, value). List-typed attributes compare
# unequal to everything, as upstream only compares scalar values.
AttributeValue = tuple[str, object]
SCALAR_TYPES = ("string", "int", "bool", "version")


def lookup_attribute(device: JSON, device_id: DeviceID, name: str) -> AttributeValue | None:
    """A fully qualified attribute, also found under its short name in the driver's domain."""
    attributes = device.get("attributes") or {}
    value = attributes.get(name)
    if value is None and "/" in name:
        domain, short = name.split("/", 1)
        if domain == device_id.driver:
            value = attributes.get(short)
    if value is None:
        return None
    for kind in SCALAR_TYPES:
        if kind in value and value[kind] is not None:
            return (kind, value[kind])
    return ("other", object())


def _applies(names: frozenset[str], request: str, subrequest: str) -> bool:
    if not names:
        return True
    return request in names or (bool(subrequest) and f"{request}/{subrequest}" in names)


class Constraint(Protocol):
    def add(self, request: str, subrequest: str, device: JSON, device_id: DeviceID) -> bool: ...

    def remove(self, request: str, subrequest: str, device: JSON, device_id: DeviceID) -> None: ...

    def describe(self) -> str: ...


class _AttributeConstraint:
    """What every attribute constraint shares: the requests it covers, the attribute's
    lookup, and refusing a device without that attribute; subclasses keep the values."""

    kind: ClassVar[str]

    def __init__(self, attribute: str, requests: Sequence[str]) -> None:
        self.attribute = attribute
        self.requests = frozenset(requests)

    def describe(self) -> str:
        return f"{self.kind} {self.attribute}"

    def add(self, request: str, subrequest: str, device: JSON, device_id: DeviceID) -> bool:
        if not _applies(self.requests, request, subrequest):
            return True
        value = lookup_attribute(device, device_id, self.attribute)
        if value is None:
            return False
        return self._accept(request, device_id, value)

    def remove(self, request: str, subrequest: str, device: JSON, device_id: DeviceID) -> None:
        if _applies(self.requests, request, subrequest):
            self._release(request, device, device_id)

    def _accept(self, request: str, device_id: DeviceID, value: AttributeValue) -> bool:
        """Record a device of a covered request with this value, or False if it breaks the rule."""
        raise NotImplementedError

    def _release(self, request: str, device: JSON, device_id: DeviceID) -> None:
        """Forget a device of a covered request that `_accept` recorded."""
        raise NotImplementedError


class MatchAttribute(_AttributeConstraint):
    """All devices of the named requests have the same value of one attribute."""

    kind = "matchAttribute"

    def __init__(self, attribute: str, requests: Sequence[str]) -> None:
        super().__init__(attribute, requests)
        self._value: AttributeValue | None = None
        self._count = 0

    def _accept(self, request: str, device_id: DeviceID, value: AttributeValue) -> bool:
        if self._count == 0:
            self._value = value
        elif self._value is None or value[0] not in SCALAR_TYPES or value != self._value:
            return False
        self._count += 1
        return True

    def _release(self, request: str, device: JSON, device_id: DeviceID) -> None:
        self._count -= 1


class DistinctAttribute(_AttributeConstraint):
    """Devices of the named requests have pairwise different values of one attribute.

    Every chosen device counts, also several of the same request: kube-scheduler
    1.37 rejects such a claim when the values run out (checked against it). Older
    releases: `DistinctAttributePerRequest`.
    """

    kind = "distinctAttribute"

    def __init__(self, attribute: str, requests: Sequence[str]) -> None:
        super().__init__(attribute, requests)
        self._values: list[AttributeValue] = []

    def _accept(self, request: str, device_id: DeviceID, value: AttributeValue) -> bool:
        if self._values and (value[0] not in SCALAR_TYPES or value in self._values):
            return False
        self._values.append(value)
        return True

    def _release(self, request: str, device: JSON, device_id: DeviceID) -> None:
        value = lookup_attribute(device, device_id, self.attribute)
        if value in self._values:
            self._values.remove(value)


class DistinctAttributePerRequest(_AttributeConstraint):
    """`distinctAttribute` as Kubernetes 1.34 to 1.36 check it (`DistinctRule`).

    One entry per request: the device most recently chosen for it and its value. A new
    device is compared with those entries only; removing any device of a request drops the
    request's entry. With `by_identity` (1.34) an entry conflicts only with the very same
    device, since 1.34 compared the values' pointers instead of the values.
    """

    kind = "distinctAttribute"

    def __init__(self, attribute: str, requests: Sequence[str], *, by_identity: bool) -> None:
        super().__init__(attribute, requests)
        self.by_identity = by_identity
        self._latest: dict[str, tuple[DeviceID, AttributeValue]] = {}
        self._count = 0

    def _accept(self, request: str, device_id: DeviceID, value: AttributeValue) -> bool:
        if self._count > 0 and self._conflicts(device_id, value):
            return False
        self._latest[request] = (device_id, value)
        self._count += 1
        return True

    def _conflicts(self, device_id: DeviceID, value: AttributeValue) -> bool:
        for other_id, other in self._latest.values():
            if value[0] not in SCALAR_TYPES:
                return True  # no comparable value: upstream rejects once anything is recorded
            if self.by_identity:
                if other_id == device_id:
                    return True
            elif other == value:
                return True
        return False

    def _release(self, request: str, device: JSON, device_id: DeviceID) -> None:
        self._latest.pop(request, None)
        self._count -= 1


def build_constraints(claim: JSON, features: Features | None = None) -> list[Constraint]:
    """The claim's constraints under a release's rules; ValueError for one of no known kind."""
    rule = (features or Features()).distinct_rule
    result: list[Constraint] = []
    devices = (claim.get("spec") or {}).get("devices") or {}
    for index, constraint in enumerate(devices.get("constraints") or []):
        requests = list(constraint.get("requests") or [])
        if constraint.get("matchAttribute"):
            result.append(MatchAttribute(str(constraint["matchAttribute"]), requests))
        elif constraint.get("distinctAttribute"):
            attribute = str(constraint["distinctAttribute"])
            if rule is DistinctRule.EVERY_DEVICE:
                result.append(DistinctAttribute(attribute, requests))
            else:
                by_identity = rule is DistinctRule.SAME_DEVICE_ONLY
                result.append(DistinctAttributePerRequest(attribute, requests, by_identity=by_identity))
        else:
            raise ValueError(f"constraint #{index}: empty constraint (unsupported constraint type?)")
    return result
