"""Health state → device taints and the kubelet health stream; injected faults for the fake backend."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.health import (
    FaultFile,
    HealthPolicy,
    HealthReporter,
    HealthTracker,
    Recovery,
    parse_xids,
)
from draplugin.kubelet.interface import HealthStatus

DRIVER = "gpu.draplugin.dev"


def test_xid_classes_by_default_and_with_no_execute() -> None:
    policy = HealthPolicy()
    assert policy.effect_for_xid(13) is None  # application error
    assert policy.effect_for_xid(109) is None  # context switch timeout: the application's
    assert policy.effect_for_xid(79) == "NoSchedule"  # fallen off the bus: fatal, default effect
    assert policy.effect_for_xid(92) == "NoSchedule"
    evicting = HealthPolicy(fatal_effect="NoExecute")
    assert evicting.effect_for_xid(79) == "NoExecute" and evicting.effect_for_xid(48) == "NoExecute"
    assert evicting.effect_for_xid(92) == "NoSchedule"  # not fatal: never evicts
    custom = HealthPolicy(application_xids=frozenset({92}), fatal_xids=frozenset({13}))
    assert custom.effect_for_xid(92) is None and custom.effect_for_xid(13) == "NoSchedule"


def test_recovery_and_xid_settings_parse_or_say_what_is_wrong() -> None:
    assert Recovery.parse("never") == Recovery("never")
    assert Recovery.parse("on-reset") == Recovery("on-reset")
    assert Recovery.parse("after:10m") == Recovery("after", 600.0)
    assert str(Recovery.parse("after:90")) == "after:90s"
    for bad in ("sometimes", "after:", "after:-5s", "after:0", "after:10 minutes"):
        with pytest.raises(ValueError, match=r"never, on-reset|after:<duration>"):
            Recovery.parse(bad)
    assert parse_xids("13, 31,,43") == {13, 31, 43} and parse_xids("") == frozenset()
    with pytest.raises(ValueError, match="'x13' is not an XID"):
        parse_xids("x13")


def test_after_recovery_clears_a_quiet_fault_and_a_new_fault_restarts_the_clock() -> None:
    now = [100.0]
    policy = HealthPolicy(recovery=Recovery("after", 60.0))
    tracker = HealthTracker(DRIVER, policy, clock=lambda: now[0])
    calls: list[int] = []
    tracker.add_listener(lambda: calls.append(1))
    tracker.report_unhealthy(["gpu-0"], "NoSchedule", "xid-48", "ECC")
    now[0] = 150.0
    assert not tracker.expire()
    tracker.report_unhealthy(["gpu-0"], "NoSchedule", "xid-48", "ECC again")  # restarts the period
    now[0] = 200.0
    assert not tracker.expire() and set(tracker.faults()) == {"gpu-0"}
    now[0] = 211.0
    assert tracker.expire() and tracker.faults() == {}
    assert calls == [1, 1]  # tainted, then cleared: each republishes once


def test_never_and_on_reset_recovery() -> None:
    never = HealthTracker(DRIVER, HealthPolicy(recovery=Recovery("never")), clock=lambda: 1e9)
    never.report_unhealthy(["gpu-0"], "NoSchedule", "gpu-lost", "lost")
    assert not never.report_recovered(["gpu-0"], "back") and not never.expire()
    assert set(never.faults()) == {"gpu-0"}
    assert never.report_healthy(["gpu-0"])  # the fault's own source (the fault file) can clear it

    on_reset = HealthTracker(DRIVER)  # the default
    on_reset.report_unhealthy(["gpu-0", "gpu-1"], "NoSchedule", "gpu-lost", "lost")
    assert not on_reset.expire()  # time alone clears nothing
    assert on_reset.report_recovered(["gpu-0"], "back") and set(on_reset.faults()) == {"gpu-1"}


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
        "gpu-0": ("NoSchedule", "xid-79"),  # fatal, with the default effect
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
