"""The sampling pass: a failing or hanging device never stops the others; unprepared claims vanish."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from draplugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.model import Device
from draplugin.usage.holders import HolderDirectory
from draplugin.usage.idle import IdleTracker
from draplugin.usage.reading import DeviceReading
from draplugin.usage.sampler import SampleMetrics, UsageSampler


class ScriptedSource:
    """Reads per device name: a reading, an exception to raise, or an event to block on."""

    def __init__(self) -> None:
        self.raises: dict[str, Exception] = {}
        self.blocks: dict[str, threading.Event] = {}
        self.calls: list[str] = []

    def read(self, device: Device) -> DeviceReading:
        self.calls.append(device.name)
        if device.name in self.raises:
            raise self.raises[device.name]
        if device.name in self.blocks:
            self.blocks[device.name].wait(30)
        return DeviceReading(gpu_ratio=0.5 + device.index / 10, memory_used_bytes=device.index)


def claim_on(device: str, uid: str = "uid-1") -> ClaimRecord:
    record = DeviceRecord(("gpu",), "node-1", device, ("cdi",))
    return ClaimRecord(uid, "ns", f"claim-{device}", ClaimState.PREPARE_COMPLETED, (record,))


def sampler(
    source: ScriptedSource,
    records: Callable[[], list[ClaimRecord]] = list,
    gpus: int = 3,
    timeout_s: float = 0.3,
) -> tuple[UsageSampler, CollectorRegistry]:
    registry = CollectorRegistry()
    fake = FakeBackend("node-1", config_from_flags(gpus, "H100-80GB-HBM3"))
    built = UsageSampler(
        node="node-1",
        devices=fake.discover,
        source=source,
        holders=HolderDirectory(records, None),
        locate=lambda pid: None,
        idle=IdleTracker(0.05, 60.0, None),
        interval_s=10.0,
        metrics=SampleMetrics(registry),
        device_timeout_s=timeout_s,
    )
    return built, registry


def errors(registry: CollectorRegistry, device: str, reason: str) -> float:
    value = registry.get_sample_value(
        "draplugin_usage_sample_errors_total", {"device": device, "reason": reason}
    )
    return value or 0.0


def test_a_failing_device_costs_only_its_own_figures() -> None:
    source = ScriptedSource()
    source.raises["gpu-1"] = RuntimeError("NVML exploded")
    built, registry = sampler(source)
    snapshot = built.sample_once()
    readings = {d.name: d.reading for d in snapshot.devices}
    assert readings["gpu-1"] is None
    assert readings["gpu-0"] is not None and readings["gpu-2"] is not None
    assert errors(registry, "gpu-1", "RuntimeError") == 1.0


def test_a_hanging_device_times_out_and_is_skipped_until_its_call_returns() -> None:
    source = ScriptedSource()
    release = threading.Event()
    source.blocks["gpu-0"] = release
    built, registry = sampler(source, timeout_s=0.2)
    started = time.monotonic()
    snapshot = built.sample_once()
    assert time.monotonic() - started < 2.0  # bounded by the deadline, not by the hung call
    assert {d.name for d in snapshot.devices if d.reading is not None} == {"gpu-1", "gpu-2"}
    assert errors(registry, "gpu-0", "Timeout") == 1.0
    snapshot = built.sample_once()  # still stuck: not called again, the others are read
    assert source.calls.count("gpu-0") == 1
    assert errors(registry, "gpu-0", "StillHung") == 1.0
    assert {d.name for d in snapshot.devices if d.reading is not None} == {"gpu-1", "gpu-2"}
    release.set()
    time.sleep(0.05)
    snapshot = built.sample_once()
    assert {d.name for d in snapshot.devices if d.reading is not None} == {"gpu-0", "gpu-1", "gpu-2"}
    built.stop()


def test_an_unprepared_claim_is_gone_from_the_next_snapshot() -> None:
    records = [claim_on("gpu-0"), claim_on("gpu-2", "uid-2")]
    built, _ = sampler(ScriptedSource(), lambda: list(records))
    snapshot = built.sample_once()
    held = {(d.name, s.claim) for d in snapshot.devices for s in d.split.holders}
    assert held == {("gpu-0", "claim-gpu-0"), ("gpu-2", "claim-gpu-2")}
    assert {c.claim for c in snapshot.claims} == {"claim-gpu-0", "claim-gpu-2"}
    records.pop(0)
    snapshot = built.sample_once()
    assert {s.claim for d in snapshot.devices for s in d.split.holders} == {"claim-gpu-2"}
    assert {c.claim for c in snapshot.claims} == {"claim-gpu-2"}


def test_the_loop_survives_a_pass_that_raises_and_stops_when_asked() -> None:
    calls = []

    def devices() -> list[Device]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("backend hiccup")
        return FakeBackend("node-1", config_from_flags(1)).discover()

    registry = CollectorRegistry()
    built = UsageSampler(
        node="node-1",
        devices=devices,
        source=ScriptedSource(),
        holders=HolderDirectory(list, None),
        locate=lambda pid: None,
        idle=IdleTracker(0.05, 60.0, None),
        interval_s=0.05,
        metrics=SampleMetrics(registry),
    )
    built.start()
    deadline = time.monotonic() + 5
    while built.latest is None and time.monotonic() < deadline:
        time.sleep(0.01)
    built.stop()
    assert built.latest is not None and len(calls) >= 2
    count = registry.get_sample_value("draplugin_usage_sample_duration_seconds_count")
    assert count is not None and count >= 1


@pytest.mark.parametrize("reason", ["NotSupported", "GpuIsLost"])
def test_errors_reported_in_a_reading_are_counted(reason: str) -> None:
    class Partial(ScriptedSource):
        def read(self, device: Device) -> DeviceReading:
            return DeviceReading(gpu_ratio=0.1, errors=(reason,))

    built, registry = sampler(Partial(), gpus=1)
    built.sample_once()
    assert errors(registry, "gpu-0", reason) == 1.0
