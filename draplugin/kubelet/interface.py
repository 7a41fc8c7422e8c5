"""The contract between the kubelet protocol layer and the driver behind it.

The protocol layer (registration, the v1 and v1beta1 DRA services, the health
service) speaks gRPC and knows nothing of devices. It turns each request into
calls on a `Driver`, one per claim, and turns each claim's outcome into that
claim's entry in the response. Types here are version-neutral: the same driver
serves both DRA API versions.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as the kubelet names it: all it sends is these three fields."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (uid {self.uid})"


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device made available to a claim's containers.

    `request_names` are the base request names (never `request/subrequest`):
    the kubelet matches them against the container's `resources.claims[].request`.
    An empty tuple means the device applies to every request of the claim.
    """

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


class ClaimError(Exception):
    """A claim-specific failure whose message is reported to the kubelet verbatim."""


class Driver(Protocol):
    """What the protocol layer needs from the device side.

    Each claim method handles one claim. Raising (`ClaimError` or anything else)
    fails that claim only; the protocol layer reports the message in the
    claim's `error` field and keeps serving. Implementations must be
    idempotent: the kubelet retries at any time and after restarts.

    The protocol layer (`ClaimRunner`) never runs two calls for the same claim
    UID at once, across requests and API versions, so implementations need no
    per-claim lock of their own; anyone else who calls a driver concurrently
    for one claim must give the same guarantee (run it through a `ClaimRunner`).
    Calls for different claims do run concurrently.
    """

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        """Prepare the claim's devices on this node and return them with their CDI IDs."""
        ...

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        """Undo prepare. An unknown or never-prepared claim is a success."""
        ...

    def reload_state(self) -> None:
        """Re-read state another plugin process on this node may have changed (rolling updates).

        Called on the event loop each time this process takes the cross-process
        lock afresh (no claim of this process is then in the middle of its work),
        before the claim that took it goes on; so it must be quick (a small file
        read) and not await. A driver that keeps no state across processes does
        nothing. The lock is held around each claim call except where the driver
        steps out of it for API reads (`draplugin.kubelet.nodestate`).
        """
        ...


class HealthStatus(enum.IntEnum):
    """Device health as the kubelet's DRA health API encodes it."""

    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """One device's health as the kubelet's health stream carries it."""

    pool_name: str
    device_name: str
    health: HealthStatus
    last_updated_unix: int
    message: str = ""
    health_check_timeout_seconds: int = 0


class HealthSource(Protocol):
    """Device health for the kubelet's DRA health service, handed to the plugin server on its own:
    health comes from device monitoring, not from the driver that prepares claims."""

    def watch_health(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        """Yield the full list of the driver's devices with their health, on every change."""
        ...
