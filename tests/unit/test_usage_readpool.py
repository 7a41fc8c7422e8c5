"""The sampler's read threads: one reads every device in turn; reads queued behind stuck ones get
threads of their own, which go again once they are not needed (thread counts, not timings)."""

from __future__ import annotations

import threading

from devcluster.wait import wait_for
from draplugin.usage.readpool import ReadPool
from tests.unit.test_usage_sampler import ScriptedSource, sampler


def usage_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("usage-"))


def test_one_thread_reads_all_64_devices_of_a_pass() -> None:
    before = usage_threads()
    built, _ = sampler(ScriptedSource(), gpus=64)
    try:
        snapshot = built.sample_once()
        assert sum(1 for d in snapshot.devices if d.reading is not None) == 64
        assert usage_threads() - before == 1
    finally:
        built.stop()


def test_reads_behind_several_stuck_devices_are_still_read_in_the_pass() -> None:
    source = ScriptedSource()
    release = threading.Event()
    for name in ("gpu-0", "gpu-1", "gpu-2"):
        source.blocks[name] = release
    built, _ = sampler(source, gpus=8, timeout_s=2.0)
    try:
        snapshot = built.sample_once()
        read = {d.name for d in snapshot.devices if d.reading is not None}
        assert read == {f"gpu-{i}" for i in range(3, 8)}
        release.set()
        # The threads started for the queued reads, and the stuck ones once back, go again.
        wait_for(
            "the extra read threads to end",
            lambda: built._pool is not None and built._pool.threads == 1,
            10.0,
            0.02,
        )
        snapshot = built.sample_once()
        assert sum(1 for d in snapshot.devices if d.reading is not None) == 8
    finally:
        release.set()
        built.stop()


def test_rescue_starts_nothing_while_a_thread_still_moves() -> None:
    now = [0.0]
    release = threading.Event()
    entered = threading.Event()

    def read(item: int) -> int:
        if item == 0:
            entered.set()
            release.wait(10)
        return item

    pool: ReadPool[int, int] = ReadPool(read, name="usage-test", stall_s=1.0, clock=lambda: now[0])
    try:
        first, second = pool.submit(0), pool.submit(1)
        assert entered.wait(10)
        assert pool.rescue() == 0  # the read began 0 s ago by this clock: not stuck
        now[0] = 1.5
        assert pool.rescue() == 1
        assert second.result(10) == 1 and not first.done()
        release.set()
        assert first.result(10) == 0
    finally:
        release.set()
        pool.close()
