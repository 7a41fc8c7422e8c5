"""Per-pod sockets (rolling updates): the node-wide lock covers node-local state, never an API read.

What the lock guarantees (`draplugin.kubelet.serialize`): the old and the new plugin process never
work on the checkpoint, CDI specs and sharing state at once, and each starts from what the other
committed. A prepare's claim GET touches none of that, so it runs outside the lock, as the Go
helper's "slow API calls before serializing" does: a stalled API server must not hold up an
unprepare, nor the other process.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState, DeviceRecord
from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet.dra import ClaimRunner
from draplugin.kubelet.interface import ClaimRef
from draplugin.kubelet.serialize import FileLockSerializer
from draplugin.prepare.plan import ClaimPlan
from tests.unit.test_prepare_driver import FakeClaims, Node, two_gpu_claim
from tests.unit.test_prepare_plan import NODE, claim_doc, result

WAIT = 10.0  # a guard against a hang, never a measure: nothing below waits on time


def claim(ref: ClaimRef) -> v1.Claim:
    return v1.Claim(namespace=ref.namespace, uid=ref.uid, name=ref.name)


@contextlib.contextmanager
def other_process_lock(path: Path) -> Iterator[None]:
    """The other plugin process's hold of the lock, taken without waiting: BlockingIOError if this
    process holds it (flock locks belong to open files, so a second open conflicts like a process)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)


class SignallingClaims(FakeClaims):
    """Claims whose GETs say when they are in flight (and stalled at the gate, if one is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.reading: dict[str, asyncio.Event] = {}

    def read_started(self, name: str) -> asyncio.Event:
        return self.reading.setdefault(name, asyncio.Event())

    async def get_claim(self, namespace: str, name: str, deadline: float) -> dict[str, Any] | None:
        self.read_started(name).set()
        return await super().get_claim(namespace, name, deadline)


async def reading(claims: SignallingClaims, name: str) -> None:
    async with asyncio.timeout(WAIT):
        await claims.read_started(name).wait()


def stalling_node(root: Path) -> Node:
    return Node(root, claims=SignallingClaims())


def claims_of(node: Node) -> SignallingClaims:
    assert isinstance(node.claims, SignallingClaims)
    return node.claims


async def test_unprepare_is_answered_while_a_prepare_waits_on_the_api_server(tmp_path: Path) -> None:
    node = stalling_node(tmp_path)
    lock = tmp_path / "serialize.lock"
    runner = ClaimRunner(node.driver(), serializer=FileLockSerializer(lock))
    leaving = node.claims.add(claim_doc(uid="uid-b", name="b", results=[result("g", "gpu-2")]))
    assert (await runner.prepare([claim(leaving)]))["uid-b"].error == ""

    node.claims.gate = asyncio.Event()  # the API server stalls from here on
    stalled = node.claims.add(two_gpu_claim(uid="uid-a", name="a"))
    stuck = asyncio.create_task(runner.prepare([claim(stalled)]))
    await reading(claims_of(node), "a")
    async with asyncio.timeout(WAIT):
        answers = await runner.unprepare([claim(leaving)])
    assert answers["uid-b"].error == ""
    assert node.spec_files() == []
    # Nothing of this process holds the lock while the read waits: the other process gets in.
    with other_process_lock(lock):
        pass
    assert not stuck.done()

    node.claims.gate.set()
    assert (await stuck)["uid-a"].error == ""
    assert node.spec_files() == ["gpu.draplugin.dev-claim_uid-a.json"]


async def test_what_the_other_process_commits_during_the_read_is_seen_before_the_device_check(
    tmp_path: Path,
) -> None:
    node = stalling_node(tmp_path)
    lock = tmp_path / "serialize.lock"
    runner = ClaimRunner(node.driver(), serializer=FileLockSerializer(lock))
    node.claims.gate = asyncio.Event()
    ours = node.claims.add(claim_doc(uid="uid-a", name="a", results=[result("g", "gpu-0")]))
    preparing = asyncio.create_task(runner.prepare([claim(ours)]))
    await reading(claims_of(node), "a")

    # Meanwhile the other plugin process prepares another claim on gpu-0 and commits it.
    with other_process_lock(lock):
        other = CheckpointStore(node.checkpoint_path, node.boot_id)
        other.load()
        device = DeviceRecord(("g",), NODE, "gpu-0", ("gpu.draplugin.dev/gpu=uid-other-gpu-0",))
        other.put(ClaimRecord("uid-other", "ns", "other", ClaimState.PREPARE_COMPLETED, (device,)))
        other.save()

    node.claims.gate.set()
    async with asyncio.timeout(WAIT):
        answers = await preparing
    # Our process re-read the checkpoint when it took the lock after the read: the GPU is taken.
    assert "is already prepared for claim ns/other" in answers["uid-a"].error
    assert node.spec_files() == []


async def test_a_process_holding_the_lock_for_local_work_keeps_the_other_out(tmp_path: Path) -> None:
    """The guarantee itself: while a claim's node-local work runs, the other process waits."""
    node = stalling_node(tmp_path)
    lock = tmp_path / "serialize.lock"
    driver = node.driver()
    runner = ClaimRunner(driver, serializer=FileLockSerializer(lock))
    seen: list[str] = []
    original = driver.sharing.apply

    def apply_and_probe(plan: ClaimPlan) -> ClaimPlan:
        # Runs inside the prepare's local work (on a worker thread): probe the lock from here.
        try:
            with other_process_lock(lock):
                seen.append("free")
        except BlockingIOError:
            seen.append("busy")
        return original(plan)

    driver.sharing.apply = apply_and_probe  # type: ignore[method-assign]
    ref = node.claims.add(claim_doc(uid="uid-a", name="a", results=[result("g", "gpu-0")]))
    assert (await runner.prepare([claim(ref)]))["uid-a"].error == ""
    assert seen == ["busy"]
    with other_process_lock(lock):  # and it is released once the call is answered
        pass
