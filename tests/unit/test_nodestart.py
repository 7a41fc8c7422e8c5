"""`draplugin run`'s start order: sockets first, the node daemon (and its recovery) behind them."""

from __future__ import annotations

import asyncio
import gc
import shutil
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from draplugin import nodestart
from draplugin.config import Settings
from draplugin.devices import DeviceBackend
from draplugin.kubelet.interface import ClaimRef, Driver, PreparedDevice
from draplugin.kubelet.server import KubeletPluginServer
from draplugin.kubelet.sockets import socket_paths
from draplugin.node import NodeDaemon
from tests.kubelet_client import FakeKubelet, StaticDriver
from tests.unit.test_node import DRIVER, WAIT, FakeSliceApi, daemon, settings_for, wait_until

CLAIM = ClaimRef(namespace="default", uid="uid-1", name="claim-1")


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ns-", dir="/tmp"))  # short: socket paths have a 107-byte limit
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """A start freezes the heap (`freeze_start_up_heap`); this test process's is given back after."""
    yield
    gc.unfreeze()


@pytest.fixture
def api() -> Iterator[FakeSliceApi]:
    fake = FakeSliceApi()
    yield fake
    fake.closed.set()


class RecoveringDriver(StaticDriver):
    """A driver whose start-up recovery (in its factory) has finished, recording what it was asked."""

    def __init__(self) -> None:
        super().__init__(DRIVER)
        self.calls: list[str] = []

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        self.calls.append(claim.uid)
        return await super().prepare_claim(claim)


class SlowBuild:
    """Stands in for `build_node`: the real daemon, whose driver's recovery waits for `release`."""

    def __init__(self, api: FakeSliceApi, *, fail: str | None = None) -> None:
        self.api = api
        self.fail = fail
        self.release = threading.Event()
        self.recovering = threading.Event()
        self.driver: RecoveringDriver | None = None

    def factory(self, settings: Settings, backend: DeviceBackend) -> Driver:
        self.recovering.set()
        assert self.release.wait(WAIT)
        if self.fail is not None:
            raise nodestart.NodeUnavailable(self.fail)
        self.driver = RecoveringDriver()
        return self.driver

    def __call__(self, settings: Settings, server: KubeletPluginServer | None) -> NodeDaemon:
        return daemon(settings, self.api, driver_factory=self.factory, server=server)


def staged(root: Path, build: SlowBuild) -> nodestart.StagedNode:
    return nodestart.StagedNode(settings_for(root), build)


async def test_the_sockets_serve_before_recovery_and_a_prepare_waits_for_it(
    root: Path, api: FakeSliceApi
) -> None:
    build = SlowBuild(api)
    node = staged(root, build)
    starting = asyncio.ensure_future(node.start())
    try:
        await wait_until(build.recovering.is_set, "the driver's recovery to begin")
        paths = socket_paths(root / "kubelet", DRIVER)
        assert paths.registration.is_socket() and paths.dra.is_socket()
        async with FakeKubelet(root / "kubelet" / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()  # answered while recovery is under way
            prepare = asyncio.ensure_future(plugin.prepare([CLAIM]))
            await asyncio.sleep(0.3)
            assert not prepare.done(), "a prepare was answered before start-up recovery finished"
            assert build.driver is None
            build.release.set()
            async with asyncio.timeout(WAIT):
                devices = await prepare
                await starting
            assert build.driver is not None and build.driver.calls == ["uid-1"]
            assert devices["uid-1"][0].device_name == "gpu-0"
    finally:
        build.release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await node.stop()


async def test_a_failed_start_refuses_the_waiting_claim_and_removes_the_sockets(
    root: Path, api: FakeSliceApi
) -> None:
    build = SlowBuild(api, fail="no GPUs here")
    node = staged(root, build)
    starting = asyncio.ensure_future(node.start())
    paths = socket_paths(root / "kubelet", DRIVER)
    try:
        await wait_until(build.recovering.is_set, "the driver's recovery to begin")
        async with FakeKubelet(root / "kubelet" / "plugins_registry") as kubelet:
            async with asyncio.timeout(WAIT):
                plugin = await kubelet.register_plugin()
            prepare = asyncio.ensure_future(plugin.prepare_results([CLAIM]))
            await asyncio.sleep(0.1)
            build.release.set()
            with pytest.raises(nodestart.NodeUnavailable, match="no GPUs here"):
                async with asyncio.timeout(WAIT):
                    await starting
            answer = await asyncio.gather(prepare, return_exceptions=True)
        # Refused with the reason, or cut off by the server going away: never prepared.
        (result,) = answer
        if not isinstance(result, BaseException):
            assert "could not start" in result["uid-1"].error and "no GPUs here" in result["uid-1"].error
        assert not paths.registration.exists() and not paths.dra.exists()
    finally:
        build.release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await node.stop()


async def test_the_start_up_heap_goes_to_the_permanent_generation_once_recovery_is_done(
    root: Path, api: FakeSliceApi
) -> None:
    gc.unfreeze()
    build = SlowBuild(api)
    node = staged(root, build)
    starting = asyncio.ensure_future(node.start())
    try:
        await wait_until(build.recovering.is_set, "the driver's recovery to begin")
        assert gc.get_freeze_count() == 0, "frozen before recovery was done"
        build.release.set()
        async with asyncio.timeout(WAIT):
            await starting
        assert gc.get_freeze_count() > 0
        # A full collection no longer traverses what the start built: the driver is in none of
        # the three generations the collector walks.
        assert not any(obj is build.driver for obj in gc.get_objects())
    finally:
        build.release.set()
        await asyncio.gather(starting, return_exceptions=True)
        await node.stop()
