"""Consumable capacity: how much of a device's capacity a request takes, and whether it fits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dracommon.quantity import Quantity

JSON = Mapping[str, Any]


class CapacityRequestError(ValueError):
    """The request names a capacity the device does not have (the device is skipped)."""


def _policy_quantity(policy: JSON, key: str) -> Quantity | None:
    value = policy.get(key)
    return None if value is None else Quantity.from_json(value)


def consumed_amount(requested: Quantity | None, capacity: JSON) -> Quantity:
    """The amount taken from one capacity: the request rounded up per requestPolicy,
    or the policy default (else the whole capacity) when nothing was requested."""
    policy = capacity.get("requestPolicy")
    if requested is None:
        default = _policy_quantity(policy or {}, "default")
        return default if default is not None else Quantity.from_json(capacity.get("value", "0"))
    if policy is None:
        return requested
    valid_range = policy.get("validRange")
    if valid_range is not None and valid_range.get("min") is not None:
        minimum = Quantity.from_json(valid_range["min"])
        if requested < minimum:
            return minimum
        step_text = valid_range.get("step")
        if step_text is None:
            return requested
        step_quantity = Quantity.from_json(step_text)
        step = step_quantity.value()
        base = minimum.value()
        added = requested.value() - base
        steps = -(-added // step)
        return Quantity.from_int(base + step * steps, step_quantity.format)
    valid_values = policy.get("validValues")
    if valid_values is not None:
        for text in valid_values:
            value = Quantity.from_json(text)
            if requested <= value:
                return value
    return requested


def violates_policy(amount: Quantity, policy: JSON | None) -> bool:
    if policy is None:
        return False
    default = _policy_quantity(policy, "default")
    if default is not None and amount == default:
        return False
    valid_range = policy.get("validRange")
    if valid_range is not None:
        maximum = _policy_quantity(valid_range, "max")
        if maximum is not None and amount > maximum:
            return True
        step = _policy_quantity(valid_range, "step")
        if step is not None:
            minimum = _policy_quantity(valid_range, "min") or Quantity.from_int(0)
            return (amount.value() - minimum.value()) % step.value() != 0
        return False
    valid_values = policy.get("validValues") or []
    if valid_values:
        return all(amount != Quantity.from_json(v) for v in valid_values)
    return False


def consumed_capacity(requests: Mapping[str, Any] | None, device: JSON) -> dict[str, Quantity]:
    """Per capacity of the device, what one share for this request consumes."""
    result: dict[str, Quantity] = {}
    for name, capacity in (device.get("capacity") or {}).items():
        text = (requests or {}).get(name)
        result[name] = consumed_amount(None if text is None else Quantity.from_json(text), capacity)
    return result


def request_fits(
    requests: Mapping[str, Any] | None,
    device: JSON,
    allocated: Mapping[str, Quantity],
    allocating: Mapping[str, Quantity],
) -> bool:
    """Whether one more share fits next to what is allocated and being allocated.

    Raises CapacityRequestError when the request names a capacity the device lacks.
    """
    capacities: JSON = device.get("capacity") or {}
    for name in requests or {}:
        if name not in capacities:
            raise CapacityRequestError(f"requested capacity {name} is not defined by the device")
    for name, capacity in capacities.items():
        text = (requests or {}).get(name)
        amount = consumed_amount(None if text is None else Quantity.from_json(text), capacity)
        if violates_policy(amount, capacity.get("requestPolicy")):
            return False
        total = amount
        if name in allocated:
            total += allocated[name]
        if name in allocating:
            total += allocating[name]
        if total > Quantity.from_json(capacity.get("value", "0")):
            return False
    return True
