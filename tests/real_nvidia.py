"""Driver roots holding NVIDIA's real user-space tools, from Debian's non-free 550.163.01 packages.

`tests/cluster/fetch_nvidia_debs.sh` unpacks the packages into a cache
(`tree/`); this builds a small driver root from it: the real `nvidia-smi`,
`nvidia-cuda-mps-control` and `nvidia-cuda-mps-server`, `libnvidia-ml` and
`libcuda`, hard-linked (copied across file systems). Nothing here needs a GPU:
without one, the real `nvidia-smi` that finds its NVML exits 9 ("couldn't
communicate with the NVIDIA driver"), one that does not exits 12; the MPS
control daemon starts, answers its control protocol, and the server it starts
fails with "no CUDA-capable device" once it has loaded libcuda.

Tests skip when the cache is not there (the fetch needs the network once).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

VERSION = "550.163.01"
CACHE = Path.home() / ".cache/draplugin-kube/nvidia-debs-550.163.01-2"
# Exit statuses of the real nvidia-smi: NVML not found; found, but no driver to talk to.
SMI_NO_NVML = 12
SMI_NO_DRIVER = 9
# Where Debian's packages put the files in their tree.
_DEBIAN_LIBS = "usr/lib/x86_64-linux-gnu/nvidia/current"
_FILES = {
    "usr/lib/nvidia/current/nvidia-smi": "usr/bin/nvidia-smi",  # the alternatives link's target
    "usr/bin/nvidia-cuda-mps-control": "usr/bin/nvidia-cuda-mps-control",
    "usr/sbin/nvidia-cuda-mps-server": "usr/sbin/nvidia-cuda-mps-server",
}
_LIBRARIES = {"libnvidia-ml": "libnvidia-ml.so.1", "libcuda": "libcuda.so.1"}


def tree() -> Path | None:
    root = Path(os.environ.get("DRA_NVIDIA_DEBS_DIR") or CACHE) / "tree"
    return root if (root / "usr/lib/nvidia/current/nvidia-smi").is_file() else None


def real_driver_root(dest: Path, lib_dir: str = "usr/lib/x86_64-linux-gnu") -> Path:
    """A driver root at `dest` with the real tools and libraries (`lib_dir`: where the libraries go)."""
    source = tree()
    if source is None:
        pytest.skip("no NVIDIA 550.163.01 packages cached (tests/cluster/fetch_nvidia_debs.sh)")
    for found, placed in _FILES.items():
        _link(source / found, dest / placed)
    for name, soname in _LIBRARIES.items():
        real = f"{name}.so.{VERSION}"
        _link(source / _DEBIAN_LIBS / real, dest / lib_dir / real)
        (dest / lib_dir / soname).symlink_to(real)
    return dest


def _link(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)
