"""Prepare's config values (`gpuconfig`) beside the one validator (`claimconfig`'s pydantic model)
and the checkpoint's reading of them (`storedconfig`).

The values mirror the model field for field; a plugin whose claims carry no opaque config plans,
prepares and recovers without importing pydantic; a stored default config is read without the
validator, and every other document gets the validator's own answer.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dracommon.drivername import config_api_version
from draplugin.prepare import claimconfig, gpuconfig
from draplugin.prepare.claimconfig import validate_opaque_config
from draplugin.prepare.gpuconfig import (
    ConfigError,
    GpuConfig,
    MpsConfig,
    Sharing,
    SharingStrategy,
    TimeSliceInterval,
    TimeSlicingConfig,
    default_config,
)
from draplugin.prepare.storedconfig import read_stored_config

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
API_VERSION = config_api_version(DRIVER)

PAIRS: list[tuple[type[BaseModel], type[Any]]] = [
    (claimconfig.GpuConfig, GpuConfig),
    (claimconfig.Sharing, Sharing),
    (claimconfig.MpsConfig, MpsConfig),
    (claimconfig.TimeSlicingConfig, TimeSlicingConfig),
]


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _model_default(model: type[BaseModel], name: str) -> Any:
    info = model.model_fields[name]
    if info.is_required():
        return dataclasses.MISSING
    return info.get_default(call_default_factory=True)


@pytest.mark.parametrize(("model", "value"), PAIRS, ids=[v.__name__ for _, v in PAIRS])
def test_each_value_has_the_fields_of_its_model_in_order(model: type[BaseModel], value: type[Any]) -> None:
    assert [f.name for f in dataclasses.fields(value)] == list(model.model_fields)


@pytest.mark.parametrize(("model", "value"), PAIRS, ids=[v.__name__ for _, v in PAIRS])
def test_each_value_field_defaults_as_its_model_field(model: type[BaseModel], value: type[Any]) -> None:
    for field in dataclasses.fields(value):
        if field.name == "kind":
            # Required in a document (it says what it is); the value is only ever a GpuConfig.
            assert _model_default(model, "kind") is dataclasses.MISSING and field.default == gpuconfig.KIND
            continue
        wanted = _model_default(model, field.name)
        got = _default(field)
        if isinstance(wanted, BaseModel):  # a nested model's default: the value of its own defaults
            assert got == claimconfig._value(wanted), field.name
        else:
            assert got == wanted, field.name


def test_the_validator_gives_the_values_with_every_field_set() -> None:
    mps = validate_opaque_config(
        {
            "apiVersion": API_VERSION,
            "kind": "GpuConfig",
            "sharing": {
                "strategy": "MPS",
                "mpsConfig": {
                    "defaultActiveThreadPercentage": 30,
                    "defaultPinnedDeviceMemoryLimit": "1Gi",
                    "perDevicePinnedMemoryLimit": {"gpu-1": "2Gi"},
                },
            },
        },
        "p",
        api_version=API_VERSION,
    )
    assert mps == GpuConfig(
        api_version=API_VERSION,
        sharing=Sharing(
            strategy=SharingStrategy.MPS,
            mps=MpsConfig(
                default_active_thread_percentage=30,
                default_pinned_device_memory_limit=1 << 30,
                per_device_pinned_memory_limit={"gpu-1": 2 << 30},
            ),
        ),
    )
    assert hash(mps) == hash(read_stored_config(mps.to_json(), "p", api_version=API_VERSION))
    sliced = validate_opaque_config(
        {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
        "p",
        api_version=API_VERSION,
    )
    assert sliced.sharing == Sharing(
        strategy=SharingStrategy.TIME_SLICING, time_slicing=TimeSlicingConfig(TimeSliceInterval.DEFAULT)
    )
    assert type(sliced.sharing.time_slicing) is TimeSlicingConfig


# Stored documents: the default's canonical form, and near ones that are not (or not only) it.
STORED: list[Any] = [
    default_config(API_VERSION).to_json(),
    {"apiVersion": API_VERSION, "kind": "GpuConfig"},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {}},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Exclusive", "mpsConfig": {}}},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Exclusive"}, "extra": 1},
    {"apiVersion": "gpu.other.dev/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Exclusive"}},
    {"apiVersion": API_VERSION, "kind": "TpuConfig", "sharing": {"strategy": "Exclusive"}},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "exclusive"}},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing"}},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": ["Exclusive"]},
    {"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": SharingStrategy.EXCLUSIVE}},
]


def _answer(read: Any, doc: Any) -> Any:
    try:
        return read(doc)
    except ConfigError as err:
        return str(err)


@pytest.mark.parametrize("doc", STORED)
def test_a_stored_config_reads_as_the_validator_reads_it(doc: Any) -> None:
    def stored(d: Any) -> GpuConfig:
        return read_stored_config(d, "checkpoint", api_version=API_VERSION)

    def validated(d: Any) -> GpuConfig:
        return validate_opaque_config(d, "checkpoint", api_version=API_VERSION)

    assert _answer(stored, doc) == _answer(validated, doc)


def test_only_the_canonical_default_document_skips_the_validator(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def counting(parameters: Any, path: str, *, api_version: str) -> GpuConfig:
        calls.append(parameters)
        return validate_opaque_config(parameters, path, api_version=api_version)

    monkeypatch.setattr(claimconfig, "validate_opaque_config", counting)
    for doc in STORED:
        _answer(lambda d: read_stored_config(d, "checkpoint", api_version=API_VERSION), doc)
    assert calls == STORED[1:]


PLAIN_THEN_OPAQUE = """
import asyncio, sys
from pathlib import Path
from draplugin.prepare.errors import PlanError
from draplugin.prepare.plan import plan_claim
from tests.unit.test_prepare_driver import Node
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, REF, claim_doc, config, gpu_config, result

