"""Shared whole GPUs (`--shared-gpus`): how they are published, and how prepare enforces each share.

Publishing: `allowMultipleAllocations` and a `requestPolicy` per consumable
capacity, within the API server's rules. Prepare: a claim's `consumedCapacity`
becomes its MPS client limits (pinned memory, active thread percentage), share
IDs reach the kubelet, and two claims may hold a shared GPU but never an
unshared one. The GPU's one MPS daemon across shares: tests/unit/test_mps_shared_gpu.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from draplugin import config
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from draplugin.devices import load_backend
from draplugin.devices.model import CapacityPolicy, Device, DeviceValidationError
from draplugin.devices.schema import GpuInfo, SystemInfo, build_devices
from draplugin.devices.shared import SharedGpus, UnlimitedShares, memory_policy, share
from draplugin.kubelet.interface import ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare import mps
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.gpuconfig import SharingStrategy
from draplugin.prepare.plan import PlanError, check_sharing, plan_claim, plan_from_record, render_spec
from draplugin.slices.plan import plan_slices
from tests import nvmldouble
from tests.nvmldouble import GI_PROFILE_1_SLICE, GI_PROFILE_3_SLICE, Gpu, MigDevice
from tests.unit import sharing_fixtures, test_prepare_driver
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, gpu_config, result
from tests.unit.test_prepare_plan import config as config_entry

tool_node = sharing_fixtures.tool_node
crash_at = test_prepare_driver.crash_at  # the fixture: SIGKILL stood in for by an uncatchable exception
GiB, MiB = 1 << 30, 1 << 20


def gpu_info(index: int = 0, memory: int = 80 * GiB) -> GpuInfo:
    return GpuInfo(
        index=index,
        minor=index,
        uuid=f"GPU-{index:08d}",
        product_name="H100-80GB-HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=memory,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        pcie_root=None,
        device_nodes=(f"/dev/nvidia{index}",),
    )


SYSTEM = SystemInfo("580.65.06", "13.0")


def shared_gpu(index: int = 0, mode: SharedGpus = SharedGpus.MEMORY_AND_COMPUTE) -> Device:
    (device,), _ = build_devices(SYSTEM, [gpu_info(index)], shared=mode)
    return device


# --- publishing ---------------------------------------------------------------------------------------


def test_off_publishes_the_gpu_unchanged() -> None:
    (device,), _ = build_devices(SYSTEM, [gpu_info()])
    assert shared_gpu(mode=SharedGpus.OFF) == device
    assert "allowMultipleAllocations" not in device.to_api()


def test_memory_mode_publishes_a_consumable_memory_capacity() -> None:
    api = shared_gpu(mode=SharedGpus.MEMORY).to_api()
    assert api["allowMultipleAllocations"] is True
    assert api["capacity"] == {
        "memory": {
            "value": "80Gi",
            "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Gi", "step": "1Mi"}},
        }
    }


def test_memory_and_compute_mode_adds_a_compute_percentage() -> None:
    api = shared_gpu().to_api()
    assert api["capacity"]["compute"] == {
        "value": "100",
        "requestPolicy": {"default": "100", "validRange": {"min": "1", "max": "100", "step": "1"}},
    }
    assert api["capacity"]["memory"]["requestPolicy"]["default"] == "80Gi"


def test_memory_that_is_not_whole_mib_defaults_to_the_whole_mib_below_it() -> None:
    policy = memory_policy(15843721216)  # a T4: 15109.75 MiB
    assert policy == CapacityPolicy(default="15109Mi", min="1Gi", step="1Mi")
    device = share(shared_gpu(mode=SharedGpus.OFF), 15843721216, SharedGpus.MEMORY)
    device = dataclasses.replace(device, capacity={"memory": "15843721216"})
    device.validate()  # default - min is a multiple of the step, and below the capacity


def test_a_gpu_too_small_to_split_is_published_whole() -> None:
    whole = dataclasses.replace(shared_gpu(mode=SharedGpus.OFF), capacity={"memory": "1Gi"})
    assert share(whole, GiB, SharedGpus.MEMORY) is whole


def test_mig_devices_and_partitionable_gpus_are_not_shared() -> None:
    mig = dataclasses.replace(shared_gpu(mode=SharedGpus.OFF), parent_uuid="GPU-00000000")
    assert share(mig, 80 * GiB, SharedGpus.MEMORY) is mig


def test_fake_backend_publishes_shared_gpus_when_asked() -> None:
    backend = load_backend("fake", "node-a", gpus=2, shared_gpus=SharedGpus.MEMORY)
    assert [d.allow_multiple_allocations for d in backend.discover()] == [True, True]


def test_nvml_backend_shares_whole_gpus_but_not_mig_ones(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # On the NVML double: two H100s, GPU 0 in MIG mode with a 3g.40gb and a 1g.10gb, GPU 1 whole.
    migs = (MigDevice(GI_PROFILE_3_SLICE, 0), MigDevice(GI_PROFILE_1_SLICE, 6))
    double = nvmldouble.nvml_double_factory(tmp_path)(
        "dgxh100", gpus=2, overrides=[Gpu(index=0, mig_mode=1, mig_devices=migs)]
    )
    (tmp_path / "sys").mkdir()  # an empty sysfs: nothing of this machine's PCI tree
    # publish: this checks which GPUs are shared, not their memory limit (test_memlimit_discovery).
    backend = nvmldouble.plugin_backend(
        double,
        request,
        shared_gpus=SharedGpus.MEMORY,
        unlimited_shares=UnlimitedShares.PUBLISH,
        sysfs_root=str(tmp_path / "sys"),
    )
    devices = backend.discover()
    assert sorted(d.kind for d in devices) == ["gpu", "mig", "mig"]
    shared = {d.name for d in devices if d.allow_multiple_allocations}
    assert shared == {"gpu-1"}  # GPU 0 has MIG on: its MIG devices are already partitions
    assert all(not d.allow_multiple_allocations for d in devices if d.kind == "mig")


def test_shared_gpus_fit_the_slice_limits() -> None:
    (planned,) = plan_slices([shared_gpu(i) for i in range(8)])
    assert len(planned.devices) == 8
    assert all(d["allowMultipleAllocations"] for d in planned.devices)


@pytest.mark.parametrize(
    ("policy", "field", "problem"),
    [
        (CapacityPolicy(default="100Gi", min="1Gi", max="80Gi"), "default", "more than max"),
        (CapacityPolicy(default="512Mi", min="1Gi"), "default", "less than min"),
        (CapacityPolicy(default="2Gi", min="90Gi"), "validRange.min", "larger than capacity"),
        (CapacityPolicy(default="1536Mi", min="1Gi", step="1Gi"), "default", "multiple of step"),
        (CapacityPolicy(default="1Gi", min="1Gi", step="0"), "validRange.step", "greater than zero"),
        (CapacityPolicy(default="1Gi", min="1Gi", step="80Gi"), "validRange.step", "one step above min"),
        (CapacityPolicy(default="1Gi", min="1Gi", step="1.5"), "validRange.step", "whole number"),
    ],
)
def test_policies_the_api_server_would_refuse_are_refused(
    policy: CapacityPolicy, field: str, problem: str
) -> None:
    device = dataclasses.replace(shared_gpu(mode=SharedGpus.MEMORY), capacity_policies={"memory": policy})
    with pytest.raises(DeviceValidationError) as caught:
        device.validate()
    assert caught.value.field_path == f"capacity[memory].requestPolicy.{field}"
    assert problem in caught.value.problem


def test_a_policy_needs_allow_multiple_allocations_and_the_capacity() -> None:
    device = shared_gpu(mode=SharedGpus.MEMORY)
    with pytest.raises(DeviceValidationError, match="allowMultipleAllocations must be true"):
        dataclasses.replace(device, allow_multiple_allocations=False).validate()
    with pytest.raises(DeviceValidationError, match="no such capacity"):
        dataclasses.replace(device, capacity_policies={"cores": CapacityPolicy("1", "1")}).validate()


# --- settings -----------------------------------------------------------------------------------------


def test_the_setting_has_an_environment_mirror_and_reaches_the_backend() -> None:
    settings = config.load({"node_name": "n", "backend": "fake"}, environ={"SHARED_GPUS": "memory"})
    assert settings.shared_gpus is SharedGpus.MEMORY
    assert settings.backend_options()["shared_gpus"] is SharedGpus.MEMORY
    flag = config.load({"node_name": "n", "backend": "fake", "shared_gpus": "memory-and-compute"}, environ={})
    assert flag.shared_gpus is SharedGpus.MEMORY_AND_COMPUTE
    assert (
        "shared_gpus" not in config.load({"node_name": "n", "backend": "fake"}, environ={}).backend_options()
    )


def test_a_bad_setting_names_the_flag_and_the_choices() -> None:
    with pytest.raises(config.ConfigError) as caught:
        config.load({"node_name": "n", "backend": "fake"}, environ={"SHARED_GPUS": "yes"})
    assert str(caught.value) == (
        "--shared-gpus (SHARED_GPUS): 'yes' is not one of off, memory, memory-and-compute"
    )


# --- planning -----------------------------------------------------------------------------------------

DEVICES = {d.name: d for d in (shared_gpu(0), shared_gpu(1), shared_gpu(2, SharedGpus.MEMORY))}
UNSHARED = dataclasses.replace(
    DEVICES["gpu-0"], allow_multiple_allocations=False, capacity={"memory": "80Gi"}, capacity_policies={}
)


def shared_result(device: str, share_id: str, request: str = "gpu", **consumed: str) -> dict[str, Any]:
    return result(request, device, shareID=share_id, consumedCapacity=consumed)


def plan(doc: dict[str, Any], uid: str = "uid-1", devices: dict[str, Device] = DEVICES) -> Any:
    return plan_claim(ClaimRef("ns", uid, "claim"), doc, driver=DRIVER, pool=NODE, devices=devices)


def mps_of(planned: Any) -> Any:
    (sharing,) = {d.config.sharing for d in planned.devices}
    assert sharing.strategy is SharingStrategy.MPS
    return sharing.mps


def test_a_share_gets_an_mps_limit_equal_to_the_memory_and_compute_it_consumed() -> None:
    planned = plan(claim_doc(results=[shared_result("gpu-0", "s-1", memory="10Gi", compute="30")]))
    limits = mps_of(planned)
    assert limits.per_device_pinned_memory_limit == {"gpu-0": 10 * GiB}
    assert limits.default_active_thread_percentage == 30
    settings = mps.settings_for(planned)
    assert settings is not None
    assert (settings.devices, settings.active_thread_percentage, settings.pinned_limits_mib) == (
        (DEVICES["gpu-0"].uuid,),
        30,
        ((0, 10240),),
    )
    assert planned.prepared_devices()[0].share_id == "s-1"


def test_two_requests_of_one_claim_on_one_gpu_add_up() -> None:
    doc = claim_doc(results=[
        shared_result("gpu-0", "s-1", "a", memory="4Gi", compute="20"),
        shared_result("gpu-0", "s-2", "b", memory="6Gi", compute="30"),
    ])  # fmt: skip
    planned = plan(doc)
    assert mps_of(planned).per_device_pinned_memory_limit == {"gpu-0": 10 * GiB}
    assert mps_of(planned).default_active_thread_percentage == 50
    assert [d.share_id for d in planned.prepared_devices()] == ["s-1", "s-2"]
    spec = render_spec(planned).to_json()
    assert len(spec["devices"]) == 1  # one CDI device serves both shares


def test_memory_mode_leaves_the_thread_percentage_to_the_claims_config() -> None:
    doc = claim_doc(
        results=[shared_result("gpu-2", "s-1", memory="8Gi")],
        configs=[
            config_entry("FromClaim", gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 40}))
        ],
    )
    limits = mps_of(plan(doc))
    assert (limits.per_device_pinned_memory_limit, limits.default_active_thread_percentage) == (
        {"gpu-2": 8 * GiB},
        40,
    )


def test_the_cdi_variables_carry_the_same_limits_as_the_daemon() -> None:
    planned = plan(claim_doc(results=[shared_result("gpu-0", "s-1", memory="10Gi", compute="30")]))
    (device,) = render_spec(planned).to_json()["devices"]
    env = device["containerEdits"]["env"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in env
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={DEVICES['gpu-0'].uuid}=10240M" in env


def test_a_share_of_the_whole_gpu_is_prepared_like_an_exclusive_one() -> None:
    doc = claim_doc(
        results=[shared_result("gpu-0", "s-1", memory="80Gi", compute="100")],
        configs=[
            config_entry("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Long"}))
        ],
    )
    (device,) = plan(doc).devices
    assert device.config.sharing.strategy is SharingStrategy.TIME_SLICING


def test_the_derived_config_survives_the_checkpoint() -> None:
    planned = plan(claim_doc(results=[shared_result("gpu-0", "s-1", memory="10Gi", compute="30")]))
    record = ClaimRecord("uid-1", "ns", "claim", ClaimState.PREPARE_COMPLETED, planned.device_records())
    restored = plan_from_record(record, DEVICES, driver=DRIVER)
    assert mps.settings_for(restored) == mps.settings_for(planned)
    assert restored.prepared_devices() == planned.prepared_devices()


@pytest.mark.parametrize(
    ("configured", "consumed", "reason", "text"),
    [
        (
            gpu_config("TimeSlicing"),
            {"memory": "10Gi", "compute": "30"},
            "UnsupportedSharing",
            "cannot ask for TimeSlicing",
        ),
        (
            gpu_config("MPS", mpsConfig={"defaultPinnedDeviceMemoryLimit": "20Gi"}),
            {"memory": "10Gi", "compute": "30"},
            "InvalidConfig",
            "cannot set sharing.mpsConfig pinned memory limits",
        ),
        (
            gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 90}),
            {"memory": "10Gi", "compute": "30"},
            "InvalidConfig",
            "cannot set sharing.mpsConfig.defaultActiveThreadPercentage",
        ),
        (gpu_config(), {"compute": "30"}, "InvalidClaim", "without consumedCapacity.memory"),
    ],
)
def test_a_config_that_contradicts_the_share_is_refused(
    configured: dict[str, Any], consumed: dict[str, str], reason: str, text: str
) -> None:
    doc = claim_doc(
        results=[shared_result("gpu-0", "s-1", **consumed)], configs=[config_entry("FromClaim", configured)]
    )
    with pytest.raises(PlanError) as caught:
        plan(doc)
    assert caught.value.reason == reason
    assert "claim ns/claim: request gpu takes a share of GPU gpu-0" in str(caught.value)
    assert text in str(caught.value)


def test_shares_with_different_compute_in_one_claim_are_refused() -> None:
    doc = claim_doc(results=[
        shared_result("gpu-0", "s-1", "a", memory="4Gi", compute="20"),
        shared_result("gpu-1", "s-2", "b", memory="4Gi", compute="30"),
    ])  # fmt: skip
    with pytest.raises(PlanError, match=r"different compute shares \(20, 30\)") as caught:
        plan(doc)
    assert caught.value.reason == "UnsupportedSharing"


@pytest.mark.parametrize("bad", [{"memory": "lots"}, {"memory": "-1Gi"}, ["10Gi"]])
def test_malformed_consumed_capacity_is_a_clear_error(bad: Any) -> None:
    doc = claim_doc(results=[result("gpu", "gpu-0", shareID="s-1", consumedCapacity=bad)])
    with pytest.raises(PlanError, match=r"status.allocation.devices.results\[0\].consumedCapacity") as caught:
        plan(doc)
    assert caught.value.reason == "InvalidClaim"


# --- two claims on one GPU ------------------------------------------------------------------------------


def record_of(planned: Any, uid: str) -> ClaimRecord:
    return ClaimRecord(uid, "ns", "other", ClaimState.PREPARE_COMPLETED, planned.device_records())


def test_two_claims_may_share_a_shared_gpu() -> None:
    first = plan(claim_doc(uid="uid-1", results=[shared_result("gpu-0", "s-1", memory="10Gi", compute="30")]))
    second = plan(
        claim_doc(uid="uid-2", results=[shared_result("gpu-0", "s-2", memory="20Gi", compute="60")]), "uid-2"
    )
    check_sharing(second, [record_of(first, "uid-1")])


def test_two_claims_on_an_unshared_gpu_are_refused_even_with_share_ids() -> None:
    devices = {"gpu-0": UNSHARED}
    first = plan(
        claim_doc(uid="uid-1", results=[shared_result("gpu-0", "s-1", memory="80Gi")]), devices=devices
    )
    second = plan(
        claim_doc(uid="uid-2", results=[shared_result("gpu-0", "s-2", memory="80Gi")]), "uid-2", devices
    )
    with pytest.raises(PlanError, match="not published as a shared GPU") as caught:
        check_sharing(second, [record_of(first, "uid-1")])
    assert caught.value.reason == "DeviceInUse"


def test_a_share_next_to_an_exclusive_holder_is_refused() -> None:
    holder = plan(claim_doc(uid="uid-1", results=[result("gpu", "gpu-0")]))
    second = plan(
        claim_doc(uid="uid-2", results=[shared_result("gpu-0", "s-2", memory="10Gi", compute="10")]), "uid-2"
    )
    with pytest.raises(PlanError, match="uses it exclusively"):
        check_sharing(second, [record_of(holder, "uid-1")])


# --- through the prepare driver, on stand-in driver tools -------------------------------------------------


def driver(node: ToolNode, claims: FakeClaims, devices: Sequence[Device] | None = None) -> GpuDriver:
    """The prepare driver on `node`'s stand-in tools, recovered; `devices` default to the shares here."""
    process = GpuDriver(
        driver_name=DRIVER,
        node_name=NODE,
        devices=list(DEVICES.values()) if devices is None else list(devices),
        claims=claims,
        cdi_store=SpecStore(node.state.parent / "cdi", DRIVER),
        checkpoint=CheckpointStore(node.state / "checkpoint.json", "boot-1"),
        sharing=node.sharing(),
        events=RecordingEvents(),
        metrics=ClaimMetrics(CollectorRegistry()),
    )
    process.recover()
    return process
