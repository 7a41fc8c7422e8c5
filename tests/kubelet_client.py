"""A test stand-in for the kubelet's side of plugin registration and DRA calls.

It follows the kubelet's rules (see the DRA reference notes, §1.1-1.6) closely
enough that a plugin passing these tests registers with a real kubelet:

* discovery: new Unix sockets in the plugins_registry directory, names
  starting with '.' ignored (polling stands in for inotify);
* GetInfo with a 1 s timeout; type must be "DRAPlugin"; an empty endpoint means
  the registration socket itself;
* version choice: the first entry of the *plugin's* list that we support;
  none (or an empty list) means NotifyRegistrationStatus(false, reason);
* NodePrepare/NodeUnprepare with a 45 s timeout, and the kubelet's response
  checks: every requested UID answered, no extra keys, any claim error fails.
"""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Final, Self

import grpc

from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2 as v1beta1
from draplugin.kubelet._proto.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_pb
from draplugin.kubelet._proto.dra_health.v1 import api_pb2_grpc as health_grpc
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1_pb
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from draplugin.kubelet._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from draplugin.kubelet.interface import ClaimRef, PreparedDevice

KUBELET_SUPPORTED: Final = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
GET_INFO_TIMEOUT: Final = 1.0
NOTIFY_TIMEOUT: Final = 5.0
CLAIM_CALL_TIMEOUT: Final = 45.0


class KubeletError(Exception):
    """Something the real kubelet would treat as a failure."""


@dataclass(frozen=True)
class ClaimResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class RegistrationAttempt:
    socket: Path
    info: reg_pb2.PluginInfo | None
    accepted: bool
    reason: str = ""
    notify_error: grpc.aio.AioRpcError | None = None


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except FileNotFoundError:
        return False


