"""Dynamic MIG at prepare: a claim on a partitionable slice gets its own MIG device, created and destroyed.

Through `SharingState` (what the driver calls) on the fake GPUs' MIG hardware
(`draplugin.devices.fakemig`): create at the allocated placement, the CDI spec
with that MIG device's own nvidia-caps nodes, placement conflicts, MIG mode
off, no half-created instance on failure, destroy at release, and the orphan
left by a kill -9 between create and the ledger record destroyed at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draplugin import config, crashpoints
from draplugin.devices import load_backend
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.fakemig import FAIL_COMPUTE_INSTANCE, STATE_FILE, FakeMigHardware
from draplugin.devices.model import Device
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.mig import MigError, placement_of
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim, render_spec
from draplugin.prepare.sharing import SharingState
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, result


class Killed(BaseException):
    """Stands in for SIGKILL at a crash point: escapes every handler."""


@pytest.fixture
def devices(tmp_path: Path) -> dict[str, Device]:
    backend = FakeBackend(NODE, config_from_flags(1, partitionable=True), device_dir=tmp_path / "dev")
    return {d.name: d for d in backend.discover()}


@pytest.fixture
def hardware(tmp_path: Path) -> FakeMigHardware:
    return FakeMigHardware(tmp_path / "state" / STATE_FILE, tmp_path / "dev")


@pytest.fixture
def sharing(tmp_path: Path, hardware: FakeMigHardware) -> SharingState:
    return SharingState(tmp_path / "state", mig_partitioner=hardware)


def plan_for(uid: str, devices: dict[str, Device], *names: str) -> ClaimPlan:
    doc = claim_doc(uid, [result(f"r{i}", name) for i, name in enumerate(names)], name=f"claim-{uid}")
    return plan_claim(ClaimRef("ns", uid, f"claim-{uid}"), doc, driver=DRIVER, pool=NODE, devices=devices)


def node_paths(plan: ClaimPlan) -> set[str]:
    spec = render_spec(plan).to_json()
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
    return {n["path"] for e in edits for n in e.get("deviceNodes", [])}


def external(tmp_path: Path, parent: str, profile: str, start: int, slices: list[int], **extra: Any) -> None:
    """An instance an admin made with nvidia-smi: in the hardware state, not in the plugin's ledger."""
    instance = {"parent": parent, "minor": 0, "profile": profile, "start": start, "slices": slices}
    state = {
        "instances": [{**instance, "gi": 5, "ci": 0, "uuid": "MIG-admin", "computeInstance": True}],
        **extra,
    }
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps(state))


def test_two_claims_on_two_slices_get_their_own_mig_devices(
    devices: dict[str, Device], sharing: SharingState, hardware: FakeMigHardware, tmp_path: Path
) -> None:
    a = sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    b = sharing.apply(plan_for("uid-b", devices, "gpu-0-mig-1g5gb-1"))
    mig_a, mig_b = a.devices[0].device, b.devices[0].device
    assert mig_a.uuid.startswith("MIG-") and mig_b.uuid.startswith("MIG-") and mig_a.uuid != mig_b.uuid
    caps_a = {n for n in node_paths(a) if "nvidia-caps" in n}
    caps_b = {n for n in node_paths(b) if "nvidia-caps" in n}
    assert len(caps_a) == 2 and len(caps_b) == 2 and not caps_a & caps_b
    for cap in caps_a | caps_b:  # real character devices the runtime can inject
        assert (tmp_path / "dev" / cap.removeprefix("/dev/")).is_char_device()
    # What NVIDIA's toolkit gives a MIG device: the parent node (CUDA opens the GPU there; with MIG
    # on it grants no compute) and control nodes, plus this instance's GI and CI caps, nothing else.
    assert (
        node_paths(a)
        == {"/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} | caps_a
    )
    spec = render_spec(a).to_json()
    assert (
        f"DRAPLUGIN_DEVICE_GPU_0_MIG_1G5GB_0_UUID={mig_a.uuid}" in spec["devices"][0]["containerEdits"]["env"]
    )
    assert [(i["profile"], i["start"]) for i in hardware.instances()] == [("1g.5gb", 0), ("1g.5gb", 1)]


def test_repeated_apply_reuses_the_instance(devices: dict[str, Device], sharing: SharingState,
                                            hardware: FakeMigHardware) -> None:  # fmt: skip
    plan = plan_for("uid-a", devices, "gpu-0-mig-2g10gb-2")
    first = sharing.apply(plan)
    again = sharing.apply(plan)
    assert first.devices[0].device == again.devices[0].device and len(hardware.instances()) == 1


def test_release_destroys_exactly_what_the_claim_created(
    devices: dict[str, Device], sharing: SharingState, hardware: FakeMigHardware, tmp_path: Path
) -> None:
    parent = devices["gpu-0"].uuid
    external(tmp_path, parent, "1g.5gb", 6, [6])
    sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    sharing.release("uid-a")
    assert [i["uuid"] for i in hardware.instances()] == ["MIG-admin"]
    assert sharing.ledger.entries() == []
    sharing.release("uid-a")  # repeated: nothing to do


def test_a_placement_taken_outside_the_plugin_fails_and_creates_nothing(
    devices: dict[str, Device], sharing: SharingState, hardware: FakeMigHardware, tmp_path: Path
) -> None:
    external(tmp_path, devices["gpu-0"].uuid, "2g.10gb", 0, [0, 1])
    with pytest.raises(MigError) as err:
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-1"))
    assert err.value.reason == "MigPlacementTaken"
    assert "claim ns/claim-uid-a" in str(err.value) and "did not create" in str(err.value)
    assert [i["uuid"] for i in hardware.instances()] == ["MIG-admin"] and sharing.ledger.entries() == []


def test_mig_mode_off_is_a_specific_error(devices: dict[str, Device], sharing: SharingState,
                                          tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps({"migModeOff": [devices["gpu-0"].uuid]}))
    with pytest.raises(MigError) as err:
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    assert err.value.reason == "MigModeDisabled" and "MIG mode off" in str(err.value)


def test_a_failure_on_the_second_device_undoes_the_first(
    devices: dict[str, Device], sharing: SharingState, hardware: FakeMigHardware, tmp_path: Path
) -> None:
    external(tmp_path, devices["gpu-0"].uuid, "1g.5gb", 3, [3])
    with pytest.raises(MigError, match=r"MIG placement 1g\.5gb@3"):
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0", "gpu-0-mig-1g5gb-3"))
    assert [i["uuid"] for i in hardware.instances()] == ["MIG-admin"] and sharing.ledger.entries() == []


def test_a_half_created_instance_is_undone(devices: dict[str, Device], sharing: SharingState,
                                           hardware: FakeMigHardware, tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps({"failCreate": FAIL_COMPUTE_INSTANCE}))
    with pytest.raises(MigError, match="compute instance"):
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    # The fake left a GPU instance without compute instance behind (a partitioner whose own undo
    # failed): the ledger's "creating" entry named it, and the failed first prepare destroyed it.
    assert hardware.instances() == [] and sharing.ledger.entries() == []


def test_a_half_created_instance_left_by_a_failed_undo_is_destroyed_at_start(
    devices: dict[str, Device], hardware: FakeMigHardware, tmp_path: Path
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / STATE_FILE).write_text(
        json.dumps({"failCreate": FAIL_COMPUTE_INSTANCE, "failDestroy": True})
    )
    sharing = SharingState(tmp_path / "state", mig_partitioner=hardware)
    with pytest.raises(MigError, match="compute instance"):
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    assert len(hardware.instances()) == 1 and [e.state for e in sharing.ledger.entries()] == ["creating"]
    assert sharing.release_orphans(prepared=set()) == []  # the GPU still refuses: kept for the next start
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps({"instances": hardware.instances()}))
    assert sharing.release_orphans(prepared=set()) == ["uid-a"]
    assert hardware.instances() == [] and sharing.ledger.entries() == []


