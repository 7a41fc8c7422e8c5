"""Group commit of the checkpoint: claims that complete while a write is in flight share the next
write's fsyncs, and no caller returns before a write holding its change has been fsynced.

The disk is the real one (tmp_path); only `os.fsync` is replaced, through the store's `fsync`
seam, by one that counts each sync and holds it until the test lets it through, so every
assertion is about order and counts, never about time.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from tests.unit.test_prepare_driver import Node
from tests.unit.test_prepare_plan import claim_doc, gpu, result

N = 64


class HeldDisk:
    """An fsync seam: counts every sync; a held sync waits for `allow` (a permit per sync)."""

    def __init__(self, *, held: bool = True) -> None:
        self.held = held
        self.syncs = 0
        self.kinds: list[str] = []  # "file" or "dir", in the order the syncs began
        self.fail_next = 0  # syncs that raise EIO instead of syncing
        self._permits = threading.Semaphore(0)
        self._entered = threading.Condition()

    def fsync(self, fd: int) -> None:
        with self._entered:
            self.syncs += 1
            self.kinds.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
            self._entered.notify_all()
        if self.held:
            self._permits.acquire()
        if self.fail_next:
            self.fail_next -= 1
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    def allow(self, syncs: int) -> None:
        for _ in range(syncs):
            self._permits.release()

    def let_go(self) -> None:
        """Stop holding: every sync from now on goes through at once (and any waiting one too)."""
        self.held = False
        self.allow(N * 4)

    async def reached(self, syncs: int) -> None:
        """Until `syncs` syncs have begun (the writer thread is inside the last one)."""

        def wait() -> None:
            with self._entered:
                if not self._entered.wait_for(lambda: self.syncs >= syncs, timeout=30):
                    raise AssertionError(f"only {self.syncs} of {syncs} syncs began")

        await asyncio.to_thread(wait)


def record(i: int, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    return ClaimRecord(f"u{i}", "ns", f"c{i}", state)


def on_disk(path: Path) -> set[str]:
    return {c["uid"] for c in json.loads(path.read_text())["claims"]} if path.exists() else set()


async def settle() -> None:
    """Let every ready task run until it blocks (a few loop turns; no time involved)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_claims_completing_during_a_write_share_the_next_one(tmp_path: Path) -> None:
    disk = HeldDisk()
    store = CheckpointStore(tmp_path / "cp.json", "b", fsync=disk.fsync)
    store.put(record(0))
    first = asyncio.create_task(store.commit())
    await disk.reached(1)  # the first write is inside its first fsync
    rest = []
    for i in range(1, N):
        store.put(record(i))
        rest.append(asyncio.create_task(store.commit()))
    await settle()
    disk.let_go()
    await asyncio.gather(first, *rest)
    # One write for the first claim, one for the 63 that completed while it was in flight; each
    # syncs its file only (new records: `CheckpointStore._forgets_unwritten`).
    assert disk.kinds == ["file", "file"]
    assert on_disk(tmp_path / "cp.json") == {f"u{i}" for i in range(N)}


async def test_a_caller_returns_only_after_the_write_holding_its_change_is_fsynced(tmp_path: Path) -> None:
    disk = HeldDisk()
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, "b", fsync=disk.fsync)
    store.put(record(1))
    one = asyncio.create_task(store.commit())
    await disk.reached(1)
    store.put(record(2))  # completes while the write of u1 is in flight
    two = asyncio.create_task(store.commit())
    await settle()
    assert not one.done() and not two.done()

    disk.allow(1)  # the temp file's sync, the only one a write of new records takes
    await one
    assert on_disk(path) == {"u1"}
    await disk.reached(2)  # u2's write began after u1's ended, and is held in its sync
    await settle()
    assert not two.done(), "released by a write that did not hold its change"
    assert store.durable("u1") and not store.durable("u2")

    disk.allow(1)
    await two
    assert on_disk(path) == {"u1", "u2"} and store.durable("u2")


async def test_a_write_that_forgets_a_claim_answers_only_once_its_directory_is_synced(
    tmp_path: Path,
) -> None:
    """New records: the file's sync alone. A forget (unprepare): the file's, then the directory's,
    and no caller of that write returns before the directory's is through. A record whose rename
    a power loss undoes is redone by the kubelet after the reboot; a forget it undoes would bring
    the claim back for good (`CheckpointStore._forgets_unwritten`)."""
    disk = HeldDisk()
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, "b", fsync=disk.fsync)
    store.put(record(1))
    store.put(record(2))
    disk.allow(1)
    await store.commit()
    assert disk.kinds == ["file"]

    store.forget("u1")
    forgets = asyncio.create_task(store.commit())
    await disk.reached(2)
    disk.allow(1)  # the file's sync; the write now waits in the directory's
    await disk.reached(3)
    await settle()
    assert disk.kinds == ["file", "file", "dir"]
    assert not forgets.done(), "an unprepare answered before its rename was durable"
    disk.allow(1)
    await forgets
    assert on_disk(path) == {"u2"}

    store.put(record(3))
    disk.allow(1)
    await store.commit()
    assert disk.kinds == ["file", "file", "dir", "file"]


