"""The usage settings: defaults of the contract, checks, and what the node daemon builds from them."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from draplugin import config
from draplugin.checkpoint import ClaimRecord
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.devices.health import HealthTracker
from draplugin.usage.fakesource import FakeUsageSource
from draplugin.usage.wiring import build_usage


def settings(**flags: str) -> config.Settings:
    return config.load({"node_name": "node-1", "backend": "fake", **flags}, {})


def test_defaults_are_the_contracts() -> None:
    loaded = settings()
    assert loaded.usage_sample_interval_s == 10.0
    assert loaded.idle_threshold_percent == 5.0
    assert loaded.idle_after_s == 1800.0
    assert loaded.usage_proc_root == Path("/proc")


def test_environment_mirrors_and_durations() -> None:
    env = {"USAGE_SAMPLE_INTERVAL": "1m", "IDLE_THRESHOLD_PERCENT": "2.5", "IDLE_AFTER": "45m"}
    loaded = config.load({"node_name": "node-1"}, env)
    assert (loaded.usage_sample_interval_s, loaded.idle_threshold_percent, loaded.idle_after_s) == (
        60,
        2.5,
        2700,
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("idle_threshold_percent", "101", "--idle-threshold-percent (IDLE_THRESHOLD_PERCENT): '101' must be"),
        ("idle_threshold_percent", "lots", "is not a number"),
        ("idle_after", "-5m", "--idle-after (IDLE_AFTER)"),
        ("usage_sample_interval", "often", "--usage-sample-interval (USAGE_SAMPLE_INTERVAL)"),
        ("usage_proc_root", "proc", "--usage-proc-root (USAGE_PROC_ROOT): 'proc' must be an absolute path"),
    ],
)
def test_bad_values_name_the_setting(flag: str, value: str, message: str) -> None:
    with pytest.raises(config.ConfigError) as caught:
        settings(**{flag: value})
    assert message in str(caught.value)


def test_interval_0_builds_no_sampler() -> None:
    backend = FakeBackend("node-1", config_from_flags(1))
    built = build_usage(
        settings(usage_sample_interval="0"),
        backend,
        records=list,
        tracker=HealthTracker("gpu.draplugin.dev"),
        api=None,
        events=None,
        registry=CollectorRegistry(),
    )
    assert built is None


def test_the_fake_backend_gets_the_fake_source_and_the_series_are_served(tmp_path: Path) -> None:
    backend = FakeBackend("node-1", config_from_flags(2))
    registry = CollectorRegistry()
    records: list[ClaimRecord] = []
    service = build_usage(
        settings(state_dir=str(tmp_path)),
        backend,
        records=lambda: records,
        tracker=HealthTracker("gpu.draplugin.dev"),
        api=None,
        events=None,
        registry=registry,
    )
    assert service is not None
    assert isinstance(service.sampler._source, FakeUsageSource)
    service.sampler.sample_once()
    registry.register(service.collector)
    text = generate_latest(registry).decode()
    assert 'draplugin_device_gpu_utilization_ratio{device="gpu-0",model="NVIDIA A100-SXM4-40GB"' in text
    registry.unregister(service.collector)
