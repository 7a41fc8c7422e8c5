"""Dynamic MIG through the prepare driver: the kill -9 table, Events on MIG errors, unprepare destroys.

The driver runs on fake partitionable GPUs whose MIG "hardware" (`fakemig`) is
a file that outlives each simulated plugin process, as a GPU's instances do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from draplugin import crashpoints
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.fakemig import STATE_FILE, FakeMigHardware
from draplugin.kubelet.interface import ClaimError
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.sharing import SharingState
from tests.unit import test_prepare_driver
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents, SimulatedCrash
from tests.unit.test_prepare_plan import DRIVER, NODE, claim_doc, result

# The crash-point fixture of the driver tests: SIGKILL stood in for by an exception nothing catches.
crash_at = test_prepare_driver.crash_at


@dataclass
class MigNode:
    root: Path
    claims: FakeClaims = field(default_factory=FakeClaims)
    events: RecordingEvents = field(default_factory=RecordingEvents)

    @property
    def hardware(self) -> FakeMigHardware:
        return FakeMigHardware(self.root / "state" / STATE_FILE, self.root / "dev")

    def driver(self) -> GpuDriver:
        """A fresh plugin process on the same node (and the same GPU state)."""
        backend = FakeBackend(NODE, config_from_flags(1, partitionable=True), device_dir=self.root / "dev")
        driver = GpuDriver(
            driver_name=DRIVER,
            node_name=NODE,
            devices=backend.discover(),
            claims=self.claims,
            cdi_store=SpecStore(self.root / "cdi", DRIVER),
            checkpoint=CheckpointStore(self.root / "state" / "checkpoint.json", "boot-1"),
            sharing=SharingState(self.root / "state", mig_partitioner=self.hardware),
            events=self.events,
            metrics=ClaimMetrics(CollectorRegistry()),
        )
        driver.recover()
        return driver

    def spec(self, uid: str) -> dict[str, Any]:
        return dict(json.loads((self.root / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text()))


def mig_claim(uid: str, device: str) -> dict[str, Any]:
    return claim_doc(uid, [result("mig", device)], name=f"claim-{uid}")


def caps(spec: dict[str, Any]) -> set[str]:
    return {
        n["path"]
        for d in spec["devices"]
        for n in d["containerEdits"].get("deviceNodes", [])
        if "nvidia-caps" in n["path"]
    }


@pytest.fixture
def node(tmp_path: Path) -> MigNode:
    return MigNode(tmp_path)


async def test_prepare_creates_the_instance_and_unprepare_destroys_it(node: MigNode) -> None:
    driver = node.driver()
    a = node.claims.add(mig_claim("uid-a", "gpu-0-mig-1g5gb-0"))
    b = node.claims.add(mig_claim("uid-b", "gpu-0-mig-3g20gb-4"))
    await driver.prepare_claim(a)
    await driver.prepare_claim(b)
    instances = node.hardware.instances()
    assert sorted((i["profile"], i["start"]) for i in instances) == [("1g.5gb", 0), ("3g.20gb", 4)]
    caps_a, caps_b = caps(node.spec("uid-a")), caps(node.spec("uid-b"))
    assert len(caps_a) == len(caps_b) == 2 and not caps_a & caps_b
    await driver.unprepare_claim(a)
    assert [(i["profile"], i["start"]) for i in node.hardware.instances()] == [("3g.20gb", 4)]
    await driver.unprepare_claim(b)
    assert node.hardware.instances() == []


async def test_restart_keeps_the_instances_of_prepared_claims(node: MigNode) -> None:
    ref = node.claims.add(mig_claim("uid-a", "gpu-0-mig-1g5gb-2"))
    first = await node.driver().prepare_claim(ref)
    before = node.hardware.instances()
    restarted = node.driver()
    assert node.hardware.instances() == before  # a plugin restart does not touch the GPU
    assert await restarted.prepare_claim(ref) == first and node.hardware.instances() == before


async def test_a_taken_placement_fails_prepare_with_an_event_and_creates_nothing(node: MigNode) -> None:
    driver = node.driver()
    parent = driver.devices["gpu-0"].uuid
    admin = {"parent": parent, "minor": 0, "profile": "7g.40gb", "start": 0, "slices": list(range(8)),
             "gi": 1, "ci": 0, "uuid": "MIG-admin", "computeInstance": True}  # fmt: skip
    (node.root / "state" / STATE_FILE).write_text(json.dumps({"instances": [admin]}))
    ref = node.claims.add(mig_claim("uid-a", "gpu-0-mig-1g5gb-0"))
    with pytest.raises(ClaimError, match="overlaps existing GPU instance 1"):
        await driver.prepare_claim(ref)
    assert [reason for _, reason, _ in node.events.claim_events] == ["MigPlacementTaken"]
    assert node.hardware.instances() == [admin]
    assert not (node.root / "cdi").exists() or list((node.root / "cdi").glob("*.json")) == []


MIG_POINTS = [
    crashpoints.AFTER_CHECKPOINT_STARTED,
    crashpoints.AFTER_MIG_CREATE,
    crashpoints.AFTER_CDI_WRITE,
    crashpoints.AFTER_CHECKPOINT_COMPLETED,
    crashpoints.BEFORE_RETURN,
]


@pytest.mark.parametrize("point", MIG_POINTS)
async def test_kill_during_prepare_then_restart_leaves_no_orphan_and_retry_gives_the_same_answer(
    node: MigNode, crash_at: list[str], point: str, tmp_path: Path
) -> None:
    reference = MigNode(tmp_path / "reference")
    expected = await reference.driver().prepare_claim(
        reference.claims.add(mig_claim("uid-a", "gpu-0-mig-2g10gb-2"))
    )

    ref = node.claims.add(mig_claim("uid-a", "gpu-0-mig-2g10gb-2"))
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await node.driver().prepare_claim(ref)
    restarted = node.driver()
    completed = point in (crashpoints.AFTER_CHECKPOINT_COMPLETED, crashpoints.BEFORE_RETURN)
    # Start-up destroyed what no prepared claim holds; a completed claim keeps its instance.
    assert len(node.hardware.instances()) == (1 if completed else 0)
    assert await restarted.prepare_claim(ref) == expected
    assert len(node.hardware.instances()) == 1 and len(caps(node.spec("uid-a"))) == 2
    await restarted.unprepare_claim(ref)
    assert node.hardware.instances() == [] and restarted.sharing.ledger.entries() == []


@pytest.mark.parametrize(
    "point", [crashpoints.UNPREPARE_AFTER_CDI_REMOVE, crashpoints.UNPREPARE_AFTER_RELEASE]
)
async def test_kill_during_unprepare_then_retry_destroys_it(
    node: MigNode, crash_at: list[str], point: str
) -> None:
    ref = node.claims.add(mig_claim("uid-a", "gpu-0-mig-1g5gb-6"))
    await node.driver().prepare_claim(ref)
    crash_at.append(point)
    with pytest.raises(SimulatedCrash):
        await node.driver().unprepare_claim(ref)
    restarted = node.driver()
    await restarted.unprepare_claim(ref)
    assert node.hardware.instances() == [] and len(restarted.checkpoint) == 0
