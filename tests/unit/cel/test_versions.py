"""The CEL environment per Kubernetes release: libraries a release lacks are undeclared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.allocation.builders import device, device_class, resource_slice
from controller.cel import ENGINES, CompileError, compile_selector
from controller.cel.versions import VERSION_ENV, environment_version, library_available
from controller.cli import main
from dracommon.kubeversion import VersionError, parse_kubernetes_version, version_from_info
from tests.unit.cel.conformance import CASES, COMPILE, UNSUPPORTED, Case

GATED = [c for c in CASES if c.since is not None]
UNGATED = [c for c in CASES if c.since is None and c.expect != COMPILE]


def _ids(case: Case) -> str:
    return case.expression[:80]


def test_ext_lists_needs_a_1_35_server() -> None:
    # Introduced in upstream's base environment at 1.34; servers check new selectors one release back.
    assert environment_version((1, 35)) == (1, 34)
    assert not library_available("ext.Lists", (1, 34))
    assert library_available("ext.Lists", (1, 35))
    assert library_available("ext.Lists", (1, 37))
    ext_lists = [c for c in GATED if c.since == (1, 35)]
    assert {c.since for c in GATED} == {(1, 35), (1, 38)}
    assert len(ext_lists) == 16


def test_lists_v1_includes_needs_a_1_38_server() -> None:
    # Kubernetes library.Lists v1 joined the base environment at 1.37.
    assert not library_available("library.Lists.v1", (1, 37))
    assert library_available("library.Lists.v1", (1, 38))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", GATED, ids=_ids)
def test_gated_case_is_undeclared_on_1_34(case: Case, engine: str) -> None:
    with pytest.raises(CompileError) as failure:
        compile_selector(case.expression, engine=engine, kubernetes_version=(1, 34))
    assert failure.value.message.startswith("undeclared reference to '")
    assert failure.value.message.endswith("' (in container '')")
    if case.expect != COMPILE and (case.celpy != UNSUPPORTED or engine != "cel-python"):
        compile_selector(case.expression, engine=engine, kubernetes_version=(1, 35))
        compile_selector(case.expression, engine=engine, kubernetes_version=(1, 37))


@pytest.mark.parametrize(
    ("expression", "message", "column"),
    [
        # Positions as kube-apiserver 1.34.4 reports them: the call's "(", or the namespace.
        ("[1, 2].reverse() == [2, 1]", "undeclared reference to 'reverse' (in container '')", 15),
        ('"b,a".split(",").sort() == ["a", "b"]', "undeclared reference to 'sort' (in container '')", 22),
        ("[[1], [2, 3]].flatten() == [1, 2, 3]", "undeclared reference to 'flatten' (in container '')", 22),
        ("lists.range(3) == [0, 1, 2]", "undeclared reference to 'lists' (in container '')", 1),
        (
            "[1].size() == 1 &&\n  [2, 1].sort() == [1, 2]",
            "undeclared reference to 'sort' (in container '')",
            14,
        ),
    ],
)
def test_undeclared_reference_reads_like_upstream(expression: str, message: str, column: int) -> None:
    with pytest.raises(CompileError) as failure:
        compile_selector(expression, kubernetes_version=(1, 34))
    assert failure.value.message == message
    assert failure.value.column == column
    assert failure.value.line == expression.count("\n", 0, expression.find(message.split("'")[1])) + 1


@pytest.mark.parametrize("case", UNGATED, ids=_ids)
def test_everything_else_compiles_on_1_34(case: Case) -> None:
    compile_selector(case.expression, engine="cel-expr-python", kubernetes_version=(1, 34))


def test_a_variable_named_like_a_function_is_not_a_library_call() -> None:
    expression = '["a"].exists(sort, sort == "a")'
    compile_selector(expression, kubernetes_version=(1, 34))


def test_environment_variable_is_the_default_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VERSION_ENV, "v1.34.4")
    with pytest.raises(CompileError, match="undeclared reference to 'sort'"):
        compile_selector("[2, 1].sort() == [1, 2]")
    # An explicit version wins over the variable.
    compile_selector("[2, 1].sort() == [1, 2]", kubernetes_version=(1, 37))
    monkeypatch.setenv(VERSION_ENV, "one.thirty")
    with pytest.raises(CompileError, match=f"\\${VERSION_ENV}"):
        compile_selector("[2, 1].sort() == [1, 2]")
    monkeypatch.delenv(VERSION_ENV)
    compile_selector("[2, 1].sort() == [1, 2]")


@pytest.mark.parametrize(
    ("text", "version"),
    [("1.34", (1, 34)), ("v1.34.4", (1, 34)), ("1.37.2-gke.100", (1, 37)), (" 1.40 ", (1, 40))],
)
def test_kubernetes_versions_parse(text: str, version: tuple[int, int]) -> None:
    assert parse_kubernetes_version(text) == version


@pytest.mark.parametrize(
    ("text", "reason"), [("1.33", "not supported"), ("34", "not a Kubernetes version"), ("", "not a")]
)
def test_bad_kubernetes_versions_are_rejected(text: str, reason: str) -> None:
    with pytest.raises(VersionError, match=reason):
        parse_kubernetes_version(text)


def test_version_endpoint_answers() -> None:
    assert version_from_info({"major": "1", "minor": "34", "gitVersion": "v1.34.4"}) == (1, 34)
    assert version_from_info({"major": "1", "minor": "35+", "gitVersion": "custom"}) == (1, 35)
    with pytest.raises(VersionError):
        version_from_info({"major": "", "minor": ""})
    with pytest.raises(VersionError):
        version_from_info(["not", "a", "dict"])


# ----- the command line ------------------------------------------------------------------------

SLICE = resource_slice("node1-gpu", [device("gpu-0", {"numa": 1})], node="node1", driver="gpu.example.com")
SORTING = '[2, 1].sort()[0] == 1 && device.attributes["gpu.example.com"].numa == 1'
CLASS = device_class("sorted", [SORTING])


def test_cel_command_follows_the_chosen_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    slices = tmp_path / "slices.yaml"
    slices.write_text(yaml.safe_dump(SLICE))
    assert main(["cel", SORTING, "-f", str(slices)]) == 0
    assert "match" in capsys.readouterr().out
    assert main(["cel", SORTING, "-f", str(slices), "--kubernetes-version", "1.34"]) == 2
    assert "undeclared reference to 'sort'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["cel", SORTING, "-f", str(slices), "--kubernetes-version", "1.3x"])
    assert "not a Kubernetes version" in capsys.readouterr().err


def test_lint_follows_the_chosen_release_and_its_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(VERSION_ENV, raising=False)
    manifests = tmp_path / "objects.yaml"
    manifests.write_text(yaml.safe_dump_all([SLICE, CLASS]))
    assert main(["lint", "--objects", str(manifests), "-o", "json"]) == 0
    capsys.readouterr()
    assert main(["lint", "--objects", str(manifests), "-o", "json", "--kubernetes-version", "1.34"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert any("undeclared reference to 'sort'" in str(f) for f in report["findings"])
    monkeypatch.setenv(VERSION_ENV, "1.34")
    assert main(["lint", "--objects", str(manifests), "-o", "json"]) == 1
    capsys.readouterr()
    assert main(["lint", "--objects", str(manifests), "-o", "json", "--kubernetes-version", "1.35"]) == 0
