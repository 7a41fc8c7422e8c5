"""Shared whole GPUs (`--shared-gpus`): several claims hold one GPU, each a part of its capacity.

A shared GPU is published with `allowMultipleAllocations: true` and a
`requestPolicy` on the capacities that shares take (consumable capacity,
KEP-5075), so the scheduler counts what each claim takes and never hands out
more than the GPU has. Prepare enforces each share (`draplugin.prepare.shares`).

- `memory`: the GPU's memory. A share takes what its request asks
  (`capacity.requests.memory`), at least 1Gi, rounded up to whole MiB, the
  unit in which MPS sets a pinned device memory limit, so the limit prepare
  sets is exactly what the scheduler counted. A request that names no memory
  takes the whole memory (rounded down to MiB), so a claim written for a whole
  GPU still gets one.
- `compute` (mode `memory-and-compute` only): a share of the GPU's
  streaming multiprocessors in percent, 1 to 100, which prepare sets as the
  share's MPS active thread percentage (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of
  its containers, clients of the GPU's one MPS daemon): a cap on the SMs each
  of the share's CUDA contexts may run on, not a split of the GPU's time and
  not a guaranteed minimum (SMs one share leaves idle are not given to
  another beyond its cap). A request that names none takes 100:
  a claim that does not say how much compute it needs reserves all of it, so
  every claim on a GPU shared this way asks for both.

On the NVML backend each shared GPU also says whether the driver limits a
share's memory (`sharedMemoryLimit`): `nvml-cgroup` where discovery found
the driver's per-cgroup memory limit (`nvmlDeviceSetMemoryLimits_v1`) and
NVIDIA's `nvidia-cdi-hook` that applies it to each container (prepare adds the
hook, `draplugin.prepare.memlimits`), `none` where one is missing and
`--unlimited-shares=publish` publishes the shares anyway. With the default
`--unlimited-shares=skip` such a GPU is published whole, for one claim.

Only whole GPUs that draw from no counter set are shared: MIG devices are
already partitions, and a partitionable GPU's counters describe its MIG
slices, not shares.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    # Imported where used at run time: the settings import this module (its two enums) before
    # the kubelet plugin's sockets, and the device model is not needed to check them.
    from draplugin.devices.model import CapacityPolicy, Device


class SharedGpus(enum.StrEnum):
    """Which capacities of a whole GPU claims may take a part of."""

    OFF = "off"
    MEMORY = "memory"
    MEMORY_AND_COMPUTE = "memory-and-compute"


MEMORY: Final = "memory"
COMPUTE: Final = "compute"
# The whole GPU's compute, in percent of its streaming multiprocessors.
COMPUTE_WHOLE: Final = 100
MEMORY_MIN_BYTES: Final = 1 << 30
# MPS takes pinned device memory limits in whole MiB.
MEMORY_STEP_BYTES: Final = 1 << 20

# Whether the driver limits a share's memory: the attribute and its two values.
MEMORY_LIMIT_ATTRIBUTE: Final = "sharedMemoryLimit"
MEMORY_LIMIT_NVML: Final = "nvml-cgroup"
MEMORY_LIMIT_NONE: Final = "none"


class UnlimitedShares(enum.StrEnum):
    """What to publish for a shared GPU whose shares' memory the driver cannot limit."""

    SKIP = "skip"  # the GPU whole, for one claim
    PUBLISH = "publish"  # shares, with sharedMemoryLimit: none


@functools.cache
def compute_policy() -> CapacityPolicy:
    from draplugin.devices.model import CapacityPolicy

    return CapacityPolicy(default=str(COMPUTE_WHOLE), min="1", max=str(COMPUTE_WHOLE), step="1")


def memory_policy(memory_bytes: int) -> CapacityPolicy | None:
    """The memory policy of a GPU with this much memory; None when it is too small to share
    (the API server wants room for at least one step above the minimum)."""
    from draplugin.devices.model import CapacityPolicy, format_bytes

    whole_mib = memory_bytes // MEMORY_STEP_BYTES * MEMORY_STEP_BYTES
    if whole_mib < MEMORY_MIN_BYTES + MEMORY_STEP_BYTES:
        return None
    return CapacityPolicy(
        default=format_bytes(whole_mib),
        min=format_bytes(MEMORY_MIN_BYTES),
        step=format_bytes(MEMORY_STEP_BYTES),
    )


def share(device: Device, memory_bytes: int, mode: SharedGpus) -> Device:
    """The device as published in `mode`: unchanged when off, not a whole GPU, or too small."""
    if mode is SharedGpus.OFF or device.consumes_counters or device.parent_uuid is not None:
        return device
    memory = memory_policy(memory_bytes)
    if memory is None:
        return device
    capacity = dict(device.capacity)
    policies = {MEMORY: memory}
    if mode is SharedGpus.MEMORY_AND_COMPUTE:
        capacity[COMPUTE] = str(COMPUTE_WHOLE)
        policies[COMPUTE] = compute_policy()
    return dataclasses.replace(
        device, capacity=capacity, allow_multiple_allocations=True, capacity_policies=policies
    )


def is_shared(device: Device) -> bool:
    return device.allow_multiple_allocations and MEMORY in device.capacity_policies


def with_memory_limit(device: Device, limited: bool, policy: UnlimitedShares) -> Device:
    """A shared device as published when the driver can (`limited`) or cannot limit its shares'
    memory: marked `nvml-cgroup`; else unshared (skip) or marked `none` (publish)."""
    if not is_shared(device):
        return device
    if not limited and policy is UnlimitedShares.SKIP:
        capacity = {k: v for k, v in device.capacity.items() if k != COMPUTE}
        return dataclasses.replace(
            device, capacity=capacity, allow_multiple_allocations=False, capacity_policies={}
        )
    value = MEMORY_LIMIT_NVML if limited else MEMORY_LIMIT_NONE
    return dataclasses.replace(device, attributes={**device.attributes, MEMORY_LIMIT_ATTRIBUTE: value})
