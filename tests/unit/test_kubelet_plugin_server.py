"""The kubelet plugin server over real gRPC on Unix sockets, driven by a kubelet-faithful client.

Size: one file because every test shares the same real gRPC server fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet._proto.dra.v1 import api_pb2_grpc as v1_grpc
from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_v1
from draplugin.kubelet._proto.dra_health.v1alpha1 import api_pb2 as health_v1alpha1
from draplugin.kubelet.dra import DEFAULT_MAX_CONCURRENT_CLAIMS, MAX_CLAIMS_PER_CALL
from draplugin.kubelet.interface import (
    ClaimError,
    ClaimRef,
    DeviceHealth,
    HealthSource,
    HealthStatus,
    PreparedDevice,
)
from draplugin.kubelet.server import KubeletPluginServer, PluginServerOptions
from draplugin.kubelet.sockets import SocketPathError
from tests.kubelet_client import FakeKubelet, KubeletError, RegisteredPlugin

DRIVER = "gpu.draplugin.dev"
WAIT = 10.0


class FakeDriver:
    """Records calls; fails or blocks claims on request; tracks concurrency."""

    def __init__(self) -> None:
        self.prepared: dict[str, ClaimRef] = {}
        self.prepare_calls: list[ClaimRef] = []
        self.unprepare_calls: list[ClaimRef] = []
        self.failures: dict[str, BaseException] = {}
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.completed = asyncio.Event()
        self.in_flight = 0
        self.max_in_flight = 0

    def devices_for(self, claim: ClaimRef) -> list[PreparedDevice]:
        return [
            PreparedDevice(
                request_names=("gpu",),
                pool_name="node-a",
                device_name=f"gpu-{claim.name}",
                cdi_device_ids=(f"{DRIVER}/gpu={claim.uid}-0",),
                share_id=f"share-{claim.uid}",
            )
        ]

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        self.prepare_calls.append(claim)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            self.entered.set()
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)  # let other claims in, so concurrency is observable
            if claim.uid in self.failures:
                raise self.failures[claim.uid]
            self.prepared[claim.uid] = claim
            self.completed.set()
            return self.devices_for(claim)
        finally:
            self.in_flight -= 1

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        self.unprepare_calls.append(claim)
        if claim.uid in self.failures:
            raise self.failures[claim.uid]
        self.prepared.pop(claim.uid, None)

    def reload_state(self) -> None:
        """Nothing is shared with other processes."""


class FakeHealth:
    """A health source fed by the test: each queued list is one snapshot."""

    def __init__(self) -> None:
        self.snapshots: asyncio.Queue[list[DeviceHealth]] = asyncio.Queue()

    async def watch_health(self) -> AsyncIterator[Sequence[DeviceHealth]]:
        while True:
            yield await self.snapshots.get()


def claim(n: int, ns: str = "default") -> ClaimRef:
    return ClaimRef(namespace=ns, uid=f"uid-{n}", name=f"claim-{n}")


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    # pytest's tmp_path is long enough to push socket paths past the AF_UNIX limit.
    root = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def options(root: Path, **overrides: object) -> PluginServerOptions:
    base: dict[str, object] = {"driver_name": DRIVER, "kubelet_root_dir": root, "grace_seconds": 1.0}
    base.update(overrides)
    return PluginServerOptions(**base)  # type: ignore[arg-type]


@pytest.fixture
async def driver() -> FakeDriver:
    return FakeDriver()


@pytest.fixture
async def server(kubelet_root: Path, driver: FakeDriver) -> AsyncIterator[KubeletPluginServer]:
    async with KubeletPluginServer(driver, options(kubelet_root)) as srv:
        yield srv


@pytest.fixture
async def plugin(kubelet_root: Path, server: KubeletPluginServer) -> AsyncIterator[RegisteredPlugin]:
    async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
        async with asyncio.timeout(WAIT):
            registered = await kubelet.register_plugin()
        yield registered


@contextlib.asynccontextmanager
async def registered_with_health(
    kubelet_root: Path, driver: FakeDriver, health: HealthSource
) -> AsyncIterator[RegisteredPlugin]:
    """A server with this health source, registered with a fake kubelet; all within WAIT."""
    async with (
        KubeletPluginServer(driver, options(kubelet_root), health_source=health),
        FakeKubelet(kubelet_root / "plugins_registry") as kubelet,
        asyncio.timeout(WAIT),
    ):
        yield await kubelet.register_plugin()


async def liveness(path: Path) -> int:
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
        status: int = reply.status
        return status


# --- registration -----------------------------------------------------------------------------


async def test_registers_as_v1_and_serves_prepare_and_unprepare(
    server: KubeletPluginServer, plugin: RegisteredPlugin, driver: FakeDriver
) -> None:
    assert plugin.info.type == "DRAPlugin"
    assert plugin.name == DRIVER
    assert plugin.endpoint == str(server.paths.dra)
    assert list(plugin.info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert plugin.version == "v1.DRAPlugin"
    assert server.registration.registered

    devices = await plugin.prepare([claim(1), claim(2)])
    assert devices == {
        "uid-1": tuple(driver.devices_for(claim(1))),
        "uid-2": tuple(driver.devices_for(claim(2))),
    }
    assert devices["uid-1"][0].share_id == "share-uid-1"
    await plugin.unprepare([claim(1), claim(2)])
    assert driver.prepared == {}


async def test_kubelet_limited_to_v1beta1_gets_the_v1beta1_service(
    kubelet_root: Path, server: KubeletPluginServer, driver: FakeDriver
) -> None:
    async with FakeKubelet(kubelet_root / "plugins_registry", supported=["v1beta1.DRAPlugin"]) as kubelet:
        async with asyncio.timeout(WAIT):
            plugin = await kubelet.register_plugin()
        assert plugin.version == "v1beta1.DRAPlugin"
        devices = await plugin.prepare([claim(1)])
        (device,) = devices["uid-1"]
        # v1beta1 has no share_id on the wire; everything else arrives intact.
        assert device.share_id is None
        assert device.cdi_device_ids == (f"{DRIVER}/gpu=uid-1-0",)
        assert device.request_names == ("gpu",)
        await plugin.unprepare([claim(1)])
        assert driver.unprepare_calls == [claim(1)]


async def test_v1beta1_can_be_switched_off(kubelet_root: Path, driver: FakeDriver) -> None:
    async with KubeletPluginServer(driver, options(kubelet_root, serve_v1beta1=False)) as server:
        assert server.advertised_versions == ["v1.DRAPlugin"]
        async with FakeKubelet(kubelet_root / "plugins_registry", supported=["v1beta1.DRAPlugin"]) as kubelet:
            async with asyncio.timeout(WAIT):
                attempt = await kubelet.register_next()
        assert not attempt.accepted


async def test_rejection_by_the_kubelet_is_surfaced(
    kubelet_root: Path, server: KubeletPluginServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="draplugin.kubelet.registration")
    async with FakeKubelet(kubelet_root / "plugins_registry", supported=["v9.DRAPlugin"]) as kubelet:
        async with asyncio.timeout(WAIT):
            attempt = await kubelet.register_next()
    assert not attempt.accepted
    assert "none of the versions supported by the plugin" in attempt.reason
    # The plugin answers a rejection with an error status, as the upstream helper does.
    assert attempt.notify_error is not None
    assert attempt.notify_error.code() == grpc.StatusCode.UNKNOWN
    assert attempt.reason in (attempt.notify_error.details() or "")
    status = server.registration.status
    assert status is not None and not status.registered and status.error == attempt.reason
    records = [r for r in caplog.records if r.getMessage() == "kubelet rejected the plugin registration"]
    assert len(records) == 1
    assert records[0].__dict__["kubelet_error"] == attempt.reason
    assert await liveness(server.paths.dra) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_liveness_follows_registration(kubelet_root: Path, server: KubeletPluginServer) -> None:
    assert await liveness(server.paths.dra) == health_pb2.HealthCheckResponse.NOT_SERVING
    async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
        async with asyncio.timeout(WAIT):
            await kubelet.register_plugin()
    assert await liveness(server.paths.dra) == health_pb2.HealthCheckResponse.SERVING


async def test_liveness_is_also_served_on_a_tcp_port(kubelet_root: Path, driver: FakeDriver) -> None:
    opts = options(kubelet_root, healthcheck_port=0, healthcheck_host="127.0.0.1")
    async with KubeletPluginServer(driver, opts) as server:
        assert server.healthcheck_port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.healthcheck_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            before = await stub.Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            await server.registration.record(True, "")
            after = await stub.Check(health_pb2.HealthCheckRequest(), timeout=WAIT)
            # The DRA service itself must not be reachable over TCP.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1.NodePrepareResourcesRequest(), timeout=WAIT
                )
    assert before.status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert after.status == health_pb2.HealthCheckResponse.SERVING
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_per_pod_sockets_register(kubelet_root: Path, driver: FakeDriver) -> None:
    uid = "3f2c1a9e-0000-4000-8000-00000000beef"
    async with KubeletPluginServer(driver, options(kubelet_root, pod_uid=uid)) as server:
        assert server.paths.registration.name == f"{DRIVER}-{uid}-reg.sock"
        async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            assert plugin.endpoint.endswith(f"dra-{uid}.sock")
            assert await plugin.prepare([claim(1)])


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
async def test_device_health_is_advertised_newest_first_and_streamed_in_both_versions(
    kubelet_root: Path, driver: FakeDriver, version: str
) -> None:
    health = FakeHealth()
    async with KubeletPluginServer(driver, options(kubelet_root), health_source=health) as server:
        # The 1.37 kubelet takes the first health service it knows, so v1 must come first.
        assert server.advertised_versions == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
        async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            assert plugin.version == "v1.DRAPlugin"
            stream = plugin.watch_health() if version == "v1" else plugin.watch_health_v1alpha1()
            long_message = "x" * 2000
            await health.snapshots.put(
                [
                    DeviceHealth("node-a", "gpu-0", HealthStatus.HEALTHY, 1700000000, "", 60),
                    DeviceHealth("node-a", "gpu-1", HealthStatus.UNHEALTHY, 1700000001, long_message),
                ]
            )
            async with asyncio.timeout(WAIT):
                first = await stream.read()
            stream.cancel()
    # Each version answers in its own package's message type, decoded by its own stub.
    expected_type = health_v1 if version == "v1" else health_v1alpha1
    assert isinstance(first, expected_type.NodeWatchResourcesResponse)
    got = [(d.device.pool_name, d.device.device_name, d.health, d.last_updated_time) for d in first.devices]
    assert got == [("node-a", "gpu-0", 1, 1700000000), ("node-a", "gpu-1", 2, 1700000001)]
    assert [d.health_check_timeout_seconds for d in first.devices] == [60, 0]
    assert first.devices[1].message == "x" * 1021 + "..."


async def test_start_serves_dra_before_the_registration_socket_appears(
    kubelet_root: Path, driver: FakeDriver
) -> None:
    seen: list[bool] = []

    class Probe(KubeletPluginServer):
        async def _start_registration(self) -> grpc.aio.Server:
            async with grpc.aio.insecure_channel(f"unix://{self.paths.dra}") as channel:
                reply = await v1_grpc.DRAPluginStub(channel).NodePrepareResources(
                    v1.NodePrepareResourcesRequest(), timeout=WAIT
                )
            seen.append(reply.claims == {} and not self.paths.registration.exists())
            return await super()._start_registration()

    async with Probe(driver, options(kubelet_root)):
        pass
    assert seen == [True]


# --- per-claim answers and bad input ----------------------------------------------------------


async def test_claim_failures_stay_with_their_claim(plugin: RegisteredPlugin, driver: FakeDriver) -> None:
    driver.failures["uid-2"] = ClaimError("claim default/claim-2 is not allocated")
    driver.failures["uid-3"] = KeyError("boom")
    results = await plugin.prepare_results([claim(1), claim(2), claim(3)])
    assert results["uid-1"].error == "" and len(results["uid-1"].devices) == 1
    assert results["uid-2"].error == "claim default/claim-2 is not allocated"
    assert results["uid-2"].devices == ()
    assert results["uid-3"].error == "KeyError: 'boom'"
    with pytest.raises(KubeletError, match="uid-2"):
        await plugin.prepare([claim(1), claim(2)])
    # The server keeps serving after driver exceptions.
    assert await plugin.prepare([claim(4)])


async def test_unprepare_failure_is_reported_per_claim(plugin: RegisteredPlugin, driver: FakeDriver) -> None:
    driver.failures["uid-2"] = ClaimError("device busy")
    errors = await plugin.unprepare_results([claim(1), claim(2)])
    assert errors == {"uid-1": "", "uid-2": "device busy"}


async def test_unprepare_of_unknown_claim_succeeds(plugin: RegisteredPlugin, driver: FakeDriver) -> None:
    await plugin.unprepare([claim(99)])
    assert driver.unprepare_calls == [claim(99)]


@pytest.mark.parametrize(
    ("bad", "key", "fragment"),
    [
        (ClaimRef(namespace="", uid="uid-x", name="c"), "uid-x", "is missing namespace"),
        (ClaimRef(namespace="ns", uid="uid-x", name=""), "uid-x", "is missing name"),
        (ClaimRef(namespace="", uid="uid-x", name=""), "uid-x", "is missing namespace, name"),
        (ClaimRef(namespace="ns", uid="", name="c"), "", "ns/c has no uid (reported under the empty key)"),
    ],
)
async def test_incomplete_claims_get_their_own_error(
    plugin: RegisteredPlugin, driver: FakeDriver, bad: ClaimRef, key: str, fragment: str
) -> None:
    results = await plugin.prepare_results([claim(1), bad])
    assert fragment in results[key].error
    assert results["uid-1"].error == "" and results["uid-1"].devices
    assert driver.prepare_calls == [claim(1)], "the driver must not see an incomplete claim"
    errors = await plugin.unprepare_results([bad])
    assert fragment in errors[key]
    assert driver.unprepare_calls == []


async def test_duplicate_uids_fail_only_that_uid(plugin: RegisteredPlugin, driver: FakeDriver) -> None:
    twin = ClaimRef(namespace="other", uid="uid-1", name="twin")
    results = await plugin.prepare_results([claim(1), claim(2), twin])
    assert results["uid-1"].error == (
        "claim uid uid-1 appears 2 times in one request; each claim must be listed once"
    )
    assert results["uid-2"].error == ""
    assert [c.uid for c in driver.prepare_calls] == ["uid-2"]


async def test_a_request_of_the_most_claims_one_call_may_carry(
    plugin: RegisteredPlugin, driver: FakeDriver
) -> None:
    # Past MAX_CLAIMS_PER_CALL, claims are refused one by one (test_kubelet_call_bound.py).
    claims = [claim(n) for n in range(MAX_CLAIMS_PER_CALL)]
    devices = await plugin.prepare(claims)
    assert len(devices) == MAX_CLAIMS_PER_CALL
    last = MAX_CLAIMS_PER_CALL - 1
    assert devices[f"uid-{last}"][0].device_name == f"gpu-claim-{last}"
    assert 1 < driver.max_in_flight <= DEFAULT_MAX_CONCURRENT_CLAIMS, "claims run concurrently, but bounded"
    await plugin.unprepare(claims)
    assert driver.prepared == {}


async def test_cancelled_call_does_not_break_the_server(plugin: RegisteredPlugin, driver: FakeDriver) -> None:
    driver.gate = asyncio.Event()
    stub = v1_grpc.DRAPluginStub(plugin.channel)
    call = stub.NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="default", uid="uid-1", name="claim-1")])
    )
    async with asyncio.timeout(WAIT):
        await driver.entered.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    driver.gate.set()
    # A started claim still completes, so the kubelet's retry finds it done.
    async with asyncio.timeout(WAIT):
        await driver.completed.wait()
    assert "uid-1" in driver.prepared
    assert await plugin.prepare([claim(2)])


async def test_client_that_disconnects_mid_call_does_not_break_the_server(
    server: KubeletPluginServer, plugin: RegisteredPlugin, driver: FakeDriver
) -> None:
    driver.gate = asyncio.Event()
    channel = grpc.aio.insecure_channel(f"unix://{server.paths.dra}")
    call = v1_grpc.DRAPluginStub(channel).NodePrepareResources(
        v1.NodePrepareResourcesRequest(claims=[v1.Claim(namespace="default", uid="uid-1", name="claim-1")])
    )
    async with asyncio.timeout(WAIT):
        await driver.entered.wait()
    await channel.close()
    with pytest.raises((grpc.aio.AioRpcError, asyncio.CancelledError)):
        await call
    driver.gate.set()
    assert await plugin.prepare([claim(2)])


# --- sockets on disk --------------------------------------------------------------------------


async def test_stale_sockets_are_replaced_and_removed_on_stop(kubelet_root: Path, driver: FakeDriver) -> None:
    opts = options(kubelet_root)
    srv = KubeletPluginServer(driver, opts)
    for path in (srv.paths.registration, srv.paths.dra):
        path.parent.mkdir(parents=True, exist_ok=True)
        leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        leftover.bind(str(path))
        leftover.close()
    await srv.start()
    try:
        async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            assert await plugin.prepare([claim(1)])
    finally:
        await srv.stop()
    assert not srv.paths.registration.exists()
    assert not srv.paths.dra.exists()
    await srv.stop()  # idempotent


async def test_non_socket_in_the_way_fails_start_and_leaves_nothing(
    kubelet_root: Path, driver: FakeDriver
) -> None:
    srv = KubeletPluginServer(driver, options(kubelet_root))
    srv.paths.registration.parent.mkdir(parents=True)
    srv.paths.registration.write_text("not a socket")
    with pytest.raises(SocketPathError, match="not a socket"):
        await srv.start()
    assert srv.paths.registration.read_text() == "not a socket"
    assert not srv.paths.dra.exists(), "the DRA socket started first must be cleaned up"


async def test_stop_ends_open_health_streams_instead_of_waiting_out_the_grace(
    kubelet_root: Path, driver: FakeDriver
) -> None:
    health = FakeHealth()
    server = KubeletPluginServer(driver, options(kubelet_root, grace_seconds=60.0), health_source=health)
    await server.start()
    try:
        async with FakeKubelet(kubelet_root / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
                stream = plugin.watch_health()
                await health.snapshots.put([DeviceHealth("node-a", "gpu-0", HealthStatus.HEALTHY, 1)])
                assert await stream.read() != grpc.aio.EOF
            # Well under the 60 s grace: the stream is ended, not waited for.
            async with asyncio.timeout(WAIT):
                await server.stop()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stream.read()
            assert err.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    finally:
        await server.stop(grace=0)
    assert not server.paths.dra.exists()


async def test_failing_health_source_ends_the_stream_with_its_reason(
    kubelet_root: Path, driver: FakeDriver
) -> None:
    class BrokenHealth:
        async def watch_health(self) -> AsyncIterator[Sequence[DeviceHealth]]:
            raise RuntimeError("NVML event set lost")
            yield []  # an async generator that fails on first use

    async with registered_with_health(kubelet_root, driver, BrokenHealth()) as plugin:
        stream = plugin.watch_health()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stream.read()
        # The DRA service keeps working.
        assert await plugin.prepare([claim(1)])
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "NVML event set lost" in (err.value.details() or "")


async def test_kubelet_leaving_the_health_stream_closes_the_source(
    kubelet_root: Path, driver: FakeDriver
) -> None:
    closed = asyncio.Event()

    class WatchedHealth:
        async def watch_health(self) -> AsyncIterator[Sequence[DeviceHealth]]:
            try:
                yield [DeviceHealth("node-a", "gpu-0", HealthStatus.HEALTHY, 1)]
                await asyncio.Event().wait()  # no further changes
                yield []
            finally:
                closed.set()

    async with registered_with_health(kubelet_root, driver, WatchedHealth()) as plugin:
        stream = plugin.watch_health()
        assert await stream.read() != grpc.aio.EOF
        stream.cancel()
        await closed.wait()


async def test_the_same_claim_is_never_handled_twice_at_once(
    server: KubeletPluginServer, plugin: RegisteredPlugin
) -> None:
    overlap: list[str] = []
    active: set[str] = set()

    class Tracking(FakeDriver):
        async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
            if claim.uid in active:
                overlap.append(claim.uid)
            active.add(claim.uid)
            try:
                await asyncio.sleep(0.01)
                return self.devices_for(claim)
            finally:
                active.discard(claim.uid)

        async def unprepare_claim(self, claim: ClaimRef) -> None:
            if claim.uid in active:
                overlap.append(claim.uid)
            active.add(claim.uid)
            await asyncio.sleep(0.01)
            active.discard(claim.uid)

    server._runner._driver = Tracking()
    shared = [claim(1), claim(2)]
    await asyncio.gather(
        plugin.prepare(shared), plugin.prepare(shared), plugin.unprepare(shared), plugin.prepare([claim(3)])
    )
    assert overlap == []
    assert len(server._runner._per_claim) == 0, "per-claim locks are dropped when idle"
