"""The threads that read devices for a sampling pass: as few as keep up, one more for each stuck read.

A device read is a handful of NVML calls, well under a millisecond each, so one thread reads
a node's GPUs in turn well inside the pass's deadline; a thread per GPU (as before) cost 64
threads, each with its stack and allocator arena, on a 64-GPU node, to be ready for reads that
hang (a GPU falling off the bus can block its NVML calls for seconds). Instead a read that has
run for `stall_s` counts as stuck: the pass then starts a thread for every read still queued
(`rescue`), so the others start at most `stall_s` late and then run side by side, as each
had its own thread. A stuck thread finishes its call whenever the driver lets it, and then
goes, unless it is the last one. Threads are daemons, not a ThreadPoolExecutor's: those are
joined at interpreter exit, and a call hung in the driver would keep the plugin from exiting.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# A device read taking longer than this is taken for stuck (NVML answers in microseconds to
# milliseconds); at most this much of a pass's deadline goes before the other reads go on.
DEFAULT_STALL_S: Final = 0.05


class ReadPool(Generic[T, R]):
    """Runs `read(item)` for submitted items on `keep` threads or more (see the module)."""

    def __init__(
        self,
        read: Callable[[T], R],
        *,
        name: str,
        keep: int = 1,
        stall_s: float = DEFAULT_STALL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._name = name
        self._keep = keep
        self.stall_s = stall_s
        self._clock = clock
        self._jobs: deque[tuple[T, Future[R]]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # Each thread's current read started at (monotonic), None while it waits for one.
        self._busy_since: dict[int, float | None] = {}
        self._closed = False
        self._started = 0

    @property
    def threads(self) -> int:
        with self._lock:
            return len(self._busy_since)

    def submit(self, item: T) -> Future[R]:
        future: Future[R] = Future()
        with self._lock:
            self._jobs.append((item, future))
            if len(self._busy_since) < self._keep:
                self._spawn_locked()
            self._wake.notify()
        return future

    def rescue(self) -> int:
        """If every thread is in a read older than `stall_s`, start one for each queued read;
        returns how many were started."""
        now = self._clock()
        with self._lock:
            if not self._jobs:
                return 0
            moving = [s for s in self._busy_since.values() if s is None or now - s < self.stall_s]
            if moving:
                return 0
            for _ in self._jobs:
                self._spawn_locked()
            self._wake.notify_all()
            return len(self._jobs)

    def close(self) -> None:
        """Threads end after their current read; queued reads are cancelled."""
        with self._lock:
            self._closed = True
            while self._jobs:
                self._jobs.popleft()[1].cancel()
            self._wake.notify_all()

    def _spawn_locked(self) -> None:
        self._started += 1
        ident = self._started
        self._busy_since[ident] = None
        threading.Thread(target=self._run, args=(ident,), name=f"{self._name}-{ident}", daemon=True).start()

    def _run(self, ident: int) -> None:
        while True:
            with self._lock:
                while not self._jobs and not self._closed:
                    if len(self._busy_since) > self._keep:
                        del self._busy_since[ident]  # a rescuer, or a stuck one come back: not needed
                        return
                    self._wake.wait()
                if self._closed:
                    del self._busy_since[ident]
                    return
                item, future = self._jobs.popleft()
                self._busy_since[ident] = self._clock()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self._read(item))
                except BaseException as err:  # reported by the pass that waits for it
                    future.set_exception(err)
            with self._lock:
                self._busy_since[ident] = None
