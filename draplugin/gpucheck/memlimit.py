"""`make gpu-check`, memory shares: the driver's per-cgroup memory limit on each whole GPU.

What NVIDIA's `nvidia-cdi-hook apply-cuda-memory-limits` does for a share's
container, done by this check on a scratch cgroup of its own, then undone:

1. `nvmlDeviceSetMemoryLimits_v1` with soft = hard = `LIMIT_MIB` on a new
   cgroup v2 directory, read back with `nvmlDeviceGetMemoryLimits_v1`.
2. From a process moved into that cgroup before it loads CUDA: `cuMemAlloc`
   of `BELOW_MIB` must succeed and of `PAST_MIB` must fail, through the
   driver's own `libcuda.so.1` with ctypes (no CUDA toolkit). Without a
   `libcuda.so.1` the row is skipped, saying so.
3. The limit cleared (soft 0, hard `NVML_DEVICE_MEMORY_LIMIT_MAX`) and the
   cgroup removed, also after a failure.

Needs root and cgroup v2 at `/sys/fs/cgroup` (what the hook needs); otherwise
the rows are skipped with the reason. `NOT_SUPPORTED` from the driver is a
skipped row naming it: the plugin then publishes that GPU whole
(`--unlimited-shares=skip`). Not yet run on a GPU.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid as uuidlib
from pathlib import Path
from typing import Any, Final

from draplugin.devices.memlimit_probe import CGROUP_ROOT, cgroup_problem
from draplugin.devices.model import Device
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row

MiB: Final = 1 << 20
LIMIT_MIB: Final = 1024
BELOW_MIB: Final = 256
PAST_MIB: Final = 2048
LIMIT_MAX: Final = 0xFFFFFFFFFFFFFFFF  # NVML_DEVICE_MEMORY_LIMIT_MAX: "no limit"
ALLOC_TIMEOUT_S: Final = 120.0

# The child: into the cgroup first, then CUDA on the one visible GPU; prints "<MiB> <CUresult>" per try.
_ALLOCATE = """
import ctypes, sys
open(sys.argv[1] + "/cgroup.procs", "w").write("0")  # this process, before CUDA sees the GPU
cuda = ctypes.CDLL("libcuda.so.1")
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
steps = (
    lambda: cuda.cuInit(0),
    lambda: cuda.cuDeviceGet(ctypes.byref(dev), 0),
    lambda: cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev),
)
for step in steps:
    rc = step()
    if rc:
        print("setup", rc)
        sys.exit(0)
for mib in map(int, sys.argv[2:]):
    rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(mib << 20))
    print(mib, rc)
    if rc == 0:
        cuda.cuMemFree_v2(ptr)
"""


def memory_limit_rows(
    nvml: Any,
    gpu: Device,
    *,
    cgroup_root: str = CGROUP_ROOT,
    mounts_file: str = "/proc/self/mounts",
    allocate: bool = True,
) -> list[Row]:
    """The rows for one whole GPU; `cgroup_root` and `mounts_file` are for tests without a v2 host,
    `allocate` False leaves out the allocation row (it needs the driver's libcuda)."""
    subject = f"{gpu.name} ({gpu.uuid})"
    if not hasattr(nvml, "c_nvmlSetMemoryLimits_v1_t"):
        return [
            Row("memory limit", subject, "this nvidia-ml-py has no nvmlDeviceSetMemoryLimits_v1", "", SKIPPED)
        ]
    if os.geteuid() != 0:
        return [Row("memory limit", subject, "needs root (cgroups, NVML limits)", "", SKIPPED)]
    problem = cgroup_problem(mounts_file)
    if problem is not None:
        return [Row("memory limit", subject, problem, "", SKIPPED)]
    handle = nvml.nvmlDeviceGetHandleByUUID(gpu.uuid)
    cgroup = Path(cgroup_root) / f"draplugin-gpu-check-{uuidlib.uuid4().hex[:12]}"
    cgroup.mkdir()
    rows: list[Row] = []
    try:
        try:
            _set(nvml, handle, str(cgroup), LIMIT_MIB * MiB, LIMIT_MIB * MiB)
        except nvml.NVMLError as err:
            status = SKIPPED if isinstance(err, nvml.NVMLError_NotSupported) else MISMATCH
            return [
                Row("memory limit set", subject, f"nvmlDeviceSetMemoryLimits_v1: {err}", "success", status)
            ]
        soft, hard = _get(nvml, handle, str(cgroup))
        ours = f"{soft // MiB}/{hard // MiB} MiB"
        expected = f"{LIMIT_MIB}/{LIMIT_MIB} MiB"
        rows.append(
            Row("memory limit read back", subject, ours, expected, OK if ours == expected else MISMATCH)
        )
        if allocate:
            rows.append(_allocation_row(subject, gpu.uuid, cgroup))
    finally:
        with contextlib.suppress(nvml.NVMLError):  # removing the cgroup clears the limit too
            _set(nvml, handle, str(cgroup), 0, LIMIT_MAX)
        cgroup.rmdir()
    return rows


def _set(nvml: Any, handle: Any, cgroup: str, soft: int, hard: int) -> None:
    limits = nvml.c_nvmlSetMemoryLimits_v1_t()
    limits.nameSpace, limits.softLimit, limits.hardLimit = cgroup.encode(), soft, hard
    nvml.nvmlDeviceSetMemoryLimits_v1(handle, limits)


def _get(nvml: Any, handle: Any, cgroup: str) -> tuple[int, int]:
    limits = nvml.c_nvmlGetMemoryLimits_v1_t()
    limits.nameSpace = cgroup.encode()
    nvml.nvmlDeviceGetMemoryLimits_v1(handle, limits)
    return int(limits.softLimit), int(limits.hardLimit)


def _allocation_row(subject: str, uuid: str, cgroup: Path) -> Row:
    expected = f"{BELOW_MIB} MiB ok, {PAST_MIB} MiB refused"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": uuid}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _ALLOCATE, str(cgroup), str(BELOW_MIB), str(PAST_MIB)],
            capture_output=True, text=True, timeout=ALLOC_TIMEOUT_S, check=False, env=env,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as err:
        return Row("memory limit allocation", subject, f"cannot run: {err}", expected, MISMATCH)
    if "libcuda.so.1" in done.stderr and "OSError" in done.stderr:
        return Row("memory limit allocation", subject, "no libcuda.so.1 to allocate with", expected, SKIPPED)
    answers = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    if "setup" in answers or done.returncode != 0:
        ours = f"CUDA setup failed: {answers.get('setup', done.stderr.strip()[-200:])}"
        return Row("memory limit allocation", subject, ours, expected, MISMATCH)
    below, past = answers.get(str(BELOW_MIB)), answers.get(str(PAST_MIB))
    ours = f"{BELOW_MIB} MiB -> CUresult {below}, {PAST_MIB} MiB -> CUresult {past}"
    ok = below == "0" and past not in (None, "0")
    return Row("memory limit allocation", subject, ours, expected, OK if ok else MISMATCH)
