"""Dynamic MIG and the driver files through the real pynvml on the C-ABI NVML double (go-nvml's DGX models).

Each test was seen failing before its fix (the report of the change says how):
the placement passed by value to nvmlDeviceCreateGpuInstanceWithPlacement,
a two-part driver version compared in its published semver form, MIG mode
never switched in partitionable mode, and NOT_SUPPORTED (MIG off) from the
GPU-instance lookups taken for a hard error at unprepare.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest

from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.devices.mig import MigPlacement
from draplugin.devices.model import Device
from draplugin.devices.nvml import NvmlBackend
from draplugin.prepare.mig import MigError
from draplugin.prepare.sharing import SharingState
from tests.driverroot_layout import debian_layout
from tests.unit import nvmldouble_local as double
from tests.unit.test_mig_prepare import plan_for


class Killed(BaseException):
    """Stands in for SIGKILL: escapes every handler."""


def backend(tmp_path: Path, *, partitionable: bool = True, **config: Any) -> NvmlBackend:
    proc = double.configure(tmp_path, **config)
    return NvmlBackend(
        "node-a", lib_path=str(double.library()), partitionable=partitionable, proc_root=str(proc)
    )


def gpu_state(tmp_path: Path, b: NvmlBackend) -> dict[str, Any]:
    uuid = next(d.uuid for d in b.discover() if d.kind == "gpu")
    return dict(double.state(tmp_path)["gpus"][uuid])


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


H100_MIG_ON: dict[str, Any] = {"machine": "dgxh100", "gpuCount": 1, "gpus": [{"index": 0, "migMode": 1}]}


def test_dynamic_mig_create_does_not_crash_the_process(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The placement goes by reference: passed by value, NVML read its bytes as an address (the
    test's own process died of SIGSEGV)."""
    if not double.in_own_process(request, tmp_path):
        return
    b = backend(tmp_path, **H100_MIG_ON)
    gpu = devices_of(b)["gpu-0"]
    made = b.mig_create(MigPlacement(gpu.uuid, gpu.minor, "1g.10gb", 3))
    assert made.uuid.startswith("MIG-") and len(made.cap_nodes) == 2
    (instance,) = gpu_state(tmp_path, b)["gpuInstances"]
    assert (instance["id"], instance["start"], instance["size"]) == (made.gpu_instance_id, 3, 1)


def test_a_two_part_driver_version_finds_its_libraries(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """NVIDIA's 550.135 names its files libcuda.so.550.135; the published version is 550.135.0."""
    if not double.in_own_process(request, tmp_path):
        return
    b = backend(tmp_path, partitionable=False, machine="dgxh100", gpuCount=1, driverVersion="550.135")
    assert str(b.discover()[0].attributes["driverVersion"]) == "550.135.0"
    root = debian_layout(version="550.135", dev_nodes=(), proc_version=None).build(tmp_path / "driver")
    files = driverfiles.for_backend(DriverRoot.at(str(root)), b, report=lambda reason, message: None)
    install = files.install()
    assert (install.version, install.version_source) == ("550.135", "NVML")


def test_partitionable_hopper_switches_mig_mode_on_for_mig_and_off_for_the_whole_gpu(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if not double.in_own_process(request, tmp_path):
        return
    b = backend(tmp_path, **H100_MIG_ON)
    devices = devices_of(b)
    assert "gpu-0" in devices and mig_named(devices, "1g.10gb", 2)  # both kinds: Hopper switches at once
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)

    # A whole GPU is never handed out in MIG mode: nothing is on it, so the mode goes off.
    sharing.apply(plan_for("uid-whole", devices, "gpu-0"))
    assert gpu_state(tmp_path, b)["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE
    sharing.release("uid-whole")

    # The first MIG device switches MIG mode on; the whole GPU then cannot be had.
    sharing.apply(plan_for("uid-a", devices, mig_named(devices, "1g.10gb", 2)))
    state = gpu_state(tmp_path, b)
    assert state["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE and len(state["gpuInstances"]) == 1
    with pytest.raises(MigError) as err:
        sharing.apply(plan_for("uid-whole", devices, "gpu-0"))
    assert err.value.reason == "MigModeEnabled"

    # The last one gone, MIG mode goes back off.
    sharing.apply(plan_for("uid-b", devices, mig_named(devices, "1g.10gb", 5)))
    sharing.release("uid-a")
    assert gpu_state(tmp_path, b)["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE
    sharing.release("uid-b")
    state = gpu_state(tmp_path, b)
    assert state["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE and state["gpuInstances"] == []
    assert sharing.ledger.entries() == []
    sharing.apply(plan_for("uid-whole", devices, "gpu-0"))


def test_a_kill_between_the_mode_switch_and_the_create_is_undone_at_start_up(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not double.in_own_process(request, tmp_path):
        return
    b = backend(tmp_path, **H100_MIG_ON)
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
    assert gpu_state(tmp_path, b)["migMode"] == pynvml.NVML_DEVICE_MIG_ENABLE
    assert [e.state for e in sharing.ledger.entries()] == ["creating"]
    # Start-up of the next plugin process: the orphan is released, MIG mode goes back off.
    restarted = SharingState(tmp_path / "state", mig_partitioner=b)
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert gpu_state(tmp_path, b)["migMode"] == pynvml.NVML_DEVICE_MIG_DISABLE
    assert restarted.ledger.entries() == []


def test_an_ampere_offers_only_what_its_current_mig_mode_serves(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A100: switching MIG mode takes a reset, so it offers its MIG devices or itself, never both."""
    if not double.in_own_process(request, tmp_path):
        return
    on = devices_of(
        backend(tmp_path / "on", machine="dgxa100", gpuCount=1, gpus=[{"index": 0, "migMode": 1}])
    )
    assert "gpu-0" not in on and any(d.kind == "mig" for d in on.values())
    off = devices_of(backend(tmp_path / "off", machine="dgxa100", gpuCount=1))
    assert list(off) == ["gpu-0"] and not off["gpu-0"].consumes_counters


def test_unprepare_after_mig_mode_went_off_finds_its_device_gone(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A GPU reset (or an admin) turned MIG off: NOT_SUPPORTED from the lookups means nothing is left."""
    if not double.in_own_process(request, tmp_path):
        return
    b = backend(tmp_path, **H100_MIG_ON)
    devices = devices_of(b)
    sharing = SharingState(tmp_path / "state", mig_partitioner=b)
    sharing.apply(plan_for("uid-a", devices, mig_named(devices, "3g.40gb", 4)))
    uuid = devices["gpu-0"].uuid
    doc = double.state(tmp_path)
    doc["gpus"][uuid].update(migMode=0, migModePending=0, gpuInstances=[])  # the reset
    (tmp_path / "nvml.state").write_text(json.dumps(doc))
    sharing.release("uid-a")
    assert sharing.ledger.entries() == []
    assert sharing.release_orphans(prepared=set()) == []
