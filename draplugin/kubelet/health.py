"""Health over gRPC: device health for the kubelet, and process liveness for probes.

Two unrelated kinds of service share the DRA socket:

* `DRAResourceHealth` streams device health to the kubelet (only when the
  plugin server is given a `HealthSource`), as `v1` (kubelet 1.37+) and
  `v1alpha1` (older kubelets) from one stream implementation.
* the standard `grpc.health.v1.Health` answers liveness probes. It reports
  NOT_SERVING until the kubelet has accepted our registration, and again after
  the kubelet rejects it: a plugin the kubelet cannot use is not alive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import grpc
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2

from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_v1
from draplugin.kubelet._proto.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from draplugin.kubelet.interface import DeviceHealth, HealthSource
from draplugin.kubelet.metrics import kubelet_metrics
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


def to_wire(devices: Sequence[DeviceHealth]) -> health_v1.NodeWatchResourcesResponse:
    response = health_v1.NodeWatchResourcesResponse()
    for device in devices:
        response.devices.add(
            device=health_v1.DeviceIdentifier(pool_name=device.pool_name, device_name=device.device_name),
            health=health_v1.HealthStatus.ValueType(int(device.health)),
            last_updated_time=device.last_updated_unix,
            health_check_timeout_seconds=device.health_check_timeout_seconds,
            message=_truncate(device.message),
        )
    return response


def to_v1alpha1(response: health_v1.NodeWatchResourcesResponse) -> health_v1alpha1.NodeWatchResourcesResponse:
    """The same response for the v1alpha1 service.

    The two versions differ only in their proto package: every field number and
    type is the same (the wire-contract test holds both to upstream), so the v1
    bytes are a valid v1alpha1 message. Re-parsing keeps one mapping, `to_wire`.
    """
    return health_v1alpha1.NodeWatchResourcesResponse.FromString(response.SerializeToString())


# Either version's stream context: the stream code only aborts on it.
AnyContext = grpc.aio.ServicerContext[Any, Any]


class DeviceHealthStream:
    """Relays the health source's snapshots to the kubelet, one message per snapshot.

    The one implementation behind both service versions; `close` ends every open
    stream of either version.
    """

    def __init__(self, source: HealthSource) -> None:
        self._source = source
        self._closing = asyncio.Event()

    async def responses(
        self, version: str, context: AnyContext
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        # Which version the kubelet chose is worth a log line: 1.37+ should pick v1.
        log.info("kubelet opened the device health stream", extra={"health_version": version})
        kubelet_metrics().health_streams.labels(version=version).inc()
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
        log.info("device health stream ended", extra={"health_version": version})

    def close(self) -> None:
        """End every open stream (with UNAVAILABLE) and refuse new ones' waits."""
        self._closing.set()


class DeviceHealthServicerV1(health_v1_grpc.DRAResourceHealthServicer):
    """`v1.DRAResourceHealth`: what the 1.37+ kubelet picks."""

    def __init__(self, stream: DeviceHealthStream) -> None:
        self._stream = stream

    async def NodeWatchResources(
        self,
        request: health_v1.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            health_v1.NodeWatchResourcesRequest, health_v1.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[health_v1.NodeWatchResourcesResponse]:
        async for response in self._stream.responses("v1", context):
            yield response


class DeviceHealthServicerV1Alpha1(health_v1alpha1_grpc.DRAResourceHealthServicer):
    """`v1alpha1.DRAResourceHealth`: the only version kubelets before 1.37 know."""

    def __init__(self, stream: DeviceHealthStream) -> None:
        self._stream = stream

    async def NodeWatchResources(
        self,
        request: health_v1alpha1.NodeWatchResourcesRequest,
        context: grpc.aio.ServicerContext[
            health_v1alpha1.NodeWatchResourcesRequest, health_v1alpha1.NodeWatchResourcesResponse
        ],
    ) -> AsyncIterator[health_v1alpha1.NodeWatchResourcesResponse]:
        async for response in self._stream.responses("v1alpha1", context):
            yield to_v1alpha1(response)


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
