"""Fake MIG devices report only what real NVML reports for a MIG device.

What NVML gives (nvml.h, and the NVML double in tests/cluster/nvmldouble that mirrors it:
`nvmlDeviceGetUtilizationRates`, `nvmlDeviceGetProcessUtilization`, power, temperature, ECC and
clock-event reasons take whole-GPU handles only, and answer NOT_SUPPORTED on a MIG-enabled GPU;
memory info and running processes are per MIG device): a MIG device's memory and processes, no
utilization, no power, temperature, ECC or throttle figures. A dashboard tried on fake GPUs must
not show MIG utilization that real GPUs never will.
"""

from __future__ import annotations

from pathlib import Path

from draplugin.devices.fake import FakeBackend, parse_config
from draplugin.devices.schema import KIND_GPU
from draplugin.usage.fakesource import FakeUsageSource


def _backend() -> FakeBackend:
    gpus = [
        {"model": "A100-SXM4-40GB", "mig": ["3g.20gb", "2g.10gb"], "usage": {"busyPercent": 60}},
        {"model": "A100-SXM4-40GB", "usage": {"busyPercent": 60}},
    ]
    return FakeBackend("node-1", parse_config({"gpus": gpus}))


def test_a_fake_mig_device_has_memory_but_no_utilization_power_temperature_or_ecc() -> None:
    fake = _backend()
    source = FakeUsageSource(fake, clock=lambda: 1_700_000_000.0)
    migs = [d for d in fake.discover() if d.kind != KIND_GPU]
    assert len(migs) == 2
    for device in migs:
        reading = source.read(device)
        assert (reading.gpu_ratio, reading.memory_ratio) == (None, None)
        assert (reading.power_watts, reading.temperature_celsius) == (None, None)
        assert (reading.ecc_corrected, reading.ecc_uncorrected, reading.throttle) == (None, None, {})
        assert reading.memory_total_bytes and reading.memory_used_bytes is not None
        assert 0 < reading.memory_used_bytes <= reading.memory_total_bytes


def test_a_whole_fake_gpu_still_reports_utilization() -> None:
    fake = _backend()
    source = FakeUsageSource(fake, clock=lambda: 1_700_000_000.0)
    (gpu,) = [d for d in fake.discover() if d.kind == KIND_GPU]
    reading = source.read(gpu)
    assert reading.gpu_ratio is not None and reading.power_watts is not None


def test_processes_on_a_fake_mig_device_carry_memory_and_no_sm_figure(tmp_path: Path) -> None:
    fake = _backend()
    mig = next(d for d in fake.discover() if d.kind != KIND_GPU)
    processes = tmp_path / "processes.yaml"
    processes.write_text(f"{mig.name}:\n  - {{pid: 4242, smPercent: 30, memory: 2Gi}}\n")
    reading = FakeUsageSource(fake, processes).read(mig)
    assert reading.gpu_ratio is None
    assert [(p.pid, p.sm_ratio, p.memory_bytes) for p in reading.processes] == [(4242, None, 2 << 30)]
    assert reading.memory_used_bytes == 2 << 30


def test_a_fake_mig_device_reports_its_unsupported_calls_once_as_nvml_source_does() -> None:
    """NvmlUsageSource records NotSupported once per call a device does not support and never
    tries that call again: utilization, power, temperature, ECC, clock reasons, process samples."""
    fake = _backend()
    source = FakeUsageSource(fake, clock=lambda: 1_700_000_000.0)
    first, second = [d for d in fake.discover() if d.kind != KIND_GPU]
    assert source.read(first).errors == ("NotSupported",) * 6
    assert source.read(first).errors == ()
    assert source.read(second).errors == ("NotSupported",) * 6
