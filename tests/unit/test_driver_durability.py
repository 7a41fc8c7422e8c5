"""Durability of the prepare driver: a failed checkpoint write is never answered as prepared later, and
a claim rebuilt from its CDI spec alone keeps its sharing state across restarts.

A failed write (ENOSPC, EIO, a read-only state filesystem) is injected at the checkpoint's atomic
write, the one place the checkpoint reaches the disk; everything else on the node works.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubeapi import ApiError
from draplugin import checkpoint as checkpoint_module
from draplugin.cdi.spec import atomic_write
from draplugin.checkpoint import ClaimState
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.prepare.driver import GpuDriver
from tests.unit import sharing_fixtures
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_mig_driver import MigNode, mig_claim
from tests.unit.test_prepare_driver import FakeClaims, Node
from tests.unit.test_prepare_plan import DEVICES, claim_doc, config, gpu_config, result
from tests.unit.test_shares import driver as shares_driver

tool_node = sharing_fixtures.tool_node
GPU0 = DEVICES["gpu-0"].uuid


class FailingDisk:
    """While `full`, every checkpoint write fails as a full state filesystem fails it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.failed = 0

        def write(
            path: Path, content: bytes, mode: int = 0o644, *, durable: bool = True, sync_dir: bool = True
        ) -> None:
            if self.full:
                self.failed += 1
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            atomic_write(path, content, mode, durable=durable, sync_dir=sync_dir)

        monkeypatch.setattr(checkpoint_module, "atomic_write", write)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> FailingDisk:
    return FailingDisk(monkeypatch)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def on_disk(node: Node) -> dict[str, str]:
    """Claim UID -> state of each record in the checkpoint file."""
    doc = json.loads(node.checkpoint_path.read_text())
    return {c["uid"]: c["state"] for c in doc["claims"]}


def exclusive(node: Node, uid: str, name: str, gpu: str = "gpu-0") -> ClaimRef:
    return node.claims.add(claim_doc(uid=uid, name=name, results=[result("gpu", gpu)]))


# --- item 1: a failed write at prepare ----------------------------------------------------------------


async def test_a_prepare_whose_write_failed_is_written_by_the_retry_before_it_is_answered(
    node: Node, disk: FailingDisk
) -> None:
    driver = node.driver()
    a = exclusive(node, "uid-a", "a")
    disk.full = True
    with pytest.raises(ClaimError, match="No space left on device"):
        await driver.prepare_claim(a)
    # Memory says what the disk says: not prepared, but its devices stay taken (its spec exists).
    record = driver.checkpoint.get("uid-a")
    assert record is not None and record.state is ClaimState.PREPARE_STARTED
    with pytest.raises(ClaimError, match="already prepared for claim ns/a"):
        await driver.prepare_claim(exclusive(node, "uid-b", "b"))
    disk.full = False
    assert [d.device_name for d in await driver.prepare_claim(a)] == ["gpu-0"]
    assert on_disk(node) == {"uid-a": "PrepareCompleted"}  # answered prepared: durable
    # A restart keeps the running pod's spec and gives gpu-0 to nobody else.
    restarted = node.driver()
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-a.json"]
    with pytest.raises(ClaimError, match="already prepared for claim ns/a"):
        await restarted.prepare_claim(exclusive(node, "uid-b", "b"))


async def test_a_retry_while_the_disk_is_still_full_is_answered_with_an_error(
    node: Node, disk: FailingDisk
) -> None:
    driver = node.driver()
    a = exclusive(node, "uid-a", "a")
    disk.full = True
    for _ in range(2):
        with pytest.raises(ClaimError, match="checkpoint"):
            await driver.prepare_claim(a)
    assert disk.failed == 2  # the retry tried to write, and said it could not
    assert node.events.claim_events[-1][1] == "CheckpointWriteFailed"
    # Never answered: a restart finds no record and removes the spec it left as leaked.
    disk.full = False
    restarted = node.driver()
    assert node.spec_files() == [] and len(restarted.checkpoint) == 0
    await restarted.prepare_claim(exclusive(node, "uid-b", "b"))


