"""`KubeletPluginServer`: the two gRPC servers a kubelet plugin runs, with their sockets.

Start order matters: the DRA socket is served before the registration socket
appears, because the kubelet may call the DRA service as soon as it has read
GetInfo. Stop order is the reverse: the registration socket goes first so the
kubelet stops routing new calls to us, then in-flight DRA calls get a grace
period. Both socket files are removed on stop (only if they are still ours).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import grpc
from grpc_health.v1 import health_pb2_grpc

from draplugin.kubelet import sockets
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from draplugin.kubelet._proto.dra_health.v1 import api_pb2_grpc as dra_health_v1_grpc
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2_grpc as dra_health_v1alpha1_grpc
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from draplugin.kubelet.dra import DEFAULT_MAX_CONCURRENT_CLAIMS, ClaimRunner, DRAPluginV1, DRAPluginV1Beta1
from draplugin.kubelet.health import (
    DeviceHealthServicerV1,
    DeviceHealthServicerV1Alpha1,
    DeviceHealthStream,
    LivenessHealth,
)
from draplugin.kubelet.interface import Driver, HealthSource
from draplugin.kubelet.pending import PendingDriver
from draplugin.kubelet.registration import RegistrationServicer, RegistrationState, supported_versions
from draplugin.kubelet.serialize import FileLockSerializer, lock_path

DEFAULT_GRACE_SECONDS: Final = 5.0
DEFAULT_HEALTHCHECK_HOST: Final = "127.0.0.1"

log = logging.getLogger(__name__)


class PluginServerError(RuntimeError):
    """The plugin could not start serving (socket path, bind failure)."""


@dataclass(frozen=True, slots=True)
class PluginServerOptions:
    """How `KubeletPluginServer` serves: the driver, its sockets, limits and the TCP health port."""

    driver_name: str
    kubelet_root_dir: Path
    pod_uid: str | None = None
    serve_v1beta1: bool = True
    max_concurrent_claims: int = DEFAULT_MAX_CONCURRENT_CLAIMS
    # None: no TCP listener. 0: any free port (tests). The TCP listener carries
    # only the gRPC health service, for kubelet liveness probes, which cannot reach a Unix socket.
    healthcheck_port: int | None = None
    # One IP address, never every one: under host networking the port is the node's. The chart gives
    # the pod's IP (the node's then), where the kubelet probes. gRPC sets SO_REUSEPORT, so a rolling
    # update's new pod binds the same port beside the old one.
    healthcheck_host: str = DEFAULT_HEALTHCHECK_HOST
    grace_seconds: float = DEFAULT_GRACE_SECONDS


class KubeletPluginServer:
    """Serves registration, DRA v1/v1beta1, device health and liveness for one driver."""

    def __init__(
        self,
        driver: Driver | PendingDriver,
        options: PluginServerOptions,
        *,
        health_source: HealthSource | None = None,
    ) -> None:
        self.options = options
        self.paths = sockets.socket_paths(options.kubelet_root_dir, options.driver_name, options.pod_uid)
        self.registration = RegistrationState()
        self.liveness = LivenessHealth()
        # A pod UID means another instance may serve beside us (rolling update): serialize with it.
        serializer = (
            FileLockSerializer(lock_path(options.kubelet_root_dir, options.driver_name))
            if options.pod_uid is not None
            else None
        )
        self._runner = ClaimRunner(driver, options.max_concurrent_claims, serializer)
        # Without a health source the health service is neither served nor advertised.
        self._health_source = health_source
        self._device_health = (
            DeviceHealthStream(self._health_source) if self._health_source is not None else None
        )
        self._dra_server: grpc.aio.Server | None = None
        self._registration_server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._owned: list[sockets.SocketIdentity] = []
        self.healthcheck_port: int | None = None
        self.registration.add_listener(self.liveness.on_registration)

    @property
    def serves_device_health(self) -> bool:
        return self._health_source is not None

    @property
    def advertised_versions(self) -> list[str]:
        return supported_versions(
            serve_v1beta1=self.options.serve_v1beta1, serve_health=self.serves_device_health
        )

    async def start(self) -> None:
        try:
            await self.liveness.start()
            self._dra_server = await self._start_dra()
            self._registration_server = await self._start_registration()
            if self.options.healthcheck_port is not None:
                self._health_server = await self._start_tcp_health(self.options.healthcheck_port)
        except BaseException:
            await self.stop(grace=0)
            raise
        log.info(
            "serving kubelet plugin",
            extra={
                "driver": self.options.driver_name,
                "registration_socket": str(self.paths.registration),
                "dra_socket": str(self.paths.dra),
                "versions": ",".join(self.advertised_versions),
            },
        )

    async def _bind_unix(self, server: grpc.aio.Server, path: Path) -> None:
        sockets.ensure_dir(path.parent)
        sockets.remove_stale_socket(path)
        try:
            server.add_insecure_port(f"unix://{path}")
        except RuntimeError as exc:
            raise PluginServerError(f"cannot listen on {path}: {exc}") from exc
        await server.start()
        self._owned.append(sockets.SocketIdentity.of(path))

    async def _start_dra(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1(self._runner), server)
        if self.options.serve_v1beta1:
            v1beta1_grpc.add_DRAPluginServicer_to_server(DRAPluginV1Beta1(self._runner), server)
        if self._device_health is not None:
            # Both versions, one stream: a 1.37+ kubelet takes v1, older ones v1alpha1.
            dra_health_v1_grpc.add_DRAResourceHealthServicer_to_server(
                DeviceHealthServicerV1(self._device_health), server
            )
            dra_health_v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
                DeviceHealthServicerV1Alpha1(self._device_health), server
            )
        health_pb2_grpc.add_HealthServicer_to_server(self.liveness.servicer, server)
        await self._bind_unix(server, self.paths.dra)
        return server

    async def _start_registration(self) -> grpc.aio.Server:
        server = grpc.aio.server()
        servicer = RegistrationServicer(
            driver_name=self.options.driver_name,
            endpoint=str(self.paths.dra),
            versions=self.advertised_versions,
            state=self.registration,
        )
        reg_grpc.add_RegistrationServicer_to_server(servicer, server)
        await self._bind_unix(server, self.paths.registration)
        return server

    async def _start_tcp_health(self, port: int) -> grpc.aio.Server:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.liveness.servicer, server)
        host = self.options.healthcheck_host
        address = f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise PluginServerError(f"cannot listen for health checks on {address}: {exc}") from exc
        await server.start()
        self.healthcheck_port = bound
        log.info("serving gRPC health checks", extra={"address": address, "port": bound})
        return server

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving and remove our sockets. Safe to call more than once."""
        grace = self.options.grace_seconds if grace is None else grace
        await self.liveness.shutting_down()
        if self._device_health is not None:
            self._device_health.close()
        # Registration first: once its socket is gone the kubelet stops sending new work.
        for attr in ("_registration_server", "_health_server", "_dra_server"):
            server: grpc.aio.Server | None = getattr(self, attr)
            if server is not None:
                setattr(self, attr, None)
                await server.stop(grace)
        await self._runner.aclose(grace)
        for owned in self._owned:
            owned.remove()
        self._owned.clear()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
