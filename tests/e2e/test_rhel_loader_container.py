"""NVIDIA's real `nvidia-smi -L` lists the claimed GPU in a rootfs whose loader searches only RHEL's path.

The image is `tests/e2e/rhel_image.py`'s: glibc's loader and libraries in `/lib64`, the
loader's compiled-in system directories rewritten to RHEL's `/lib64/` and `/usr/lib64/`
(plus two that do not exist), no `ld.so.cache`, `/etc/ld.so.conf` naming `/usr/lib64`,
and the CUDA UBI images' `LD_LIBRARY_PATH` (`/usr/local/nvidia/lib:/usr/local/nvidia/lib64`,
empty here). The plugin runs the NVML path over the NVML double on the root of NVIDIA's
real 550.163.01 files, as in `test_nvidia_smi_container.py`; our spec mounts every library
in `/usr/lib/x86_64-linux-gnu` and in `/usr/lib64`, and `nvidia-smi` at `/usr/bin`.

What this proves: a loader that searches what a RHEL-family loader searches finds the
driver's NVML through our spec's `/usr/lib64` copy, and NVIDIA's `nvidia-smi` (its own
dependencies from `/lib64`) lists exactly the claimed GPU. `LD_DEBUG=libs` shows the copy
that was loaded (`/usr/lib64/libnvidia-ml.so.1`) and that no multiarch path was tried,
although the spec's multiarch copy is there in the container too; the loader's
`--help` shows its search path.

What it does not: this is not a UBI or Rocky image. Its glibc is Debian's 2.36 with a
patched table, not RHEL's build; RHEL's `ld.so.cache` (which a real image has, listing
its own libraries, never our mounts) and RHEL's own packages are not involved.
"""

from __future__ import annotations

import re

import pytest

from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.kubeapi import KubeApi
from tests.e2e import nvml_double, rhel_image

pytestmark = pytest.mark.kubelet

SCRIPT = f"""
/lib64/ld-linux-x86-64.so.2 --help | sed -n 's/^ *\\(.*\\) (system search path)$/SYSDIR \\1/p'
for d in {" ".join(rhel_image.ABSENT_DIRS)} /etc/ld.so.cache /lib/x86_64-linux-gnu; do
  test -e $d && echo "PRESENT $d"
done
test -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 && echo "MULTIARCH-COPY present"
LD_DEBUG=libs nvidia-smi -L 2>/tmp/ld.log
rc=$?
sed 's/^/LD /' /tmp/ld.log
(exit $rc)
"""


def test_nvidia_smi_finds_nvml_in_usr_lib64_with_rhels_search_path(
    api: KubeApi,
    nvml_plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    double_configs: nvml_double.DoubleConfigs,
) -> None:
    ns = test_namespace
    image = rhel_image.import_rhel_image(kubelet_node)
    uuids = nvml_double.published_uuids(api, kubelet_node.name)
    with nvml_double.script_pod(
        api, nvml_plugin, kubelet_node, ns, "rhel", image.name, SCRIPT, double_configs,
        device_class=gpu_device_class,
    ) as log:  # fmt: skip
        (claimed,) = nvml_double.allocated_devices(api, ns, "gpu")

        # The loader searches RHEL's directories, and the ones it has besides do not exist.
        system_dirs = [
            re.sub("/+", "/", line.split(" ", 1)[1])
            for line in log.splitlines()
            if line.startswith("SYSDIR ")
        ]
        assert system_dirs == ["/lib64/", "/usr/lib64/", *rhel_image.ABSENT_DIRS], log
        assert "PRESENT" not in log, log
        # Our spec's multiarch copy is in the container: which one is loaded is the loader's choice.
        assert "MULTIARCH-COPY present" in log, log

        ld = [re.sub("/+", "/", line) for line in log.splitlines() if line.startswith("LD ")]
        inits = [line.split("calling init: ", 1)[1].strip() for line in ld if "calling init: " in line]
        assert "/usr/lib64/libnvidia-ml.so.1" in inits, "\n".join(ld)
        assert not [line for line in ld if "x86_64-linux-gnu" in line], "\n".join(ld)

        lines = [line for line in log.splitlines() if line.startswith("GPU ")]
        assert len(lines) == 1, log
        assert f"(UUID: {uuids[claimed]})" in lines[0], (claimed, log)
        others = [uuid for name, uuid in uuids.items() if name != claimed]
        assert not any(uuid in log for uuid in others), log
