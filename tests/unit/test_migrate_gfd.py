"""The GFD label table: every translatable row compiles in our CEL layer and selects exactly the
fake devices whose node GFD would have labelled that way.

The labels a node would carry are computed here the way GFD computes them (internal/lm in
k8s-device-plugin: spaces in the NVML name as "-", memory in MiB rounded down, family from the
compute capability, driver version split at dots with the text kept), independently of the
table's inverse encodings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controller.cel import compile_selector
from controller.migrate import gfd
from draplugin.devices.fake import (
    DEFAULT_CUDA_DRIVER_VERSION,
    DEFAULT_DRIVER_VERSION,
    MODELS,
    FakeBackend,
    parse_config,
)

DRIVER = "gpu.draplugin.dev"
MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
RELEASES = [(1, 34), (1, 37)]


def gfd_family(major: int, minor: int) -> str:
    by_major = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return by_major.get(major, "undefined")


def gfd_labels(model: str) -> dict[str, str]:
    """The node labels GFD writes for a node with this fake model (and the fake driver)."""
    info = MODELS[model]
    driver = DEFAULT_DRIVER_VERSION.split(".")
    cuda = DEFAULT_CUDA_DRIVER_VERSION.split(".")
    major, minor = info.compute_capability
    return {
        "nvidia.com/gpu.product": info.product_name.replace(" ", "-"),
        "nvidia.com/gpu.memory": str(info.memory_bytes // MiB),
        "nvidia.com/gpu.family": gfd_family(major, minor),
        "nvidia.com/gpu.compute.major": str(major),
        "nvidia.com/gpu.compute.minor": str(minor),
        "nvidia.com/cuda.driver.major": driver[0],
        "nvidia.com/cuda.driver.minor": driver[1],
        "nvidia.com/cuda.driver.rev": driver[2],
        "nvidia.com/cuda.driver-version.major": driver[0],
        "nvidia.com/cuda.driver-version.minor": driver[1],
        "nvidia.com/cuda.driver-version.revision": driver[2],
        "nvidia.com/cuda.driver-version.full": DEFAULT_DRIVER_VERSION,
        "nvidia.com/cuda.runtime.major": cuda[0],
        "nvidia.com/cuda.runtime.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
        "nvidia.com/cuda.runtime-version.full": DEFAULT_CUDA_DRIVER_VERSION,
    }


def devices_of(config: dict[str, Any]) -> list[dict[str, Any]]:
    backend = FakeBackend("node-a", parse_config(config))
    return [device.to_api() for device in backend.discover()]


def whole_gpu(model: str, **extra: Any) -> dict[str, Any]:
    (device,) = devices_of({"gpus": [{"model": model}], **extra})
    return device


TRANSLATABLE_KEYS = [key for row in gfd.ROWS if row.translatable for key in row.keys]


def test_every_translatable_label_has_a_gfd_value_here() -> None:
    assert set(TRANSLATABLE_KEYS) == set(gfd_labels("H100-80GB-HBM3"))


@pytest.mark.parametrize("key", TRANSLATABLE_KEYS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_row_selects_the_model_it_labels(key: str, model: str) -> None:
    value = gfd_labels(model)[key]
    term = gfd.translate(key, gfd.EQUALS, [value])
    assert term is not None
    for release in RELEASES:
        selector = compile_selector(term.cel, kubernetes_version=release)
        assert selector.matches(DRIVER, whole_gpu(model)), (key, value, term.cel)
    # Not a device whose node GFD would label differently.
    others = [m for m in sorted(MODELS) if gfd_labels(m)[key] != value]
    for other in others:
        assert not compile_selector(term.cel).matches(DRIVER, whole_gpu(other)), (key, value, other)


@pytest.mark.parametrize(
    ("key", "value", "other_driver"),
    [
        ("nvidia.com/cuda.driver.major", "570", "570.86.15"),
        ("nvidia.com/cuda.driver.rev", "06", "580.65.10"),
        ("nvidia.com/cuda.driver-version.full", "570.86.15", "570.86.15"),
        ("nvidia.com/cuda.runtime.minor", "8", "12.8"),
    ],
)
def test_version_rows_follow_the_driver(key: str, value: str, other_driver: str) -> None:
    """A label value the default fake driver does not have matches a node with that driver."""
    term = gfd.translate(key, gfd.EQUALS, [value])
    assert term is not None
    selector = compile_selector(term.cel)
    field = "cudaDriverVersion" if "runtime" in key else "driverVersion"
    matching = whole_gpu("L4", **{field: other_driver})
    if key.endswith(".rev"):
        # 06 is the default driver's revision; 580.65.10 has revision 10.
        assert selector.matches(DRIVER, whole_gpu("L4"))
        assert not selector.matches(DRIVER, matching)
    else:
        assert selector.matches(DRIVER, matching)
        assert not selector.matches(DRIVER, whole_gpu("L4"))


def test_memory_comparisons_are_in_mib_rounded_down() -> None:
    h100 = whole_gpu("H100-80GB-HBM3")  # 81559 MiB exactly
    one_byte_short = whole_gpu("H100-80GB-HBM3")
    one_byte_short["capacity"]["memory"]["value"] = str(81559 * MiB - 1)  # GFD: 81558
    cases = [
        ("Gt", "81558", True, False),
        ("Gt", "81559", False, False),
        ("Lt", "81559", False, True),
        ("Lt", "81560", True, True),
    ]
    for op, value, on_h100, on_short in cases:
        term = gfd.translate("nvidia.com/gpu.memory", op, [value])
        assert term is not None
        selector = compile_selector(term.cel)
        assert selector.matches(DRIVER, h100) is on_h100, (op, value)
        assert selector.matches(DRIVER, one_byte_short) is on_short, (op, value)
    equal = gfd.translate("nvidia.com/gpu.memory", gfd.EQUALS, ["81558"])
    assert equal is not None
    assert compile_selector(equal.cel).matches(DRIVER, one_byte_short)
    assert not compile_selector(equal.cel).matches(DRIVER, h100)


def test_mig_product_selects_that_profile_only() -> None:
    devices = devices_of({"gpus": [{"model": "A100-SXM4-80GB", "mig": ["1g.10gb", "2g.20gb"]}]})
    term = gfd.translate("nvidia.com/gpu.product", gfd.EQUALS, ["NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"])
    assert term is not None and term.mig
    selector = compile_selector(term.cel)
    matched = [d["name"] for d in devices if selector.matches(DRIVER, d)]
    assert matched == ["gpu-0-mig-1g10gb-0"]
    whole = gfd.translate("nvidia.com/gpu.product", gfd.EQUALS, ["NVIDIA-A100-SXM4-80GB"])
    assert whole is not None and not whole.mig
    # A whole-GPU device of the same model has no profile attribute: the guard keeps that a non-match.
    assert not selector.matches(DRIVER, whole_gpu("A100-SXM4-80GB"))


def test_shared_suffix_is_dropped_with_a_note() -> None:
    term = gfd.translate("nvidia.com/gpu.product", gfd.EQUALS, ["NVIDIA-L4-SHARED"])
    assert term is not None and "SHARED" in term.note
    assert compile_selector(term.cel).matches(DRIVER, whole_gpu("L4"))


def test_in_and_not_in() -> None:
    term = gfd.translate("nvidia.com/gpu.product", "In", ["NVIDIA-L4", "Tesla-T4"])
    negated = gfd.translate("nvidia.com/gpu.product", "NotIn", ["NVIDIA-L4", "Tesla-T4"])
    assert term is not None and negated is not None
    for model, expected in (("L4", True), ("T4", True), ("H200", False)):
        assert compile_selector(term.cel).matches(DRIVER, whole_gpu(model)) is expected
        assert compile_selector(negated.cel).matches(DRIVER, whole_gpu(model)) is not expected


def test_exists_needs_no_selector() -> None:
    assert gfd.translate("nvidia.com/gpu.product", "Exists", []) is None


@pytest.mark.parametrize(
    ("key", "operator", "values", "message"),
    [
        ("nvidia.com/gpu.family", "=", ["blackwell-ultra"], "not one GFD derives"),
        ("nvidia.com/gpu.memory", "=", ["lots"], "not an integer"),
        ("nvidia.com/gpu.count", "=", ["8"], "no device equivalent"),
        ("nvidia.com/mig.strategy", "=", ["single"], "no device equivalent"),
        ("nvidia.com/mig-1g.10gb.count", "=", ["7"], "no device equivalent"),
        ("nvidia.com/gpu.product", "Gt", ["3"], "only an integer label"),
        ("nvidia.com/gpu.product", "DoesNotExist", [], "no device matches"),
        ("nvidia.com/gpu.product", "=", [""], "empty product"),
        ("nvidia.com/gpu.foo", "=", ["x"], "not a GPU Feature Discovery label"),
        ("nvidia.com/cuda.driver-version.full", "=", ["r580"], "not a version"),
    ],
)
def test_untranslatable_requirements_say_why(
    key: str, operator: str, values: list[str], message: str
) -> None:
    with pytest.raises(gfd.LabelError, match=message):
        gfd.translate(key, operator, values)


@pytest.mark.parametrize("row", [r for r in gfd.ROWS if r.translatable], ids=lambda r: r.label)
def test_table_example_compiles_on_every_release(row: gfd.Row) -> None:
    assert row.equals is not None
    for release in RELEASES:
        compile_selector(row.equals(row.example).cel, kubernetes_version=release)
    if row.ordered is not None:
        for op in gfd.ORDERED_OPERATORS:
            compile_selector(row.ordered(op, 5), kubernetes_version=(1, 34))


def test_docs_table_is_generated_from_the_module() -> None:
    doc = (REPO / "docs" / "migration.md").read_text(encoding="utf-8")
    assert gfd.with_current_table(doc) == doc, (
        "docs/migration.md's GFD table is stale: run "
        ".venv/bin/python -m controller.migrate.gfd docs/migration.md"
    )
    for row in gfd.ROWS:
        assert f"`{row.label}`" in doc
