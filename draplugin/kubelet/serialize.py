"""One prepare/unprepare call at a time across plugin processes on a node (rolling updates).

During a maxSurge rolling update the old and the new plugin pod serve side by
side, each on its own sockets, and the kubelet may send NodePrepareResources
to either. Both work on the same checkpoint, CDI directory and sharing state,
so their calls must not interleave. An exclusive `flock` on
`<kubelet-root>/plugins/<driver>/serialize.lock` does that: the directory is
the one both pods mount, and the kernel drops the lock when a process dies, so
a crashed pod never wedges its successor.

`flock` blocks, so it runs in a worker thread and the event loop keeps serving.
Locks belong to an open file description: two holders in one process would
share it, so an asyncio lock lets only one task at a time reach the file lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Final, Protocol

from draplugin.kubelet import sockets

LOCK_FILE_NAME: Final = "serialize.lock"
# Waiting longer than this for the other pod is logged: it usually means a stuck call there.
SLOW_WAIT_SECONDS: Final = 10.0

log = logging.getLogger(__name__)


class CallSerializer(Protocol):
    """Held around each prepare/unprepare call."""

    def hold(self) -> contextlib.AbstractAsyncContextManager[None]: ...


def lock_path(kubelet_root: Path, driver_name: str) -> Path:
    return kubelet_root / sockets.PLUGINS_DIR_NAME / driver_name / LOCK_FILE_NAME


class FileLockSerializer:
    """Exclusive `flock` on one file, shared by every plugin process of the driver on this node."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._local:
            fd = await self._acquire()
            try:
                yield
            finally:
                _release(fd)

    async def _acquire(self) -> int:
        started = time.monotonic()
        acquiring = asyncio.ensure_future(asyncio.to_thread(_open_and_lock, self.path))
        try:
            fd = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            # The thread cannot be interrupted: let it finish and give the lock straight back,
            # or this process would hold it (and block the other pod) until it exits.
            acquiring.add_done_callback(_release_when_acquired)
            raise
        waited = time.monotonic() - started
        if waited > SLOW_WAIT_SECONDS:
            log.warning(
                "waited for another plugin process on this node",
                extra={"lock": str(self.path), "seconds": round(waited, 1)},
            )
        return fd


@contextlib.contextmanager
def held_now(path: Path) -> Iterator[None]:
    """The same lock, taken synchronously: for start-up recovery, before the event loop serves,
    so that it never cleans up behind a call the other plugin process is in the middle of."""
    fd = _open_and_lock(path)
    try:
        yield
    finally:
        _release(fd)


def _open_and_lock(path: Path) -> int:
    sockets.ensure_dir(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _release(fd: int) -> None:
    # Closing the descriptor drops the lock; the unlock first makes the intent explicit.
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _release_when_acquired(done: asyncio.Future[int]) -> None:
    if not done.cancelled() and done.exception() is None:
        _release(done.result())
