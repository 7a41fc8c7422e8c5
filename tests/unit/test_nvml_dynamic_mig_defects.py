"""Dynamic MIG and the driver files through the real pynvml on the C-ABI NVML double (go-nvml's DGX models).

Each test was seen failing before its fix (the report of the change says how):
the placement passed by value to nvmlDeviceCreateGpuInstanceWithPlacement,
a two-part driver version compared in its published semver form, MIG mode
never switched in partitionable mode, and NOT_SUPPORTED (MIG off) from the
GPU-instance lookups taken for a hard error at unprepare.

They run in pytest's own process (`tests/nvmldouble.py` points pynvml at the double and the
double at each test's configuration); only the create that once killed its process runs in a
child.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.devices.model import Device
from draplugin.devices.nvml import NvmlBackend
from draplugin.prepare.mig import MigError
from draplugin.prepare.sharing import SharingState
from tests import nvmldouble
from tests.driverroot_layout import debian_layout
from tests.nvmldouble import Gpu, NvmlDouble
from tests.unit.test_mig_prepare import plan_for


class Killed(BaseException):
    """Stands in for SIGKILL: escapes every handler."""


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


def backend(request: pytest.FixtureRequest, double: NvmlDouble, *, partitionable: bool = True) -> NvmlBackend:
    backend: NvmlBackend = nvmldouble.plugin_backend(double, request, partitionable=partitionable)
    return backend


def gpu_state(double: NvmlDouble, b: NvmlBackend) -> dict[str, Any]:
    uuid = next(d.uuid for d in b.discover() if d.kind == "gpu")
    return dict(double.state()[uuid])


def devices_of(b: NvmlBackend) -> dict[str, Device]:
    return {d.name: d for d in b.discover()}


def mig_named(devices: dict[str, Device], profile: str, start: int) -> str:
    """The partitionable MIG device of this profile and placement (found by what it is, not by name)."""
    (name,) = [
        d.name
        for d in devices.values()
        if d.kind == "mig" and d.attributes["profile"] == profile and d.name.endswith(f"-{start}")
    ]
    return name


MIG_ON = (Gpu(index=0, mig_mode=1),)

# Run in a child: passed by value, the placement's bytes were read as an address and the process died.
CREATE_IN_A_CHILD = """
import json, sys
from draplugin.devices.mig import MigPlacement
from draplugin.devices.nvml import NvmlBackend
b = NvmlBackend("node-a", lib_path=sys.argv[1], partitionable=True, proc_root=sys.argv[2])
gpu = next(d for d in b.discover() if d.name == "gpu-0")
made = b.mig_create(MigPlacement(gpu.uuid, gpu.minor, "1g.10gb", 3))
print(json.dumps({"uuid": made.uuid, "caps": len(made.cap_nodes), "gi": made.gpu_instance_id}))
"""


def test_dynamic_mig_create_does_not_crash_the_process(nvml_double: Callable[..., NvmlDouble]) -> None:
    """The placement goes by reference: passed by value, NVML read its bytes as an address (the
    test's own process died of SIGSEGV), so this one runs in a child process."""
    double = nvml_double("dgxh100", gpus=1, overrides=MIG_ON)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(CREATE_IN_A_CHILD),
            str(double.lib_path),
            str(double.proc_root),
        ],
        env={**os.environ, **double.env()},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=nvmldouble.REPO,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
    made = json.loads(done.stdout)
    assert made["uuid"].startswith("MIG-") and made["caps"] == 2
    ((instance),) = next(iter(double.state().values()))["gpuInstances"]
    assert (instance["id"], instance["start"], instance["size"]) == (made["gi"], 3, 1)


