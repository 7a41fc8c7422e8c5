"""The NVML double (tests/cluster/nvmldouble) through the real pynvml, nvidia-smi and go-nvml."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import nvmldouble
from tests.nvmldouble import ComputeInstance, Gpu, MigDevice, NvmlDouble

# go-nvml's mock data (pkg/nvml/mock/gpus/h100.go, a100.go), which the double serves.
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY = 81920 << 20
A100_NAME = "Mock NVIDIA A100-SXM4-40GB"
A100_MEMORY = 40960 << 20
H100_PLACEMENTS = {
    0: [(s, 1) for s in range(7)],  # 1g.10gb
    1: [(0, 2), (2, 2), (4, 2)],  # 2g.20gb
    2: [(0, 3), (4, 3)],  # 3g.40gb
    3: [(0, 4)],  # 4g.40gb
    4: [(0, 7)],  # 7g.80gb
}
A100_PROFILES = {
    0: ("1g.5gb", 4864, 7),
    1: ("2g.10gb", 9856, 3),
    2: ("3g.20gb", 19968, 2),
    4: ("7g.40gb", 40192, 1),
}


@pytest.fixture
def nvml_double(tmp_path: Path) -> Callable[..., NvmlDouble]:
    return nvmldouble.nvml_double_factory(tmp_path)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _placements(nvml: Any, handle: Any, profile_id: int) -> list[tuple[int, int]]:
    array = (nvml.c_nvmlGpuInstancePlacement_t * 16)()
    count = ctypes.c_uint(16)
    nvml.nvmlDeviceGetGpuInstancePossiblePlacements(handle, profile_id, array, ctypes.byref(count))
    return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]


def _run_python(double: NvmlDouble, code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **double.env(), "PYTHONPATH": str(nvmldouble.REPO)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=nvmldouble.REPO,
    )


def _create_gi(nvml: Any, handle: Any, profile_id: int, start: int, size: int) -> Any:
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start, placement.size = start, size
    gi = nvml.c_nvmlGpuInstance_t()
    fn = nvml._nvmlGetFunctionPointer("nvmlDeviceCreateGpuInstanceWithPlacement")
    ret = fn(handle, profile_id, ctypes.byref(placement), ctypes.byref(gi))
    nvml._nvmlCheckReturn(ret)
    return gi


# --- discovery ------------------------------------------------------------------------------------


def test_dgxh100_discovery_and_stable_uuids(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxh100", gpus=2)
    with double.pynvml() as nvml:
        assert _text(nvml.nvmlSystemGetDriverVersion()) == "550.163.01"
        assert nvml.nvmlSystemGetCudaDriverVersion() == 12040
        assert nvml.nvmlDeviceGetCount() == 2
        handle = nvml.nvmlDeviceGetHandleByIndex(1)
        assert _text(nvml.nvmlDeviceGetName(handle)) == H100_NAME
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == H100_MEMORY
        assert nvml.nvmlDeviceGetCudaComputeCapability(handle) == (9, 0)
        assert nvml.nvmlDeviceGetArchitecture(handle) == nvml.NVML_DEVICE_ARCH_HOPPER
        assert nvml.nvmlDeviceGetIndex(handle) == 1
        assert nvml.nvmlDeviceGetMinorNumber(handle) == 1
        uuids = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(2)]
        bus = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
        assert bus == "00000000:01:00.0"
        assert _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByPciBusId("0000:01:00.0"))) == uuids[1]
        assert _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByUUID(uuids[0]))) == uuids[0]
    assert all(u.startswith("GPU-") for u in uuids) and len(set(uuids)) == 2
    with double.pynvml() as nvml:  # a second init, and a second process, see the same UUIDs
        again = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(2)]
    assert again == uuids
    done = _run_python(
        double,
        """
        import ctypes, os, pynvml
        pynvml.nvmlLib = ctypes.CDLL(os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libnvidia-ml.so.1")
        pynvml.nvmlInit()
        print(",".join(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(2)))
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ",".join(uuids)


def test_dgxa100_discovery_and_mig_profiles(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxa100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert _text(nvml.nvmlDeviceGetName(handle)) == A100_NAME
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == A100_MEMORY
        assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
        for profile_id, (name, memory_mb, count) in A100_PROFILES.items():
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
            assert (_text(info.name), int(info.memorySizeMB), int(info.instanceCount)) == (
                f"MIG {name}",
                memory_mb,
                count,
            )
        assert _placements(nvml, handle, 4) == [(0, 8)]
        assert _placements(nvml, handle, 0) == [(s, 1) for s in range(7)]


def test_h100_profiles_and_placements_are_go_nvml_mock_data(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        for profile_id, placements in H100_PLACEMENTS.items():
            assert _placements(nvml, handle, profile_id) == placements
        info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0)
        assert (_text(info.name), int(info.memorySizeMB), int(info.multiprocessorCount)) == (
            "MIG 1g.10gb",
            10240,
            16,
        )


# --- MIG ------------------------------------------------------------------------------------------


def test_mig_off_lists_profiles_but_no_instances_and_mig_on_works(
    nvml_double: Callable[..., NvmlDouble],
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]
        # nvml.h: profile info and placements are NOT_SUPPORTED only where the GPU "doesn't support
        # MIG"; placements are returned "regardless of whether MIG is enabled or not".
        assert _text(nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0).name) == "MIG 1g.10gb"
        assert _placements(nvml, handle, 2) == H100_PLACEMENTS[2]
        # What exists or can still be made needs MIG mode: "doesn't have MIG mode enabled".
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetGpuInstanceById(handle, 1)
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, 0)
        with pytest.raises(nvml.NVMLError_NotSupported):
            _create_gi(nvml, handle, 0, 0, 1)
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0
        # Hopper switches MIG mode without a reset.
        assert nvml.nvmlDeviceSetMigMode(handle, 1) == nvml.NVML_SUCCESS
        assert nvml.nvmlDeviceGetMigMode(handle) == [1, 1]
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetGpuInstanceById(handle, 1)
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 7)
        nvml.nvmlDeviceSetMigMode(handle, 0)
        assert nvml.nvmlDeviceGetMigMode(handle) == [0, 0]


