"""The node daemon behind `draplugin run`: every part of the plugin on one node, wired together.

Start order follows the data: the backend discovers the devices; the health
tracker marks faulty ones; the slice publisher offers them to the scheduler
(with health taints) and keeps doing so in its own threads; the prepare driver
serves the same devices; the kubelet plugin server comes last, because once
its registration socket exists the kubelet sends work. While it runs, the
device watcher re-reads the devices (`--rediscover-interval`, and at once on
NVML events that signal a change): a change republishes the slices and gives
prepare the new list; a prepared claim whose device vanished stays in the
checkpoint, with a log line and an Event on the Node. Stop order is the
reverse: the server goes first (no new kubelet calls, sockets removed), then
health monitoring and the watcher, then the publisher (which deletes our slices only when
asked: a restarting plugin should not make its devices vanish from the
scheduler's view), then the backend.

`draplugin run` opens the server's sockets before all of this is built (`draplugin.nodestart`)
and hands it over here, already serving; the driver goes behind it once recovered.

The API server is only needed by the publisher and by prepare, and both retry:
a plugin that starts while the API server is unreachable (or before the
kubelet has created its Node) serves the kubelet anyway, logs why slices are
not published yet, and catches up on its own. Prepare fails per claim, with
the API error in the message, until then.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from draplugin.config import Settings
from draplugin.devices import DeviceBackend, load_backend
from draplugin.devices.deviceplugin_guard import DevicePluginGuard
from draplugin.devices.health import FaultFile, HealthReporter, HealthTracker
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.devices.watch import DeviceChange, DeviceWatcher
from draplugin.kubelet.interface import Driver
from draplugin.kubelet.server import KubeletPluginServer
from draplugin.nodeidentity import writer_id
from draplugin.nodestart import NodeUnavailable as NodeUnavailable  # raised here, defined light
from draplugin.nodestart import plugin_server_options
from draplugin.slices.api import KubeSliceApi, SliceApi
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.plan import layout_for
from draplugin.slices.publisher import SlicePublisher, backend_source

if TYPE_CHECKING:
    from draplugin.usage.wiring import UsageService

log = logging.getLogger(__name__)

FAULT_POLL_SECONDS: Final = 1.0
THREAD_JOIN_SECONDS: Final = 5.0
# How often the device plugin guard looks again when re-discovery is off (--rediscover-interval=0).
GUARD_CHECK_SECONDS: Final = 60.0

DriverFactory = Callable[[Settings, DeviceBackend], Driver]
# Builds the usage sampler (draplugin.usage) for the daemon's backend, driver and health tracker.
UsageFactory = Callable[[Settings, DeviceBackend, Driver, HealthTracker], "UsageService | None"]
HealthMonitor = Callable[[threading.Event], None]


def build_backend(settings: Settings) -> DeviceBackend:
    """The device backend the settings name (NVML library or fake inventory loaded here)."""
    try:
        return load_backend(settings.backend, settings.node_name, **settings.backend_options())
    except (ValueError, RuntimeError, OSError) as err:
        raise NodeUnavailable(f"{settings.backend} device backend: {err}") from err


def prepare_driver(settings: Settings, backend: DeviceBackend) -> Driver:
    """The prepare driver for the devices `backend` publishes (recovered from its checkpoint)."""
    # Imported here: the prepare side pulls in the Kubernetes client and the CDI writer.
    from draplugin.prepare.wiring import WiringError, driver_from_settings

    try:
        return driver_from_settings(settings, backend)
    except WiringError as err:
        raise NodeUnavailable(str(err)) from err


def kube_slice_api(settings: Settings) -> SliceApi:
    """ResourceSlice access with the settings' credentials. Loading them does not contact the server."""
    from dracommon.kubeapi import KubeApi, load_api_client

    try:
        client = load_api_client(str(settings.kubeconfig) if settings.kubeconfig else None)
    except Exception as err:  # KubeConfigError, or the client library's own errors on a bad file
        raise NodeUnavailable(f"no API server credentials: {err}") from err
    return KubeSliceApi(KubeApi(client))


def health_monitor(
    settings: Settings,
    backend: DeviceBackend,
    tracker: HealthTracker,
    rediscover: Callable[[], None] | None = None,
) -> HealthMonitor | None:
    """What feeds the tracker: NVML events on real GPUs, the fault file for fake ones.

    `rediscover` is what NVML events that signal a device change call (the watcher's wake).
    """
    fault_file = settings.fault_file
    if fault_file is not None:
        faults = FaultFile(fault_file, tracker)
        faults.poll()  # faults already in the file are in the first published slices

        def poll_faults(stop: threading.Event) -> None:
            faults.run(stop, FAULT_POLL_SECONDS)

        return poll_faults
    attach = getattr(backend, "attach_health", None)
    if callable(attach):
        attach(tracker)  # lost GPUs found by re-discovery are reported there
    monitor = getattr(backend, "monitor_health", None)
    if callable(monitor):

        def watch_events(stop: threading.Event) -> None:
            monitor(tracker, stop, rediscover=rediscover)

        return watch_events
    return None


