"""The NVML adapter against the fake NVML module: GPUs, MIG, partitionable mode, library errors, events."""

from __future__ import annotations

import threading
from pathlib import Path

import pynvml
import pytest

from draplugin.devices.health import HealthPolicy, HealthTracker, Recovery
from draplugin.devices.model import Version, validate_devices
from draplugin.devices.nvml import (
    NvmlBackend,
    NvmlUnavailableError,
    find_library,
    normalize_bus_id,
    numa_node,
    pcie_root,
)
from tests.unit.fakenvml import FakeEvent, FakeNvml, a10g, h100_with_mig

DRIVER = "gpu.draplugin.dev"


def backend(nvml: FakeNvml, **kw: object) -> NvmlBackend:
    return NvmlBackend("node-a", nvml=nvml, **kw)  # type: ignore[arg-type]


def test_gpu_without_mig_has_the_nvidia_attribute_names() -> None:
    (gpu,) = backend(FakeNvml([a10g(minor=4)])).discover()
    assert gpu.name == "gpu-0" and gpu.kind == "gpu" and gpu.minor == 4
    assert gpu.attributes == {
        "type": "gpu",
        "uuid": "GPU-99999999-0000-0000-0000-000000000000",
        "productName": "NVIDIA A10G",
        "brand": "Nvidia",
        "architecture": "Ampere",
        "cudaComputeCapability": Version("8.6.0"),
        "driverVersion": Version("580.65.6"),
        "cudaDriverVersion": Version("13.0.0"),
        "index": 0,
        "minor": 4,
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
    }
    assert gpu.capacity == {"memory": "23028Mi"}
    assert gpu.device_nodes == ("/dev/nvidia4", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def test_static_mig_publishes_existing_mig_devices_not_the_parent() -> None:
    devices = backend(FakeNvml([h100_with_mig(), a10g()])).discover()
    assert [d.name for d in devices] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-6", "gpu-1"]
    mig = devices[0]
    assert mig.kind == "mig" and mig.uuid == "MIG-aaaaaaaa-0000-0000-0000-000000000001"
    assert mig.parent_uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert mig.attributes["type"] == "mig" and mig.attributes["profile"] == "3g.40gb"
    assert mig.attributes["parentUUID"] == mig.parent_uuid
    assert mig.capacity == {
        "multiprocessors": "60",
        "copyEngines": "3",
        "decoders": "3",
        "encoders": "0",
        "jpegEngines": "3",
        "ofaEngines": "0",
        "memory": "40192Mi",
    }
    validate_devices(devices)


def test_mig_caps_device_nodes_come_from_proc(tmp_path: Path) -> None:
    gi = tmp_path / "driver/nvidia/capabilities/gpu0/mig/gi2"
    (gi / "ci0").mkdir(parents=True)
    (gi / "access").write_text("DeviceFileMinor: 21\nDeviceFileMode: 444\n")
    (gi / "ci0" / "access").write_text("DeviceFileMinor: 22\n")
    mig = backend(FakeNvml([h100_with_mig()]), proc_root=str(tmp_path)).discover()[0]
    assert mig.device_nodes[-2:] == ("/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22")


def test_partitionable_mode_publishes_profiles_with_counters() -> None:
    b = backend(FakeNvml([h100_with_mig()]), partitionable=True)
    devices, sets = b.discover(), b.shared_counters()
    assert [s.name for s in sets] == ["gpu-0-counters"]
    assert len(devices) == 1 + 1 + 2 + 7  # whole GPU, 7g, 2x 3g, 7x 1g
    three_g = next(d for d in devices if d.name == "gpu-0-mig-3g40gb-9-4")
    consumed = three_g.consumes_counters[0].counters
    assert [k for k in consumed if k.startswith("memory-slice")] == [f"memory-slice-{i}" for i in range(4, 8)]
    validate_devices(devices, sets)


def test_gpu_that_fails_to_read_is_skipped_not_fatal() -> None:
    nvml = FakeNvml([a10g()])
    nvml.failing["nvmlDeviceGetMinorNumber"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert backend(nvml).discover() == []


def test_missing_library_error_names_library_and_search_path() -> None:
    nvml = FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    with pytest.raises(NvmlUnavailableError) as info:
        backend(nvml)
    message = str(info.value)
    assert "libnvidia-ml.so.1" in message and "LD_LIBRARY_PATH" in message and "--nvml-lib-path" in message


def test_real_pynvml_without_a_gpu_gives_the_same_clear_error() -> None:
    # This machine has no NVIDIA driver: the real binding fails to load the library.
    with pytest.raises(NvmlUnavailableError, match=r"libnvidia-ml\.so\.1 not found"):
        NvmlBackend("node-a")


def test_driver_root_search_and_bad_paths(tmp_path: Path) -> None:
    lib = tmp_path / "usr/lib64/libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"")
    assert find_library(str(tmp_path)) == str(lib)
    assert find_library(str(lib)) == str(lib)
    assert find_library(None) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        NvmlUnavailableError, match=f"not found under driver root {empty}; looked in: {empty}/usr"
    ):
        find_library(str(empty))
    with pytest.raises(NvmlUnavailableError, match="does not exist"):
        find_library(str(tmp_path / "nope"))
    dir_named_like_lib = tmp_path / "libnvidia-ml.so.1"
    dir_named_like_lib.mkdir()
    with pytest.raises(NvmlUnavailableError, match="is a directory"):
        find_library(str(dir_named_like_lib))


def test_library_file_that_is_not_a_library_is_reported(tmp_path: Path) -> None:
    lib = tmp_path / "libnvidia-ml.so.1"
    lib.write_bytes(b"not an ELF file")
    with pytest.raises(NvmlUnavailableError, match=f"cannot load NVML library {lib}"):
        backend(FakeNvml([]), lib_path=str(lib))


def test_bus_id_and_pcie_root(tmp_path: Path) -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    device_dir = tmp_path / "devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    device_dir.mkdir(parents=True)
    (tmp_path / "bus/pci/devices").mkdir(parents=True)
    (tmp_path / "bus/pci/devices/0000:3b:00.0").symlink_to(device_dir)
    assert pcie_root(str(tmp_path), "0000:3b:00.0") == "pci0000:3a"
    assert pcie_root(str(tmp_path), "0000:99:00.0") is None


def sysfs_with_numa(root: Path, bus_id: str, text: str) -> Path:
    """A sysfs tree where the PCI device `bus_id` reports `text` as its numa_node."""
    device_dir = root / "devices/pci0000:3a/0000:3a:00.0" / bus_id
    device_dir.mkdir(parents=True)
    (device_dir / "numa_node").write_text(text)
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    (root / "bus/pci/devices" / bus_id).symlink_to(device_dir)
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1\n", 1), ("0\n", 0), ("-1\n", None), ("1024\n", None), ("garbage\n", None), ("", None)],
)
def test_numa_node_from_sysfs_and_no_affinity_means_none(
    tmp_path: Path, text: str, expected: int | None
) -> None:
    root = sysfs_with_numa(tmp_path, "0000:3b:00.0", text)
    assert numa_node(str(root), "0000:3b:00.0") == expected
    # A device sysfs does not know has no NUMA node either, rather than an error.
    assert numa_node(str(root), "0000:99:00.0") is None


