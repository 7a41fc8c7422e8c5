"""The node daemon runs the usage sampler while it runs, and stops it (and its series) with itself."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from draplugin.config import Settings
from draplugin.devices.health import HealthTracker
from draplugin.devices.model import DeviceBackend
from draplugin.kubelet.interface import Driver
from draplugin.usage.wiring import UsageService, build_usage
from tests.unit.test_node import FakeSliceApi, daemon, root, settings_for, wait_until

__all__ = ["root"]  # the fixture, used by name


async def test_the_sampler_runs_with_the_daemon_and_its_series_go_with_it(root: Path) -> None:
    registry = CollectorRegistry()
    built: list[UsageService] = []

    def factory(
        settings: Settings, backend: DeviceBackend, driver: Driver, tracker: HealthTracker
    ) -> UsageService:
        service = build_usage(
            settings, backend, records=list, tracker=tracker, api=None, events=None, registry=registry
        )
        assert service is not None
        built.append(service)
        return service

    api = FakeSliceApi()
    node = daemon(settings_for(root, usage_sample_interval="0.05s"), api, usage_factory=factory)
    await node.start()
    try:
        (service,) = built
        await wait_until(lambda: service.sampler.latest is not None, "a first usage pass")
        text = generate_latest(registry).decode()
        assert 'draplugin_device_gpu_utilization_ratio{device="gpu-3"' in text
    finally:
        await node.stop()
        api.closed.set()
    assert "draplugin_device_gpu_utilization_ratio" not in generate_latest(registry).decode()


async def test_interval_0_runs_no_sampler(root: Path) -> None:
    def factory(settings: Settings, backend: DeviceBackend, driver: Driver, tracker: HealthTracker) -> None:
        assert build_usage(settings, backend, records=list, tracker=tracker, api=None, events=None) is None

    api = FakeSliceApi()
    node = daemon(settings_for(root, usage_sample_interval="0"), api, usage_factory=factory)
    assert node.usage is None
    api.closed.set()
