"""What the plugin serves before start-up has finished: the sockets are open, the driver is not.

`draplugin run` opens its sockets first (the kubelet finds the plugin at once) and builds
the rest behind them: device discovery, credentials, and the prepare driver's start-up
recovery, which reads the checkpoint and puts the CDI specs right. A claim call that
arrives meanwhile must never act on state not yet recovered, so the `ClaimRunner` waits
for the gate before each claim (before the node-wide lock: recovery of a rolling update
takes that lock itself) and then runs the recovered driver. The kubelet's deadline still
holds: a claim that waits past it is answered as still running, like any slow claim, and
the kubelet's retry gets its result. If start-up fails, every waiting and later claim is
refused with the reason, and the process exits.

The device health stream waits the same way (`PendingHealth`): the kubelet opens it right
after registration, and the first snapshot comes once the devices are known.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Generic, TypeVar

from draplugin.kubelet.interface import ClaimError, DeviceHealth, Driver, HealthSource

T = TypeVar("T")


class StartupFailed(ClaimError):
    """The plugin's start-up failed: no claim can be served by this process."""


class Pending(Generic[T]):
    """A value handed over later, on the event loop's thread; `get` waits for it.

    The event is made on first use, so a `Pending` may be built before the loop runs.
    """

    def __init__(self, what: str) -> None:
        self._what = what
        self._value: T | None = None
        self._failure: str | None = None
        self._settled: asyncio.Event | None = None

    @property
    def value(self) -> T | None:
        """The value once handed over, else None (never waits)."""
        return self._value

    def _event(self) -> asyncio.Event:
        if self._settled is None:
            self._settled = asyncio.Event()
        return self._settled

    def set(self, value: T) -> None:
        self._value = value
        self._event().set()

    def fail(self, reason: str) -> None:
        """Nothing will come: waiting and later `get` calls raise `StartupFailed` with `reason`."""
        self._failure = reason
        self._event().set()

    async def get(self) -> T:
        if self._value is None and self._failure is None:
            await self._event().wait()
        if self._value is not None:
            return self._value
        raise StartupFailed(f"the plugin could not start, so no {self._what} is served: {self._failure}")


class PendingDriver(Pending[Driver]):
    """The prepare driver, once recovered. `reload_state` reaches it only then: the runner
    takes the node-wide lock (whose taking calls it) only after `get` has returned."""

    def __init__(self) -> None:
        super().__init__("claim")

    def reload_state(self) -> None:
        driver = self.value
        if driver is not None:
            driver.reload_state()


class PendingHealth(Pending[HealthSource]):
    """A `HealthSource` whose snapshots start once the real source is handed over."""

    def __init__(self) -> None:
        super().__init__("device health")

    async def watch_health(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        source = await self.get()
        snapshots = source.watch_health()
        try:
            async for snapshot in snapshots:
                yield snapshot
        finally:
            # Closed with this stream, not whenever collected: the source holds a listener.
            aclose = getattr(snapshots, "aclose", None)
            if aclose is not None:
                await aclose()