def test_kill_after_create_before_the_record_leaves_an_orphan_that_start_up_destroys(
    devices: dict[str, Device],
    sharing: SharingState,
    hardware: FakeMigHardware,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def reach(point: str) -> None:
        if point == crashpoints.AFTER_MIG_CREATE:
            raise Killed(point)

    monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(Killed):
        sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    monkeypatch.undo()
    # The kill skipped every undo: the instance exists, the ledger only says "creating".
    assert len(hardware.instances()) == 1 and [e.state for e in sharing.ledger.entries()] == ["creating"]
    # A held claim is kept, an unprepared one is an orphan.
    assert sharing.release_orphans(prepared={"uid-a"}) == [] and len(hardware.instances()) == 1
    assert sharing.release_orphans(prepared=set()) == ["uid-a"]
    assert hardware.instances() == []
    # Re-prepare gives the same answer: the same device, created again.
    again = sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    assert again.devices[0].device.name == "gpu-0-mig-1g5gb-0" and len(hardware.instances()) == 1


def test_a_recorded_instance_that_vanished_is_created_again(
    devices: dict[str, Device], sharing: SharingState, hardware: FakeMigHardware, tmp_path: Path
) -> None:
    first = sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    (tmp_path / "state" / STATE_FILE).write_text(json.dumps({"instances": []}))  # a GPU reset
    again = sharing.apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    assert again.devices[0].device.uuid != first.devices[0].device.uuid and len(hardware.instances()) == 1


def test_no_mig_backend_is_a_clear_error(devices: dict[str, Device], tmp_path: Path) -> None:
    with pytest.raises(PlanError) as err:
        SharingState(tmp_path / "s").apply(plan_for("uid-a", devices, "gpu-0-mig-1g5gb-0"))
    assert err.value.reason == "MigUnavailable"


def test_placement_comes_from_the_published_device(devices: dict[str, Device]) -> None:
    placement = placement_of(devices["gpu-0-mig-3g20gb-4"])
    assert (placement.profile, placement.start, placement.slices) == ("3g.20gb", 4, (4, 5, 6, 7))
    assert placement.parent_uuid == devices["gpu-0"].uuid


def test_static_mig_and_whole_gpus_create_nothing(tmp_path: Path, sharing: SharingState,
                                                  hardware: FakeMigHardware) -> None:  # fmt: skip
    devices = {d.name: d for d in FakeBackend(NODE, config_from_flags(1), dev_root="/dev").discover()}
    plan = plan_for("uid-a", devices, "gpu-0")
    assert sharing.apply(plan) == plan and hardware.instances() == []


def test_the_partitionable_mig_setting_publishes_every_placement() -> None:
    settings = config.load({"node_name": "n", "backend": "fake"}, environ={"PARTITIONABLE_MIG": "true"})
    assert settings.partitionable_mig and settings.backend_options()["partitionable"] is True
    options = {k: v for k, v in settings.backend_options().items() if k != "device_dir"}
    names = [d.name for d in load_backend("fake", "n", dev_root="/dev", **options).discover()]
    assert "gpu-0-mig-1g5gb-6" in names and "gpu-0" in names
    default = config.load({"node_name": "n", "backend": "fake"}, environ={})
    assert not default.partitionable_mig and "partitionable" not in default.backend_options()
