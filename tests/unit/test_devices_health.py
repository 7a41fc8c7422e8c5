"""Health state → device taints and the kubelet health stream; injected faults for the fake backend."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.health import FaultFile, HealthReporter, HealthTracker, effect_for_xid
from draplugin.kubelet.interface import HealthStatus

DRIVER = "gpu.draplugin.dev"


def test_xid_classes() -> None:
    assert effect_for_xid(13) is None  # application error
    assert effect_for_xid(79) == "NoExecute"  # fallen off the bus
    assert effect_for_xid(48) == "NoExecute"  # double-bit ECC
    assert effect_for_xid(92) == "NoSchedule"


def test_unhealthy_device_gets_a_taint_and_stronger_effect_wins() -> None:
    devices = FakeBackend("n", config_from_flags(3, "L4")).discover()
    tracker = HealthTracker(DRIVER)
    calls: list[int] = []
    tracker.add_listener(lambda: calls.append(1))
    assert tracker.report_unhealthy(["gpu-1"], "NoSchedule", "xid-92", "high single-bit rate")
    assert tracker.report_unhealthy(["gpu-1"], "NoExecute", "xid-79", "gone")
    assert not tracker.report_unhealthy(["gpu-1"], "NoSchedule", "xid-92", "again")  # weaker: no change
    tainted = tracker.apply(devices)
    assert tainted[0] == devices[0] and tainted[2] == devices[2]
    (taint,) = tainted[1].taints
    assert (taint.key, taint.value, taint.effect) == ("gpu.draplugin.dev/unhealthy", "xid-79", "NoExecute")
    assert len(calls) == 2
    assert tracker.report_healthy(["gpu-1"]) and tracker.apply(devices)[1].taints == ()


async def test_health_stream_yields_full_list_on_every_change() -> None:
    backend = FakeBackend("n", config_from_flags(2, "T4"))
    tracker = HealthTracker(DRIVER)
    stream = HealthReporter(tracker, backend, "n").watch_health()
    first = await anext(stream)
    assert [(h.device_name, h.health) for h in first] == [
        ("gpu-0", HealthStatus.HEALTHY),
        ("gpu-1", HealthStatus.HEALTHY),
    ]
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    await asyncio.to_thread(tracker.report_unhealthy, ["gpu-1"], "NoExecute", "xid-79", "XID 79")
    second = await asyncio.wait_for(pending, 2)
    assert [(h.device_name, h.health, h.message) for h in second][1] == (
        "gpu-1",
        HealthStatus.UNHEALTHY,
        "XID 79",
    )
    assert second[0].pool_name == "n"


def test_fault_file_injects_and_clears(tmp_path: Path) -> None:
    tracker = HealthTracker(DRIVER)
    path = tmp_path / "faults.yaml"
    faults = FaultFile(path, tracker)
    faults.poll()
    assert tracker.faults() == {}
    path.write_text("gpu-0: 79\ngpu-1: {xid: 92}\n")
    faults.poll()
    assert {n: (f.effect, f.reason) for n, f in tracker.faults().items()} == {
        "gpu-0": ("NoExecute", "xid-79"),
        "gpu-1": ("NoSchedule", "xid-92"),
    }
    path.write_text("gpu-1: 92\n# gpu-0 repaired\n")
    faults.poll()
    assert set(tracker.faults()) == {"gpu-1"}
    path.write_text("gpu-1: [not, an, xid]\n")  # bad file: logged, last state kept
    faults.poll()
    assert set(tracker.faults()) == {"gpu-1"}
    path.unlink()
    faults.poll()
    assert tracker.faults() == {}


async def test_closed_health_streams_leave_no_listener_behind() -> None:
    """Every kubelet reconnect opens a new stream; closing it must unregister its wake-up."""
    backend = FakeBackend("n", config_from_flags(1, "T4"))
    tracker = HealthTracker(DRIVER)
    reporter = HealthReporter(tracker, backend, "n")
    publisher_calls: list[int] = []
    tracker.add_listener(lambda: publisher_calls.append(1))  # the slice publisher's, stays
    for _ in range(3):
        stream = reporter.watch_health()
        await anext(stream)
        assert tracker.listener_count() == 2
        await stream.aclose()
    assert tracker.listener_count() == 1

    # A stream cancelled while waiting for a change (the kubelet hung up) lets go too.
    stream = reporter.watch_health()
    await anext(stream)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await stream.aclose()
    assert tracker.listener_count() == 1
    assert tracker.report_unhealthy(["gpu-0"], "NoSchedule", "xid-92", "still reported")
    assert publisher_calls == [1]


def test_the_taint_key_follows_the_driver_name() -> None:
    assert HealthTracker("gpu.example.com").taint_key == "gpu.example.com/unhealthy"
