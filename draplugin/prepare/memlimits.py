"""Memory shares of a shared GPU as the driver's per-cgroup memory limits (pure).

A share of a GPU published with `sharedMemoryLimit: nvml-cgroup`
(`draplugin.devices.shared`) gets, in its CDI device, NVIDIA's own
`nvidia-cdi-hook apply-cuda-memory-limits --driver-root <root> --gpu-id <uuid>`
as a `createRuntime` hook, and `NVIDIA_GPU_MEMORY_LIMIT` /
`NVIDIA_GPU_MEMORY_REQUEST` (MiB) in the container's environment. The hook
(NVIDIA Container Toolkit 1.20, `cmd/nvidia-cdi-hook/apply-cuda-memory-limits`)
reads both from the container's OCI spec, finds the container's cgroup from
`/proc/<pid>/cgroup` and calls `nvmlDeviceSetMemoryLimits_v1` on the GPU for it:
the runtime runs `createRuntime` hooks after the container process is in its
cgroup and before the user's program starts (`docs/sharing.md`). Hard limit
and request are both the share's memory: what the scheduler counted.

A claim's shares of one GPU under several share IDs are one CDI device, so
the limit is their sum; a claim whose shares hold the whole GPU gets none
(`draplugin.prepare.shares` prepares it like an exclusive GPU).

`check_memory_fits` refuses a plan whose shares, with those of the claims
already prepared on the node, take more of a GPU's memory than it has: the
scheduler never allocates that, so only a hand-written allocation can.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Final, Protocol

from draplugin.cdi import spec as cdi
from draplugin.devices.model import Device
from draplugin.devices.shared import MEMORY_LIMIT_ATTRIBUTE, MEMORY_LIMIT_NVML, MEMORY_STEP_BYTES
from draplugin.prepare.errors import PlanError
from draplugin.prepare.gpuconfig import ConfigError, GpuConfig, SharingStrategy
from draplugin.prepare.shares import whole_memory
from draplugin.prepare.storedconfig import read_stored_config

if TYPE_CHECKING:
    from draplugin.checkpoint import ClaimRecord


class PlannedShare(Protocol):
    """What this module reads of a planned device (`draplugin.prepare.plan.PlannedDevice`, which
    imports this module)."""

    @property
    def device(self) -> Device: ...
    @property
    def config(self) -> GpuConfig: ...
    @property
    def share_id(self) -> str | None: ...
    @property
    def admin_access(self) -> bool: ...


class ClaimOf(Protocol):
    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...


class PlanOf(Protocol):
    """What this module reads of a claim's plan (`draplugin.prepare.plan.ClaimPlan`)."""

    @property
    def claim(self) -> ClaimOf: ...
    @property
    def devices(self) -> Sequence[PlannedShare]: ...


# What NVIDIA's hook reads from the container's environment, in MiB.
LIMIT_ENV: Final = "NVIDIA_GPU_MEMORY_LIMIT"
REQUEST_ENV: Final = "NVIDIA_GPU_MEMORY_REQUEST"
HOOK_COMMAND: Final = "apply-cuda-memory-limits"


@dataclass(frozen=True, slots=True)
class MemoryLimitHook:
    """Where NVIDIA's hook is on the host and the driver root it finds libnvidia-ml.so.1 under."""

    path: str
    driver_root: str = "/"

    def edits(self, device: Device, limit_bytes: int) -> tuple[tuple[str, ...], tuple[cdi.Hook, ...]]:
        """The env and hook of a container that may use `limit_bytes` of the device's memory."""
        mib = limit_bytes // MEMORY_STEP_BYTES
        # argv[0] as NVIDIA writes it: the hook binary answers its subcommands at top level.
        args = (
            PurePosixPath(self.path).name,
            HOOK_COMMAND,
            "--driver-root",
            self.driver_root,
            "--gpu-id",
            device.uuid,
        )
        env = (f"{LIMIT_ENV}={mib}", f"{REQUEST_ENV}={mib}")
        return env, (cdi.Hook("createRuntime", self.path, args),)


def limited(device: Device) -> bool:
    """Whether discovery found the driver's per-cgroup limit usable for shares of this device."""
    return device.attributes.get(MEMORY_LIMIT_ATTRIBUTE) == MEMORY_LIMIT_NVML


def share_limit(planned: PlannedShare) -> int | None:
    """Bytes of the device's memory the claim's share holds; None when it is no partial share."""
    if planned.share_id is None:
        return None
    return _limit_of(planned.config, planned.device.name)


def _limit_of(config: GpuConfig, device_name: str) -> int | None:
    sharing = config.sharing
    if sharing.strategy is not SharingStrategy.MPS or sharing.mps is None:
        return None  # a share holding the whole GPU keeps the claim's own config
    return sharing.mps.per_device_pinned_memory_limit.get(device_name)


def device_edits(
    planned: PlannedShare, hook: MemoryLimitHook | None
) -> tuple[tuple[str, ...], tuple[cdi.Hook, ...]]:
    """The memory-limit env and hook of one planned device's CDI device; empty when it has none."""
    limit = share_limit(planned)
    if hook is None or limit is None or not limited(planned.device):
        return (), ()
    return hook.edits(planned.device, limit)


def check_memory_fits(plan: PlanOf, holders: Iterable[ClaimRecord]) -> None:
    """PlanError when the plan's shares and the prepared claims' shares of a GPU exceed its memory."""
    mine: dict[str, int] = {}
    devices: dict[str, Device] = {}
    for planned in plan.devices:
        if planned.share_id is None or planned.admin_access:
            continue
        amount = share_limit(planned)
        mine[planned.device.name] = amount if amount is not None else whole_memory(planned.device)
        devices[planned.device.name] = planned.device
    if not mine:
        return
    held: dict[str, list[tuple[str, int]]] = {name: [] for name in mine}
    for record in holders:
        if record.uid == plan.claim.uid:
            continue
        for device in record.devices:
            if device.device not in mine or device.share_id is None or device.admin_access:
                continue
            amount = _held_amount(device.config, device.device, plan)
            held[device.device].append(
                (f"{record.namespace}/{record.name}", amount or whole_memory(devices[device.device]))
            )
    for name, amount in sorted(mine.items()):
        total = amount + sum(a for _, a in held[name])
        capacity = whole_memory(devices[name])
        if total > capacity:
            others = ", ".join(f"{who} {a // MEMORY_STEP_BYTES} MiB" for who, a in held[name]) or "none"
            raise PlanError(
                "MemoryOverCommitted",
                f"claim {plan.claim.namespace}/{plan.claim.name}: its share of GPU {name} "
                f"({amount // MEMORY_STEP_BYTES} MiB) and the shares already prepared on it ({others}) "
                f"take {total // MEMORY_STEP_BYTES} MiB of its {capacity // MEMORY_STEP_BYTES} MiB: "
                "the scheduler never allocates this, so the allocation was not the scheduler's",
            )


def _held_amount(config: Mapping[str, object] | None, device_name: str, plan: PlanOf) -> int | None:
    """A prepared share's memory from its checkpointed config; None: it held the whole GPU."""
    if config is None:
        return None
    api_version = plan.devices[0].config.api_version
    with contextlib.suppress(ConfigError):
        return _limit_of(read_stored_config(config, "checkpoint", api_version=api_version), device_name)
    return None