def test_an_ampere_mig_mode_switch_waits_for_a_reset(nvml_double: Callable[..., NvmlDouble]) -> None:
    """nvmlDeviceSetMigMode on an A100 sets the pending mode only (activationStatus RESET_REQUIRED,
    as NVIDIA's MIG user guide has Ampere need a GPU reset); resetAtInit is the reset at a later init."""
    double = nvml_double("dgxa100", gpus=1, reset_at_init=True)
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        assert nvml.nvmlDeviceSetMigMode(handle, 1) == nvml.NVML_ERROR_RESET_REQUIRED
        assert nvml.nvmlDeviceGetMigMode(handle) == [0, 1]
        with pytest.raises(nvml.NVMLError_NotSupported):
            _create_gi(nvml, handle, 0, 0, 1)
    # The reset (a reboot) is a later process's first init: pending becomes current. A child
    # process, since this one may have initialised the double long before this test.
    after_reset = textwrap.dedent(
        """
        import ctypes, json, sys
        import pynvml as nvml
        nvml.nvmlLib = ctypes.CDLL(sys.argv[1])
        nvml.nvmlInit()
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        mode = list(nvml.nvmlDeviceGetMigMode(handle))
        again = nvml.nvmlDeviceSetMigMode(handle, 1)
        print(json.dumps({"mode": mode, "again": again}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", after_reset, str(double.lib_path)],
        env={**os.environ, **double.env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout)
    assert seen == {"mode": [1, 1], "again": 0}, seen  # no change left to wait for: NVML_SUCCESS
    with double.pynvml() as nvml:  # a GPU instance now holds MIG mode on
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        _create_gi(nvml, handle, 0, 0, 1)
        assert nvml.nvmlDeviceSetMigMode(handle, 0) == nvml.NVML_ERROR_IN_USE


def test_utilization_in_mig_mode_is_not_supported(nvml_double: Callable[..., NvmlDouble]) -> None:
    """nvml.h: "On MIG-enabled GPUs, querying device utilization rates [process utilization] is not
    currently supported"; process samples only for processes with some utilization, after lastSeen."""
    from tests.nvmldouble import Process

    busy, idle = Process(pid=10, sm_util=30, mem_util=5), Process(pid=11)
    double = nvml_double(
        "dgxh100", gpus=2, overrides=[Gpu(index=0, mig_mode=1), Gpu(index=1, processes=(busy, idle))]
    )
    with double.pynvml() as nvml:
        mig, whole = (nvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetUtilizationRates(mig)
        with pytest.raises(nvml.NVMLError_NotSupported):
            nvml.nvmlDeviceGetProcessUtilization(mig, 0)
        (sample,) = nvml.nvmlDeviceGetProcessUtilization(whole, 0)
        assert (sample.pid, sample.smUtil, sample.memUtil) == (10, 30, 5)
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetProcessUtilization(whole, (1 << 63))  # nothing newer than that


def test_create_and_destroy_instances_shared_with_another_process(
    nvml_double: Callable[..., NvmlDouble],
) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        parent_uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        gi = _create_gi(nvml, handle, 2, 4, 3)  # 3g.40gb at slice 4
        info = nvml.nvmlGpuInstanceGetInfo(gi)
        assert (int(info.profileId), int(info.placement.start), int(info.placement.size)) == (2, 4, 3)
        gi_id = int(info.id)
        ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gi, nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        )
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_profile.id))
        ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
        mig_uuid = _text(nvml.nvmlDeviceGetUUID(ci_info.device))
        assert mig_uuid.startswith("MIG-")
        with pytest.raises(nvml.NVMLError_InsufficientResources):
            _create_gi(nvml, handle, 0, 5, 1)  # overlaps the 3g instance
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 4)
        assert nvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
        assert (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig)) == (gi_id, 0)
        parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
        assert _text(nvml.nvmlDeviceGetUUID(parent)) == parent_uuid
        assert nvml.nvmlDeviceGetMemoryInfo(mig).total == 40960 << 20
        access = double.proc_root / f"driver/nvidia/capabilities/gpu0/mig/gi{gi_id}/ci0/access"  # type: ignore[operator]
        assert access.read_text().splitlines()[0] == f"DeviceFileMinor: {3 + gi_id * 9 + 1}"

    seen = _run_python(
        double,
        f"""
        import ctypes, os, pynvml
        pynvml.nvmlLib = ctypes.CDLL(os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libnvidia-ml.so.1")
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        gi = pynvml.nvmlDeviceGetGpuInstanceById(h, {gi_id})
        ci = pynvml.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
        print(pynvml.nvmlDeviceGetUUID(pynvml.nvmlComputeInstanceGetInfo(ci).device))
        pynvml.nvmlComputeInstanceDestroy(ci)
        pynvml.nvmlGpuInstanceDestroy(gi)
        """,
    )
    assert seen.returncode == 0, seen.stderr
    assert seen.stdout.strip() == mig_uuid
    state = double.state()
    assert state[parent_uuid]["gpuInstances"] == []
    assert not access.exists()
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(nvml.NVMLError_NotFound):
            nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)


