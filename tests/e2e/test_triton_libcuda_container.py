"""Triton's libcuda discovery, run in a real container on our spec, finds the driver's libcuda.

The project's issue: Triton's `libcuda_dirs()` (`third_party/nvidia/backend/driver.py`,
installed as `triton/backends/nvidia/driver.py`; torch.compile and vLLM compile their
kernels through it) asserts "libcuda.so cannot found!" when it finds no directory with
`libcuda.so`. Its logic: `TRITON_LIBCUDA_PATH` if set, as the only directory; else the
lines of `/sbin/ldconfig -p` naming `libcuda.so.1`, their directories; else, when that
found none, the `LD_LIBRARY_PATH` directories holding `libcuda.so.1`; then the assertion
that `libcuda.so` exists in one of them. Triton then links its launcher `-lcuda` with
`-L` on those directories.

The container (our image, Debian bookworm with python3) runs that logic, written out
here (behaviour, not Triton's code; Triton itself is not in the image), on the spec's
environment, and again as if the variable were unset. Expected, and asserted:

- with `TRITON_LIBCUDA_PATH` (our spec sets it to `/usr/lib/x86_64-linux-gnu`) the
  directory is returned and its `libcuda.so` is NVIDIA's real `libcuda.so.550.163.01`
  of the driver root, byte for byte (`md5sum`), and loads: `dlopen("libcuda.so")` and
  `cuDriverGetVersion` answer 12040 (CUDA 12.4, the 550 driver's) without a GPU;
- without it, `/sbin/ldconfig -p` of the image lists none of the driver's libraries
  (our spec is hook-free: nothing runs `ldconfig` in the container, and the image's
  cache was built before our mounts existed), so Triton's fallback would fail with its
  assertion, and `ctypes.util.find_library("cuda")` (which on glibc parses the same
  `ldconfig -p`) returns None, while `dlopen("libcuda.so.1")` by name works, because
  the loader searches its default directories, not only the cache.

Not shown: Triton compiling or launching a kernel (no GPU, no Triton here), nor
`cuInit` succeeding (the root's `/dev/nvidiactl` has no kernel driver behind it).
"""

from __future__ import annotations

import hashlib
import json

import pytest

from devcluster import pods
from devcluster.chart import import_our_image
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from tests import nvidia_roots
from tests.e2e import nvml_double

pytestmark = pytest.mark.kubelet

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
# Triton's libcuda_dirs() as it behaves, one JSON line per way of calling it; then what
# else asks the loader cache (find_library) and what does not (dlopen by name).
DISCOVERY = r"""
python3 - <<'PY'
import ctypes, ctypes.util, json, os, subprocess

def libcuda_dirs(env_path):
    if env_path:
        dirs = [env_path]
    else:
        listing = subprocess.check_output(["/sbin/ldconfig", "-p"]).decode(errors="ignore")
        # lines look like: libcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1
        locations = [line.split()[-1] for line in listing.splitlines() if "libcuda.so.1" in line]
        dirs = [os.path.dirname(location) for location in locations]
        search = os.getenv("LD_LIBRARY_PATH")
        if search and not dirs:
            dirs = [d for d in search.split(":") if os.path.exists(os.path.join(d, "libcuda.so.1"))]
    found = any(os.path.exists(os.path.join(d, "libcuda.so")) for d in dirs)
    return {"dirs": dirs, "found": found}

print("TRITON " + json.dumps({
    "env": os.environ.get("TRITON_LIBCUDA_PATH"),
    "with_env": libcuda_dirs(os.environ.get("TRITON_LIBCUDA_PATH")),
    "without_env": libcuda_dirs(None),
    "find_library": ctypes.util.find_library("cuda"),
}))
cuda = ctypes.CDLL(os.path.join(libcuda_dirs(os.environ.get("TRITON_LIBCUDA_PATH"))["dirs"][0], "libcuda.so"))
version = ctypes.c_int()
by_name = ctypes.CDLL("libcuda.so.1")
print("CUDA " + json.dumps({
    "rc": cuda.cuDriverGetVersion(ctypes.byref(version)),
    "version": version.value,
    "same_handle": by_name._handle == cuda._handle,
}))
PY
"""


def _record(log: str, tag: str) -> dict[str, object]:
    lines = [line for line in log.splitlines() if line.startswith(f"{tag} ")]
    assert len(lines) == 1, log
    found: dict[str, object] = json.loads(lines[0].removeprefix(f"{tag} "))
    return found


def test_triton_libcuda_dirs_finds_the_drivers_libcuda(
    api: KubeApi,
    nvml_plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    double_configs: nvml_double.DoubleConfigs,
    nvidia_root: nvidia_roots.NvidiaRoot,
) -> None:
    ns = test_namespace
    image = import_our_image(kubelet_node)
    host_libcuda = nvidia_root.path / nvidia_root.lib_dir / f"libcuda.so.{nvidia_root.version}"
    host_md5 = hashlib.md5(host_libcuda.read_bytes()).hexdigest()
    with nvml_double.script_pod(
        api, nvml_plugin, kubelet_node, ns, "triton", image.name, DISCOVERY, double_configs,
        device_class=gpu_device_class,
    ) as log:  # fmt: skip
        triton = _record(log, "TRITON")
        assert triton["env"] == LIB_DIR, triton
        assert triton["with_env"] == {"dirs": [LIB_DIR], "found": True}, triton

        # The directory's libcuda.so is the root's real libcuda, byte for byte.
        code, out, err = pods.exec_in(api, ns, "triton", "app", ["md5sum", f"{LIB_DIR}/libcuda.so"])
        assert code == 0, err
        assert out.split()[0] == host_md5, (out, host_md5)
        cuda = _record(log, "CUDA")
        # NVIDIA's libcuda answers without a GPU; libcuda.so and libcuda.so.1 are one loaded object.
        assert cuda == {"rc": 0, "version": 12040, "same_handle": True}, cuda

        # Hook-free: the image's loader cache does not list our mounts, so Triton's fallback and
        # anything else that parses `ldconfig -p` find nothing. This is recorded, not wished away:
        # should the spec ever update the cache, this assertion says so.
        code, listing, err = pods.exec_in(api, ns, "triton", "app", ["/sbin/ldconfig", "-p"])
        assert code == 0, err
        assert "libc.so.6" in listing, listing  # the cache itself is there and read
        nvidia = [line for line in listing.splitlines() if "libcuda" in line or "libnvidia" in line]
        assert nvidia == [], nvidia
        assert triton["without_env"] == {"dirs": [], "found": False}, triton
        assert triton["find_library"] is None, triton
