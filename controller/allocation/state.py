"""What is already in use: devices, shared-device shares and consumed capacity.

Built from the claims that already carry `status.allocation`, the way the
scheduler builds it: admin-access results never block a device, results with a
`shareID` only consume capacity, all others take the whole device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.pools import DeviceID
from controller.allocation.taintrules import apply_taint_rules
from dracommon.quantity import Quantity, QuantityError

JSON = Mapping[str, Any]

# DeviceTaintRules are applied where the allocator's view is built; kept importable from here.
__all__ = ["AllocatedState", "allocated_state", "apply_taint_rules"]


@dataclass
class AllocatedState:
    # device -> "namespace/name" of the claim that holds it (first one seen).
    devices: dict[DeviceID, str] = field(default_factory=dict)
    # device -> claims that hold shares of it.
    shared: dict[DeviceID, list[str]] = field(default_factory=dict)
    # device -> capacity name -> sum consumed by shares.
    capacity: dict[DeviceID, dict[str, Quantity]] = field(default_factory=dict)

    def is_allocated(self, device: DeviceID) -> bool:
        """Allocated whole or in shares: its counters are consumed either way."""
        return device in self.devices or device in self.shared or device in self.capacity

    def holders(self, device: DeviceID) -> list[str]:
        if device in self.devices:
            return [self.devices[device]]
        return list(self.shared.get(device, []))

    def add_claim(self, claim: JSON) -> None:
        """Record the results of an allocated claim (no-op for unallocated ones)."""
        meta = claim.get("metadata") or {}
        owner = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            self.add_result(result, owner)

    def add_result(self, result: JSON, owner: str) -> None:
        if result.get("adminAccess"):
            return
        device = DeviceID(
            str(result.get("driver", "")), str(result.get("pool", "")), str(result.get("device", ""))
        )
        if not result.get("shareID"):
            self.devices.setdefault(device, owner)
            return
        self.shared.setdefault(device, []).append(owner)
        consumed = result.get("consumedCapacity") or {}
        if consumed:
            totals = self.capacity.setdefault(device, {})
            for name, value in consumed.items():
                try:
                    amount = Quantity.from_json(value)
                except QuantityError:
                    continue
                totals[name] = totals[name] + amount if name in totals else amount


def allocated_state(claims: Iterable[JSON]) -> AllocatedState:
    state = AllocatedState()
    for claim in claims:
        state.add_claim(claim)
    return state
