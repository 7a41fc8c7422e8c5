"""Which optional DRA features the allocator honours, and which release's rules apply."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Features:
    """Feature gates as kube-scheduler sees them. The defaults are Kubernetes 1.37's.

    `skip_unusable_pools` is the one behaviour change between releases that
    alters results: from 1.35 on, incomplete and invalid pools are skipped for
    allocation; 1.34 still allocated from incomplete pools (ExactCount) and
    failed hard when the search reached an invalid pool.
    """

    admin_access: bool = True
    prioritized_list: bool = True
    partitionable_devices: bool = True
    device_taints: bool = True
    consumable_capacity: bool = True
    binding_conditions: bool = True
    skip_unusable_pools: bool = True

    @classmethod
    def for_release(cls, minor: int) -> Features:
        """Default-on gates of Kubernetes 1.<minor> (1.34 or later)."""
        if minor >= 36:
            return cls()
        # 1.34/1.35: taints, partitionable devices, consumable capacity and
        # binding conditions were alpha (off by default).
        return cls(
            device_taints=False,
            partitionable_devices=False,
            consumable_capacity=False,
            binding_conditions=False,
            skip_unusable_pools=minor >= 35,
        )