def _v1_claims(claims: Sequence[ClaimRef]) -> list[v1.Claim]:
    return [v1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _v1beta1_claims(claims: Sequence[ClaimRef]) -> list[v1beta1.Claim]:
    return [v1beta1.Claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]


def _prepared_device(device: v1.Device | v1beta1.Device) -> PreparedDevice:
    # Only v1 has share_id (optional: unset means the device is not shared).
    share_id = device.share_id if isinstance(device, v1.Device) and device.HasField("share_id") else None
    return PreparedDevice(
        request_names=tuple(device.request_names),
        pool_name=device.pool_name,
        device_name=device.device_name,
        cdi_device_ids=tuple(device.cdi_device_ids),
        share_id=share_id,
    )


def _claim_results(
    answered: Mapping[str, v1.NodePrepareResourceResponse]
    | Mapping[str, v1beta1.NodePrepareResourceResponse],
) -> dict[str, ClaimResult]:
    """Either version's per-claim answers as ClaimResults (the fields read are the same)."""
    return {
        uid: ClaimResult(devices=tuple(_prepared_device(d) for d in entry.devices), error=entry.error)
        for uid, entry in answered.items()
    }


def _check_keys(kind: str, requested: Sequence[ClaimRef], answered: Sequence[str]) -> None:
    wanted = {c.uid for c in requested}
    extra = sorted(set(answered) - wanted)
    if extra:
        raise KubeletError(f"{kind}: response contains unexpected claim UIDs {extra}")
    missing = wanted - set(answered)
    if missing:
        raise KubeletError(f"{kind}: skipped {len(missing)} ResourceClaims: {sorted(missing)}")


@dataclass
class RegisteredPlugin:
    """A plugin the fake kubelet accepted, with a channel to its DRA endpoint."""

    name: str
    endpoint: str
    version: str
    info: reg_pb2.PluginInfo
    registration_socket: Path
    channel: grpc.aio.Channel = field(repr=False)

    async def prepare_results(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        """NodePrepareResources, checked for completeness; per-claim errors are returned, not raised."""
        if self.version == "v1.DRAPlugin":
            v1_request = v1.NodePrepareResourcesRequest(claims=_v1_claims(claims))
            v1_response = await v1_grpc.DRAPluginStub(self.channel).NodePrepareResources(
                v1_request, timeout=CLAIM_CALL_TIMEOUT
            )
            results = _claim_results(v1_response.claims)
        else:
            beta_request = v1beta1.NodePrepareResourcesRequest(claims=_v1beta1_claims(claims))
            beta_response = await v1beta1_grpc.DRAPluginStub(self.channel).NodePrepareResources(
                beta_request, timeout=CLAIM_CALL_TIMEOUT
            )
            results = _claim_results(beta_response.claims)
        _check_keys("NodePrepareResources", claims, list(results))
        return results

    async def unprepare_results(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """NodeUnprepareResources, checked for completeness; returns each claim's error string."""
        if self.version == "v1.DRAPlugin":
            v1_response = await v1_grpc.DRAPluginStub(self.channel).NodeUnprepareResources(
                v1.NodeUnprepareResourcesRequest(claims=_v1_claims(claims)),
                timeout=CLAIM_CALL_TIMEOUT,
            )
            errors = {uid: entry.error for uid, entry in v1_response.claims.items()}
        else:
            beta_response = await v1beta1_grpc.DRAPluginStub(self.channel).NodeUnprepareResources(
                v1beta1.NodeUnprepareResourcesRequest(claims=_v1beta1_claims(claims)),
                timeout=CLAIM_CALL_TIMEOUT,
            )
            errors = {uid: entry.error for uid, entry in beta_response.claims.items()}
        _check_keys("NodeUnprepareResources", claims, list(errors))
        return errors

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, tuple[PreparedDevice, ...]]:
        """Like the kubelet: any claim error fails the whole call."""
        results = await self.prepare_results(claims)
        failed = {uid: r.error for uid, r in results.items() if r.error}
        if failed:
            raise KubeletError(f"NodePrepareResources failed for claims: {failed}")
        return {uid: r.devices for uid, r in results.items()}

    async def unprepare(self, claims: Sequence[ClaimRef]) -> None:
        errors = await self.unprepare_results(claims)
        failed = {uid: e for uid, e in errors.items() if e}
        if failed:
            raise KubeletError(f"NodeUnprepareResources failed for claims: {failed}")

    def watch_health(
        self,
    ) -> grpc.aio.UnaryStreamCall[health_pb.NodeWatchResourcesRequest, health_pb.NodeWatchResourcesResponse]:
        """The v1 health stream, as the 1.37+ kubelet opens it."""
        stub = health_grpc.DRAResourceHealthStub(self.channel)
        return stub.NodeWatchResources(health_pb.NodeWatchResourcesRequest())

    def watch_health_v1alpha1(
        self,
    ) -> grpc.aio.UnaryStreamCall[
        health_v1alpha1_pb.NodeWatchResourcesRequest, health_v1alpha1_pb.NodeWatchResourcesResponse
    ]:
        """The v1alpha1 health stream, as kubelets before 1.37 open it."""
        stub = health_v1alpha1_grpc.DRAResourceHealthStub(self.channel)
        return stub.NodeWatchResources(health_v1alpha1_pb.NodeWatchResourcesRequest())

    async def close(self) -> None:
        await self.channel.close()


class FakeKubelet:
    """Watches a plugins_registry directory and registers DRA plugins like the kubelet does."""

    def __init__(
        self,
        registry_dir: Path,
        supported: Sequence[str] = KUBELET_SUPPORTED,
        poll_interval: float = 0.02,
    ) -> None:
        self.registry_dir = registry_dir
        self.supported = tuple(supported)
        self.poll_interval = poll_interval
        self.attempts: list[RegistrationAttempt] = []
        self.plugins: list[RegisteredPlugin] = []
        self._seen: set[Path] = set()

    def new_sockets(self) -> list[Path]:
        if not self.registry_dir.is_dir():
            return []
        found = []
        for path in sorted(self.registry_dir.iterdir()):
            if path.name.startswith(".") or path in self._seen or not _is_socket(path):
                continue
            found.append(path)
        return found

    async def register_next(self) -> RegistrationAttempt:
        """Wait for the next new registration socket and run the registration handshake on it.

        Waits forever: wrap in `asyncio.timeout`.
        """
        # Polling the directory stands in for the kubelet's inotify watch; there is no event to wait on.
        while not (fresh := [p for p in self.new_sockets() if p.name.endswith("-reg.sock")]):  # noqa: ASYNC110
            await asyncio.sleep(self.poll_interval)
        socket = fresh[0]
        self._seen.add(socket)
        attempt = await self._register(socket)
        self.attempts.append(attempt)
        return attempt

    async def register_plugin(self) -> RegisteredPlugin:
        attempt = await self.register_next()
        if not attempt.accepted:
            raise KubeletError(f"plugin at {attempt.socket} rejected: {attempt.reason}")
        return self.plugins[-1]

    async def _register(self, socket: Path) -> RegistrationAttempt:
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = reg_grpc.RegistrationStub(channel)
            try:
                info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                reason = f"GetInfo failed: {exc.details()}"
                return RegistrationAttempt(socket, None, accepted=False, reason=reason)
            reason = self._validate(info)
            if reason:
                notify_error = await self._notify(stub, False, reason)
                return RegistrationAttempt(socket, info, False, reason, notify_error)
            version = next(v for v in info.supported_versions if v in self.supported)
            notify_error = await self._notify(stub, True, "")
            if notify_error is not None:
                return RegistrationAttempt(socket, info, False, f"notify failed: {notify_error.details()}")
        endpoint = info.endpoint or str(socket)
        self.plugins.append(
            RegisteredPlugin(
                name=info.name,
                endpoint=endpoint,
                version=version,
                info=info,
                registration_socket=socket,
                channel=grpc.aio.insecure_channel(f"unix://{endpoint}"),
            )
        )
        return RegistrationAttempt(socket, info, accepted=True)

    def _validate(self, info: reg_pb2.PluginInfo) -> str:
        if info.type != "DRAPlugin":
            return f"no handler registered for plugin type: {info.type}"
        if not info.name:
            return "plugin name is empty"
        if not info.supported_versions:
            return "empty list for supported versions"
        if not any(v in self.supported for v in info.supported_versions):
            return (
                f"none of the versions supported by the plugin ({list(info.supported_versions)}) "
                f"are supported by the kubelet ({list(self.supported)})"
            )
        return ""

    @staticmethod
    async def _notify(
        stub: reg_grpc.RegistrationAsyncStub, registered: bool, error: str
    ) -> grpc.aio.AioRpcError | None:
        try:
            await stub.NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=registered, error=error), timeout=NOTIFY_TIMEOUT
            )
        except grpc.aio.AioRpcError as exc:
            return exc
        return None

    async def close(self) -> None:
        for plugin in self.plugins:
            await plugin.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class StaticDriver:
    """A minimal driver for exercising the plugin end to end: one fixed device per claim."""

    def __init__(self, driver_name: str = "gpu.draplugin.dev") -> None:
        self.driver_name = driver_name
        self.prepared: set[str] = set()

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        self.prepared.add(claim.uid)
        return [
            PreparedDevice(
                request_names=(),
                pool_name="pool",
                device_name="gpu-0",
                cdi_device_ids=(f"{self.driver_name}/gpu={claim.uid}-gpu-0",),
            )
        ]

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        self.prepared.discard(claim.uid)

    def reload_state(self) -> None:
        """Nothing is shared with other processes."""


def static_driver_factory(settings: object) -> StaticDriver:
    """`DRAPLUGIN_DRIVER_FACTORY=tests.kubelet_client:static_driver_factory` for `draplugin run`."""
    return StaticDriver(str(getattr(settings, "driver_name", "gpu.draplugin.dev")))
