"""Fake GPU usage: deterministic moving waves, idle devices, the `usage` key, the process file."""

from __future__ import annotations

from pathlib import Path

import pytest

from draplugin.devices.fake import FakeBackend, FakeConfigError, config_from_flags, parse_config
from draplugin.devices.fakeusage import IDLE_USAGE, FakeUsage, default_usage
from draplugin.usage.fakesource import FakeProcessFileError, FakeUsageSource, parse_processes
from draplugin.usage.reading import ProcessUsage

GiB = 1 << 30


def backend(gpus: list[dict[str, object]]) -> FakeBackend:
    return FakeBackend("node-1", parse_config({"gpus": gpus}))


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_utilization_moves_over_time_and_is_the_same_at_the_same_time() -> None:
    clock = Clock()
    fake = FakeBackend("node-1", config_from_flags(2, "H100-80GB-HBM3"))
    source = FakeUsageSource(fake, clock=clock)
    gpu0, gpu1 = fake.discover()
    first = [source.read(d).gpu_ratio for d in (gpu0, gpu1)]
    again = FakeUsageSource(FakeBackend("node-1", config_from_flags(2, "H100-80GB-HBM3")), clock=clock)
    assert [again.read(d).gpu_ratio for d in (gpu0, gpu1)] == first
    assert first[0] != first[1]  # GPUs differ from each other
    clock.now += 60
    assert source.read(gpu0).gpu_ratio != first[0]  # and move
    for t in range(0, 3600, 37):
        clock.now += t
        ratio = source.read(gpu0).gpu_ratio
        assert ratio is not None and 0.0 <= ratio <= 1.0


def test_a_device_configured_idle_stays_idle() -> None:
    fake = backend([{"model": "L4", "count": 1, "usage": "idle"}, {"model": "L4", "count": 1}])
    idle, _busy = fake.discover()
    clock = Clock()
    source = FakeUsageSource(fake, clock=clock)
    for _ in range(50):
        clock.now += 17
        assert source.read(idle).gpu_ratio == 0.0
    assert fake.usage_of(0) == IDLE_USAGE
    assert fake.usage_of(1) == default_usage(1)


def test_the_usage_key_sets_the_wave() -> None:
    fake = backend([{"model": "L4", "usage": {"busyPercent": 60, "swingPercent": 0, "memoryPercent": 25}}])
    (gpu,) = fake.discover()
    reading = FakeUsageSource(fake, clock=Clock()).read(gpu)
    assert reading.gpu_ratio == pytest.approx(0.6)
    assert reading.memory_total_bytes == 23034 * (1 << 20)
    assert reading.memory_used_bytes == int(reading.memory_total_bytes * 0.25)
    assert reading.power_watts is not None and reading.temperature_celsius is not None


@pytest.mark.parametrize(
    ("usage", "message"),
    [
        ("busy", "must be 'idle' or a mapping"),
        ({"busyPercent": 120}, "busyPercent: must be a number from 0 to 100"),
        ({"busyPercent": True}, "busyPercent: must be a number"),
        ({"period": "soon"}, "period: 'soon'"),
        ({"period": "0s"}, "period: must be longer than 0s"),
        ({"speed": 3}, "unknown keys: speed"),
    ],
)
def test_bad_usage_is_refused_naming_the_entry(usage: object, message: str) -> None:
    with pytest.raises(FakeConfigError, match=r"gpus\[0\]\.usage") as caught:
        parse_config({"gpus": [{"model": "L4", "usage": usage}]})
    assert message in str(caught.value)


def test_the_process_file_drives_the_device_and_is_reread_when_it_changes(tmp_path: Path) -> None:
    fake = FakeBackend("node-1", config_from_flags(2, "H100-80GB-HBM3"))
    gpu0, gpu1 = fake.discover()
    path = tmp_path / "fake-processes.yaml"
    path.write_text("gpu-0:\n  - {pid: 101, smPercent: 30, memory: 2Gi}\n  - {pid: 202, smPercent: 10}\n")
    source = FakeUsageSource(fake, path, clock=Clock())
    reading = source.read(gpu0)
    assert reading.processes == (ProcessUsage(101, 0.3, 2 * GiB), ProcessUsage(202, 0.1, 0))
    assert reading.gpu_ratio == pytest.approx(0.4)
    assert reading.memory_used_bytes == 2 * GiB
    assert source.read(gpu1).processes == ()
    path.write_text("gpu-1:\n  - {pid: 303, smPercent: 100, memory: 1Gi}\n")
    assert source.read(gpu0).processes == ()
    assert source.read(gpu1).gpu_ratio == 1.0


def test_a_broken_process_file_keeps_the_last_good_one(tmp_path: Path) -> None:
    fake = FakeBackend("node-1", config_from_flags(1, "H100-80GB-HBM3"))
    (gpu,) = fake.discover()
    path = tmp_path / "p.yaml"
    path.write_text("gpu-0: [{pid: 5, smPercent: 50}]\n")
    source = FakeUsageSource(fake, path, clock=Clock())
    assert source.read(gpu).processes == (ProcessUsage(5, 0.5, 0),)
    path.write_text("gpu-0: [{pid: -1}]   # a bad pid\n")
    assert source.read(gpu).processes == (ProcessUsage(5, 0.5, 0),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "top level must map device names"),
        ({"gpu-0": {"pid": 1}}, "want `device-name:"),
        ({"gpu-0": [{"pid": "x"}]}, "gpu-0[0].pid: must be a positive integer"),
        ({"gpu-0": [{"pid": 1, "smPercent": 101}]}, "smPercent: must be a number from 0 to 100"),
        ({"gpu-0": [{"pid": 1, "memory": "lots"}]}, "gpu-0[0].memory"),
        ({"gpu-0": [{"pid": 1, "cpu": 3}]}, "want a mapping of pid, smPercent and memory"),
    ],
)
def test_bad_process_files_are_refused_naming_the_entry(data: object, message: str) -> None:
    with pytest.raises(FakeProcessFileError) as caught:
        parse_processes(data)
    assert message in str(caught.value)


def test_wave_is_clamped_to_0_and_1() -> None:
    wave = FakeUsage(busy_percent=90, swing_percent=50, period_s=100, memory_percent=10)
    values = [wave.sm_ratio(0.0, t) for t in range(100)]
    assert max(values) == 1.0 and min(values) == pytest.approx(0.4, abs=0.01)
