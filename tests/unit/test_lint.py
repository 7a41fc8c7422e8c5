"""lint findings: compile errors with position, no match, unknown and unguarded attributes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.cli import main
from controller.lint import attribute_reads, is_guarded, lint

D = "gpu.draplugin.dev"
SLICES = [
    resource_slice(
        "s", [device("g0", {"model": "H100", "mig": True}), device("g1", {"model": "A100"})], node="n"
    )
]


def codes(classes: list[dict[str, object]], claims: list[dict[str, object]] | None = None) -> list[str]:
    return [f.code for f in lint(classes, claims or [], SLICES).findings]


def test_compile_error_has_line_and_column() -> None:
    report = lint([device_class("bad", ["device.driver ==\n  == 1"])], [], SLICES)
    [finding] = report.findings
    assert finding.code == "compile-error"
    assert (finding.line, finding.column) == (2, 3)
    assert report.errors == 1


def test_selector_matching_nothing_is_a_warning() -> None:
    assert codes([device_class("b200", [f'device.attributes["{D}"].model == "B200"'])]) == ["no-match"]


def test_attribute_no_device_has() -> None:
    found = codes(
        [device_class("c", [f'has(device.attributes["{D}"].memory) && device.attributes["{D}"].memory > 1'])]
    )
    assert "unknown-attribute" in found


def test_unguarded_optional_attribute_and_its_runtime_error() -> None:
    found = codes([device_class("mig", [f'device.attributes["{D}"].mig'])])
    assert found == ["unguarded-attribute", "runtime-error"]


def test_guarded_optional_attribute_is_clean() -> None:
    guarded = f'"mig" in device.attributes["{D}"] && device.attributes["{D}"].mig'
    assert codes([device_class("mig", [guarded])]) == []


def test_claim_selector_combined_with_class_selector_for_matching() -> None:
    classes = [device_class("h100", [f'device.attributes["{D}"].model == "H100"'])]
    claims = [claim("c", [exactly("gpu", "h100", selectors=[f'device.attributes["{D}"].model == "A100"'])])]
    findings = lint(classes, claims, SLICES).findings
    assert [(f.object, f.code) for f in findings] == [("ResourceClaim/default/c", "no-match")]


def test_unknown_class_in_claim() -> None:
    assert codes([], [claim("c", [exactly("gpu", "nope")])]) == ["unknown-class"]


def test_read_extraction_and_guards() -> None:
    expression = (
        f'device.attributes["{D}"].a && device.capacity["{D}"]["mem"] > 0 && device.attributes["{D}"].?b'
    )
    assert attribute_reads(expression) == [
        ("attributes", D, "a"),
        ("capacity", D, "mem"),
        ("attributes", D, "b"),
    ]
    assert is_guarded(expression, "attributes", D, "b")
    assert not is_guarded(expression, "attributes", D, "a")


def test_templates_are_linted_like_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "spec": claim("t", [exactly("gpu", selectors=["device.driver =="]), exactly("x", "absent")])[
                "spec"
            ]
        },
    }
    same_name_claim = claim("t", [exactly("gpu")], namespace="ns")
    (tmp_path / "objects.yaml").write_text(
        yaml.safe_dump_all([device_class("gpu"), *SLICES, broken, same_name_claim])
    )
    assert main(["lint", "--objects", str(tmp_path), "-o", "json"]) == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["object"], f["code"], f["where"]) for f in findings] == [
        ("ResourceClaimTemplate/ns/t", "compile-error", "request gpu, selector #0"),
        ("ResourceClaimTemplate/ns/t", "unknown-class", "request x"),
    ]
