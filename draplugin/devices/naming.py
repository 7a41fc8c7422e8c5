"""How published devices are named: ours (`draplugin`), or NVIDIA's DRA driver's (`nvidia`).

The name is what the scheduler writes into a claim's allocation and what the
kubelet's pod-resources API reports per container (driver, pool, device), so
monitoring agents that know only NVIDIA's driver (DCGM exporter) can attribute
our devices when the driver name is `gpu.nvidia.com` and the names and
attributes are NVIDIA's (docs/monitoring-agents.md).

- `draplugin`: `gpu-<index>`, and `gpu-<index>-mig-<profile>[-<profile ID>]-<start>`
  for MIG devices (the profile without dots, as a DNS label; NVML's profile ID
  where the backend knows it, fake profiles have none).
- `nvidia`: as NVIDIA's kubelet plugin (k8s-dra-driver-gpu v25.12.0 and v0.4.0,
  cmd/gpu-kubelet-plugin: `GpuInfo.CanonicalName`, `MigSpecTuple.ToCanonicalName`):
  `gpu-<minor>`, and `gpu-<parent minor>-mig-<profile>-<profile ID>-<start>`,
  the profile with its dots dropped, lower-cased, every character outside
  `[a-z0-9-.]` replaced by `-` one for one and outer `-` trimmed
  (`toRFC1123Compliant`). The minor number is the `/dev/nvidia<minor>` node,
  which is not the NVML index on every machine. A fake MIG profile has no NVML
  ID, so its name lacks that part in both schemes; on NVML it is always there.

Both schemes put the parent first and the placement start last, so the parse
in `draplugin.prepare.mig.placement_of` reads either.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Final

# NVIDIA's DRA driver name (k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/main.go `DriverName`), the
# only one DCGM exporter maps (internal/pkg/transformation/const.go `DRAGPUDriverName`).
NVIDIA_DRIVER_NAME: Final = "gpu.nvidia.com"

_NOT_RFC1123: Final = re.compile(r"[^a-z0-9-.]")


class DeviceNaming(StrEnum):
    DRAPLUGIN = "draplugin"
    NVIDIA = "nvidia"


def gpu_name(naming: DeviceNaming, index: int, minor: int) -> str:
    """A whole GPU: `gpu-<index>` (ours) or `gpu-<minor>` (NVIDIA's)."""
    return f"gpu-{minor if naming is DeviceNaming.NVIDIA else index}"


def nvidia_profile_label(profile: str) -> str:
    """The profile part of NVIDIA's MIG names: "1g.24gb+me" → "1g24gb-me" (see the module doc)."""
    name = _NOT_RFC1123.sub("-", profile.replace(".", "").lower()).strip("-")
    return name.removesuffix(".")


def mig_name(
    naming: DeviceNaming,
    *,
    gpu_index: int,
    gpu_minor: int,
    profile: str,
    placement_start: int,
    profile_id: int | None = None,
    compute_slice_start: int | None = None,
) -> str:
    """A MIG device of the GPU with `gpu_index` and `gpu_minor` (see the module doc for both forms).

    A compute instance that is one part of its GPU instance ("1c.3g.40gb", which NVIDIA's driver
    does not publish) adds where it starts in the GPU instance, in both schemes.
    """
    if naming is DeviceNaming.NVIDIA:
        name = f"gpu-{gpu_minor}-mig-{nvidia_profile_label(profile)}"
    else:
        # Imported here: the settings import this module before the kubelet plugin's sockets,
        # and the device model is not needed to check them.
        from draplugin.devices.model import dns_label_from

        name = f"gpu-{gpu_index}-mig-{dns_label_from(profile.replace('.', ''))}"
    if profile_id is not None:
        name += f"-{profile_id}"
    name += f"-{placement_start}"
    if compute_slice_start is not None:
        name += f"-{compute_slice_start}"
    return name