async def test_a_repeated_prepare_of_a_record_the_disk_never_got_writes_it_first(
    node: Node, disk: FailingDisk
) -> None:
    a = exclusive(node, "uid-a", "a")
    await node.driver().prepare_claim(a)
    # A lost checkpoint rebuilt at start-up from the API, whose save hit a full disk.
    node.checkpoint_path.write_bytes(b"{")
    node.claims.docs[("ns", "a")]["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "p"}]
    disk.full = True
    driver = node.driver()
    record = driver.checkpoint.get("uid-a")
    assert record is not None and record.completed
    with pytest.raises(ClaimError, match="No space left on device"):
        await driver.prepare_claim(a)
    disk.full = False
    await driver.prepare_claim(a)
    assert on_disk(node) == {"uid-a": "PrepareCompleted"}


# --- item 1: a failed write at unprepare --------------------------------------------------------------


async def test_an_unprepare_whose_write_failed_keeps_the_claim_until_a_retry_writes_it(
    node: Node, disk: FailingDisk
) -> None:
    driver = node.driver()
    a = exclusive(node, "uid-a", "a")
    await driver.prepare_claim(a)
    disk.full = True
    with pytest.raises(ClaimError, match="No space left on device"):
        await driver.unprepare_claim(a)
    # The file still says prepared: memory says so too, and gpu-0 is not given away.
    assert driver.checkpoint.get("uid-a") is not None
    with pytest.raises(ClaimError, match="already prepared for claim ns/a"):
        await driver.prepare_claim(exclusive(node, "uid-b", "b"))
    disk.full = False
    await driver.unprepare_claim(a)  # the kubelet's retry
    assert on_disk(node) == {}
    restarted = node.driver()
    assert node.spec_files() == [] and len(restarted.checkpoint) == 0
    await restarted.prepare_claim(exclusive(node, "uid-b", "b"))


# --- item 3: a claim rebuilt from its spec alone keeps its sharing state ----------------------------


def rebuilt_from_spec_alone(node: Node | MigNode) -> None:
    """The checkpoint torn while the plugin was down, and the API server unreachable at start-up."""
    path = node.root / "state" / "checkpoint.json"
    path.write_bytes(path.read_bytes()[:40])
    node.claims.list_error = ApiError(0, "connection refused")


async def test_a_mig_instance_of_a_claim_rebuilt_from_its_spec_survives_the_next_restarts(
    tmp_path: Path,
) -> None:
    node = MigNode(tmp_path)
    ref = node.claims.add(mig_claim("uid-a", "gpu-0-mig-2g10gb-2"))
    await node.driver().prepare_claim(ref)
    before = node.hardware.instances()
    rebuilt_from_spec_alone(node)
    node.driver()  # recovery: the claim is known from its spec alone
    node.driver()  # an ordinary restart, the API still down
    assert node.hardware.instances() == before
    node.claims.list_error = None
    restarted = node.driver()  # the API is back, the checkpoint intact: nothing asks it
    assert node.hardware.instances() == before
    # The kubelet's prepare of the running claim completes its record on the same instance.
    await restarted.prepare_claim(ref)
    assert node.hardware.instances() == before
    record = restarted.checkpoint.get("uid-a")
    assert record is not None and record.completed and record.name == "claim-uid-a"
    await restarted.unprepare_claim(ref)
    assert node.hardware.instances() == []


def sharing_driver(node: ToolNode, claims: FakeClaims) -> GpuDriver:
    return shares_driver(node, claims, list(DEVICES.values()))


@pytest.mark.parametrize(
    ("strategy", "settings"),
    [
        ("MPS", {"mpsConfig": {"defaultActiveThreadPercentage": 25}}),
        ("TimeSlicing", {"timeSlicingConfig": {"interval": "Long"}}),
    ],
)
async def test_mps_and_time_slices_of_a_claim_rebuilt_from_its_spec_survive_the_next_restart(
    tool_node: ToolNode, strategy: str, settings: dict[str, Any]
) -> None:
    claims = FakeClaims()
    doc = claim_doc(
        "uid-a", [result("gpu", "gpu-0")], [config("FromClaim", gpu_config(strategy, **settings))]
    )
    ref = claims.add(doc)
    await sharing_driver(tool_node, claims).prepare_claim(ref)
    daemons, level = tool_node.daemon_pids(), tool_node.timeslice_of(GPU0)
    assert (len(daemons), level) == ((1, "0") if strategy == "MPS" else (0, "3"))
    path = tool_node.state / "checkpoint.json"
    path.write_bytes(path.read_bytes()[:40])
    claims.list_error = ApiError(0, "connection refused")
    sharing_driver(tool_node, claims)
    restarted = sharing_driver(tool_node, claims)
    assert (tool_node.daemon_pids(), tool_node.timeslice_of(GPU0)) == (daemons, level)
    claims.list_error = None
    await restarted.prepare_claim(ref)
    assert (tool_node.daemon_pids(), tool_node.timeslice_of(GPU0)) == (daemons, level)
    await restarted.unprepare_claim(ref)
    assert (tool_node.daemon_pids(), tool_node.timeslice_of(GPU0)) == ([], "0")