def test_gpu_publishes_the_standard_numa_attribute_from_sysfs_on_it_and_its_mig_devices(
    tmp_path: Path,
) -> None:
    root = sysfs_with_numa(tmp_path, "0000:3b:00.0", "1\n")
    (gpu,) = backend(FakeNvml([a10g()]), sysfs_root=str(root)).discover()
    assert gpu.attributes["resource.kubernetes.io/numaNode"] == 1
    # The H100 sits at bus 0x18: its MIG devices share the parent's NUMA node.
    sysfs_with_numa(tmp_path, "0000:18:00.0", "0\n")
    migs = backend(FakeNvml([h100_with_mig()]), sysfs_root=str(root)).discover()
    assert migs and {d.attributes["resource.kubernetes.io/numaNode"] for d in migs} == {0}


def test_gpu_without_numa_affinity_publishes_no_numa_attribute(tmp_path: Path) -> None:
    root = sysfs_with_numa(tmp_path, "0000:3b:00.0", "-1\n")
    (gpu,) = backend(FakeNvml([a10g()]), sysfs_root=str(root)).discover()
    assert "resource.kubernetes.io/numaNode" not in gpu.attributes


def test_events_taint_the_right_devices() -> None:
    h100, other = h100_with_mig(), a10g()
    nvml = FakeNvml([h100, other])
    b = backend(nvml)
    tracker = HealthTracker(DRIVER)
    xid = pynvml.nvmlEventTypeXidCriticalError
    nvml.events = [
        FakeEvent(other, xid, 13),  # application error: ignored
        FakeEvent(h100, xid, 31, gpu_instance_id=9),  # MMU fault: application-level, ignored
        FakeEvent(h100, xid, 92, gpu_instance_id=9),  # one MIG device
        FakeEvent(other, pynvml.nvmlEventTypeDoubleBitEccError, 0),
    ]
    import threading

    stop = threading.Event()
    nvml.on_wait_empty = stop.set
    b.monitor_health(tracker, stop, wait_ms=1)
    faults = tracker.faults()
    assert set(faults) == {"gpu-0-mig-1g10gb-19-6", "gpu-1"}
    assert (faults["gpu-0-mig-1g10gb-19-6"].effect, faults["gpu-0-mig-1g10gb-19-6"].reason) == (
        "NoSchedule",
        "xid-92",
    )
    assert (faults["gpu-1"].effect, faults["gpu-1"].reason) == ("NoSchedule", "ecc-double-bit")
    assert nvml.registered == {h100.uuid: h100.supported_events, other.uuid: other.supported_events}


