"""The CEL `device` variable built from a resource.k8s.io/v1 ResourceSlice device (JSON).

Unqualified attribute and capacity names belong to the driver's domain, so
`gpu.example.com/model` and `model` (from driver gpu.example.com) both land in
`device.attributes["gpu.example.com"]["model"]`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

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


def build_view(
    driver: str,
    device: Mapping[str, Any],
    *,
    semver: Callable[[Semver], object],
    quantity: Callable[[Quantity], object],
) -> dict[str, Any]:
    """The `device` variable; `semver`/`quantity` turn library values into an engine's values."""
    if not isinstance(device, Mapping):
        raise DeviceShapeError("device must be an object")
    attributes: dict[str, dict[str, object]] = {}
    for name, attr in _mapping(device, "attributes").items():
        domain, ident = split_name(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, attr, semver)
    capacity: dict[str, dict[str, object]] = {}
    for name, cap in _mapping(device, "capacity").items():
        domain, ident = split_name(name, driver)
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


__all__ = ["DeviceShapeError", "LibraryError", "build_view", "device_name", "split_name"]
