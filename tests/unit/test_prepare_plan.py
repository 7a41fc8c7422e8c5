"""Pure planning: which results are ours, which config applies, names, sharing checks, CDI rendering.

The claim builders here are shared with the driver tests.

Size: one file because its claim builders are shared by every planning case.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import Any

import pytest

from dracommon.drivername import config_api_version
from draplugin.checkpoint import ClaimRecord, ClaimState
from draplugin.devices.model import Device
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from draplugin.prepare.gpuconfig import SharingStrategy, TimeSliceInterval
from draplugin.prepare.plan import (
    PlanError,
    base_request_name,
    check_sharing,
    plan_claim,
    plan_from_record,
    render_spec,
)

DRIVER = "gpu.draplugin.dev"
NODE = "node-a"


def gpu(i: int, kind: str = "gpu") -> Device:
    return Device(
        name=f"gpu-{i}" if kind == "gpu" else f"gpu-{i}-mig-1g5gb-0",
        kind=kind,
        uuid=f"GPU-0000000{i}" if kind == "gpu" else f"MIG-0000000{i}",
        index=i,
        minor=i,
        parent_uuid=None if kind == "gpu" else f"GPU-0000000{i}",
        attributes={"productName": "A100-SXM4-40GB"},
        device_nodes=("/dev/null",),
    )


DEVICES = {d.name: d for d in (gpu(0), gpu(1), gpu(2), gpu(3), gpu(0, "mig"))}


def result(request: str, device: str, driver: str = DRIVER, pool: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def gpu_config(strategy: str = "Exclusive", **settings: Any) -> dict[str, Any]:
    sharing: dict[str, Any] = {"strategy": strategy, **settings}
    return {"apiVersion": config_api_version(DRIVER), "kind": "GpuConfig", "sharing": sharing}


def config(
    source: str, parameters: Any, requests: Sequence[str] = (), driver: str = DRIVER
) -> dict[str, Any]:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": driver, "parameters": parameters}}
    if requests:
        entry["requests"] = list(requests)
    return entry


def claim_doc(
    uid: str = "uid-1",
    results: Sequence[dict[str, Any]] = (),
    configs: Sequence[dict[str, Any]] = (),
    allocated: bool = True,
    name: str = "claim",
    namespace: str = "ns",
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": []}},
        "status": {},
    }
    if allocated:
        doc["status"]["allocation"] = {"devices": {"results": list(results), "config": list(configs)}}
    return doc


REF = ClaimRef("ns", "uid-1", "claim")


def plan(doc: dict[str, Any], ref: ClaimRef = REF) -> Any:
    return plan_claim(ref, doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def test_uid_mismatch_names_both_uids() -> None:
    with pytest.raises(PlanError) as caught:
        plan(claim_doc(uid="uid-new", results=[result("gpu", "gpu-0")]))
    assert caught.value.reason == "ClaimReplaced"
    assert (
        str(caught.value) == "claim ns/claim has UID uid-new, kubelet asked for uid-1: the claim was replaced"
    )


def test_unallocated_claim_is_refused() -> None:
    with pytest.raises(PlanError, match=r"claim ns/claim is not allocated") as caught:
        plan(claim_doc(allocated=False))
    assert caught.value.reason == "ClaimNotAllocated"


def test_foreign_driver_and_pool_results_are_ignored() -> None:
    planned = plan(
        claim_doc(
            results=[
                result("nic", "eth0", driver="net.example.com"),
                result("gpu", "gpu-1", pool="node-b"),
                result("gpu", "gpu-0"),
            ]
        )
    )
    assert [d.device.name for d in planned.devices] == ["gpu-0"]


def test_prepared_devices_use_base_request_names_and_uid_cdi_ids() -> None:
    planned = plan(claim_doc(results=[result("gpu/large", "gpu-0"), result("other", "gpu-1")]))
    assert planned.prepared_devices() == [
        PreparedDevice(("gpu",), NODE, "gpu-0", ("gpu.draplugin.dev/gpu=uid-1-gpu-0",)),
        PreparedDevice(("other",), NODE, "gpu-1", ("gpu.draplugin.dev/gpu=uid-1-gpu-1",)),
    ]
    assert base_request_name("a/b") == "a" and base_request_name("a") == "a"


def test_unknown_device_is_an_error() -> None:
    with pytest.raises(PlanError, match="allocated device node-a/gpu-9, which this node does not have"):
        plan(claim_doc(results=[result("gpu", "gpu-9")]))


def test_class_configs_apply_before_claim_configs_and_later_wins() -> None:
    # The claim's config is listed first but is FromClaim: the class config must not override it.
    planned = plan(
        claim_doc(
            results=[result("gpu", "gpu-0")],
            configs=[
                config("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Long"})),
                config("FromClass", gpu_config("Exclusive"), requests=["gpu"]),
            ],
        )
    )
    sharing = planned.devices[0].config.sharing
    assert sharing.strategy is SharingStrategy.TIME_SLICING
    assert sharing.time_slicing is not None and sharing.time_slicing.interval is TimeSliceInterval.LONG


def test_later_claim_config_wins() -> None:
    planned = plan(
        claim_doc(
            results=[result("gpu", "gpu-0")],
            configs=[
                config("FromClaim", gpu_config("TimeSlicing")),
                config("FromClaim", gpu_config("MPS")),
            ],
        )
    )
    assert planned.devices[0].config.sharing.strategy is SharingStrategy.MPS


def test_configs_are_scoped_per_request_and_subrequest() -> None:
    planned = plan(
        claim_doc(
            results=[result("a/small", "gpu-0"), result("b", "gpu-1"), result("c", "gpu-2")],
            configs=[
                config(
                    "FromClaim", gpu_config("TimeSlicing"), requests=["a"]
                ),  # base name covers subrequests
                config("FromClaim", gpu_config("MPS"), requests=["b/other"]),  # another subrequest: not b
                config("FromClaim", gpu_config("MPS"), requests=["c"]),
            ],
        )
    )
    strategies = {d.device.name: d.config.sharing.strategy for d in planned.devices}
    assert strategies == {
        "gpu-0": SharingStrategy.TIME_SLICING,
        "gpu-1": SharingStrategy.EXCLUSIVE,
        "gpu-2": SharingStrategy.MPS,
    }


def test_exact_subrequest_scope() -> None:
    planned = plan(
        claim_doc(
            results=[result("a/small", "gpu-0")],
            configs=[config("FromClaim", gpu_config("TimeSlicing"), requests=["a/small"])],
        )
    )
    assert planned.devices[0].config.sharing.strategy is SharingStrategy.TIME_SLICING


def test_other_drivers_configs_are_neither_applied_nor_validated() -> None:
    planned = plan(
        claim_doc(
            results=[result("gpu", "gpu-0")],
            configs=[config("FromClaim", {"anything": "goes"}, driver="net.example.com")],
        )
    )
    assert planned.devices[0].config.sharing.strategy is SharingStrategy.EXCLUSIVE


def test_invalid_claim_config_reports_the_spec_path() -> None:
    bad = gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 150})
    with pytest.raises(PlanError) as caught:
        plan(
            claim_doc(
                results=[result("gpu", "gpu-0")],
                configs=[
                    config("FromClass", gpu_config()),
                    config("FromClaim", gpu_config(), driver="net.example.com"),
                    config("FromClaim", bad),
                ],
            )
        )
    assert caught.value.reason == "InvalidConfig"
    assert str(caught.value) == (
        "claim ns/claim: invalid claim config: spec.devices.config[1].opaque.parameters.sharing.mpsConfig."
        "defaultActiveThreadPercentage: must be between 1 and 100, got 150"
    )


def test_invalid_class_config_says_so() -> None:
    with pytest.raises(
        PlanError, match=r"invalid DeviceClass config: status\.allocation\.devices\.config\[0\]"
    ):
        plan(
            claim_doc(results=[result("gpu", "gpu-0")], configs=[config("FromClass", {"kind": "GpuConfig"})])
        )


def test_time_slicing_on_mig_is_refused() -> None:
    with pytest.raises(PlanError, match="time-slicing cannot be applied to MIG device") as caught:
        plan(
            claim_doc(
                results=[result("gpu", "gpu-0-mig-1g5gb-0")],
                configs=[config("FromClaim", gpu_config("TimeSlicing"))],
            )
        )
    assert caught.value.reason == "UnsupportedSharing"


def test_per_device_limit_for_unallocated_device_is_refused() -> None:
    mps = gpu_config("MPS", mpsConfig={"perDevicePinnedMemoryLimit": {"gpu-3": "1Gi"}})
    with pytest.raises(
        PlanError, match=r"perDevicePinnedMemoryLimit\[gpu-3\]: device gpu-3 is not allocated"
    ):
        plan(claim_doc(results=[result("gpu", "gpu-0")], configs=[config("FromClaim", mps)]))


def test_malformed_claim_json_is_an_error_not_a_crash() -> None:
    doc = claim_doc()
    doc["status"]["allocation"]["devices"]["results"] = "nope"
    with pytest.raises(PlanError, match="results is not a list") as caught:
        plan(doc)
    assert caught.value.reason == "InvalidClaim"


# --- sharing between claims ---------------------------------------------------------------------------


def holder(uid: str, device: str, strategy: str = "Exclusive", **extra: Any) -> ClaimRecord:
    other = plan(
        claim_doc(
            uid=uid,
            results=[result("gpu", device, **extra)],
            configs=[config("FromClaim", gpu_config(strategy))],
        ),
        ClaimRef("ns", uid, "other"),
    )
    return ClaimRecord(uid, "ns", "other", ClaimState.PREPARE_COMPLETED, other.device_records())


def test_device_held_exclusively_by_another_claim_is_refused() -> None:
    mine = plan(claim_doc(results=[result("gpu", "gpu-0")]))
    with pytest.raises(PlanError) as caught:
        check_sharing(mine, [holder("uid-2", "gpu-0")])
    assert caught.value.reason == "DeviceInUse"
    assert "device node-a/gpu-0 is already prepared for claim ns/other (uid uid-2)" in str(caught.value)


@pytest.mark.parametrize(
    ("mine_extra", "theirs_extra", "mine_strategy", "theirs_strategy", "allowed"),
    [
        ({}, {}, "TimeSlicing", "TimeSlicing", True),
        ({}, {}, "TimeSlicing", "Exclusive", False),
        ({}, {}, "MPS", "MPS", False),
        ({"adminAccess": True}, {}, "Exclusive", "Exclusive", True),
        # Distinct share IDs, but gpu-0 is not published as a shared GPU (tests/unit/test_shares.py
        # has the shared case).
        ({"shareID": "a"}, {"shareID": "b"}, "Exclusive", "Exclusive", False),
        ({"shareID": "a"}, {"shareID": "a"}, "Exclusive", "Exclusive", False),
    ],
)
def test_sharing_rules(
    mine_extra: dict[str, Any],
    theirs_extra: dict[str, Any],
    mine_strategy: str,
    theirs_strategy: str,
    allowed: bool,
) -> None:
    mine = plan(
        claim_doc(
            results=[result("gpu", "gpu-0", **mine_extra)],
            configs=[config("FromClaim", gpu_config(mine_strategy))],
        )
    )
    holders = [
        holder("uid-2", "gpu-0", theirs_strategy, **theirs_extra),
        holder("uid-1", "gpu-0"),
    ]  # self ignored
    if allowed:
        check_sharing(mine, holders)
    else:
        with pytest.raises(PlanError):
            check_sharing(mine, holders)


def test_other_devices_do_not_conflict() -> None:
    check_sharing(plan(claim_doc(results=[result("gpu", "gpu-1")])), [holder("uid-2", "gpu-0")])


# --- CDI rendering and records ------------------------------------------------------------------------


def test_spec_has_per_device_env_and_device_nodes() -> None:
    planned = plan(claim_doc(results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")]))
    doc = render_spec(planned).to_json()
    assert doc["kind"] == "gpu.draplugin.dev/gpu" and doc["cdiVersion"] == "0.3.0"
    first = doc["devices"][0]
    assert first["name"] == "uid-1-gpu-0"
    assert first["containerEdits"]["deviceNodes"] == [{"path": "/dev/null"}]
    assert "DRAPLUGIN_DEVICE_GPU_0_UUID=GPU-00000000" in first["containerEdits"]["env"]
    assert "DRAPLUGIN_DEVICE_GPU_0_MODEL=A100-SXM4-40GB" in first["containerEdits"]["env"]
    assert "DRAPLUGIN_DEVICE_GPU_1_UUID=GPU-00000001" in doc["devices"][1]["containerEdits"]["env"]


def test_uid_starting_with_a_digit_needs_cdi_0_5_0() -> None:
    ref = ClaimRef("ns", "7c1e-uid", "claim")
    assert (
        render_spec(plan(claim_doc(uid="7c1e-uid", results=[result("gpu", "gpu-0")]), ref)).cdi_version
        == "0.5.0"
    )


def test_mps_settings_and_mount() -> None:
    mps = gpu_config(
        "MPS",
        mpsConfig={
            "defaultActiveThreadPercentage": 25,
            "defaultPinnedDeviceMemoryLimit": "1Gi",
            "perDevicePinnedMemoryLimit": {"gpu-1": "1536Ki"},
        },
    )
    planned = plan(
        claim_doc(
            results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")], configs=[config("FromClaim", mps)]
        )
    )
    doc = render_spec(planned, PurePosixPath("/state/mps/uid-1")).to_json()
    edits = doc["devices"][0]["containerEdits"]
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in edits["env"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-00000000=1024M,GPU-00000001=2M" in edits["env"]
    assert "CUDA_MPS_PIPE_DIRECTORY=/var/run/draplugin/mps/pipe" in edits["env"]
    assert edits["mounts"] == [
        {
            "hostPath": "/state/mps/uid-1",
            "containerPath": "/var/run/draplugin/mps",
            "options": ["rbind", "rw", "nosuid", "nodev"],
        },
        # MPS server and clients share memory segments: the claim's own /dev/shm.
        {
            "hostPath": "/state/mps/uid-1/shm",
            "containerPath": "/dev/shm",
            "options": ["rbind", "rw", "nosuid", "nodev"],
        },
    ]
    # Every MPS device carries the same values, so the union in one container is consistent.
    assert [e for e in doc["devices"][1]["containerEdits"]["env"] if e.startswith("CUDA_")] == [
        e for e in edits["env"] if e.startswith("CUDA_")
    ]


def test_two_mps_configs_in_one_claim_are_refused() -> None:
    with pytest.raises(PlanError, match="one MPS server"):
        plan(
            claim_doc(
                results=[result("a", "gpu-0"), result("b", "gpu-1")],
                configs=[
                    config(
                        "FromClaim", gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 10}), ["a"]
                    ),
                    config(
                        "FromClaim", gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 20}), ["b"]
                    ),
                ],
            )
        )


def test_plan_round_trips_through_the_checkpoint_record() -> None:
    planned = plan(
        claim_doc(
            results=[
                result("gpu/x", "gpu-0", shareID="5b3e1f0a-0000-4000-8000-000000000000"),
                result("b", "gpu-1"),
            ],
            configs=[config("FromClaim", gpu_config("TimeSlicing"), ["b"])],
        )
    )
    record = ClaimRecord("uid-1", "ns", "claim", ClaimState.PREPARE_COMPLETED, planned.device_records())
    rebuilt = plan_from_record(record, DEVICES, driver=DRIVER)
    assert rebuilt == planned
    assert rebuilt.prepared_devices()[0].share_id == "5b3e1f0a-0000-4000-8000-000000000000"
