"""Prepare of shares whose GPU takes the driver's per-cgroup memory limit: the CDI device runs
NVIDIA's apply-cuda-memory-limits (createRuntime) with the share's memory in MiB in the env, and a
hand-written over-commit of a GPU's memory is refused."""

from __future__ import annotations

from typing import Any

import pytest

from draplugin.cdi.spec import CdiError
from draplugin.checkpoint import ClaimRecord, ClaimState
from draplugin.devices.model import Device
from draplugin.devices.schema import GpuInfo, SystemInfo, build_devices
from draplugin.devices.shared import SharedGpus, UnlimitedShares, with_memory_limit
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.memlimits import MemoryLimitHook, check_memory_fits
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim, render_spec
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, result

GiB = 1 << 30
HOOK = MemoryLimitHook("/usr/bin/nvidia-cdi-hook", "/run/nvidia/driver")


def _gpu(index: int, *, limited: bool) -> Device:
    info = GpuInfo(
        index=index,
        minor=index,
        uuid=f"GPU-{index:08d}",
        product_name="H100-80GB-HBM3",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=80 * GiB,
        pci_bus_id=f"0000:{index + 1:02x}:00.0",
        pcie_root=None,
        device_nodes=(f"/dev/nvidia{index}",),
    )
    (device,), _ = build_devices(SystemInfo("580.65.06", "13.0"), [info], shared=SharedGpus.MEMORY)
    return with_memory_limit(device, limited, UnlimitedShares.PUBLISH)


DEVICES = {"gpu-0": _gpu(0, limited=True), "gpu-1": _gpu(1, limited=False)}


def _plan(uid: str, *results: dict[str, Any]) -> ClaimPlan:
    doc = claim_doc(uid=uid, name=f"claim-{uid}", results=list(results))
    return plan_claim(ClaimRef("ns", uid, f"claim-{uid}"), doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def _share(device: str, share_id: str, memory: str, request: str = "gpu") -> dict[str, Any]:
    return result(request, device, shareID=share_id, consumedCapacity={"memory": memory})


def _record(plan: ClaimPlan) -> ClaimRecord:
    return ClaimRecord(
        plan.claim.uid,
        plan.claim.namespace,
        plan.claim.name,
        ClaimState.PREPARE_COMPLETED,
        tuple(d.to_record() for d in plan.devices),
    )


def _device_edits(plan: ClaimPlan, hook: MemoryLimitHook | None = HOOK) -> dict[str, Any]:
    (device,) = render_spec(plan, memory_limit_hook=hook).to_json()["devices"]
    edits: dict[str, Any] = device["containerEdits"]
    return edits


def test_a_limited_share_runs_nvidias_hook_with_its_memory_in_mib() -> None:
    edits = _device_edits(_plan("a", _share("gpu-0", "s-1", "10Gi")))
    assert edits["hooks"] == [
        {
            "hookName": "createRuntime",
            "path": "/usr/bin/nvidia-cdi-hook",
            "args": [
                "nvidia-cdi-hook",
                "apply-cuda-memory-limits",
                "--driver-root",
                "/run/nvidia/driver",
                "--gpu-id",
                "GPU-00000000",
            ],
        }
    ]
    assert {"NVIDIA_GPU_MEMORY_LIMIT=10240", "NVIDIA_GPU_MEMORY_REQUEST=10240"} <= set(edits["env"])


def test_two_shares_of_one_claim_on_one_gpu_get_their_sum() -> None:
    edits = _device_edits(_plan("a", _share("gpu-0", "s-1", "4Gi", "a"), _share("gpu-0", "s-2", "6Gi", "b")))
    assert "NVIDIA_GPU_MEMORY_LIMIT=10240" in edits["env"] and len(edits["hooks"]) == 1


@pytest.mark.parametrize(
    ("plan", "hook"),
    [
        (lambda: _plan("a", _share("gpu-1", "s-1", "10Gi")), HOOK),  # sharedMemoryLimit: none
        (lambda: _plan("a", _share("gpu-0", "s-1", "80Gi")), HOOK),  # the whole GPU: no limit needed
        (lambda: _plan("a", _share("gpu-0", "s-1", "10Gi")), None),  # no hook configured
        (lambda: _plan("a", result("gpu", "gpu-0")), HOOK),  # no share at all
    ],
)
def test_no_hook_and_no_limit_env_where_no_share_is_limited(plan: Any, hook: MemoryLimitHook | None) -> None:
    edits = _device_edits(plan(), hook)
    assert "hooks" not in edits
    assert not [e for e in edits["env"] if e.startswith("NVIDIA_GPU_MEMORY_")]


def test_shares_that_fit_beside_prepared_ones_pass() -> None:
    held = _record(_plan("a", _share("gpu-0", "s-1", "30Gi")))
    check_memory_fits(_plan("b", _share("gpu-0", "s-2", "50Gi")), [held])


def test_a_hand_written_over_commit_is_refused() -> None:
    held = [
        _record(_plan("a", _share("gpu-0", "s-1", "30Gi"))),
        _record(_plan("b", _share("gpu-0", "s-2", "40Gi"))),
    ]
    expected = r"gpu-0 \(20480 MiB\).*ns/claim-a 30720 MiB, ns/claim-b 40960 MiB.*92160 MiB of its 81920 MiB"
    with pytest.raises(PlanError, match=expected) as caught:
        check_memory_fits(_plan("c", _share("gpu-0", "s-3", "20Gi")), held)
    assert caught.value.reason == "MemoryOverCommitted"


def test_a_share_holding_the_whole_gpu_leaves_no_room() -> None:
    held = _record(_plan("a", _share("gpu-0", "s-1", "80Gi")))
    with pytest.raises(PlanError, match="MiB of its 81920 MiB"):
        check_memory_fits(_plan("b", _share("gpu-0", "s-2", "1Gi")), [held])


def test_the_claims_own_record_is_not_counted_twice() -> None:
    plan = _plan("a", _share("gpu-0", "s-1", "50Gi"))
    check_memory_fits(plan, [_record(plan)])


def test_the_spec_with_the_hook_validates_and_a_bad_hook_does_not() -> None:
    plan = _plan("a", _share("gpu-0", "s-1", "10Gi"))
    render_spec(plan, memory_limit_hook=HOOK).validate()
    bad = render_spec(plan, memory_limit_hook=MemoryLimitHook("nvidia-cdi-hook"))
    with pytest.raises(CdiError, match="hook path 'nvidia-cdi-hook' must be absolute"):
        bad.validate()
