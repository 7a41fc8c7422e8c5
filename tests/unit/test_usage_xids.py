"""XID counts: NVML events counted as they come; fake faults counted once per injection."""

from __future__ import annotations

from draplugin.devices.health import HealthTracker
from draplugin.usage.xids import XidCounter


def test_recorded_events_are_counted_per_device_and_xid() -> None:
    counter = XidCounter()
    counter.record(["gpu-0"], 13)
    counter.record(["gpu-0", "gpu-0-mig-1g10gb-0"], 13)
    counter.record(["gpu-1"], 79)
    assert counter.counts() == {"gpu-0": {13: 2}, "gpu-0-mig-1g10gb-0": {13: 1}, "gpu-1": {79: 1}}


def test_following_the_tracker_counts_each_new_xid_fault_once() -> None:
    tracker = HealthTracker("gpu.draplugin.dev")
    counter = XidCounter()
    tracker.report_unhealthy(["gpu-0"], "NoSchedule", "xid-48", "injected XID 48")  # before: counted at start
    counter.follow(tracker)
    tracker.report_unhealthy(["gpu-1"], "NoExecute", "xid-79", "injected XID 79")
    tracker.report_unhealthy(["gpu-2"], "NoSchedule", "ecc-double-bit", "ECC")  # not an XID
    tracker.report_healthy(["gpu-3"])  # a change elsewhere re-reads the faults: nothing new
    assert counter.counts() == {"gpu-0": {48: 1}, "gpu-1": {79: 1}}
    tracker.report_healthy(["gpu-1"])
    tracker.report_unhealthy(["gpu-1"], "NoExecute", "xid-79", "injected XID 79")
    assert counter.counts()["gpu-1"] == {79: 2}
