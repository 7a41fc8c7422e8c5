"""lint's selector findings, judged in the scheduler's evaluation order: compile errors with
position, runtime errors and unguarded reads only on devices a selector is really evaluated
on (class selectors first, then the request's, first non-match stops), no match, unknown
attributes, unknown classes, templates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.allocation.nodes import Node
from controller.cli import main
from controller.lint.linter import Finding, lint
from controller.lint.reads import attribute_reads, is_guarded
from controller.objects import ClusterObjects
from controller.scheduler.allocator import allocate

D = "gpu.draplugin.dev"
SLICES = [
    resource_slice(
        "s", [device("g0", {"model": "H100", "mig": True}), device("g1", {"model": "A100"})], node="n"
    )
]
# A whole GPU and two MIG devices: only the MIG devices have `profile`.
MIXED = [
    resource_slice(
        "m",
        [
            device("gpu-0", {"type": "gpu"}),
            device("mig-0", {"type": "mig", "profile": "1g.10gb"}),
            device("mig-1", {"type": "mig", "profile": "2g.20gb"}),
        ],
        node="n",
    )
]
TYPE_MIG = f'device.attributes["{D}"].type == "mig"'
PROFILE_1G = f'device.attributes["{D}"].profile == "1g.10gb"'


def findings(
    classes: Sequence[dict[str, Any]],
    claims: Sequence[dict[str, Any]] = (),
    slices: Sequence[dict[str, Any]] = SLICES,
) -> list[Finding]:
    return lint(
        ClusterObjects(device_classes=list(classes), claims=list(claims), slices=list(slices))
    ).findings


def codes(classes: Sequence[dict[str, Any]], claims: Sequence[dict[str, Any]] = ()) -> list[str]:
    return [f.code for f in findings(classes, claims)]


def test_compile_error_has_line_and_column() -> None:
    report = lint(
        ClusterObjects(device_classes=[device_class("bad", ["device.driver ==\n  == 1"])], slices=SLICES)
    )
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
    [unguarded, runtime] = findings([device_class("mig", [f'device.attributes["{D}"].mig'])])
    assert (unguarded.code, runtime.code) == ("unguarded-attribute", "runtime-error")
    assert (runtime.severity, runtime.where) == ("error", "selector #0")
    assert "device g1 of gpu.draplugin.dev: no such key: mig" in runtime.message
    assert "exists on 1 of the 2 devices" in unguarded.message


def test_guarded_optional_attribute_is_clean() -> None:
    guarded = f'"mig" in device.attributes["{D}"] && device.attributes["{D}"].mig'
    assert codes([device_class("mig", [guarded])]) == []


def test_request_selector_runs_only_on_devices_its_class_admits() -> None:
    # Example 08's shape: the class admits MIG devices only, so the request's unguarded read of
    # `profile` never meets the whole GPU, which lacks it (the scheduler stops at the class).
    mig_class = device_class("mig", [TYPE_MIG])
    mig_claim = claim("c", [exactly("mig", "mig", selectors=[PROFILE_1G])])
    assert findings([mig_class], [mig_claim], MIXED) == []
    # The same request under a class that admits the whole GPU too fails on it, as allocation would.
    found = findings(
        [device_class("any")], [claim("c", [exactly("mig", "any", selectors=[PROFILE_1G])])], MIXED
    )
    assert [(f.object, f.where, f.code) for f in found] == [
        ("ResourceClaim/default/c", "request mig, selector #0", "unguarded-attribute"),
        ("ResourceClaim/default/c", "request mig, selector #0", "runtime-error"),
    ]
    assert "exists on 2 of the 3 devices" in found[0].message
    assert "fails on 1 of the 3 devices" in found[1].message and "gpu-0" in found[1].message


def test_a_request_selector_runs_only_where_the_ones_before_it_matched() -> None:
    ordered = claim("c", [exactly("mig", "any", selectors=[TYPE_MIG, PROFILE_1G])])
    assert findings([device_class("any")], [ordered], MIXED) == []
    reversed_order = claim("c", [exactly("mig", "any", selectors=[PROFILE_1G, TYPE_MIG])])
    found = findings([device_class("any")], [reversed_order], MIXED)
    assert ("request mig, selector #0", "runtime-error") in [(f.where, f.code) for f in found]


def test_class_selectors_run_in_order_too() -> None:
    assert findings([device_class("mig-1g", [TYPE_MIG, PROFILE_1G])], slices=MIXED) == []
    found = findings([device_class("mig-1g", [PROFILE_1G, TYPE_MIG])], slices=MIXED)
    assert [(f.object, f.where, f.code) for f in found] == [
        ("DeviceClass/mig-1g", "selector #0", "unguarded-attribute"),
        ("DeviceClass/mig-1g", "selector #0", "runtime-error"),
    ]


def test_a_class_runtime_error_is_reported_on_the_class_not_on_each_request() -> None:
    broken_class = device_class("mig-1g", [PROFILE_1G])
    found = findings([broken_class], [claim("c", [exactly("gpu", "mig-1g")])], MIXED)
    assert {f.object for f in found} == {"DeviceClass/mig-1g"}


def test_a_read_guarded_by_an_earlier_test_in_the_same_expression_is_not_flagged() -> None:
    # No has() for the textual check to see, but the type test turns the whole GPU away first.
    guarded_by_type = f"{TYPE_MIG} && {PROFILE_1G}"
    assert findings([device_class("mig-1g", [guarded_by_type])], slices=MIXED) == []


@pytest.mark.parametrize(
    ("class_selectors", "request_selectors"),
    [
        ([TYPE_MIG], [PROFILE_1G]),
        ([], [PROFILE_1G]),
        ([PROFILE_1G, TYPE_MIG], []),
        ([TYPE_MIG, PROFILE_1G], []),
        ([], [TYPE_MIG, PROFILE_1G]),
    ],
)
def test_lint_runtime_errors_are_exactly_the_allocators_cel_errors(
    class_selectors: list[str], request_selectors: list[str]
) -> None:
    # MIXED lists the whole GPU first, so the allocator's first-fit search meets it before any
    # MIG device: a selector that can fail on it does fail there (lint says "can", per device).
    classes = [device_class("c", class_selectors)]
    claims = [claim("x", [exactly("r", "c", selectors=request_selectors)])]
    linted = any(f.code == "runtime-error" for f in findings(classes, claims, MIXED))
    outcome = allocate(claims, device_classes=classes, slices=MIXED, node=Node("n"))
    failed_on_cel = outcome.failure is not None and "CEL runtime error" in outcome.failure.message
    assert linted == failed_on_cel


def test_claim_selector_combined_with_class_selector_for_matching() -> None:
    classes = [device_class("h100", [f'device.attributes["{D}"].model == "H100"'])]
    claims = [claim("c", [exactly("gpu", "h100", selectors=[f'device.attributes["{D}"].model == "A100"'])])]
    [finding] = findings(classes, claims)
    assert (finding.object, finding.code) == ("ResourceClaim/default/c", "no-match")
    assert "none of the 1 devices that class h100 selects" in finding.message


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
    found = json.loads(capsys.readouterr().out)["findings"]
    assert [(f["object"], f["code"], f["where"]) for f in found] == [
        ("ResourceClaimTemplate/ns/t", "compile-error", "request gpu, selector #0"),
        ("ResourceClaimTemplate/ns/t", "unknown-class", "request x"),
    ]


def test_release_decides_the_cel_environment(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # ext.Lists' sort() is undeclared before 1.35: a compile error there, fine on 1.35.
    sorting = f'[device.attributes["{D}"].model].sort()[0] == "H100"'
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all([device_class("c", [sorting]), *SLICES]))
    assert main(["lint", "--objects", str(tmp_path), "--kubernetes-version", "1.35"]) == 0
    capsys.readouterr()
    assert main(["lint", "--objects", str(tmp_path), "--kubernetes-version", "1.34"]) == 1
    assert "[compile-error]" in capsys.readouterr().out
