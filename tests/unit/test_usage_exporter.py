"""The exporter's output, as Prometheus parses it: the contract's names and labels, nothing stale."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from dracommon import usagenames as names
from draplugin.usage.attribution import PodProcess
from draplugin.usage.exporter import UsageCollector
from draplugin.usage.holders import Holder, PodRef
from draplugin.usage.idle import ClaimIdleness
from draplugin.usage.reading import DeviceReading, ProcessUsage
from draplugin.usage.sampler import DeviceUsage, Snapshot
from draplugin.usage.split import split_device

GiB = 1 << 30
MODEL = "NVIDIA H100 80GB HBM3"
POD_A = PodRef("team-a", "train-a", "uid-a")
POD_B = PodRef("team-a", "train-b", "uid-b")
HOLDER = Holder("team-a", "train", "uid-claim", ("gpu-0",), (POD_A, POD_B))


def snapshot(holders: list[Holder], reading1: DeviceReading | None = None) -> Snapshot:
    reading0 = DeviceReading(
        gpu_ratio=0.6,
        memory_ratio=0.3,
        memory_used_bytes=9 * GiB,
        memory_total_bytes=80 * GiB,
        power_watts=310.5,
        temperature_celsius=61.0,
        ecc_corrected=3,
        ecc_uncorrected=0,
        throttle={"sw_power_cap": True, "gpu_idle": False},
        processes=(
            ProcessUsage(10, 0.3, 4 * GiB),
            ProcessUsage(20, 0.1, 2 * GiB),
            ProcessUsage(30, 0.2, GiB),
        ),
    )
    locate = {10: PodProcess("uid-a"), 20: PodProcess("uid-b")}.get
    devices = [
        DeviceUsage("gpu-0", "GPU-0000", MODEL, reading0, split_device("gpu-0", reading0, holders, locate)),
        DeviceUsage(
            "gpu-1",
            "GPU-1111",
            MODEL,
            reading1,
            split_device("gpu-1", reading1 or DeviceReading(), holders, locate),
        ),
    ]
    claims = [ClaimIdleness(h.namespace, h.name, 0.0, False) for h in holders]
    return Snapshot("node-1", 0.0, tuple(devices), tuple(claims), {"gpu-0": {79: 2}})


def scrape(snap: Snapshot | None) -> list[Sample]:
    registry = CollectorRegistry()
    registry.register(UsageCollector(lambda: snap))
    text = generate_latest(registry).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def named(samples: Iterable[Sample], name: str) -> list[Sample]:
    return [s for s in samples if s.name == name]


def test_every_series_carries_the_contracts_labels() -> None:
    samples = scrape(snapshot([HOLDER]))
    by_name = {s.name for s in samples}
    for metric in names.USAGE_METRICS:
        if metric in (names.SAMPLE_DURATION, names.SAMPLE_ERRORS):
            continue  # the sampler's own metrics, not the snapshot's
        assert metric.exposed in by_name, metric.exposed
        for sample in named(samples, metric.exposed):
            assert set(sample.labels) == set(metric.labels), (metric.exposed, sample.labels)


def test_device_figures_and_the_split_between_two_pods() -> None:
    samples = scrape(snapshot([HOLDER]))
    device = {"node": "node-1", "device": "gpu-0", "uuid": "GPU-0000", "model": MODEL}
    (util,) = named(samples, "draplugin_device_gpu_utilization_ratio")
    assert (util.labels, util.value) == (device, 0.6)
    claim = {s.labels["pod"]: s.value for s in named(samples, "draplugin_claim_gpu_utilization_ratio")}
    assert claim == {"train-a": pytest.approx(0.3), "train-b": pytest.approx(0.1)}
    memory = {s.labels["pod"]: s.value for s in named(samples, "draplugin_claim_memory_used_bytes")}
    assert memory == {"train-a": 4 * GiB, "train-b": 2 * GiB}
    (unattributed,) = named(samples, "draplugin_device_unattributed_gpu_utilization_ratio")
    assert unattributed.value == pytest.approx(0.2)
    ecc = {s.labels["type"]: s.value for s in named(samples, "draplugin_device_ecc_errors_total")}
    assert ecc == {"corrected": 3.0, "uncorrected": 0.0}
    (xid,) = named(samples, "draplugin_device_xid_errors_total")
    assert (xid.labels["xid"], xid.value) == ("79", 2.0)
    throttle = {s.labels["reason"]: s.value for s in named(samples, "draplugin_device_clock_throttle_active")}
    assert throttle == {"sw_power_cap": 1.0, "gpu_idle": 0.0}
    assert named(samples, "draplugin_device_power_watts")[0].value == 310.5


def test_an_unprepared_claims_series_are_gone() -> None:
    assert named(scrape(snapshot([HOLDER])), "draplugin_claim_idle")
    samples = scrape(snapshot([]))
    assert not named(samples, "draplugin_claim_gpu_utilization_ratio")
    assert not named(samples, "draplugin_claim_memory_used_bytes")
    assert not named(samples, "draplugin_claim_idle")
    assert not named(samples, "draplugin_claim_idle_seconds")
    assert named(samples, "draplugin_device_gpu_utilization_ratio")  # the devices stay


def test_values_a_device_did_not_give_are_absent_not_zero() -> None:
    samples = scrape(
        snapshot([HOLDER], reading1=DeviceReading(memory_used_bytes=GiB, memory_total_bytes=8 * GiB))
    )
    gpu1 = [s for s in samples if s.labels.get("device") == "gpu-1"]
    assert {s.name for s in gpu1} == {
        "draplugin_device_memory_used_bytes",
        "draplugin_device_memory_total_bytes",
        "draplugin_device_unattributed_memory_used_bytes",
    }


def test_nothing_before_the_first_pass() -> None:
    assert scrape(None) == []