def _node_event(slice_api: SliceApi, settings: Settings) -> Callable[[str, str], None] | None:
    """Events on the Node for the publisher (a duplicate node name), with the slice API's credentials."""
    make = getattr(slice_api, "node_event", None)
    return make(settings.driver_name, settings.node_name) if callable(make) else None


def device_plugin_guard(settings: Settings) -> DevicePluginGuard:
    """The guard against sharing GPUs with a device plugin: reads this Node, posts Events on it."""
    from dracommon.kubeapi import KubeApi, load_api_client
    from draplugin.events import KubeEvents

    try:
        api = KubeApi(load_api_client(str(settings.kubeconfig) if settings.kubeconfig else None))
    except Exception as err:  # as in kube_slice_api: the client library's errors on a bad file
        raise NodeUnavailable(f"no API server credentials: {err}") from err
    node_path = f"/api/v1/nodes/{settings.node_name}"
    return DevicePluginGuard(
        settings.device_plugin_coexistence,
        driver_name=settings.driver_name,
        socket_dir=settings.device_plugin_dir,
        read_node=lambda: api.get(node_path),
        events=KubeEvents(api, settings.driver_name, settings.node_name),
    )


def refuse_beside_nvidias_driver(settings: Settings, slice_api: SliceApi) -> None:
    """Under NVIDIA's driver name: stop (`NodeUnavailable`) where NVIDIA's own DRA driver runs
    (`draplugin.nvidiadriver`), before anything is published or registered."""
    if settings.driver_name != NVIDIA_DRIVER_NAME:
        return
    from dracommon.kubeapi import KubeApi, load_api_client
    from draplugin import nvidiadriver
    from draplugin.events import KubeEvents

    try:
        api = KubeApi(load_api_client(str(settings.kubeconfig) if settings.kubeconfig else None))
    except Exception as err:  # as in kube_slice_api: the client library's errors on a bad file
        raise NodeUnavailable(f"no API server credentials: {err}") from err
    events = KubeEvents(api, settings.driver_name, settings.node_name)
    try:
        nvidiadriver.check(
            kubelet_root_dir=settings.kubelet_root_dir,
            node_name=settings.node_name,
            list_slices=slice_api.list_slices,
            node_event=events.node_event,
        )
    except nvidiadriver.NvidiaDriverPresent as err:
        raise NodeUnavailable(str(err)) from err
    finally:
        events.close()  # the Event is sent before the process exits


def kube_usage(
    settings: Settings, backend: DeviceBackend, driver: Driver, tracker: HealthTracker
) -> UsageService | None:
    """Usage sampling over the driver's prepared claims, reading their pods from the API server."""
    from dracommon.kubeapi import KubeApi, load_api_client
    from draplugin.usage.wiring import build_usage

    checkpoint = getattr(driver, "checkpoint", None)
    if checkpoint is None:  # a driver without a checkpoint (a test double) holds no claims to attribute
        return None
    try:
        api = KubeApi(load_api_client(str(settings.kubeconfig) if settings.kubeconfig else None))
    except Exception as err:  # as in kube_slice_api: the client library's errors on a bad file
        raise NodeUnavailable(f"no API server credentials: {err}") from err
    events = getattr(driver, "events", None)
    return build_usage(
        settings,
        backend,
        records=checkpoint.records,
        tracker=tracker,
        api=api,
        events=events if callable(getattr(events, "pod_event", None)) else None,
    )


