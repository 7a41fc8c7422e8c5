"""Devices that change under a running plugin: re-discovery, slices that follow, prepared claims that stay."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from devcluster.wait import wait_for
from draplugin.config import Settings
from draplugin.devices import DeviceBackend
from draplugin.devices.fake import FakeBackend, config_from_flags, load_config
from draplugin.devices.health import HealthPolicy, HealthTracker, Recovery
from draplugin.devices.model import Device
from draplugin.devices.watch import DeviceChange, DeviceWatcher
from draplugin.kubelet.interface import ClaimError, Driver
from tests.kubelet_client import StaticDriver
from tests.unit.test_node import DRIVER, FakeSliceApi, api, daemon, published, root, settings_for, wait_until
from tests.unit.test_prepare_driver import Node, node, two_gpu_claim
from tests.unit.test_prepare_plan import DEVICES

__all__ = ["api", "node", "root"]  # pytest fixtures, imported for this module's tests

TWO_L4 = "gpus:\n  - model: L4\n    count: 2\n"
ONE_L4 = "gpus:\n  - model: L4\n    count: 1\n"


def write(path: Path, text: str) -> None:
    """Write and make sure the change is visible to a (mtime, size) stamp, even within one tick."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def fake_from_file(path: Path) -> FakeBackend:
    return FakeBackend("n", load_config(path), config_file=path)


def test_the_fake_backend_rereads_its_file_and_keeps_the_last_devices_on_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write(path, TWO_L4)
    backend = fake_from_file(path)
    assert [d.name for d in backend.discover()] == ["gpu-0", "gpu-1"]
    assert backend.refresh() is False  # unchanged file: nothing re-read
    write(path, ONE_L4)
    assert backend.refresh() is True and [d.name for d in backend.discover()] == ["gpu-0"]
    write(path, "gpus: [{model: no-such-gpu}]\n")
    assert backend.refresh() is False and [d.name for d in backend.discover()] == ["gpu-0"]
    assert FakeBackend("n", config_from_flags(2)).refresh() is False  # flags only: fixed inventory


def test_the_watcher_reports_what_came_and_went_and_a_device_back_counts_as_recovered(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write(path, TWO_L4)
    tracker = HealthTracker(DRIVER)
    watcher = DeviceWatcher(fake_from_file(path), tracker, interval_s=0)
    changes: list[DeviceChange] = []
    watcher.add_listener(changes.append)
    assert watcher.check() is None

    tracker.report_unhealthy(["gpu-1"], "NoSchedule", "xid-79", "fell off the bus")
    write(path, ONE_L4)
    change = watcher.check()
    assert change is not None and (change.added, change.removed) == ((), ("gpu-1",))
    assert set(tracker.faults()) == {"gpu-1"}  # gone, not yet back

    write(path, TWO_L4)
    change = watcher.check()
    assert change is not None and (change.added, change.removed) == (("gpu-1",), ())
    assert tracker.faults() == {}  # it came back (on-reset): the old fault is stale
    assert [len(c.devices) for c in changes] == [1, 2]


def test_a_wake_rediscovers_at_once_and_quiet_faults_expire_on_the_watch_thread(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    write(path, TWO_L4)
    tracker = HealthTracker(DRIVER, HealthPolicy(recovery=Recovery("after", 0.05)))
    watcher = DeviceWatcher(fake_from_file(path), tracker, interval_s=0, tick_s=0.02)  # 0: never periodic
    seen = threading.Event()
    watcher.add_listener(lambda change: seen.set())
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(stop,), daemon=True)
    thread.start()
    try:
        tracker.report_unhealthy(["gpu-0"], "NoSchedule", "xid-48", "ECC")
        write(path, ONE_L4)
        assert not seen.wait(0.2)  # no interval: a file change alone is not noticed
        watcher.wake()
        assert seen.wait(5)
        wait_for("the quiet fault to expire", lambda: not tracker.faults(), 5, 0.02)
    finally:
        stop.set()
        thread.join(5)


class ChangeRecordingDriver(StaticDriver):
    """A driver that records the device changes the daemon hands it, and on which thread."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.changes: list[tuple[list[str], list[str], str]] = []

    def devices_changed(self, devices: Sequence[Device], removed: Sequence[str]) -> None:
        self.changes.append(([d.name for d in devices], list(removed), threading.current_thread().name))


async def test_published_slices_follow_a_fake_gpu_that_disappears(root: Path, api: FakeSliceApi) -> None:
    path = root / "gpus.yaml"
    write(path, TWO_L4)
    recording: list[ChangeRecordingDriver] = []

    def factory(settings: Settings, backend: DeviceBackend) -> Driver:
        recording.append(ChangeRecordingDriver(settings.driver_name))
        return recording[0]

    settings = settings_for(root, fake_gpus="", fake_config=str(path), rediscover_interval="0.2s")
    assert settings.rediscover_interval_s == 0.2
    node = daemon(settings, api, driver_factory=factory)
    await node.start()
    try:
        await wait_until(lambda: published(api, 2), "2 published devices")
        write(path, ONE_L4)
        await wait_until(lambda: [d["name"] for d in api.devices()] == ["gpu-0"], "gpu-1 unpublished")
        await wait_until(lambda: bool(recording[0].changes), "the driver told")
        (devices, removed, thread) = recording[0].changes[0]
        assert (devices, removed) == (["gpu-0"], ["gpu-1"])
        assert thread == threading.current_thread().name  # the event loop's thread, not the watcher's
    finally:
        await node.stop()


async def test_a_prepared_claim_whose_device_vanishes_stays_prepared_with_an_event(node: Node) -> None:
    driver = node.driver()
    ref = node.claims.add(two_gpu_claim())
    await driver.prepare_claim(ref)
    remaining = [d for name, d in DEVICES.items() if name != "gpu-1"]

    driver.devices_changed(remaining, ["gpu-1"])

    assert driver.checkpoint.get(ref.uid) is not None  # still prepared: the kubelet unprepares it
    ((reason, note),) = node.events.node_events
    assert reason == "PreparedDeviceGone" and "gpu-1" in note and "ns/claim" in note
    assert "gpu-1" not in driver.devices
    # A new claim for the vanished device fails with the reason; unpreparing the old one works.
    other = node.claims.add(two_gpu_claim(uid="uid-2", name="other"))
    with pytest.raises(ClaimError, match="gpu-1"):
        await driver.prepare_claim(other)
    await driver.unprepare_claim(ref)
    assert driver.checkpoint.get(ref.uid) is None