def test_static_mig_devices_with_holes(nvml_double: Callable[..., NvmlDouble]) -> None:
    two_cis = (ComputeInstance(0), ComputeInstance(0))
    double = nvml_double(
        "dgxa100",
        gpus=1,
        overrides=[Gpu(index=0, mig_mode=1, mig_devices=(MigDevice(2, 4), MigDevice(1, 0, two_cis)))],
    )
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        found = {}
        for k in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, k)
            except nvml.NVMLError_NotFound:
                continue
            found[k] = (nvml.nvmlDeviceGetGpuInstanceId(mig), nvml.nvmlDeviceGetComputeInstanceId(mig))
        assert sorted(found) == [0, 1, 4]  # 2g at 0 with two 1c CIs, 3g at 4; the rest are holes
        assert len({gi for gi, _ in found.values()}) == 2


def test_null_out_pointer_and_foreign_handle_are_invalid_argument(
    nvml_double: Callable[..., NvmlDouble],
) -> None:
    double = nvml_double("dgxh100", gpus=1)
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        for name in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetMinorNumber"):
            fn = nvml._nvmlGetFunctionPointer(name)
            assert fn(handle, None) == nvml.NVML_ERROR_INVALID_ARGUMENT, name
        count = nvml._nvmlGetFunctionPointer("nvmlDeviceGetCount_v2")
        assert count(None) == nvml.NVML_ERROR_INVALID_ARGUMENT
        bogus = nvml.c_nvmlDevice_t(ctypes.cast(ctypes.pointer(ctypes.c_int(0)), type(handle)))
        with pytest.raises(nvml.NVMLError_InvalidArgument):
            nvml.nvmlDeviceGetName(bogus)