def test_a_two_part_driver_version_finds_its_libraries(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    """NVIDIA's 550.135 names its files libcuda.so.550.135; the published version is 550.135.0."""
    b = backend(request, nvml_double("dgxh100", gpus=1, driver_version="550.135"), partitionable=False)
    assert str(b.discover()[0].attributes["driverVersion"]) == "550.135.0"
    root = debian_layout(version="550.135", dev_nodes=(), proc_version=None).build(tmp_path / "driver")
    files = driverfiles.for_backend(DriverRoot.at(str(root)), b, report=lambda reason, message: None)
    install = files.install()
    assert (install.version, install.version_source) == ("550.135", "NVML")


def test_partitionable_hopper_switches_mig_mode_on_for_mig_and_off_for_the_whole_gpu(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=MIG_ON)
    b = backend(request, double)
    devices = devices_of(b)
    assert "gpu-0" in devices and mig_named(devices, "1g.10gb", 2)  # both kinds: Hopper switches at once
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)

    # A whole GPU is never handed out in MIG mode: nothing is on it, so the mode goes off.
    sharing.apply(plan_for("uid-whole", devices, "gpu-0"))
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE
    sharing.release("uid-whole")
    # With MIG mode off the GPU still publishes its MIG placements (NVML lists its profiles).
    b.refresh()
    assert devices_of(b) == devices

    # The first MIG device switches MIG mode on; the whole GPU then cannot be had.
    sharing.apply(plan_for("uid-a", devices, mig_named(devices, "1g.10gb", 2)))
    state = gpu_state(double, b)
    assert state["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE and len(state["gpuInstances"]) == 1
    with pytest.raises(MigError) as err:
        sharing.apply(plan_for("uid-whole", devices, "gpu-0"))
    assert err.value.reason == "MigModeEnabled"

    # The last one gone, MIG mode goes back off.
    sharing.apply(plan_for("uid-b", devices, mig_named(devices, "1g.10gb", 5)))
    sharing.release("uid-a")
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE
    sharing.release("uid-b")
    state = gpu_state(double, b)
    assert state["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE and state["gpuInstances"] == []
    assert sharing.ledger.entries() == []
    sharing.apply(plan_for("uid-whole", devices, "gpu-0"))


def test_a_partitionable_hopper_starting_with_mig_off_publishes_its_placements(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    """MIG mode off at start (never on in this plugin's life): the profiles come from NVML all the
    same, and the first MIG device switches the mode on."""
    double = nvml_double("dgxh100", gpus=1)
    b = backend(request, double)
    devices = devices_of(b)
    migs = {(d.attributes["profile"], d.name.rsplit("-", 1)[1]) for d in devices.values() if d.kind == "mig"}
    assert {("1g.10gb", "0"), ("1g.10gb", "6"), ("3g.40gb", "4"), ("7g.80gb", "0")} <= migs
    assert devices["gpu-0"].consumes_counters  # the whole GPU shares the MIG placements' counters
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)
    sharing.apply(plan_for("uid-a", devices, mig_named(devices, "3g.40gb", 4)))
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE
    sharing.release("uid-a")
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE


def test_a_kill_between_the_mode_switch_and_the_create_is_undone_at_start_up(
    request: pytest.FixtureRequest,
    nvml_double: Callable[..., NvmlDouble],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=MIG_ON)
    b = backend(request, double)
    devices = devices_of(b)
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)
    sharing.apply(plan_for("uid-whole", devices, "gpu-0"))  # MIG mode off
    sharing.release("uid-whole")

    def killed(*args: object) -> None:
        raise Killed()

    monkeypatch.setattr(b.nvml, "nvmlDeviceCreateGpuInstanceWithPlacement", killed)
    with pytest.raises(Killed):
        sharing.apply(plan_for("uid-a", devices, mig_named(devices, "1g.10gb", 0)))
    monkeypatch.undo()
    # Killed after the switch: MIG mode on, no instance, the ledger says "creating".
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE
    assert [e.state for e in sharing.ledger.entries()] == ["creating"]
    # Start-up of the next plugin process: the orphan is released, MIG mode goes back off.
    restarted = SharingState(tmp_path / "state", mig_partitioner=b)
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert gpu_state(double, b)["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE
    assert restarted.ledger.entries() == []


def test_an_ampere_offers_only_what_its_current_mig_mode_serves(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """A100: switching MIG mode takes a reset, so it offers its MIG devices or itself, never both."""
    on = devices_of(backend(request, nvml_double("dgxa100", gpus=1, overrides=MIG_ON)))
    assert "gpu-0" not in on and any(d.kind == "mig" for d in on.values())
    off = devices_of(backend(request, nvml_double("dgxa100", gpus=1)))
    assert list(off) == ["gpu-0"] and not off["gpu-0"].consumes_counters


def test_unprepare_after_mig_mode_went_off_finds_its_device_gone(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    """A GPU reset (or an admin) turned MIG off: NOT_SUPPORTED from the lookups means nothing is left."""
    double = nvml_double("dgxh100", gpus=1, overrides=MIG_ON)
    b = backend(request, double)
    devices = devices_of(b)
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)
    sharing.apply(plan_for("uid-a", devices, mig_named(devices, "3g.40gb", 4)))
    uuid = devices["gpu-0"].uuid
    doc = json.loads(double.state_path.read_text())
    doc["gpus"][uuid].update(migMode=0, migModePending=0, gpuInstances=[])  # the reset
    double.state_path.write_text(json.dumps(doc))
    sharing.release("uid-a")
    assert sharing.ledger.entries() == []
    assert sharing.release_orphans(prepared=set()) == []
