"""The node daemon's composition: fake GPUs → health → ResourceSlices → kubelet plugin, and back down."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError
from draplugin import config
from draplugin.config import Settings
from draplugin.devices import DeviceBackend
from draplugin.kubelet._proto.dra_health.v1 import api_pb2 as health_pb
from draplugin.kubelet.interface import ClaimRef, Driver
from draplugin.kubelet.sockets import SocketPathError, socket_paths
from draplugin.node import NodeDaemon, NodeUnavailable, build_backend
from draplugin.slices.metrics import SliceMetrics
from tests.kubelet_client import FakeKubelet, StaticDriver

NODE = "node-1"
NODE_UID = "node-uid-1"
DRIVER = "gpu.draplugin.dev"
WAIT = 10.0


class FakeSliceApi:
    """An in-memory API server for ResourceSlices; the Node appears when `add_node` is called."""

    def __init__(self, node_exists: bool = True) -> None:
        self.node_uid: str | None = NODE_UID if node_exists else None
        self.node_lookups = 0
        self.slices: dict[str, dict[str, Any]] = {}
        self._versions = itertools.count(1)
        self._lock = threading.Lock()
        self.closed = threading.Event()

    def add_node(self) -> None:
        self.node_uid = NODE_UID

    def server_version(self) -> tuple[int, int]:
        return (1, 37)

    def get_node_uid(self, name: str) -> str:
        self.node_lookups += 1
        if name != NODE or self.node_uid is None:
            raise ApiError(404, f'nodes "{name}" not found')
        return self.node_uid

    def list_slices(self, field_selector: str) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            return [dict(s) for s in self.slices.values()], str(next(self._versions))

    def _store(self, body: dict[str, Any], uid: str) -> dict[str, Any]:
        stored = {**body, "metadata": {**body["metadata"], "uid": uid}}
        stored["metadata"]["resourceVersion"] = str(next(self._versions))
        self.slices[body["metadata"]["name"]] = stored
        return stored

    def create_slice(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            name = body["metadata"]["name"]
            if name in self.slices:
                raise ApiError(409, f"{name} exists")
            return self._store(body, f"uid-{name}")

    def replace_slice(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            return self._store(body, self.slices[name]["metadata"]["uid"])

    def delete_slice(self, name: str, uid: str, resource_version: str) -> None:
        with self._lock:
            self.slices.pop(name, None)

    def watch_slices(
        self, field_selector: str, resource_version: str, timeout_s: int
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        # Nothing else writes here: the watch just stays open until the test ends.
        self.closed.wait(timeout_s)
        return iter(())

    def devices(self) -> list[dict[str, Any]]:
        with self._lock:
            return [d for s in sorted(self.slices) for d in self.slices[s]["spec"].get("devices", [])]


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))  # short: socket paths have a 107-byte limit
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[FakeSliceApi]:
    fake = FakeSliceApi()
    yield fake
    fake.closed.set()


def settings_for(root: Path, **flags: str) -> Settings:
    values = {
        "node_name": NODE,
        "backend": "fake",
        "fake_gpus": "4",
        "kubelet_root_dir": str(root / "kubelet"),
        "state_dir": str(root / "state"),
        "cdi_root": str(root / "cdi"),
        "metrics_port": "0",
        **flags,
    }
    return config.load(values, environ={})


def static_factory(settings: Settings, backend: DeviceBackend) -> Driver:
    return StaticDriver(settings.driver_name)


def daemon(settings: Settings, api: FakeSliceApi, **kw: Any) -> NodeDaemon:
    return NodeDaemon(
        settings,
        backend=build_backend(settings),
        slice_api=api,
        driver_factory=kw.pop("driver_factory", static_factory),
        slice_metrics=SliceMetrics(CollectorRegistry()),
        **kw,
    )


def published(api: FakeSliceApi, count: int) -> bool:
    return len(api.devices()) == count


async def wait_until(predicate: Any, what: str) -> None:
    await asyncio.to_thread(wait_for, what, predicate, WAIT, 0.05)


async def test_publishes_the_backend_devices_owned_by_the_node_and_keeps_them_on_stop(
    root: Path, api: FakeSliceApi
) -> None:
    node = daemon(settings_for(root), api)
    await node.start()
    try:
        await wait_until(lambda: published(api, 4), "4 published devices")
        assert [d["name"] for d in api.devices()] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
        (only,) = api.slices.values()
        assert only["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": NODE_UID, "controller": True}
        ]
        assert only["spec"]["driver"] == DRIVER and only["spec"]["pool"]["name"] == NODE
        # Health monitoring is on, so the kubelet is offered the device health service.
        assert "v1alpha1.DRAResourceHealth" in node.server.advertised_versions
    finally:
        await node.stop()
    assert published(api, 4), "without --delete-slices-on-shutdown the slices stay"


async def test_delete_slices_on_shutdown_removes_them(root: Path, api: FakeSliceApi) -> None:
    node = daemon(settings_for(root, delete_slices_on_shutdown="true"), api)
    await node.start()
    await wait_until(lambda: published(api, 4), "4 published devices")
    await node.stop()
    assert api.slices == {}


async def test_the_prepare_driver_gets_the_backend_that_is_published(root: Path, api: FakeSliceApi) -> None:
    seen: list[list[str]] = []

    def factory(settings: Settings, backend: DeviceBackend) -> Driver:
        seen.append([d.name for d in backend.discover()])
        return StaticDriver()

    node = daemon(settings_for(root, fake_gpus="2"), api, driver_factory=factory)
    assert seen == [["gpu-0", "gpu-1"]]
    await node.start()
    try:
        await wait_until(lambda: published(api, 2), "2 published devices")
    finally:
        await node.stop()


async def test_waits_for_the_node_to_exist_while_already_serving_the_kubelet(root: Path) -> None:
    api = FakeSliceApi(node_exists=False)
    settings = settings_for(root)
    node = daemon(settings, api)
    await node.start()
    try:
        async with FakeKubelet(settings.kubelet_root_dir / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            assert await plugin.prepare([ClaimRef("ns", "uid-1", "claim")])
        await wait_until(lambda: api.node_lookups >= 2, "a retried Node lookup")
        assert api.slices == {}
        assert node.publisher.last_error is not None and "not found" in node.publisher.last_error
        api.add_node()
        await wait_until(lambda: published(api, 4), "slices once the Node exists")
    finally:
        api.closed.set()
        await node.stop()


async def test_an_injected_fault_taints_that_device_and_reaches_the_health_stream(
    root: Path, api: FakeSliceApi
) -> None:
    settings = settings_for(root, health_taint_effect="NoExecute")
    assert settings.fault_file == root / "state" / "fake-faults.yaml"
    node = daemon(settings, api)
    await node.start()
    try:
        await wait_until(lambda: published(api, 4), "4 published devices")
        async with FakeKubelet(settings.kubelet_root_dir / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            stream = plugin.watch_health()
            first: health_pb.NodeWatchResourcesResponse = await stream.read()  # type: ignore[assignment]
            assert {d.health for d in first.devices} == {health_pb.HealthStatus.HEALTHY}

            settings.state_dir.mkdir(parents=True, exist_ok=True)
            assert settings.fault_file is not None
            settings.fault_file.write_text("gpu-2: 79\n")

            def tainted() -> bool:
                return any(d.get("taints") for d in api.devices())

            await wait_until(tainted, "a taint on the published device")
            taints = {d["name"]: d.get("taints") for d in api.devices()}
            unhealthy = {"key": f"{DRIVER}/unhealthy", "value": "xid-79", "effect": "NoExecute"}
            assert taints["gpu-2"] == [unhealthy]
            assert all(t is None for name, t in taints.items() if name != "gpu-2")

            async with asyncio.timeout(WAIT):
                while True:
                    update: health_pb.NodeWatchResourcesResponse = await stream.read()  # type: ignore[assignment]
                    health = {d.device.device_name: d.health for d in update.devices}
                    if health["gpu-2"] == health_pb.HealthStatus.UNHEALTHY:
                        break
            assert health["gpu-0"] == health_pb.HealthStatus.HEALTHY
            stream.cancel()
    finally:
        await node.stop()


async def test_stop_removes_the_sockets_before_the_slices_go(root: Path, api: FakeSliceApi) -> None:
    settings = settings_for(root, delete_slices_on_shutdown="true", pod_uid="pod-1")
    node = daemon(settings, api)
    paths = socket_paths(settings.kubelet_root_dir, DRIVER, "pod-1")
    sockets_at_publisher_stop: list[bool] = []
    stop_publisher = node.publisher.stop

    def record_then_stop(**kw: Any) -> None:
        sockets_at_publisher_stop.append(paths.registration.exists() or paths.dra.exists())
        stop_publisher(**kw)

    node.publisher.stop = record_then_stop  # type: ignore[method-assign]
    await node.start()
    assert paths.registration.exists() and paths.dra.exists()
    await wait_until(lambda: published(api, 4), "4 published devices")
    await node.stop()
    await node.stop()  # a second stop is harmless
    assert sockets_at_publisher_stop == [False]
    assert api.slices == {}


async def test_a_failed_start_stops_what_was_started_and_raises(root: Path, api: FakeSliceApi) -> None:
    settings = settings_for(root, delete_slices_on_shutdown="true")
    paths = socket_paths(settings.kubelet_root_dir, DRIVER)
    paths.dra.parent.mkdir(parents=True)
    paths.dra.write_text("not a socket")
    node = daemon(settings, api)
    with pytest.raises(SocketPathError, match="is not a socket"):
        await node.start()
    # The publisher was stopped without deleting (a failed start must not take slices away).
    assert node.publisher._stop.is_set()


def test_an_unknown_fake_model_is_a_clear_start_error(root: Path) -> None:
    with pytest.raises(NodeUnavailable, match=r"fake device backend: .*no-such-gpu"):
        build_backend(settings_for(root, fake_model="no-such-gpu"))
