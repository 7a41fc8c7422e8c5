"""The node-wide lock of per-pod sockets, held around node-local work only, never an API read.

What it protects: during a rolling update two plugin processes serve one node
(`draplugin.kubelet.serialize`), and both work on the same checkpoint, CDI
specs and sharing state. A prepare's device check, its records and its files,
and an unprepare's removals, must not interleave with the other process's, and
each process must start from what the other committed (`Driver.reload_state`).
A claim GET touches none of that: the Go helper
(k8s.io/dynamic-resource-allocation/kubeletplugin) likewise does its "slow API
calls before serializing". Held across a read, one stalled API server made
every unprepare of the node wait for the read's deadline.

So the `ClaimRunner` holds this lock around each claim's driver call, and the
driver steps out of it around its API reads (`outside_node_state`); back in,
the lock is taken again and, if the other process may have had it meanwhile,
the state is reloaded before the driver goes on. The read comes before
anything the driver decides, so nothing decided before it goes stale.

Within one process the lock is shared: the claims of this process may run
their local work concurrently (as they do without per-pod sockets, where there
is no other process), and the file lock is taken when the first of them enters
and released when the last leaves. The state is reloaded only then, when no
claim of this process is in the middle of its work, so a reload never drops a
record that a claim of ours has just made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Final

from draplugin.kubelet.serialize import CallSerializer


class NodeStateLock:
    """Shared by the claims of this process, exclusive against other processes (`serializer`).

    `on_acquired` runs with the serializer just taken and before any claim goes on: the
    driver's `reload_state`.
    """

    def __init__(self, serializer: CallSerializer, on_acquired: Callable[[], None]) -> None:
        self._serializer = serializer
        self._on_acquired = on_acquired
        self._holders = 0
        # One acquisition at a time: claims arriving meanwhile join it instead of taking their own.
        self._entry = asyncio.Lock()
        self._held: contextlib.AsyncExitStack | None = None

    @property
    def holders(self) -> int:
        return self._holders

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Held by one claim's driver call; the driver may step out with `outside_node_state`."""
        share = _Share(self)
        await share.enter()
        token = _CURRENT.set(share)
        try:
            yield
        finally:
            _CURRENT.reset(token)
            await share.leave()

    async def _join(self) -> None:
        async with self._entry:
            if self._holders == 0:
                held = contextlib.AsyncExitStack()
                await held.enter_async_context(self._serializer.hold())
                try:
                    self._on_acquired()
                except BaseException:
                    await held.aclose()
                    raise
                self._held = held
            self._holders += 1

    async def _part(self) -> None:
        self._holders -= 1
        if self._holders == 0 and self._held is not None:
            held, self._held = self._held, None
            # Shielded: a cancelled caller must still give the other process its turn.
            await asyncio.shield(held.aclose())


class _Share:
    """One claim's part in the lock: in or stepped out (for an API read)."""

    def __init__(self, lock: NodeStateLock) -> None:
        self.lock = lock
        self.inside = False

    async def enter(self) -> None:
        await self.lock._join()
        self.inside = True

    async def leave(self) -> None:
        if self.inside:
            self.inside = False
            await self.lock._part()


_CURRENT: Final[ContextVar[_Share | None]] = ContextVar("draplugin_node_state_share", default=None)


@contextlib.asynccontextmanager
async def outside_node_state() -> AsyncIterator[None]:
    """Around a driver's API read: the node-wide lock is not held meanwhile (if this claim holds it,
    it is given up and taken again after, with the state reloaded if another process had it).

    A no-op outside a `NodeStateLock` (no per-pod sockets, start-up, tests).
    """
    share = _CURRENT.get()
    if share is None or not share.inside:
        yield
        return
    await share.leave()
    try:
        yield
    finally:
        await share.enter()