def test_fatal_xid_on_whole_gpu_taints_all_its_mig_devices_no_execute() -> None:
    h100 = h100_with_mig()
    nvml = FakeNvml([h100])
    b = backend(nvml)
    tracker = HealthTracker(DRIVER, HealthPolicy(fatal_effect="NoExecute"))
    nvml.events = [FakeEvent(h100, pynvml.nvmlEventTypeXidCriticalError, 79)]
    import threading

    stop = threading.Event()
    nvml.on_wait_empty = stop.set
    b.monitor_health(tracker, stop, wait_ms=1)
    assert {n: f.effect for n, f in tracker.faults().items()} == {
        "gpu-0-mig-3g40gb-9-0": "NoExecute",
        "gpu-0-mig-1g10gb-19-6": "NoExecute",
    }


def test_fallen_off_the_bus_wakes_rediscovery() -> None:
    h100 = h100_with_mig()
    nvml = FakeNvml([h100])
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    nvml.events = [FakeEvent(h100, pynvml.nvmlEventTypeXidCriticalError, 79)]
    stop = threading.Event()
    nvml.on_wait_empty = stop.set
    backend(nvml).monitor_health(tracker, stop, wait_ms=1, rediscover=lambda: woken.append(1))
    assert woken == [1] and {f.effect for f in tracker.faults().values()} == {"NoSchedule"}