def test_placement_passed_by_value_never_creates_an_instance(nvml_double: Callable[..., NvmlDouble]) -> None:
    """What draplugin/devices/nvml.py mig_create does: the structure where NVML wants a pointer."""
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    done = _run_python(
        double,
        """
        import ctypes, os, pynvml
        pynvml.nvmlLib = ctypes.CDLL(os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libnvidia-ml.so.1")
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        where = pynvml.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = 0, 1
        try:
            gi = pynvml.nvmlDeviceCreateGpuInstanceWithPlacement(h, 0, where)
        except pynvml.NVMLError as err:
            print("ERROR", err)
        else:
            print("CREATED", pynvml.nvmlGpuInstanceGetInfo(gi).id)
        """,
    )
    assert "CREATED" not in done.stdout
    assert done.returncode != 0 or "ERROR" in done.stdout, (done.returncode, done.stdout, done.stderr)
    assert all(not g["gpuInstances"] for g in double.state().values())


def test_lost_gpu_while_running(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxh100", gpus=2)
    with double.pynvml() as nvml:
        handle = nvml.nvmlDeviceGetHandleByIndex(1)
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == H100_MEMORY
        double.mark_lost(1)
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetMemoryInfo(handle)
        with pytest.raises(nvml.NVMLError_GpuIsLost):
            nvml.nvmlDeviceGetHandleByIndex(1)
        assert nvml.nvmlDeviceGetCount() == 2
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
        double.mark_lost(1, lost=False)
        assert nvml.nvmlDeviceGetMemoryInfo(handle).total == H100_MEMORY


def test_unified_memory_gpu_has_no_memory_info(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxh100", gpus=1, overrides=[Gpu(index=0, unified_memory=True)])
    with double.pynvml() as nvml, pytest.raises(nvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))


def test_xid_event_delivered(nvml_double: Callable[..., NvmlDouble]) -> None:
    double = nvml_double("dgxh100", gpus=2)
    with double.pynvml() as nvml:
        event_set = nvml.nvmlEventSetCreate()
        handle = nvml.nvmlDeviceGetHandleByIndex(1)
        supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError & supported, event_set)
        with pytest.raises(nvml.NVMLError_Timeout):
            nvml.nvmlEventSetWait_v2(event_set, 50)
        double.append_event(0, "xid", 13)  # GPU 0 is not registered: skipped
        double.append_event(1, "xid", 79)
        data = nvml.nvmlEventSetWait_v2(event_set, 2000)
        assert data.eventType == nvml.nvmlEventTypeXidCriticalError
        assert data.eventData == 79
        assert _text(nvml.nvmlDeviceGetUUID(data.device)) == _text(nvml.nvmlDeviceGetUUID(handle))
        assert data.gpuInstanceId == 0xFFFFFFFF
        with pytest.raises(nvml.NVMLError_Timeout):
            nvml.nvmlEventSetWait_v2(event_set, 50)
        nvml.nvmlEventSetFree(event_set)


