"""The CEL corpus generator and its evaluation fleet (tests/celcorpus.py) are what the corpus tests need."""

from __future__ import annotations

from controller.cel import CompileError, EvaluationError, compile_selector
from controller.cel.device import build_view
from tests.celcorpus import FLEET_DRIVER, FLEET_SIZE, corpus, fleet

# resource.k8s.io/v1: at most 32 attributes and capacities per device, 32 results per allocation.
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ALLOCATION_RESULTS = 32


def test_fleet_is_deterministic_and_fits_the_api_limits() -> None:
    devices = fleet()
    assert devices == fleet()
    assert len(devices) == FLEET_SIZE <= MAX_ALLOCATION_RESULTS
    assert len({d["name"] for d in devices}) == len(devices)
    for d in devices:
        attributes, capacity = d["attributes"], d["capacity"]
        assert isinstance(attributes, dict) and isinstance(capacity, dict)
        assert len(attributes) + len(capacity) <= MAX_ATTRIBUTES_AND_CAPACITIES
        assert all("/" in name for name in [*attributes, *capacity]), "every name is qualified"
        build_view(FLEET_DRIVER, d, semver=str, quantity=str)  # the v1 shape: raises when not


def test_fleet_varies_per_device_and_lacks_some_attributes() -> None:
    devices = fleet()
    uuids = {d["attributes"]["gpu.example.com/uuid"]["string"] for d in devices}  # type: ignore[index]
    assert len(uuids) == len(devices)
    versions = {
        d["attributes"]["gpu.example.com/driverVersion"]["version"]  # type: ignore[index]
        for d in devices
        if "gpu.example.com/driverVersion" in d["attributes"]  # type: ignore[operator]
    }
    assert len(versions) >= 3
    assert any("gpu.example.com/productName" not in d["attributes"] for d in devices)  # type: ignore[operator]
    assert any(d.get("allowMultipleAllocations") for d in devices)
    assert not any(d.get("allowMultipleAllocations") for d in fleet(shareable=False))


def test_an_unguarded_read_errs_on_some_devices_only() -> None:
    selector = compile_selector('device.attributes["gpu.example.com"].productName.startsWith("NVIDIA H100")')
    verdicts: list[bool | None] = []
    for d in fleet():
        try:
            verdicts.append(selector.matches(FLEET_DRIVER, d))
        except EvaluationError:
            verdicts.append(None)
    assert {True, False, None} <= set(verdicts)


def test_transform_map_only_when_asked_for() -> None:
    plain = corpus(300)
    assert plain == corpus(300)
    assert not any("transformMap" in e for e in plain)
    with_transforms = corpus(300, transform_map=True)
    assert any(".transformMap(" in e for e in with_transforms)
    assert any(".transformMapEntry(" in e for e in with_transforms)


def test_corpus_expressions_are_mostly_accepted() -> None:
    accepted = 0
    for expression in corpus(100):
        try:
            compile_selector(expression)
            accepted += 1
        except CompileError:
            pass
    assert accepted > 50
