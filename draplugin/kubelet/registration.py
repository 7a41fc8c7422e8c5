"""The plugin-registration service the kubelet calls on our `-reg.sock`.

GetInfo tells the kubelet who we are and which DRA services the endpoint
serves; NotifyRegistrationStatus tells us whether the kubelet accepted us. The
outcome is kept in `RegistrationState`, which the liveness health service
follows: a plugin the kubelet does not know is not healthy.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Final

import grpc

from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from draplugin.kubelet.metrics import kubelet_metrics

# PluginInfo.type for DRA drivers.
PLUGIN_TYPE_DRA: Final = "DRAPlugin"
# Service identifiers the kubelet understands in PluginInfo.supported_versions:
# `<last segment of the proto package>.<service>`, not the full gRPC service name.
DRA_V1_SERVICE: Final = "v1.DRAPlugin"
DRA_V1BETA1_SERVICE: Final = "v1beta1.DRAPlugin"
HEALTH_V1_SERVICE: Final = "v1.DRAResourceHealth"
HEALTH_V1ALPHA1_SERVICE: Final = "v1alpha1.DRAResourceHealth"

log = logging.getLogger(__name__)


def supported_versions(*, serve_v1beta1: bool = True, serve_health: bool) -> list[str]:
    """The services to advertise, newest first: the kubelet takes the first one it supports."""
    versions = [DRA_V1_SERVICE]
    if serve_v1beta1:
        versions.append(DRA_V1BETA1_SERVICE)
    if serve_health:
        # The 1.37+ kubelet picks the first health service in this list that it knows (v1);
        # older kubelets know only v1alpha1 and, before 1.37, open it without looking here.
        versions += [HEALTH_V1_SERVICE, HEALTH_V1ALPHA1_SERVICE]
    return versions


@dataclass(frozen=True, slots=True)
class RegistrationStatus:
    """What the kubelet said of our registration (NotifyRegistrationStatus)."""

    registered: bool
    error: str
    at_monotonic: float


Listener = Callable[[RegistrationStatus], Awaitable[None]]


class RegistrationState:
    """The last registration outcome reported by the kubelet, with change listeners."""

    def __init__(self) -> None:
        self._status: RegistrationStatus | None = None
        self._listeners: list[Listener] = []
        self._registered = asyncio.Event()
        self.notifications = 0

    @property
    def status(self) -> RegistrationStatus | None:
        return self._status

    @property
    def registered(self) -> bool:
        return self._status is not None and self._status.registered

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    async def record(self, registered: bool, error: str) -> RegistrationStatus:
        status = RegistrationStatus(registered=registered, error=error, at_monotonic=time.monotonic())
        self._status = status
        self.notifications += 1
        if registered:
            self._registered.set()
        else:
            self._registered.clear()
        for listener in self._listeners:
            try:
                await listener(status)
            except Exception:
                # A broken listener must not turn the kubelet's notification into an RPC failure.
                log.exception("registration listener failed")
        return status

    async def wait_registered(self) -> None:
        """Wait until the kubelet has accepted the plugin (wrap in `asyncio.timeout`)."""
        await self._registered.wait()


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: str,
        versions: Sequence[str],
        state: RegistrationState,
    ) -> None:
        self._info = reg_pb2.PluginInfo(
            type=PLUGIN_TYPE_DRA, name=driver_name, endpoint=endpoint, supported_versions=list(versions)
        )
        self._state = state

    async def GetInfo(
        self,
        request: reg_pb2.InfoRequest,
        context: grpc.aio.ServicerContext[reg_pb2.InfoRequest, reg_pb2.PluginInfo],
    ) -> reg_pb2.PluginInfo:
        # The kubelet polls this every few seconds to see that we are alive; keep it quiet and instant.
        log.debug("kubelet asked for plugin info")
        return self._info

    async def NotifyRegistrationStatus(
        self,
        request: reg_pb2.RegistrationStatus,
        context: grpc.aio.ServicerContext[reg_pb2.RegistrationStatus, reg_pb2.RegistrationStatusResponse],
    ) -> reg_pb2.RegistrationStatusResponse:
        registered = request.plugin_registered
        kubelet_metrics().registration_notifications.labels(registered=str(registered).lower()).inc()
        await self._state.record(registered, request.error)
        if not registered:
            log.error(
                "kubelet rejected the plugin registration",
                extra={"driver": self._info.name, "kubelet_error": request.error or "(no message)"},
            )
            # Like the upstream helper: answering a rejection with an error makes it
            # visible in the kubelet's log as a failed registration, not a silent one.
            await context.abort(grpc.StatusCode.UNKNOWN, f"failed registration process: {request.error}")
        log.info(
            "kubelet registered the plugin",
            extra={"driver": self._info.name, "endpoint": self._info.endpoint},
        )
        return reg_pb2.RegistrationStatusResponse()