async def test_a_failed_write_fails_the_callers_it_held_and_not_those_after_it(tmp_path: Path) -> None:
    disk = HeldDisk()
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, "b", fsync=disk.fsync)
    store.put(record(1))
    one = asyncio.create_task(store.commit())
    await disk.reached(1)
    store.put(record(2))
    two = asyncio.create_task(store.commit())
    await settle()
    disk.fail_next = 1  # the held sync of u1's write fails: EIO
    disk.let_go()
    with pytest.raises(OSError):
        await one
    await two  # its change was not in the failed write: the next one holds it, and u1's too
    assert on_disk(path) == {"u1", "u2"}
    assert store.durable("u1") and store.durable("u2")


async def test_cancelling_a_caller_does_not_cancel_the_write_others_wait_on(tmp_path: Path) -> None:
    disk = HeldDisk()
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, "b", fsync=disk.fsync)
    store.put(record(1))
    store.put(record(2))
    gone = asyncio.create_task(store.commit())
    stays = asyncio.create_task(store.commit())
    await disk.reached(1)
    gone.cancel()
    await settle()
    disk.let_go()
    await stays
    assert gone.cancelled() and on_disk(path) == {"u1", "u2"} and disk.syncs == 1


class CountingStore(CheckpointStore):
    """Sets `all_waiting` once N callers are inside `commit`."""

    def __init__(self, path: Path, boot_id: str, *, fsync: Callable[[int], None]) -> None:
        super().__init__(path, boot_id, fsync=fsync)
        self.callers = 0
        self.all_waiting = asyncio.Event()

    async def commit(self) -> None:
        self.callers += 1
        if self.callers == N:
            self.all_waiting.set()
        await super().commit()


async def test_64_concurrent_prepares_cost_two_checkpoint_writes(tmp_path: Path) -> None:
    """Through the driver: 64 claims prepared at once on a node of 64 GPUs. The first completed
    claim's write is held in its fsync until every other claim has completed in memory and waits
    for the file; then they share one write. Without grouping each would write (128 fsyncs)."""
    node = Node(tmp_path)
    disk = HeldDisk()
    driver = node.driver()
    driver.checkpoint = CountingStore(node.checkpoint_path, node.boot_id, fsync=disk.fsync)
    driver.devices = {f"gpu-{i}": gpu(i) for i in range(N)}
    refs = [
        node.claims.add(claim_doc(uid=f"uid-{i}", name=f"claim-{i}", results=[result("gpu", f"gpu-{i}")]))
        for i in range(N)
    ]
    prepares = [asyncio.create_task(driver.prepare_claim(ref)) for ref in refs]
    await disk.reached(1)
    await asyncio.wait_for(driver.checkpoint.all_waiting.wait(), 30)
    await settle()
    assert not any(p.done() for p in prepares)
    disk.let_go()
    await asyncio.gather(*prepares)
    assert disk.kinds == ["file", "file"]
    assert on_disk(node.checkpoint_path) == {f"uid-{i}" for i in range(N)}


def test_a_caller_woken_as_a_write_ends_waits_for_the_next_write_and_gets_it(tmp_path: Path) -> None:
    """A claim that completes in the same loop turn in which the previous write's end is delivered
    (an unprepare whose spec removal ended then, say) must get its own write, not spin on the one
    that is over. Run on its own loop in a thread, so that a spinning loop fails the test (the
    thread is still alive) instead of hanging it."""
    disk = HeldDisk()
    store = CheckpointStore(tmp_path / "cp.json", "b", fsync=disk.fsync)

    async def scenario() -> None:
        go = asyncio.Event()

        async def completes_later() -> None:
            await go.wait()
            store.put(record(2))
            await store.commit()

        store.put(record(1))
        first = asyncio.create_task(store.commit())
        second = asyncio.create_task(completes_later())
        await disk.reached(1)
        await settle()
        disk.allow(2)
        # Hold the loop until the writer thread has finished the write and queued its delivery,
        # then wake the second caller: both land in the same loop turn, the delivery first.
        assert store._writer is not None
        store._writer.submit(lambda: None).result()
        go.set()
        disk.let_go()
        await asyncio.gather(first, second)

    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(scenario())
        except BaseException as err:  # reported below, in the test's own thread
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the event loop never finished: a caller spun on a finished write"
    assert not errors, errors
    assert on_disk(tmp_path / "cp.json") == {"u1", "u2"} and disk.syncs == 2
