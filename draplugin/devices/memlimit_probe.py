"""Whether a GPU's shares can get the driver's per-cgroup memory limit, found at discovery.

Three things must hold, the last two being what NVIDIA's
`nvidia-cdi-hook apply-cuda-memory-limits` (toolkit 1.20.2) needs to succeed:

- the hook binary is where `--nvidia-cdi-hook-path` says (a missing one fails
  every container of the share at create);
- `/sys/fs/cgroup` is cgroup v2 (the hook refuses otherwise: "setting GPU
  memory limits is only supported in cgroup v2"); read from the mount table,
  as a container of the plugin on a cgroup v1 host sees v1 there too;
- the GPU answers `nvmlDeviceGetMemoryLimits_v1` for an existing cgroup with
  a limit or `NOT_FOUND` (no limit yet). `NOT_SUPPORTED` (an older driver, a
  GPU the driver does not offer it on), a library without the function, or
  any other error means the limit cannot be relied on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

CGROUP_ROOT: Final = "/sys/fs/cgroup"


@dataclass(frozen=True, slots=True)
class NodeSupport:
    """The node-wide part: None when it holds, else why not."""

    problem: str | None


def node_support(hook_path: str | None, mounts_file: str = "/proc/self/mounts") -> NodeSupport:
    if hook_path is None:
        return NodeSupport("no --nvidia-cdi-hook-path is set (NVIDIA's nvidia-cdi-hook applies the limit)")
    if not os.access(hook_path, os.X_OK):
        return NodeSupport(f"--nvidia-cdi-hook-path {hook_path} is not an executable file")
    return NodeSupport(cgroup_problem(mounts_file))


def cgroup_problem(mounts_file: str = "/proc/self/mounts") -> str | None:
    """None when /sys/fs/cgroup is cgroup v2, else what it is."""
    fstype = _mount_type(mounts_file, CGROUP_ROOT)
    if fstype == "cgroup2":
        return None
    found = f"{fstype}" if fstype else "nothing"
    return f"{CGROUP_ROOT} is {found}, not cgroup v2, and nvidia-cdi-hook limits only cgroup v2"


def _mount_type(mounts_file: str, mount_point: str) -> str | None:
    """The type of what is mounted at `mount_point` last (what a lookup of the path sees)."""
    found = None
    try:
        with open(mounts_file, encoding="utf-8") as table:
            for line in table:
                fields = line.split()
                if len(fields) >= 3 and fields[1] == mount_point:
                    found = fields[2]
    except OSError:
        return None
    return found


def gpu_problem(nvml: Any, handle: Any, cgroup: str = CGROUP_ROOT) -> str | None:
    """None when the GPU answers the per-cgroup memory limit call, else the answer it gave."""
    limits_type = getattr(nvml, "c_nvmlGetMemoryLimits_v1_t", None)
    if limits_type is None:
        return "this nvidia-ml-py has no nvmlDeviceGetMemoryLimits_v1"
    limits = limits_type()
    limits.nameSpace = cgroup.encode()
    try:
        nvml.nvmlDeviceGetMemoryLimits_v1(handle, limits)
    except nvml.NVMLError_NotFound:
        return None  # supported; no limit on that cgroup
    except nvml.NVMLError as err:
        return f"nvmlDeviceGetMemoryLimits_v1 answers {err}"
    return None
