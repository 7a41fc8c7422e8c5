"""The NVML adapter on the C-ABI NVML double (go-nvml's models of NVIDIA's GPUs), in pytest's
process through the real pynvml: GPUs, MIG, partitionable mode, library errors, lost GPUs, events."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from draplugin.devices.schema import DeviceNodeSpec
from tests import nvmldouble
from tests.nvmldouble import GI_PROFILE_1_SLICE, GI_PROFILE_3_SLICE, Gpu, MigDevice, NvmlDouble
from tests.unit.fakenvml import FakeNvml, a10g

DRIVER = "gpu.draplugin.dev"
H100 = "NVIDIA H100 80GB HBM3"  # go-nvml's H100 SXM5 model
# Static MIG on GPU 0: a 3g.40gb at slice 0 and a 1g.10gb at slice 6 (NVML profile IDs 2 and 0).
STATIC_MIG = Gpu(
    index=0,
    mig_mode=1,
    mig_devices=(MigDevice(GI_PROFILE_3_SLICE, 0), MigDevice(GI_PROFILE_1_SLICE, 6)),
    pci_bus_id="00000000:18:00.0",
)
MIG_NAMES = ["gpu-0-mig-3g40gb-2-0", "gpu-0-mig-1g10gb-0-6"]


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


@pytest.fixture
def no_sysfs(tmp_path: Path) -> str:
    """An empty sysfs: nothing of this machine's PCI tree leaks into the devices."""
    (tmp_path / "sys").mkdir()
    return str(tmp_path / "sys")


def backend(request: pytest.FixtureRequest, double: NvmlDouble, **options: Any) -> NvmlBackend:
    b: NvmlBackend = nvmldouble.plugin_backend(double, request, **options)
    return b


def uuids(double: NvmlDouble) -> list[str]:
    with double.pynvml() as nvml:
        return [
            str(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i)))
            for i in range(nvml.nvmlDeviceGetCount())
        ]


