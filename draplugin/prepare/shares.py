"""Enforcing shares of a shared GPU (pure): what the scheduler counted becomes MPS limits.

A GPU published with `--shared-gpus` (`draplugin.devices.shared`) can be
allocated to several claims at once; each allocation result then carries a
`shareID` and the `consumedCapacity` the scheduler counted for it. A claim
whose shares leave room for others on the GPU is a client of the GPU's one
MPS control daemon (`draplugin.prepare.mpsgpu`), with limits from what it
consumed, in its containers' environment (the CDI spec):

- pinned device memory limit of each GPU (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`)
  = the `memory` the claim consumed there (summed when two requests of the
  claim share one GPU), in whole MiB;
- active thread percentage (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`) = the
  `compute` it consumed (percent of the GPU's SMs), when the GPU is shared
  with a compute capacity: a cap on the SMs each of its contexts may use.

The derived config is an ordinary MPS `GpuConfig`, so the rest of prepare
(CDI variables, the checkpoint, unprepare) treats it like any MPS claim, and
the checkpoint restores it unchanged. A share that holds the whole
GPU (what a claim without capacity requests gets) leaves no room for anyone,
so it is prepared like an exclusive GPU, with the claim's own config.

The claim's opaque config may not contradict its shares: time-slicing, or MPS
limits that the consumed capacity sets, are refused with the field that says
so; an MPS thread percentage of its own is kept where no compute is counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dracommon.quantity import Quantity, QuantityError
from draplugin.devices.model import Device
from draplugin.devices.shared import COMPUTE, COMPUTE_WHOLE, MEMORY, MEMORY_STEP_BYTES
from draplugin.prepare.errors import PlanError
from draplugin.prepare.gpuconfig import KIND, ConfigError, GpuConfig, SharingStrategy


@dataclass(frozen=True, slots=True)
class Share:
    """One allocation result with a `shareID`: its device, config and what it consumed."""

    device: Device
    request: str
    config: GpuConfig
    # consumedCapacity, in whole units (bytes for memory, percent for compute).
    consumed: Mapping[str, int]


def parse_consumed(raw: Any, where: str, who: str) -> dict[str, int]:
    """`consumedCapacity` of a result as whole numbers; PlanError naming the field when malformed."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise PlanError("InvalidClaim", f"claim {who}: {where} is not an object")
    consumed: dict[str, int] = {}
    for name, value in raw.items():
        try:
            quantity = Quantity.from_json(value)
        except QuantityError as err:
            raise PlanError("InvalidClaim", f"claim {who}: {where}[{name}]: {err}") from None
        if quantity.sign() < 0:
            raise PlanError("InvalidClaim", f"claim {who}: {where}[{name}] is negative: {value}")
        # Fractions round up: a limit is never below what was counted.
        consumed[str(name)] = -(-quantity.milli_value() // 1000)
    return consumed


def whole_memory(device: Device) -> int:
    """The memory a share must hold to hold the whole GPU: the policy's default (the whole memory in
    MiB), else the capacity itself."""
    policy = device.capacity_policies.get(MEMORY)
    text = policy.default if policy is not None else device.capacity.get(MEMORY, "0")
    return Quantity.parse(text).value() // MEMORY_STEP_BYTES * MEMORY_STEP_BYTES


def holds_whole(device: Device, consumed: Mapping[str, int]) -> bool:
    """Whether shares with these totals leave no room on the device for another claim."""
    if consumed.get(MEMORY, 0) < whole_memory(device):
        return False
    return COMPUTE not in device.capacity_policies or consumed.get(COMPUTE, 0) >= COMPUTE_WHOLE


def enforced_configs(shares: Sequence[Share], *, api_version: str, who: str) -> list[GpuConfig]:
    """The config each share is prepared with, in the order given: one MPS config for all the
    claim's partial shares (one set of client variables per container), the share's own config
    for whole ones."""
    totals: dict[str, dict[str, int]] = {}
    for share in shares:
        device_total = totals.setdefault(share.device.name, {})
        for name, amount in share.consumed.items():
            device_total[name] = device_total.get(name, 0) + amount
    partial = [s for s in shares if not holds_whole(s.device, totals[s.device.name])]
    if not partial:
        return [s.config for s in shares]
    limits: dict[str, int] = {}
    percentages: set[int] = set()
    for share in partial:
        name = share.device.name
        where = f"claim {who}: request {share.request} takes a share of GPU {name}"
        memory = totals[name].get(MEMORY)
        if memory is None:
            raise PlanError(
                "InvalidClaim",
                f"{where} without consumedCapacity.memory: the plugin cannot limit its memory",
            )
        limits[name] = memory
        compute = totals[name].get(COMPUTE) if COMPUTE in share.device.capacity_policies else None
        own = _own_thread_percentage(share, where, compute_counted=compute is not None)
        for percentage in (compute, own):
            if percentage is not None:
                percentages.add(min(percentage, COMPUTE_WHOLE))
    if len(percentages) > 1:
        raise PlanError(
            "UnsupportedSharing",
            f"claim {who}: its shared GPUs have different compute shares "
            f"({', '.join(map(str, sorted(percentages)))}); a claim's containers have one "
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        )
    mps: dict[str, Any] = {"perDevicePinnedMemoryLimit": {name: limits[name] for name in sorted(limits)}}
    if percentages:
        mps["defaultActiveThreadPercentage"] = percentages.pop()
    doc = {"apiVersion": api_version, "kind": KIND, "sharing": {"strategy": "MPS", "mpsConfig": mps}}
    # Imported here, not at the top: only partial shares derive a config to validate, and the
    # validator brings pydantic, which a plugin without them (nor opaque configs) never loads.
    from draplugin.prepare.claimconfig import validate_opaque_config

    try:
        derived = validate_opaque_config(doc, "consumedCapacity", api_version=api_version)
    except ConfigError as err:  # an amount outside what MPS takes (e.g. above 1 EiB)
        raise PlanError("InvalidClaim", f"claim {who}: {err}") from None
    whole = {s.device.name for s in shares} - {s.device.name for s in partial}
    return [s.config if s.device.name in whole else derived for s in shares]


def _own_thread_percentage(share: Share, where: str, *, compute_counted: bool) -> int | None:
    """The active thread percentage the share's own config asks for; PlanError where it contradicts
    the share."""
    sharing = share.config.sharing
    if sharing.strategy is SharingStrategy.TIME_SLICING:
        raise PlanError(
            "UnsupportedSharing",
            f"{where}; a shared GPU is enforced through MPS, so its config cannot ask for TimeSlicing "
            "(use no sharing config, or MPS)",
        )
    if sharing.strategy is not SharingStrategy.MPS or sharing.mps is None:
        return None
    mps = sharing.mps
    if mps.default_pinned_device_memory_limit is not None or mps.per_device_pinned_memory_limit:
        raise PlanError(
            "InvalidConfig",
            f"{where}; its memory limit is the memory it was allocated (capacity.requests.memory), "
            "so its config cannot set sharing.mpsConfig pinned memory limits",
        )
    if compute_counted and mps.default_active_thread_percentage is not None:
        raise PlanError(
            "InvalidConfig",
            f"{where}; its thread percentage is the compute it was allocated (capacity.requests.compute), "
            "so its config cannot set sharing.mpsConfig.defaultActiveThreadPercentage",
        )
    return mps.default_active_thread_percentage