class NodeDaemon:
    """Backend → health → ResourceSlice publisher → prepare driver → kubelet plugin server.

    `server`: one already serving (sockets opened first, `draplugin.nodestart`), whose pending
    driver and health source its owner hands over after `start`; this daemon still stops it.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        backend: DeviceBackend,
        slice_api: SliceApi,
        driver_factory: DriverFactory = prepare_driver,
        slice_metrics: SliceMetrics | None = None,
        guard: DevicePluginGuard | None = None,
        usage_factory: UsageFactory | None = None,
        server: KubeletPluginServer | None = None,
    ) -> None:
        self.settings = settings
        self.backend = backend
        # Without one (tests of the other parts), nothing is held back for a device plugin.
        self.guard = guard
        self.tracker = HealthTracker(settings.driver_name, settings.health_policy)
        self.watcher = DeviceWatcher(backend, self.tracker, interval_s=settings.rediscover_interval_s)
        self._monitor = health_monitor(settings, backend, self.tracker, self.watcher.wake)
        self.publisher = SlicePublisher(
            slice_api,
            node_name=settings.node_name,
            driver=settings.driver_name,
            source=(
                guard.source(backend_source(backend, self.tracker.apply))
                if guard is not None
                else backend_source(backend, self.tracker.apply)
            ),
            # With health monitoring a device may gain a taint at any time; planning for
            # it up front keeps slice boundaries still when one does.
            expect_taints=self._monitor is not None,
            layout=layout_for(settings.kubernetes_version) if settings.kubernetes_version else None,
            metrics=slice_metrics,
            writer=writer_id(settings.state_dir),  # this machine's mark on its slices (nodeidentity)
            node_event=_node_event(slice_api, settings),
        )
        # A health change republishes the slice holding the device (an in-place update).
        self.tracker.add_listener(self.publisher.trigger)
        if guard is not None:
            guard.add_listener(self.publisher.trigger)  # a device plugin came or went
        self.health = HealthReporter(self.tracker, backend, pool_name=settings.node_name)
        self.driver = driver_factory(settings, backend)
        self._start_server = server is None
        self.server = (
            server
            if server is not None
            else KubeletPluginServer(self.driver, plugin_server_options(settings), health_source=self.health)
        )
        self.watcher.add_listener(self._devices_changed)
        # Usage metrics and idle claims: a thread of its own that only reads the checkpoint.
        self.usage = usage_factory(settings, backend, self.driver, self.tracker) if usage_factory else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_monitor = threading.Event()
        self._monitor_thread: threading.Thread | None = None
        self._watch_thread: threading.Thread | None = None
        self._guard_thread: threading.Thread | None = None
        self._started = False

    def _devices_changed(self, change: DeviceChange) -> None:
        """On the watcher's thread: republish, and hand prepare the new devices on its own loop."""
        self.publisher.trigger()
        update = getattr(self.driver, "devices_changed", None)
        loop = self._loop
        if callable(update) and loop is not None and not loop.is_closed():
            # The driver's state (checkpoint, device map) belongs to the event loop's thread.
            loop.call_soon_threadsafe(update, change.devices, change.removed)

    async def start(self) -> None:
        """Start every part; if one fails, stop the ones already running and re-raise."""
        devices = self.backend.discover()
        log.info(
            "node daemon starting",
            extra={
                "node": self.settings.node_name,
                "driver": self.settings.driver_name,
                "backend": self.backend.name,
                "devices": len(devices),
                "fault_file": str(self.settings.fault_file) if self.settings.fault_file else None,
            },
        )
        self._started = True
        self._loop = asyncio.get_running_loop()
        try:
            self._stop_monitor.clear()
            self._watch_thread = threading.Thread(
                target=self.watcher.run, args=(self._stop_monitor,), name="device-watch", daemon=True
            )
            self._watch_thread.start()
            if self._monitor is not None:
                self._monitor_thread = threading.Thread(
                    target=self._monitor, args=(self._stop_monitor,), name="health-monitor", daemon=True
                )
                self._monitor_thread.start()
            if self.guard is not None:
                interval = self.settings.rediscover_interval_s or GUARD_CHECK_SECONDS
                self._guard_thread = threading.Thread(
                    target=self.guard.run, args=(self._stop_monitor, interval), name="device-plugin-guard",
                    daemon=True,
                )  # fmt: skip
                self._guard_thread.start()
            # Threads of its own: it retries API errors with backoff (Node not created yet,
            # API server unreachable) without holding up the kubelet.
            self.publisher.start()
            if self.usage is not None:
                self.usage.start()
            if self._start_server:
                await self.server.start()
        except BaseException:
            await self.stop(delete_slices=False)
            raise

    async def stop(self, *, delete_slices: bool | None = None) -> None:
        """Stop in reverse order. Safe to call more than once."""
        if not self._started:
            return
        self._started = False
        delete = self.settings.delete_slices_on_shutdown if delete_slices is None else delete_slices
        await self.server.stop()
        if self.usage is not None:
            await asyncio.to_thread(self.usage.stop)
        self._stop_monitor.set()
        for thread in (self._monitor_thread, self._watch_thread, self._guard_thread):
            if thread is not None:
                await asyncio.to_thread(thread.join, THREAD_JOIN_SECONDS)
        self._monitor_thread = self._watch_thread = self._guard_thread = None
        await asyncio.to_thread(self.publisher.stop, delete=delete, timeout_s=THREAD_JOIN_SECONDS)
        close = getattr(self.backend, "close", None)
        if callable(close):
            close()
        log.info("node daemon stopped", extra={"slices_deleted": delete})


def build_node(settings: Settings, *, server: KubeletPluginServer | None = None) -> NodeDaemon:
    """The daemon for these settings (around `server` when it already serves). Raises
    `NodeUnavailable` with the reason."""
    slice_api = kube_slice_api(settings)
    refuse_beside_nvidias_driver(settings, slice_api)
    backend = build_backend(settings)
    try:
        return NodeDaemon(
            settings,
            backend=backend,
            slice_api=slice_api,
            guard=device_plugin_guard(settings),
            usage_factory=kube_usage,
            server=server,
        )
    except BaseException:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
        raise