def gi_of(double: NvmlDouble, start: int) -> int:
    """The GPU instance ID the double gave the instance at this slice of GPU 0."""
    (state,) = [st for st in double.state().values() if st["gpuInstances"]]
    (gi,) = [g["id"] for g in state["gpuInstances"] if g["start"] == start]
    return int(gi)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Runs `monitor_health` to the end of the double's events file: the first wait that times out
    (every event delivered) stops it, or calls `on_empty` when one is set; `registered` records
    what was registered for each GPU."""
    seen: dict[str, Any] = {"registered": {}, "on_empty": None}
    stop = threading.Event()
    seen["stop"] = stop
    real_wait, real_register = pynvml.nvmlEventSetWait_v2, pynvml.nvmlDeviceRegisterEvents

    def wait(event_set: Any, timeout_ms: int) -> Any:
        try:
            return real_wait(event_set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            (seen["on_empty"] or stop.set)()
            raise

    def register(handle: Any, types: int, event_set: Any) -> None:
        seen["registered"][str(pynvml.nvmlDeviceGetUUID(handle))] = types
        real_register(handle, types, event_set)

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", wait)
    monkeypatch.setattr(pynvml, "nvmlDeviceRegisterEvents", register)
    yield seen


def test_gpu_without_mig_has_the_nvidia_attribute_names(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], no_sysfs: str
) -> None:
    gpu_config = Gpu(
        index=0, uuid="GPU-99999999-0000-0000-0000-000000000000", minor=4, pci_bus_id="00000000:3B:00.0"
    )
    double = nvml_double(
        "dgxh100", gpus=1, overrides=[gpu_config], driver_version="580.65.06", cuda_driver_version=13000
    )
    (gpu,) = backend(request, double, sysfs_root=no_sysfs).discover()
    assert gpu.name == "gpu-0" and gpu.kind == "gpu" and gpu.minor == 4
    assert gpu.attributes == {
        "type": "gpu",
        "uuid": "GPU-99999999-0000-0000-0000-000000000000",
        "productName": H100,
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": Version("9.0.0"),
        "driverVersion": Version("580.65.6"),
        "cudaDriverVersion": Version("13.0.0"),
        "index": 0,
        "minor": 4,
        "resource.kubernetes.io/pciBusID": "0000:3b:00.0",
    }
    assert gpu.capacity == {"memory": "80Gi"}
    assert gpu.device_nodes == ("/dev/nvidia4", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def test_an_ampere_is_named_from_nvidias_model(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], no_sysfs: str
) -> None:
    (gpu,) = backend(request, nvml_double("dgxa100", gpus=1), sysfs_root=no_sysfs).discover()
    assert (gpu.attributes["architecture"], gpu.attributes["cudaComputeCapability"]) == (
        "Ampere",
        Version("8.0.0"),
    )
    assert gpu.capacity == {"memory": "40Gi"}


def test_static_mig_publishes_existing_mig_devices_not_the_parent(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], no_sysfs: str
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[STATIC_MIG])
    devices = backend(request, double, sysfs_root=no_sysfs).discover()
    assert [d.name for d in devices] == [*MIG_NAMES, "gpu-1"]
    mig = devices[0]
    parent, _ = uuids(double)
    assert mig.kind == "mig" and mig.uuid is not None and mig.uuid.startswith("MIG-")
    assert mig.parent_uuid == parent
    assert mig.attributes["type"] == "mig" and mig.attributes["profile"] == "3g.40gb"
    assert mig.attributes["parentUUID"] == mig.parent_uuid
    assert mig.capacity == {  # go-nvml's H100 3g.40gb profile
        "multiprocessors": "48",
        "copyEngines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpegEngines": "0",
        "ofaEngines": "0",
        "memory": "40Gi",
    }
    validate_devices(devices)


def test_mig_caps_device_nodes_come_from_proc(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    """The nvidia-caps nodes are the double's /proc files (the driver's formats): major from
    proc/devices, minor and mode from each access file."""
    double = nvml_double("dgxh100", gpus=1, overrides=[STATIC_MIG])
    mig = backend(request, double).discover()[0]
    assert double.proc_root is not None
    gi = gi_of(double, 0)
    base = double.proc_root / f"driver/nvidia/capabilities/gpu0/mig/gi{gi}"
    minors = [
        int(
            next(line for line in f.read_text().splitlines() if line.startswith("DeviceFileMinor")).split(
                ":"
            )[1]
        )
        for f in (base / "access", base / "ci0" / "access")
    ]
    major = next(
        int(line.split()[0])
        for line in (double.proc_root / "devices").read_text().splitlines()
        if line.endswith(" nvidia-caps")
    )
    assert mig.device_nodes[-2:] == tuple(
        DeviceNodeSpec(f"/dev/nvidia-caps/nvidia-cap{m}", major, m, 0o444) for m in minors
    )


def test_partitionable_mode_publishes_profiles_with_counters(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], no_sysfs: str
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    b = backend(request, double, partitionable=True, sysfs_root=no_sysfs)
    devices, sets = b.discover(), b.shared_counters()
    assert [s.name for s in sets] == ["gpu-0-counters"]
    # go-nvml's H100: 7x 1g.10gb, 7x 1g.10gb+me, 7x 1g.20gb, 3x 2g.20gb, 2x 3g.40gb, 4g.40gb, 7g.80gb.
    profiles = [str(d.attributes["profile"]) for d in devices if d.kind == "mig"]
    assert len(devices) == 1 + len(profiles) and len(profiles) == 7 + 7 + 7 + 3 + 2 + 1 + 1
    three_g = next(d for d in devices if d.name == "gpu-0-mig-3g40gb-2-4")
    consumed = three_g.consumes_counters[0].counters
    # go-nvml's H100 places the 3g.40gb at {4, 3}: memory slices 4..6.
    assert [k for k in consumed if k.startswith("memory-slice")] == [f"memory-slice-{i}" for i in range(4, 7)]
    validate_devices(devices, sets)


def test_gpu_that_fails_to_read_is_skipped_not_fatal(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, lost=True)])
    assert backend(request, double).discover() == []


def test_real_pynvml_without_a_library_gives_a_clear_error() -> None:
    """No NVIDIA driver here: the real binding fails to load libnvidia-ml.so.1. In a child process:
    once a test has loaded the double, dlopen finds that soname in this one."""
    code = "from draplugin.devices.nvml import NvmlBackend\nNvmlBackend('node-a')"
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVML_DOUBLE_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=nvmldouble.REPO,
    )
    assert done.returncode != 0
    assert "NvmlUnavailableError" in done.stderr and "libnvidia-ml.so.1 not found" in done.stderr
    assert "LD_LIBRARY_PATH" in done.stderr and "--nvml-lib-path" in done.stderr


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
        NvmlBackend("node-a", lib_path=str(lib))


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
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    root = sysfs_with_numa(tmp_path, "0000:3b:00.0", "1\n")
    whole = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, pci_bus_id="00000000:3B:00.0")])
    (gpu,) = backend(request, whole, sysfs_root=str(root)).discover()
    assert gpu.attributes["resource.kubernetes.io/numaNode"] == 1
    # The MIG GPU sits at bus 0x18: its MIG devices share the parent's NUMA node.
    sysfs_with_numa(tmp_path, "0000:18:00.0", "0\n")
    migs = backend(
        request, nvml_double("dgxh100", gpus=1, overrides=[STATIC_MIG]), sysfs_root=str(root)
    ).discover()
    assert migs and {d.attributes["resource.kubernetes.io/numaNode"] for d in migs} == {0}


def test_gpu_without_numa_affinity_publishes_no_numa_attribute(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    root = sysfs_with_numa(tmp_path, "0000:3b:00.0", "-1\n")
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, pci_bus_id="00000000:3B:00.0")])
    (gpu,) = backend(request, double, sysfs_root=str(root)).discover()
    assert "resource.kubernetes.io/numaNode" not in gpu.attributes


def test_events_taint_the_right_devices(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[STATIC_MIG])
    b = backend(request, double)
    tracker = HealthTracker(DRIVER)
    one_g = gi_of(double, 6)
    double.append_event(1, "xid", 13)  # application error: ignored
    double.append_event(0, "xid", 31, gpu_instance_id=one_g)  # MMU fault: application-level, ignored
    double.append_event(0, "xid", 92, gpu_instance_id=one_g)  # one MIG device
    double.append_event(1, "doubleBitEcc")
    b.monitor_health(tracker, events["stop"], wait_ms=1)
    faults = tracker.faults()
    assert set(faults) == {MIG_NAMES[1], "gpu-1"}
    assert (faults[MIG_NAMES[1]].effect, faults[MIG_NAMES[1]].reason) == ("NoSchedule", "xid-92")
    assert (faults["gpu-1"].effect, faults["gpu-1"].reason) == ("NoSchedule", "ecc-double-bit")
    wanted = (
        pynvml.nvmlEventTypeXidCriticalError
        | pynvml.nvmlEventTypeDoubleBitEccError
        | pynvml.nvmlEventMigConfigChange
        | pynvml.nvmlEventTypeGpuUnavailableError
        | pynvml.nvmlEventTypeGpuRecoveryAction
    )
    assert events["registered"] == dict.fromkeys(uuids(double), wanted)


def test_fatal_xid_on_whole_gpu_taints_all_its_mig_devices_no_execute(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[STATIC_MIG])
    b = backend(request, double)
    tracker = HealthTracker(DRIVER, HealthPolicy(fatal_effect="NoExecute"))
    double.append_event(0, "xid", 79)
    b.monitor_health(tracker, events["stop"], wait_ms=1)
    assert {n: f.effect for n, f in tracker.faults().items()} == dict.fromkeys(MIG_NAMES, "NoExecute")


def test_fallen_off_the_bus_wakes_rediscovery(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[STATIC_MIG])
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    double.append_event(0, "xid", 79)
    backend(request, double).monitor_health(
        tracker, events["stop"], wait_ms=1, rediscover=lambda: woken.append(1)
    )
    assert woken == [1] and {f.effect for f in tracker.faults().values()} == {"NoSchedule"}


def test_a_lost_gpu_stays_published_tainted_and_recovers_when_it_answers_again(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[STATIC_MIG])
    b = backend(request, double)
    tracker = HealthTracker(DRIVER)
    b.attach_health(tracker)
    before = b.discover()

    double.mark_lost(1)
    assert b.refresh() is False  # kept as last read: the slices do not lose it
    assert b.discover() == before
    assert {n: (f.reason, f.effect) for n, f in tracker.faults().items()} == {
        "gpu-1": ("gpu-lost", "NoSchedule")
    }

    double.mark_lost(1, False)
    assert b.refresh() is False
    assert tracker.faults() == {}  # on-reset (default): it answers again, the taint goes


def test_never_recovery_keeps_the_lost_taint(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble]
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    b = backend(request, double)
    tracker = HealthTracker(DRIVER, HealthPolicy(recovery=Recovery("never")))
    b.attach_health(tracker)
    double.mark_lost(0)
    b.refresh()
    assert set(tracker.faults()) == {"gpu-0"}
    double.mark_lost(0, False)
    b.refresh()
    assert set(tracker.faults()) == {"gpu-0"}


def test_unknown_error_on_a_present_gpu_counts_as_lost() -> None:
    # Python fake: the double answers a lost GPU with GPU_IS_LOST only; UNKNOWN cannot be injected.
    other = a10g()
    nvml = FakeNvml([other])
    b = NvmlBackend("node-a", nvml=nvml)
    tracker = HealthTracker(DRIVER)
    b.attach_health(tracker)
    other.error = pynvml.NVML_ERROR_UNKNOWN
    b.refresh()
    assert {n: f.reason for n, f in tracker.faults().items()} == {"gpu-0": "gpu-lost"}


def test_a_gpu_nvml_no_longer_counts_leaves_and_a_mig_change_is_rediscovered(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=2, overrides=[STATIC_MIG])
    b = backend(request, double)
    assert [d.name for d in b.discover()] == [*MIG_NAMES, "gpu-1"]
    double.gpus = 1
    double.write()
    assert b.refresh() is True
    assert [d.name for d in b.discover()] == MIG_NAMES

    # A MIG layout change (the 1g.10gb destroyed, by nvidia-smi say): NVML says so with an event,
    # the monitor wakes re-discovery.
    with double.pynvml() as nvml:
        gi = nvml.nvmlDeviceGetGpuInstanceById(nvml.nvmlDeviceGetHandleByIndex(0), gi_of(double, 6))
        nvml.nvmlComputeInstanceDestroy(nvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0))
        nvml.nvmlGpuInstanceDestroy(gi)
    double.append_event(0, "migConfigChange")
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    b.monitor_health(tracker, events["stop"], wait_ms=1, rediscover=lambda: woken.append(1))
    (registered,) = events["registered"].values()
    assert woken == [1] and registered & pynvml.nvmlEventMigConfigChange
    assert b.refresh() is True
    assert [d.name for d in b.discover()] == MIG_NAMES[:1]


def test_unavailable_gpu_event_taints_and_recovery_action_none_clears(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    b = backend(request, double)
    tracker = HealthTracker(DRIVER)
    woken: list[int] = []
    double.append_event(0, "gpuUnavailable")
    b.monitor_health(tracker, events["stop"], wait_ms=1, rediscover=lambda: woken.append(1))
    assert woken == [1] and tracker.faults()["gpu-0"].reason == "gpu-lost"

    double.append_event(0, "recovery", pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)  # not yet
    double.append_event(0, "recovery", pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
    events["stop"].clear()
    b.monitor_health(tracker, events["stop"], wait_ms=1)  # a new event set reads the file from its start
    assert tracker.faults() == {}


def test_gpus_found_by_rediscovery_get_their_events_registered(
    request: pytest.FixtureRequest, nvml_double: Callable[..., NvmlDouble], events: dict[str, Any]
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    b = backend(request, double)
    calls: list[int] = []

    def on_empty() -> None:
        calls.append(1)
        if len(calls) == 1:
            double.gpus = 2  # a GPU that was reset comes back on the bus
            double.write()
            b.refresh()
        else:
            events["stop"].set()

    events["on_empty"] = on_empty
    b.monitor_health(HealthTracker(DRIVER), events["stop"], wait_ms=1)
    assert set(events["registered"]) == set(uuids(double))
