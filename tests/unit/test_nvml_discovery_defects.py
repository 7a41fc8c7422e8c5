"""Discovery through the real pynvml on the C-ABI NVML double (go-nvml's DGX models).

Each was seen failing before its fix: several compute instances of one GPU
instance, a GPU in MIG mode without MIG devices, unified memory, vGPU brands,
`--sysfs-root`, and MIG device names that must be unique for every profile.
They run in pytest's own process (`tests/nvmldouble.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from draplugin.cli import main
from draplugin.devices.model import validate_devices
from draplugin.devices.nvml import NvmlBackend
from tests import nvmldouble
from tests.nvmldouble import ComputeInstance, Gpu, MigDevice, NvmlDouble
from tests.unit.fakenvml import FakeGpu, FakeNvml, FakeProfile, h100_with_mig


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


def backend(
    request: pytest.FixtureRequest, double: NvmlDouble, *, partitionable: bool = False
) -> NvmlBackend:
    backend: NvmlBackend = nvmldouble.plugin_backend(double, request, partitionable=partitionable)
    return backend


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []

    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None:
        self.posted.append((reason, note))


def test_each_compute_instance_of_a_gpu_instance_is_its_own_device(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """A 3g.40gb split into three 1c.3g.40gb: three names, each with its own 16 SMs."""
    cis = tuple(ComputeInstance(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, s) for s in (0, 1, 2))
    gpu = Gpu(index=0, mig_mode=1, mig_devices=(MigDevice(nvmldouble.GI_PROFILE_3_SLICE, 4, cis),))
    devices = backend(request, nvml_double("dgxh100", gpus=1, overrides=[gpu])).discover()
    validate_devices(devices)
    assert [d.attributes["profile"] for d in devices] == ["1c.3g.40gb"] * 3
    assert len({d.name for d in devices}) == len({d.uuid for d in devices}) == 3
    assert {d.capacity["multiprocessors"] for d in devices} == {"16"}
    assert {d.capacity["memory"] for d in devices} == {"40Gi"}  # the GPU instance's, shared


def test_a_gpu_in_mig_mode_without_mig_devices_is_logged_and_posted_once(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    b = backend(request, nvml_double("dgxh100", gpus=2, overrides=[Gpu(index=0, mig_mode=1)]))
    events = Events()
    b.attach_events(events)
    b.refresh()
    assert [d.name for d in b.discover()] == ["gpu-1"]
    ((reason, note),) = events.posted
    assert reason == "MigEnabledWithoutDevices" and "GPU 0" in note and "MIG mode" in note


def test_a_unified_memory_gpu_is_published_without_memory(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """GB10-like parts answer NOT_SUPPORTED for memory info; NVIDIA's driver publishes no memory."""
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, unified_memory=True)])
    devices = backend(request, double).discover()
    ((gpu),) = devices
    assert gpu.name == "gpu-0" and "memory" not in gpu.capacity
    validate_devices(devices)


@pytest.mark.parametrize(
    ("brand", "name"),
    [
        (4, "Grid"),
        (7, "NvidiaVApps"),
        (8, "NvidiaVPC"),
        (9, "NvidiaVCS"),
        (10, "NvidiaVWS"),
        (11, "NvidiaCloudGaming"),
    ],
)
def test_vgpu_brands_are_named(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], brand: int, name: str
) -> None:
    (gpu,) = backend(
        request, nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, brand=brand)])
    ).discover()
    assert gpu.attributes["brand"] == name


def test_devices_previews_pcie_root_and_numa_node_from_a_sysfs_root(
    nvml_double: Callable[..., NvmlDouble],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    monkeypatch.setenv("NVML_DOUBLE_CONFIG", str(double.config_path))  # the CLI's own NvmlBackend
    sysfs = tmp_path / "sys"
    device_dir = sysfs / "devices/pci0000:00/0000:00:01.0/0000:00:00.0"
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text("1\n")
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    (sysfs / "bus/pci/devices/0000:00:00.0").symlink_to(device_dir)
    argv = ["devices", "--node-name", "n1", "--nvml-lib-path", str(double.lib_path)]
    assert main([*argv, "--sysfs-root", str(sysfs), "-o", "json"]) == 0
    (device,) = json.loads(capsys.readouterr().out)["items"][0]["spec"]["devices"]
    assert device["attributes"]["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    assert device["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 1}


def test_every_b200_profile_has_its_own_device_names(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    b = backend(
        request, nvml_double("dgxb200", gpus=1, overrides=[Gpu(index=0, mig_mode=1)]), partitionable=True
    )
    devices = b.discover()
    validate_devices(devices, b.shared_counters())
    profiles = {d.attributes["profile"] for d in devices if d.kind == "mig"}
    assert {"1g.23gb", "1g.23gb+me", "1g.45gb", "7g.180gb"} <= profiles


def test_profiles_that_differ_only_in_plus_or_minus_me_get_different_names() -> None:
    """Blackwell's 1g.24gb+me (all media engines) and 1g.24gb-me (none): both `1g24gb-me` as a label.
    The double's B200 (go-nvml's) lists no -me profile, so this one runs on the Python fake."""
    gpu: FakeGpu = h100_with_mig()
    gpu.architecture = pynvml.NVML_DEVICE_ARCH_BLACKWELL
    gpu.migs = []
    gpu.profiles = [
        FakeProfile(
            0x0F, 15, "MIG 1g.24gb+me", 1, 24 << 10, 18, 1, 1, 1, 1, 1, tuple((s, 1) for s in range(7))
        ),
        FakeProfile(
            0x0D, 13, "MIG 1g.24gb-me", 1, 24 << 10, 18, 1, 0, 0, 0, 0, tuple((s, 1) for s in range(7))
        ),
        FakeProfile(0x10, 16, "MIG 2g.48gb+me", 2, 48 << 10, 36, 2, 2, 2, 2, 2, ((0, 2), (2, 2), (4, 2))),
        FakeProfile(0x0E, 14, "MIG 2g.48gb-me", 2, 48 << 10, 36, 2, 0, 0, 0, 0, ((0, 2), (2, 2), (4, 2))),
    ]
    b = NvmlBackend("node-a", nvml=FakeNvml([gpu]), partitionable=True)
    devices = b.discover()
    validate_devices(devices, b.shared_counters())
    assert "gpu-0-mig-1g24gb-me-15-0" in {d.name for d in devices}
    assert "gpu-0-mig-1g24gb-me-13-0" in {d.name for d in devices}


def test_invalid_argument_for_an_empty_mig_slot_is_a_hole() -> None:
    """Some drivers answer INVALID_ARGUMENT, not NOT_FOUND, for an empty slot (the double does only
    past the last slot, which discovery never asks for): on the Python fake."""
    gpu = h100_with_mig()
    nvml = FakeNvml([gpu])
    real = nvml.nvmlDeviceGetMigDeviceHandleByIndex

    def holes_invalid(parent: FakeGpu, index: int) -> Any:
        if index < len(parent.migs) and parent.migs[index] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return real(parent, index)

    nvml.nvmlDeviceGetMigDeviceHandleByIndex = holes_invalid  # type: ignore[method-assign,assignment]
    assert len(NvmlBackend("node-a", nvml=nvml).discover()) == 2