def test_two_part_driver_version_and_bad_config(
    nvml_double: Callable[..., NvmlDouble], tmp_path: Path
) -> None:
    double = nvml_double("dgxh100", gpus=1, driver_version="550.135")
    with double.pynvml() as nvml:
        assert _text(nvml.nvmlSystemGetDriverVersion()) == "550.135"
        assert _text(nvml.nvmlSystemGetNVMLVersion()) == "12.550.135"
    assert "550.135" in (double.proc_root / "driver/nvidia/version").read_text()  # type: ignore[operator]
    bad = tmp_path / "bad.json"
    bad.write_text('{"machine": "dgxz900"}')
    done = _run_python(
        NvmlDouble(config_path=bad),
        """
        import ctypes, os, pynvml
        pynvml.nvmlLib = ctypes.CDLL(os.environ["LD_LIBRARY_PATH"].split(":")[0] + "/libnvidia-ml.so.1")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            print("ERROR", err)
        """,
    )
    assert "ERROR" in done.stdout
    assert f"nvml-double: {bad}" in done.stderr and "dgxz900" in done.stderr


# --- the project's own code, nvidia-smi, go-nvml ------------------------------------------------------


def test_nvml_backend_discovers_dgxh100(
    nvml_double: Callable[..., NvmlDouble], monkeypatch: pytest.MonkeyPatch
) -> None:
    from draplugin.devices.nvml import NvmlBackend

    double = nvml_double("dgxh100", gpus=2)
    monkeypatch.setenv("NVML_DOUBLE_CONFIG", str(double.config_path))
    backend = NvmlBackend("node-a", lib_path=str(double.lib_path), proc_root=str(double.proc_root))
    try:
        devices = backend.discover()
        assert backend.driver_version() == "550.163.01"
    finally:
        backend.close()
    with double.pynvml() as nvml:
        uuids = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(2)]
    assert sorted(d.uuid for d in devices if d.kind == "gpu") == sorted(uuids)


def test_nvidia_smi_lists_gpus(nvml_double: Callable[..., NvmlDouble]) -> None:
    smi = nvmldouble.nvidia_smi()
    double = nvml_double("dgxh100", gpus=2)
    with double.pynvml() as nvml:
        uuids = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) for i in range(2)]
    env = {**os.environ, **double.env()}
    listed = subprocess.run(
        [str(smi), "-L"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [f"GPU {i}: {H100_NAME} (UUID: {u})" for i, u in enumerate(uuids)]
    query = subprocess.run(
        [str(smi), "--query-gpu=index,uuid,name,memory.total,driver_version", "--format=csv,noheader"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert query.returncode == 0, query.stderr
    assert query.stdout.splitlines()[0] == f"0, {uuids[0]}, {H100_NAME}, 81920 MiB, 550.163.01"


def test_go_nvml_program_loads_the_double(nvml_double: Callable[..., NvmlDouble]) -> None:
    """A Go program (go-nvml, dlopen, as nvidia-ctk) loading the double: two Go runtimes in one process."""
    double = nvml_double(
        "dgxh100", gpus=2, overrides=[Gpu(index=1, mig_mode=1, mig_devices=(MigDevice(0, 3),))]
    )
    done = subprocess.run(
        [str(nvmldouble.gonvmlcheck_path()), str(double.lib_path)],
        env={**os.environ, **double.env()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["driverVersion"] == "550.163.01"
    assert [d["migMode"] for d in out["devices"]] == [0, 1]
    (mig,) = out["devices"][1]["migDevices"]
    assert mig["parentUuid"] == out["devices"][1]["uuid"] and mig["uuid"].startswith("MIG-")
    assert mig["name"] == f"{H100_NAME} MIG 1g.10gb" and mig["memoryMB"] == 10240
