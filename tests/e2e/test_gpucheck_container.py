"""The GPU check's container step for real, without a GPU: runc, a minimal root filesystem and exactly
the spec's edits, with a stand-in `nvidia-smi` that proves what the container got.

The stand-in is a small C program (the minimal root filesystem has no shell):
it lists the claimed GPU as `nvidia-smi -L` does, but only after finding in
the container what a CUDA process needs from the spec: `/dev/nvidiactl` and
the claimed GPU's node open, `libcuda.so.1` and `libnvidia-ml.so.1` (ELF files)
at the multiarch path, `NVIDIA_VISIBLE_DEVICES=void`, and no other GPU's node.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot, host_arch
from draplugin.cdi.preview import preview_spec
from draplugin.devices import load_backend
from draplugin.gpucheck.container import run_container
from draplugin.gpucheck.table import MISMATCH, NODE, OK
from tests.driverroot_layout import debian_layout

STAND_IN = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int elf(const char *path) {
    char magic[4];
    int fd = open(path, O_RDONLY);
    if (fd < 0 || read(fd, magic, 4) != 4 || memcmp(magic, "\x7f" "ELF", 4) != 0) {
        fprintf(stderr, "not an ELF file: %s\n", path);
        return 0;
    }
    return 1;
}

int main(void) {
    const char *visible = getenv("NVIDIA_VISIBLE_DEVICES");
    const char *uuid = getenv("DRAPLUGIN_DEVICE_GPU_0_UUID");
    if (visible == NULL || strcmp(visible, "void") != 0) {
        fprintf(stderr, "NVIDIA_VISIBLE_DEVICES is not void\n");
        return 2;
    }
    if (open("/dev/nvidiactl", O_RDWR) < 0 || open("/dev/nvidia0", O_RDWR) < 0) { perror("open"); return 3; }
    if (access("/dev/nvidia1", F_OK) == 0) { fprintf(stderr, "another GPU's node\n"); return 4; }
    if (!elf(LIBDIR "/libcuda.so.1") || !elf(LIBDIR "/libnvidia-ml.so.1")) return 5;
    printf("GPU 0: Stand-in (UUID: %s)\n", uuid ? uuid : "none");
    return 0;
}
"""


def require(condition: bool, what: str) -> None:
    if not condition:
        pytest.fail(f"the container check needs {what}", pytrace=False)


def test_container_gets_exactly_the_claimed_gpu_and_the_driver_files(tmp_path: Path) -> None:
    runc = shutil.which("runc")
    require(runc is not None, "runc (tests/cluster/install_debs.sh installs it)")
    require(os.geteuid() == 0, "root (device nodes, mounts)")
    require(shutil.which("cc") is not None, "a C compiler for the stand-in nvidia-smi")
    arch = host_arch()
    root = debian_layout(lib_dir=f"usr/lib/{arch.multiarch}", machine=arch.machine, binaries=()).build(
        tmp_path / "driver"
    )
    source = tmp_path / "stand-in.c"
    source.write_text(STAND_IN)
    nvidia_smi = root / "usr/bin/nvidia-smi"
    subprocess.run(
        ["cc", f'-DLIBDIR="/usr/lib/{arch.multiarch}"', "-o", str(nvidia_smi), str(source)], check=True
    )
    backend = load_backend("fake", NODE, gpus=2, device_dir=str(tmp_path / "dev"))
    devices = {d.name: d for d in backend.discover()}
    files = DriverFiles(DriverRoot.at(str(root)))
    spec = preview_spec(devices, ["gpu-0"], driver="gpu.draplugin.dev", node=NODE, driver_files=files)
    assert runc is not None
    row = run_container(runc, spec, devices["gpu-0"], nvidia_smi)
    assert (row.status, row.ours) == (OK, devices["gpu-0"].uuid), row
    # A claim of gpu-1 has no /dev/nvidia0: the stand-in fails inside, and the check says so.
    other = preview_spec(devices, ["gpu-1"], driver="gpu.draplugin.dev", node=NODE, driver_files=files)
    wrong = run_container(runc, other, devices["gpu-1"], nvidia_smi)
    assert wrong.status == MISMATCH and "exit 3" in wrong.ours, wrong