def test_a_lost_gpu_stays_published_tainted_and_recovers_when_it_answers_again() -> None:
    h100, other = h100_with_mig(), a10g()
    nvml = FakeNvml([h100, other])
    b = backend(nvml)
    tracker = HealthTracker(DRIVER)
    b.attach_health(tracker)
    before = b.discover()

    other.error = pynvml.NVML_ERROR_GPU_IS_LOST
    assert b.refresh() is False  # kept as last read: the slices do not lose it
    assert b.discover() == before
    assert {n: (f.reason, f.effect) for n, f in tracker.faults().items()} == {
        "gpu-1": ("gpu-lost", "NoSchedule")
    }

    other.error = None
    assert b.refresh() is False
    assert tracker.faults() == {}  # on-reset (default): it answers again, the taint goes


def test_unknown_error_on_a_present_gpu_counts_as_lost_and_never_recovery_keeps_the_taint() -> None:
    other = a10g()
    nvml = FakeNvml([other])
    b = backend(nvml)
    tracker = HealthTracker(DRIVER, HealthPolicy(recovery=Recovery("never")))
    b.attach_health(tracker)
    other.error = pynvml.NVML_ERROR_UNKNOWN
    b.refresh()
    assert set(tracker.faults()) == {"gpu-0"}
    other.error = None
    b.refresh()
    assert set(tracker.faults()) == {"gpu-0"}


def test_a_gpu_nvml_no_longer_counts_leaves_and_a_mig_change_is_rediscovered() -> None:
    h100, other = h100_with_mig(), a10g()
    nvml = FakeNvml([h100, other])
    b = backend(nvml)
    assert [d.name for d in b.discover()] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-6", "gpu-1"]
    nvml.gpus.remove(other)
    assert b.refresh() is True
    assert [d.name for d in b.discover()] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-6"]

    # A MIG layout change: NVML says so with an event, the monitor wakes re-discovery.
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    h100.migs = [h100.migs[0]]  # the 1g.10gb MIG device was destroyed
    nvml.events = [FakeEvent(h100, pynvml.nvmlEventMigConfigChange, 0)]
    stop = threading.Event()
    nvml.on_wait_empty = stop.set
    h100.supported_events |= pynvml.nvmlEventMigConfigChange
    b.monitor_health(tracker, stop, wait_ms=1, rediscover=lambda: woken.append(1))
    assert woken == [1] and nvml.registered[h100.uuid] & pynvml.nvmlEventMigConfigChange
    assert b.refresh() is True
    assert [d.name for d in b.discover()] == ["gpu-0-mig-3g40gb-9-0"]


def test_unavailable_gpu_event_taints_and_recovery_action_none_clears() -> None:
    other = a10g()
    nvml = FakeNvml([other])
    b = backend(nvml)
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    nvml.events = [FakeEvent(other, pynvml.nvmlEventTypeGpuUnavailableError, 0)]
    stop = threading.Event()
    nvml.on_wait_empty = stop.set
    b.monitor_health(tracker, stop, wait_ms=1, rediscover=lambda: woken.append(1))
    assert woken == [1] and tracker.faults()["gpu-0"].reason == "gpu-lost"

    reset_needed = pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    nvml.events = [
        FakeEvent(other, pynvml.nvmlEventTypeGpuRecoveryAction, reset_needed),  # not yet
        FakeEvent(other, pynvml.nvmlEventTypeGpuRecoveryAction, pynvml.NVML_GPU_RECOVERY_ACTION_NONE),
    ]
    stop.clear()
    b.monitor_health(tracker, stop, wait_ms=1)
    assert tracker.faults() == {}


def test_gpus_found_by_rediscovery_get_their_events_registered() -> None:
    h100 = h100_with_mig()
    nvml = FakeNvml([h100])
    b = backend(nvml)
    late = a10g()
    calls: list[int] = []
    stop = threading.Event()

    def on_empty() -> None:
        calls.append(1)
        if len(calls) == 1:
            nvml.gpus.append(late)  # a GPU that was reset comes back on the bus
            b.refresh()
        else:
            stop.set()

    nvml.on_wait_empty = on_empty
    b.monitor_health(HealthTracker(DRIVER), stop, wait_ms=1)
    assert set(nvml.registered) == {h100.uuid, late.uuid}
