"""`draplugin run`'s start order: the kubelet's sockets first, the node daemon built behind them.

A Go plugin has its sockets up in a fraction of a second; ours used to import and build
everything first (the prepare path, the device backends, the Kubernetes client: most of
a second). Now the plugin server starts with a `PendingDriver` and a `PendingHealth`
(`draplugin.kubelet.pending`), then the node daemon (`draplugin.node`) is imported and
built on a worker thread, the event loop serving the kubelet meanwhile: device discovery,
credentials, and the prepare driver with its start-up recovery. Only when recovery is done
does the driver go behind the sockets; a claim that came earlier waits for it (never acting
on the checkpoint before recovery), and if start-up fails it is refused with the reason and
the daemon stops, as before, with exit status 1.

The one exception is NVIDIA's driver name: there NVIDIA's own plugin may already serve this
node, and ours must look (`draplugin.nvidiadriver`) before registering anything under the same
name, so everything is built first, in the old order.

This module is what `run` imports before the sockets exist, so it imports nothing else of the
daemon at module level.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable
from typing import Protocol

from draplugin.config import Settings
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.kubelet.interface import Driver, HealthSource
from draplugin.kubelet.pending import PendingDriver, PendingHealth
from draplugin.kubelet.server import KubeletPluginServer, PluginServerOptions

log = logging.getLogger(__name__)


class Daemon(Protocol):
    """What is built behind the sockets (`draplugin.node.NodeDaemon`)."""

    @property
    def driver(self) -> Driver: ...

    @property
    def health(self) -> HealthSource: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Builds the daemon around a server already serving (None: one of its own, started by its start).
Build = Callable[[Settings, KubeletPluginServer | None], Daemon]


class NodeUnavailable(RuntimeError):
    """The daemon cannot be built: no device backend, no API credentials, or no prepare driver."""


def plugin_server_options(settings: Settings) -> PluginServerOptions:
    return PluginServerOptions(
        driver_name=settings.driver_name,
        kubelet_root_dir=settings.kubelet_root_dir,
        pod_uid=settings.pod_uid,
        healthcheck_port=settings.healthcheck_port,
        healthcheck_host=settings.healthcheck_address,
    )


def freeze_start_up_heap() -> None:
    """Everything the start built (modules, the daemon, its inventory) into the collector's permanent
    generation. Those objects live as long as the process, yet each full collection traversed all of
    them: under 64 concurrent prepares one such pass held the event loop for some 25 ms (measured
    with gc.callbacks in `bench.prepare`), while the young garbage of the claims is what it is for."""
    gc.freeze()


class StagedNode:
    """The node daemon behind sockets opened first (`cli.serve_service` runs it); `build` runs on
    a worker thread (`draplugin.node.build_node`, imported there)."""

    def __init__(self, settings: Settings, build: Build) -> None:
        self.settings = settings
        self._build = build
        self.driver = PendingDriver()
        self.health = PendingHealth()
        self.server: KubeletPluginServer | None = None
        self.node: Daemon | None = None

    async def start(self) -> None:
        if self.settings.driver_name == NVIDIA_DRIVER_NAME:
            self.node = await asyncio.to_thread(self._build, self.settings, None)
            await self.node.start()
            freeze_start_up_heap()
            return
        server = KubeletPluginServer(
            self.driver, plugin_server_options(self.settings), health_source=self.health
        )
        self.server = server
        await server.start()
        try:
            self.node = await asyncio.to_thread(self._build, self.settings, server)
            await self.node.start()
        except BaseException as err:
            reason = str(err) or type(err).__name__
            self.driver.fail(reason)
            self.health.fail(reason)
            if self.node is None:
                await server.stop(grace=0)
            raise
        self.health.set(self.node.health)
        self.driver.set(self.node.driver)
        freeze_start_up_heap()
        log.info("start-up recovery done: serving claims", extra={"driver": self.settings.driver_name})

    async def stop(self) -> None:
        if self.node is not None:
            await self.node.stop()
        elif self.server is not None:
            await self.server.stop()