WATCHED = ("pydantic", "pydantic_core", "draplugin.prepare.claimconfig")

def loaded():
    return sorted(m for m in WATCHED if m in sys.modules)

async def plain(node):
    driver = node.driver()
    for i in range(2):  # the second one is checked against the first's checkpointed config
        ref = node.claims.add(claim_doc(uid=f"uid-{i}", name=f"c{i}", results=[result("gpu", f"gpu-{i}")]))
        assert await driver.prepare_claim(ref)
    for spec in node.cdi_root.glob("*.json"):
        spec.unlink()
    restarted = node.driver(recover=False)
    # Recovery rebuilds both plans from their checkpointed configs.
    assert len(restarted.recover().specs_restored) == 2 and len(node.spec_files()) == 2

asyncio.run(plain(Node(Path(sys.argv[1]))))
print("PLAIN", loaded())
shared = config("FromClaim", gpu_config("Shared"))
try:
    plan_claim(REF, claim_doc(results=[result("gpu", "gpu-0")], configs=[shared]),
               driver=DRIVER, pool=NODE, devices=DEVICES)
except PlanError as err:
    print("REFUSED", err)
mps = gpu_config("MPS", mpsConfig={"defaultActiveThreadPercentage": 20})
plan = plan_claim(REF, claim_doc(results=[result("gpu", "gpu-0")], configs=[config("FromClaim", mps)]),
                  driver=DRIVER, pool=NODE, devices=DEVICES)
print("MPS", plan.devices[0].config.sharing.mps.default_active_thread_percentage)
print("OPAQUE", loaded())
"""


def test_a_plugin_without_opaque_configs_never_imports_pydantic(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PLAIN_THEN_OPAQUE, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "PLAIN []" in lines
    assert (
        "REFUSED claim ns/claim: invalid claim config: spec.devices.config[0].opaque.parameters"
        ".sharing.strategy: must be one of Exclusive, TimeSlicing, MPS, got 'Shared'" in lines
    )
    assert "MPS 20" in lines
    assert "OPAQUE ['draplugin.prepare.claimconfig', 'pydantic', 'pydantic_core']" in lines
