"""The CEL `device` variable built from a resource.k8s.io/v1 ResourceSlice device (JSON).

Unqualified attribute and capacity names belong to the driver's domain, so
`gpu.example.com/model` and `model` (from driver gpu.example.com) both land in
`device.attributes["gpu.example.com"]["model"]`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from controller.cel.analysis import WILDCARD, Read
from controller.cel.errors import LibraryError
from controller.cel.semver import Semver, SemverError
from dracommon.quantity import Quantity, QuantityError

_SCALAR_FIELDS = ("int", "bool", "string", "version")
_LIST_FIELDS = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
_EXPECTED: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}


class DeviceShapeError(ValueError):
    """The device JSON does not have the resource.k8s.io/v1 shape."""


def split_name(name: str, driver: str) -> tuple[str, str]:
    domain, slash, ident = name.rpartition("/")
    return (domain, ident) if slash else (driver, name)


def device_name(device: Mapping[str, Any]) -> str:
    name = device.get("name") if isinstance(device, Mapping) else None
    return name if isinstance(name, str) and name else "<unnamed>"


class ViewPlan:
    """Which attribute/capacity entries one expression can read, for one driver.

    From the static `reads` of controller.cel.analysis, the same the memo keys on: the
    expression's result depends on nothing else, so a view holding only those entries
    evaluates exactly as the whole one. Entries it cannot read are neither converted nor
    validated (as with the memo, a malformed entry the selector never reads is not an error).
    """

    def __init__(self, reads: tuple[Read, ...], driver: str) -> None:
        self.driver = driver
        # Per field: None = every entry; else (qualified name, unqualified name or None,
        # domain, ident) per entry read by name, and the domains read as a whole.
        self.whole: set[str] = set()
        self.exact: dict[str, list[tuple[str, str | None, str, str]]] = {"attributes": [], "capacity": []}
        self.domains: dict[str, set[str]] = {"attributes": set(), "capacity": set()}
        for field, domain, ident in reads:
            if field not in self.exact:
                continue
            if domain == WILDCARD:
                self.whole.add(field)
            elif ident == WILDCARD:
                self.domains[field].add(domain)
            else:
                short = ident if domain == driver else None
                self.exact[field].append((f"{domain}/{ident}", short, domain, ident))

    def entries(self, table: Mapping[str, Any], field: str) -> list[tuple[str, Any, str, str]] | None:
        """(name, raw value, domain, ident) of the entries to build; None: build them all."""
        if field in self.whole:
            return None
        out: list[tuple[str, Any, str, str]] = []
        domains = self.domains[field]
        if domains:
            for name, raw in table.items():
                domain, ident = split_name(name, self.driver)
                if domain in domains:
                    out.append((name, raw, domain, ident))
        for qualified, short, domain, ident in self.exact[field]:
            if domain in domains:
                continue  # already taken above
            present = qualified in table
            if short is not None and short in table:
                if present:
                    return None  # both spellings: the whole build decides which wins, as always
                qualified, present = short, True
            if present:
                out.append((qualified, table[qualified], domain, ident))
        return out


def build_view(
    driver: str,
    device: Mapping[str, Any],
    *,
    semver: Callable[[Semver], object],
    quantity: Callable[[Quantity], object],
    plan: ViewPlan | None = None,
) -> dict[str, Any]:
    """The `device` variable; `semver`/`quantity` turn library values into an engine's values.

    With a `plan` (for this driver), only the entries the expression can read.
    """
    if not isinstance(device, Mapping):
        raise DeviceShapeError("device must be an object")
    attributes: dict[str, dict[str, object]] = {}
    for name, attr, domain, ident in _entries(driver, _mapping(device, "attributes"), "attributes", plan):
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, attr, semver)
    capacity: dict[str, dict[str, object]] = {}
    for name, cap, domain, ident in _entries(driver, _mapping(device, "capacity"), "capacity", plan):
        raw = cap.get("value") if isinstance(cap, Mapping) else None
        if not isinstance(raw, str | int):
            raise DeviceShapeError(f"capacity {name!r} has no value")
        try:
            capacity.setdefault(domain, {})[ident] = quantity(Quantity.parse(str(raw)))
        except QuantityError as err:
            raise DeviceShapeError(f"capacity {name!r}: {err}") from None
    view: dict[str, Any] = {"driver": driver, "attributes": attributes, "capacity": capacity}
    view["allowMultipleAllocations"] = bool(device.get("allowMultipleAllocations", False))
    return view


def _entries(
    driver: str, table: Mapping[str, Any], field: str, plan: ViewPlan | None
) -> Iterable[tuple[str, Any, str, str]]:
    chosen = plan.entries(table, field) if plan is not None else None
    if chosen is not None:
        return chosen
    return ((name, raw, *split_name(name, driver)) for name, raw in table.items())


def _mapping(device: Mapping[str, Any], field: str) -> Mapping[str, Any]:
    value = device.get(field)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise DeviceShapeError(f"{field} must be an object")
    return value


def _attribute_value(name: str, attr: object, semver: Callable[[Semver], object]) -> object:
    if type(attr) is dict and len(attr) == 1:
        # The usual shape, {"string": "H100"}: skip probing every possible field.
        ((field, raw),) = attr.items()
        if field in _SCALAR_FIELDS and raw is not None:
            return _scalar(name, field, raw, semver)
    if not isinstance(attr, Mapping):
        raise DeviceShapeError(f"attribute {name!r} must be an object")
    present = [key for key in (*_SCALAR_FIELDS, *_LIST_FIELDS) if attr.get(key) is not None]
    if len(present) != 1:
        raise DeviceShapeError(f"attribute {name!r} must have exactly one of int, bool, string, version")
    field = present[0]
    raw = attr[field]
    if field in _LIST_FIELDS:
        if not isinstance(raw, list):
            raise DeviceShapeError(f"attribute {name!r}: {field} must be a list")
        return [_scalar(name, _LIST_FIELDS[field], item, semver) for item in raw]
    return _scalar(name, field, raw, semver)


def _scalar(name: str, field: str, raw: object, semver: Callable[[Semver], object]) -> object:
    if not isinstance(raw, _EXPECTED[field]) or (field == "int" and isinstance(raw, bool)):
        raise DeviceShapeError(f"attribute {name!r}: {field} value {raw!r} has the wrong type")
    if field == "version":
        try:
            return semver(Semver.parse(str(raw)))
        except SemverError as err:
            raise DeviceShapeError(f"attribute {name!r}: {err}") from None
    return raw


__all__ = ["DeviceShapeError", "LibraryError", "ViewPlan", "build_view", "device_name", "split_name"]
