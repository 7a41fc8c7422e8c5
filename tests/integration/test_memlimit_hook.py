"""The hook our CDI spec gives a share, run as runc runs a createRuntime hook, with NVIDIA's own
`nvidia-cdi-hook` (Container Toolkit v1.20.2, `build_nvidia_ctk.sh`) over the NVML double.

runc runs a hook with the hook entry's argv and env, the container's OCI state on stdin, after it
has put the container's init process into the container's cgroup. Here: the spec's hook entry as
rendered by prepare, a bundle whose config.json holds the env our CDI device adds, and a process
in a cgroup v2 directory of its own. The hook finds the cgroup from /proc/<pid>/cgroup and sets the
limit through NVML; the double records it. What no runtime is needed for is shown here; the order
of cgroup placement and hooks in runc is in docs/sharing.md (read from runc's source, not run).

NVIDIA's hook refuses a host whose /sys/fs/cgroup is not cgroup v2. On a hybrid host (cgroup v1
controllers, the v2 hierarchy at /sys/fs/cgroup/unified, as this project's test machines) the hook
and the readers run in a mount namespace of their own where that v2 hierarchy is bind-mounted at
/sys/fs/cgroup: the hook then sees the layout of a cgroup v2 host.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from draplugin.devices.schema import GpuInfo, SystemInfo, build_devices
from draplugin.devices.shared import SharedGpus, UnlimitedShares, with_memory_limit
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.memlimits import MemoryLimitHook
from draplugin.prepare.plan import plan_claim, render_spec
from tests import cgroupv2, nvidia_roots, nvmldouble
from tests.nvmldouble import Gpu, MemoryLimitCall, NvmlDouble
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, result

MiB = 1 << 20
NOT_SUPPORTED = 3  # NVML_ERROR_NOT_SUPPORTED


@pytest.fixture(scope="module")
def v2_view() -> tuple[Path, list[str]]:
    """Where cgroup v2 directories are made in this process's view, and the argv prefix that runs
    a command where /sys/fs/cgroup is cgroup v2 (empty on a cgroup v2 host)."""
    if os.geteuid() != 0:
        pytest.fail("this test makes cgroups and mount namespaces: it needs root")
    root, prefix = cgroupv2.v2_view()
    return root, list(prefix)


@pytest.fixture
def double(tmp_path: Path) -> NvmlDouble:
    return nvmldouble.nvml_double_factory(tmp_path)(
        "dgxh100", gpus=2, overrides=[Gpu(index=1, memory_limits=False)]
    )


@pytest.fixture
def driver_root(tmp_path: Path) -> Path:
    """A driver root whose libnvidia-ml.so.1 (where the hook's library locator looks) is the double."""
    lib_dir = tmp_path / "root" / "usr" / "lib" / "x86_64-linux-gnu"
    lib_dir.mkdir(parents=True)
    shutil.copy(nvmldouble.lib_path(), lib_dir / "libnvidia-ml.so.1")
    return tmp_path / "root"


class Container:
    """A process in a cgroup of its own: what runc has made when it runs createRuntime hooks."""

    def __init__(self, v2_root: Path) -> None:
        self.cgroup = v2_root / f"draplugin-memlimit-{uuidlib.uuid4().hex[:12]}"
        self.cgroup.mkdir()
        self.process = subprocess.Popen(["sleep", "300"])
        (self.cgroup / "cgroup.procs").write_text(str(self.process.pid))

    def host_cgroup(self) -> str:
        """The cgroup path as a process on a cgroup v2 host names it: /sys/fs/cgroup + its 0:: line."""
        (line,) = [
            x
            for x in Path(f"/proc/{self.process.pid}/cgroup").read_text().splitlines()
            if x.startswith("0::")
        ]
        return "/sys/fs/cgroup" + line.removeprefix("0::")

    def remove(self) -> None:
        self.process.kill()
        self.process.wait()
        if self.cgroup.exists():
            self.cgroup.rmdir()


@pytest.fixture
def containers(v2_view: tuple[Path, list[str]]) -> Iterator[list[Container]]:
    made: list[Container] = []
    yield made
    for container in made:
        container.remove()


def _share_spec(double: NvmlDouble, index: int, memory: str, hook: MemoryLimitHook) -> dict[str, Any]:
    """Our CDI device for a claim's share of the double's GPU `index`, rendered by prepare."""
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.nvmlDeviceGetUUID(handle)
    info = GpuInfo(
        index=index,
        minor=index,
        uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
        product_name="NVIDIA H100 80GB HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=81920 * MiB,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        pcie_root=None,
        device_nodes=(f"/dev/nvidia{index}",),
    )
    (device,), _ = build_devices(SystemInfo("550.163.01", "12.4"), [info], shared=SharedGpus.MEMORY)
    device = with_memory_limit(device, True, UnlimitedShares.SKIP)
    doc = claim_doc(results=[result("gpu", device.name, shareID="s-1", consumedCapacity={"memory": memory})])
    plan = plan_claim(
        ClaimRef("ns", "uid-1", "claim"), doc, driver=DRIVER, pool=NODE, devices={device.name: device}
    )
    (cdi_device,) = render_spec(plan, memory_limit_hook=hook).to_json()["devices"]
    edits: dict[str, Any] = cdi_device["containerEdits"]
    return edits


def _run_hook(
    edits: dict[str, Any], container: Container, double: NvmlDouble, view: list[str], bundle: Path
) -> subprocess.CompletedProcess[str]:
    """The spec's createRuntime hook as runc runs it: its path with its args, its env (plus the
    double's config, which the double needs to find its machine), the OCI state on stdin."""
    (hook,) = edits["hooks"]
    assert hook["hookName"] == "createRuntime"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.2.0", "process": {"env": edits["env"]}}))
    state = {
        "ociVersion": "1.2.0",
        "id": bundle.name,
        "status": "creating",
        "pid": container.process.pid,
        "bundle": str(bundle),
    }
    env = [*hook.get("env", []), f"NVML_DOUBLE_CONFIG={double.config_path}"]
    argv = [*view, "env", "-i", *env, hook["path"], *hook["args"][1:]]
    return subprocess.run(
        argv, input=json.dumps(state), capture_output=True, text=True, timeout=60, check=False
    )


def _held_limits(double: NvmlDouble, view: list[str]) -> dict[str, Any]:
    """double.memory_limits() read in the hook's view of /sys/fs/cgroup."""
    code = (
        "import json, sys; from pathlib import Path; from tests.nvmldouble import NvmlDouble;"
        "d = NvmlDouble(config_path=Path(sys.argv[1]));"
        "print(json.dumps({f'{u} {c}': v for (u, c), v in d.memory_limits().items()}))"
    )
    env = {**os.environ, "PYTHONPATH": str(nvmldouble.REPO)}
    out = subprocess.run(
        [*view, sys.executable, "-c", code, str(double.config_path)],
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=nvmldouble.REPO,
    )  # fmt: skip
    held: dict[str, Any] = json.loads(out.stdout)
    return held


def test_nvidias_hook_limits_each_share_to_its_memory_and_the_limit_goes_with_the_cgroup(
    double: NvmlDouble,
    driver_root: Path,
    v2_view: tuple[Path, list[str]],
    containers: list[Container],
    tmp_path: Path,
) -> None:
    v2_root, view = v2_view
    hook = MemoryLimitHook(str(nvidia_roots.nvidia_ctk_dir() / "nvidia-cdi-hook"), str(driver_root))
    small, large = Container(v2_root), Container(v2_root)
    containers += [small, large]
    for container, memory, name in ((small, "10Gi", "small"), (large, "30Gi", "large")):
        ran = _run_hook(_share_spec(double, 0, memory, hook), container, double, view, tmp_path / name)
        assert ran.returncode == 0, ran.stderr
    uuid = _share_spec(double, 0, "1Gi", hook)["hooks"][0]["args"][-1]
    assert double.memory_limit_calls() == [
        MemoryLimitCall(uuid, small.host_cgroup(), 10240 * MiB, 10240 * MiB, 0),
        MemoryLimitCall(uuid, large.host_cgroup(), 30720 * MiB, 30720 * MiB, 0),
    ]
    assert _held_limits(double, view) == {
        f"{uuid} {small.host_cgroup()}": [10240 * MiB, 10240 * MiB],
        f"{uuid} {large.host_cgroup()}": [30720 * MiB, 30720 * MiB],
    }
    gone = small.host_cgroup()
    small.remove()  # the container goes: runc removes its cgroup
    assert _held_limits(double, view) == {f"{uuid} {large.host_cgroup()}": [30720 * MiB, 30720 * MiB]}
    assert gone not in double.state()[uuid]["memoryLimits"]  # dropped, not just hidden by the reader


def test_on_a_gpu_without_the_calls_the_hook_fails_so_the_container_is_never_created(
    double: NvmlDouble,
    driver_root: Path,
    v2_view: tuple[Path, list[str]],
    containers: list[Container],
    tmp_path: Path,
) -> None:
    v2_root, view = v2_view
    hook = MemoryLimitHook(str(nvidia_roots.nvidia_ctk_dir() / "nvidia-cdi-hook"), str(driver_root))
    container = Container(v2_root)
    containers.append(container)
    ran = _run_hook(_share_spec(double, 1, "10Gi", hook), container, double, view, tmp_path / "bundle")
    assert ran.returncode != 0 and "failed to set memory limits" in ran.stderr
    assert [c.result for c in double.memory_limit_calls()] == [NOT_SUPPORTED]
