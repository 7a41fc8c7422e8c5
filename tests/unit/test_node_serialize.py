"""Prepare/unprepare calls serialized across plugin processes (rolling updates), with state reloaded."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet.dra import ClaimRunner
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from draplugin.kubelet.serialize import FileLockSerializer, held_now, lock_path
from draplugin.kubelet.server import KubeletPluginServer, PluginServerOptions
from tests.kubelet_client import StaticDriver
from tests.unit.test_prepare_driver import Node

WAIT = 10.0

# A second process: takes the lock, says so, waits for a line on stdin, leaves a marker, releases.
HOLDER = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("locked", flush=True)
    sys.stdin.readline()
    open(sys.argv[2], "w").write("released")
    fcntl.flock(fd, fcntl.LOCK_UN)
    """
)
# A second process: reports whether it could take the lock without waiting.
PROBE = textwrap.dedent(
    """
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        print("free")
    except BlockingIOError:
        print("busy")
    """
)


def probe(path: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True, timeout=WAIT
    ).stdout.strip()


def test_lock_lives_in_the_drivers_plugin_directory() -> None:
    assert lock_path(Path("/var/lib/kubelet"), "gpu.draplugin.dev") == Path(
        "/var/lib/kubelet/plugins/gpu.draplugin.dev/serialize.lock"
    )


async def test_held_lock_excludes_other_processes_and_is_released_after(tmp_path: Path) -> None:
    path = tmp_path / "plugins" / "drv" / "serialize.lock"
    serializer = FileLockSerializer(path)
    async with serializer.hold():
        assert await asyncio.to_thread(probe, path) == "busy"
    assert await asyncio.to_thread(probe, path) == "free"


async def test_waits_for_another_process_without_blocking_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "serialize.lock"
    marker = tmp_path / "released"
    holder = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", HOLDER, str(path), str(marker)),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        async with asyncio.timeout(WAIT):
            assert await holder.stdout.readline() == b"locked\n"
        serializer = FileLockSerializer(path)
        seen_inside: list[bool] = []

        async def take() -> None:
            async with serializer.hold():
                seen_inside.append(marker.exists())

        waiting = asyncio.create_task(take())
        # The loop keeps serving while the lock is awaited in a worker thread.
        await asyncio.sleep(0.2)
        assert not waiting.done()
        holder.stdin.write(b"go\n")
        await holder.stdin.drain()
        async with asyncio.timeout(WAIT):
            await waiting
        # We got in only after the other process had finished its work.
        assert seen_inside == [True]
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


class RecordingSerializer:
    def __init__(self, log: list[str]) -> None:
        self.log = log
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._lock:
            self.log.append("lock")
            yield
            self.log.append("unlock")


class ReloadingDriver(StaticDriver):
    def __init__(self, log: list[str], gate: asyncio.Event) -> None:
        super().__init__()
        self.log = log
        self.gate = gate
        self.started = 0
        self.all_started = asyncio.Event()  # once three claims have started

    def reload_state(self) -> None:
        self.log.append("reload")

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        self.log.append(f"start {claim.uid}")
        self.started += 1
        if self.started == 3:
            self.all_started.set()
        await self.gate.wait()
        self.log.append(f"end {claim.uid}")
        return await super().prepare_claim(claim)


def claims(*uids: str) -> list[v1.Claim]:
    return [v1.Claim(namespace="ns", uid=uid, name=f"c-{uid}") for uid in uids]


async def test_calls_of_this_process_share_one_hold_taken_with_a_reload() -> None:
    """The lock keeps the other process out; the calls of this one run side by side under one hold
    (as they do without per-pod sockets), and the state is reloaded each time it is taken afresh."""
    log: list[str] = []
    gate = asyncio.Event()
    driver = ReloadingDriver(log, gate)
    runner = ClaimRunner(driver, serializer=RecordingSerializer(log))
    first = asyncio.create_task(runner.prepare(claims("a1", "a2")))
    second = asyncio.create_task(runner.prepare(claims("b1")))
    async with asyncio.timeout(WAIT):
        await driver.all_started.wait()
    gate.set()
    results = await asyncio.gather(first, second)
    assert all(not o.error for r in results for o in r.values())
    assert log[:2] == ["lock", "reload"]
    assert sorted(log[2:8]) == sorted(
        f"{step} {uid}" for step in ("start", "end") for uid in ("a1", "a2", "b1")
    )
    assert log[8:] == ["unlock"]
    # The next call takes it afresh: the other process may have had it in between.
    await runner.prepare(claims("c1"))
    assert log[9:] == ["lock", "reload", "start c1", "end c1", "unlock"]


async def test_without_a_serializer_nothing_is_locked_or_reloaded() -> None:
    log: list[str] = []
    gate = asyncio.Event()
    gate.set()
    runner = ClaimRunner(ReloadingDriver(log, gate))
    await runner.prepare(claims("a"))
    assert log == ["start a", "end a"]


def test_plugin_server_serializes_only_with_a_pod_uid() -> None:
    root = Path("/var/lib/kubelet")  # nothing is created: the server is only constructed
    shared = KubeletPluginServer(StaticDriver(), PluginServerOptions("gpu.draplugin.dev", root, "pod-1"))
    alone = KubeletPluginServer(StaticDriver(), PluginServerOptions("gpu.draplugin.dev", root))
    serializer = shared._runner._serializer
    assert isinstance(serializer, FileLockSerializer)
    assert serializer.path == root / "plugins" / "gpu.draplugin.dev" / "serialize.lock"
    assert alone._runner._serializer is None


async def test_prepare_driver_reload_sees_the_other_process_claims(tmp_path: Path) -> None:
    node = Node(tmp_path)
    ours = node.driver()
    # The other plugin process prepares a claim and commits its checkpoint.
    other = CheckpointStore(node.checkpoint_path, node.boot_id)
    other.load()
    other.put(ClaimRecord("uid-other", "ns", "other", ClaimState.PREPARE_COMPLETED, ()))
    other.save()
    assert ours.checkpoint.get("uid-other") is None
    ours.reload_state()
    record = ours.checkpoint.get("uid-other")
    assert record is not None and record.state is ClaimState.PREPARE_COMPLETED
    assert node.metric("draplugin_prepared_claims") == 1


def test_start_up_recovery_waits_for_the_other_process(tmp_path: Path) -> None:
    """`held_now` (around recover() beside another pod) gets in only after the other process's
    call is done, so recovery never cleans up behind a prepare in the middle of its work."""
    path = tmp_path / "serialize.lock"
    marker = tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), str(marker)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "locked\n"
        holder.stdin.write("go\n")
        holder.stdin.flush()
        with held_now(path):
            assert marker.exists()
            assert probe(path) == "busy"
        assert probe(path) == "free"
    finally:
        holder.kill()
        holder.wait(timeout=WAIT)
