"""A MIG device the plugin creates at prepare reaches a real container as device numbers only.

The plugin runs the NVML path with `--partitionable-mig` over the NVML double (one DGX H100
GPU, MIG mode on) on the root of NVIDIA's real 550.163.01 files. A claim asks for a
`1g.10gb` placement by a CEL selector on the published attributes; prepare creates the GPU
and compute instance through NVML, and the spec gives the claim's containers that MIG
device's `nvidia-caps` access nodes as `type: c` with the major of `nvidia-caps` in
`/proc/devices` and the minor of the instances' `access` files under
`/proc/driver/nvidia/capabilities`. No such node exists under the driver root's `dev`
(it holds `nvidia-cap1`/`nvidia-cap2`, config and monitor) or in the host's `/dev`, so the
node in the container was made by runc from the numbers in our spec.

The double writes what the kernel driver shows in `/proc` under its `procRoot`; the plugin
reads `/proc` itself (`NvmlBackend(proc_root="/proc")`, no flag sets it). So the plugin runs
in a mount namespace of its own (`unshare --mount`) in which the double's `driver` directory
is bind-mounted on `/proc/driver` and its `devices` on `/proc/devices`: the plugin's code
path is the production one, only its `/proc` shows the double's driver. The container's
`nvidia-smi -L` (NVIDIA's) reads the same state file and lists the GPU and the MIG device.

Not shown: a kernel enforcing MIG isolation through the capability node (no GPU here), or
runc's device cgroup rule for it being exercised by an open.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.chart import import_our_image
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi
from tests import nvidia_roots
from tests.e2e import nvml_double

pytestmark = pytest.mark.kubelet

PROFILE = "1g.10gb"
ONE_SLICE = (
    f'device.attributes["{DEFAULT_DRIVER_NAME}"].type == "mig"'
    f' && device.attributes["{DEFAULT_DRIVER_NAME}"].profile == "{PROFILE}"'
)
SCRIPT = """
for node in /dev/nvidia-caps/*; do echo "CAP $node $(stat -c '%F %t %T' "$node")"; done
nvidia-smi -L
"""


@pytest.fixture(scope="module")
def mig_root(tmp_path_factory: pytest.TempPathFactory) -> nvidia_roots.NvidiaRoot:
    return nvml_double.build_root(tmp_path_factory.mktemp("nvidia-mig") / "root", 1)


@pytest.fixture(scope="module")
def mig_configs(tmp_path_factory: pytest.TempPathFactory) -> nvml_double.DoubleConfigs:
    configs = nvml_double.write_configs(
        tmp_path_factory.mktemp("nvml-double-mig"),
        1,
        gpu_overrides=[{"index": 0, "migMode": 1}],
        with_proc=True,
        shared_state=True,
    )
    # The bind mounts below need the double's /proc files before the plugin starts.
    nvml_double.init_double(configs)
    return configs


def _proc_namespace(proc_root: Path) -> tuple[str, ...]:
    """A prefix that runs the plugin with the double's driver files on /proc (private mounts).

    `unshare` without `--fork` and `exec` keep the plugin's process the one PluginProcess started."""
    mounts = (
        f"mount --bind {shlex.quote(str(proc_root / 'driver'))} /proc/driver"
        f" && mount --bind {shlex.quote(str(proc_root / 'devices'))} /proc/devices"
        ' && exec "$@"'
    )
    return ("unshare", "--mount", "--propagation", "private", "sh", "-c", mounts, "sh")


@pytest.fixture(scope="module")
def mig_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    mig_root: nvidia_roots.NvidiaRoot,
    mig_configs: nvml_double.DoubleConfigs,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    assert mig_configs.proc_root is not None
    expected = nvml_double.backend_device_names(mig_root, mig_configs, partitionable=True)
    assert any("mig" in name for name in expected), expected
    with nvml_double.running_nvml_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("plugin"),
        mig_root,
        mig_configs,
        expected_devices=expected,
        backend_args=("--partitionable-mig=true",),
        command_prefix=_proc_namespace(mig_configs.proc_root),
    ) as process:
        yield process


def _access_numbers(proc_root: Path) -> dict[int, Path]:
    """The DeviceFileMinor of every MIG access file the double shows, with its file."""
    found: dict[int, Path] = {}
    for access in sorted((proc_root / "driver/nvidia/capabilities").glob("gpu*/mig/gi*/**/access")):
        fields = dict(line.split(":", 1) for line in access.read_text().splitlines() if ":" in line)
        found[int(fields["DeviceFileMinor"])] = access
    return found


def _caps_major(proc_root: Path) -> int:
    for line in (proc_root / "devices").read_text().splitlines():
        number, _, name = line.strip().partition(" ")
        if name.strip() == "nvidia-caps":
            return int(number)
    raise AssertionError(f"no nvidia-caps in {proc_root / 'devices'}")


def test_created_mig_device_has_its_caps_nodes_from_the_specs_numbers(
    api: KubeApi,
    mig_plugin: PluginProcess,
    kubelet_node: KubeletNode,
    test_namespace: str,
    gpu_device_class: str,
    mig_configs: nvml_double.DoubleConfigs,
    mig_root: nvidia_roots.NvidiaRoot,
) -> None:
    ns = test_namespace
    proc_root = mig_configs.proc_root
    assert proc_root is not None
    assert _access_numbers(proc_root) == {}, "the GPU starts with no MIG device"
    image = import_our_image(kubelet_node)
    with nvml_double.script_pod(
        api, mig_plugin, kubelet_node, ns, "mig", image.name, SCRIPT, mig_configs,
        device_class=gpu_device_class, claim="mig", cel=ONE_SLICE,
    ) as log:  # fmt: skip
        (device,) = nvml_double.allocated_devices(api, ns, "mig")
        published = nvml_double.published_devices(api, kubelet_node.name)
        assert published[device]["profile"] == {"string": PROFILE}, published[device]

        # Prepare made one GPU instance and one compute instance: two access files.
        access = _access_numbers(proc_root)
        assert len(access) == 2, access
        major = _caps_major(proc_root)
        caps = {
            line.split()[1]: line.split(" ", 2)[2]
            for line in log.splitlines()
            if line.startswith("CAP ")
        }  # fmt: skip
        for minor in access:
            path = f"/dev/nvidia-caps/nvidia-cap{minor}"
            assert caps.get(path) == f"character special file {major:x} {minor:x}", (path, caps)
            # Nowhere on the host to copy it from: runc made it from the spec's numbers.
            assert not (mig_root.path / "dev/nvidia-caps" / f"nvidia-cap{minor}").exists()
            assert not Path(path).exists(), f"{path} exists on the host"
        # Only this MIG device's nodes: not config/monitor (cap1, cap2) nor another instance's.
        assert sorted(caps) == sorted(f"/dev/nvidia-caps/nvidia-cap{minor}" for minor in access), caps

        # NVIDIA's nvidia-smi in the container sees the MIG device of that profile.
        mig_lines = [line.strip() for line in log.splitlines() if line.strip().startswith("MIG ")]
        assert len(mig_lines) == 1 and PROFILE in mig_lines[0], log
    # Unprepare destroyed it again.
    assert _access_numbers(proc_root) == {}, _access_numbers(proc_root)
