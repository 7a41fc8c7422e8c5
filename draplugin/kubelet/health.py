"""Health over gRPC: device health for the kubelet, and process liveness for probes.

Two unrelated services share the DRA socket:

* `v1alpha1.DRAResourceHealth` streams device health to the kubelet (only when
  the plugin server is given a `HealthSource`).
* the standard `grpc.health.v1.Health` answers liveness probes. It reports
  NOT_SERVING until the kubelet has accepted our registration, and again after
  the kubelet rejects it: a plugin the kubelet cannot use is not alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Final

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2

from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_pb
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2_grpc as health_grpc
from draplugin.kubelet.interface import DeviceHealth, HealthSource
from draplugin.kubelet.registration import RegistrationStatus

# The kubelet cuts messages longer than this; cutting here keeps our log and its view identical.
MAX_HEALTH_MESSAGE: Final = 1024
# Health-service name probes use for the plugin as a whole (the empty name is the server).
OVERALL_SERVICE: Final = ""

log = logging.getLogger(__name__)


def _truncate(message: str) -> str:
    if len(message) <= MAX_HEALTH_MESSAGE:
        return message
    return message[: MAX_HEALTH_MESSAGE - 3] + "..."


def to_wire(devices: Sequence[DeviceHealth]) -> health_pb.NodeWatchResourcesResponse:
    response = health_pb.NodeWatchResourcesResponse()
    for device in devices:
        response.devices.add(
            device=health_pb.DeviceIdentifier(pool_name=device.pool_name, device_name=device.device_name),
            health=health_pb.HealthStatus.ValueType(int(device.health)),
            last_updated_time=device.last_updated_unix,
            health_check_timeout_seconds=device.health_check_timeout_seconds,
            message=_truncate(device.message),
        )
    return response


class DeviceHealthServicer(health_grpc.DRAResourceHealthServicer):
    """Relays the health source's snapshots to the kubelet, one message per snapshot."""

    def __init__(self, source: HealthSource) -> None:
        self._source = source
        self._closing = asyncio.Event()

    async def NodeWatchResources(
        self,
        request: health_pb.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            health_pb.NodeWatchResourcesRequest, health_pb.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        log.info("kubelet opened the device health stream")
        snapshots = aiter(self._source.watch_health())
        closing = asyncio.ensure_future(self._closing.wait())
        upcoming: asyncio.Future[Sequence[DeviceHealth]] | None = None
        try:
            while True:
                # Race the next snapshot against shutdown: the kubelet never closes
                # this stream, so waiting for the source alone would hold up stop().
                upcoming = asyncio.ensure_future(anext(snapshots))
                await asyncio.wait({upcoming, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not upcoming.done():
                    upcoming.cancel()
                    await asyncio.gather(upcoming, return_exceptions=True)
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "plugin is shutting down")
                try:
                    snapshot = upcoming.result()
                except StopAsyncIteration:
                    break
                except Exception as exc:
                    # The kubelet reopens the stream after a pause; tell it why this one ended.
                    log.exception("device health source failed")
                    await context.abort(grpc.StatusCode.UNAVAILABLE, f"device health source failed: {exc}")
                yield to_wire(snapshot)
        finally:
            closing.cancel()
            if upcoming is not None and not upcoming.done():
                # The kubelet went away mid-wait: stop the pending read before closing the source.
                upcoming.cancel()
                await asyncio.gather(upcoming, return_exceptions=True)
            # Close the source's generator now (releasing its watch), not whenever it is collected.
            aclose = getattr(snapshots, "aclose", None)
            if aclose is not None:
                await aclose()
        log.info("device health stream ended")

    def close(self) -> None:
        """End every open stream (with UNAVAILABLE) and refuse new ones' waits."""
        self._closing.set()


class LivenessHealth:
    """The standard gRPC health service, driven by the registration outcome."""

    def __init__(self) -> None:
        self.servicer = grpc_health.aio.HealthServicer()

    async def start(self) -> None:
        # The servicer starts out SERVING; we are not, until the kubelet says so.
        await self.servicer.set(OVERALL_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)

    async def on_registration(self, status: RegistrationStatus) -> None:
        serving = (
            health_pb2.HealthCheckResponse.SERVING
            if status.registered
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        await self.servicer.set(OVERALL_SERVICE, serving)

    async def shutting_down(self) -> None:
        await self.servicer.enter_graceful_shutdown()
