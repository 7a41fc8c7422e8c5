"""A table of lint findings on the project's own manifests.

Every examples/NN-*/ lints, with the chart's DeviceClasses and the fake node's slices, with
no error, and with a warning only where the example's README names it; the manifests that
docs/deviceclasses.md lints to show each placement finding raise exactly that finding.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.cli import main
from controller.lint.linter import lint
from controller.objects import load_manifests

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BASE = [EXAMPLES / "deviceclasses.yaml", EXAMPLES / "resourceslices" / "fake-node.yaml"]
EXAMPLE_DIRS = sorted(p for p in EXAMPLES.glob("[0-9][0-9]-*") if p.is_dir())


def test_the_table_has_every_example() -> None:
    assert len(EXAMPLE_DIRS) >= 12


@pytest.mark.parametrize("example", EXAMPLE_DIRS, ids=lambda p: p.name)
def test_example_lints_without_errors(example: Path) -> None:
    objects = load_manifests([*BASE, example])
    assert objects.claims or objects.claim_templates, f"{example.name} has no claim to lint"
    report = lint(objects)
    assert report.errors == 0, [f.to_text() for f in report.findings]
    readme = (example / "README.md").read_text(encoding="utf-8")
    unexplained = [f.to_text() for f in report.findings if f"[{f.code}]" not in readme]
    assert not unexplained, f"warnings that {example.name}/README.md does not explain: {unexplained}"


def test_the_whole_examples_folder_lints_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--objects", str(EXAMPLES / "deviceclasses.yaml"), str(EXAMPLES)]) == 0
    out = capsys.readouterr().out
    assert "error:" not in out, out


def test_example_08s_request_selector_would_fail_under_a_class_that_admits_whole_gpus() -> None:
    # Example 08 is clean only because its class admits MIG devices alone: the same request
    # under the whole-GPU-and-MIG class meets GPUs without `profile`, and that is an error.
    objects = load_manifests([*BASE, EXAMPLES / "08-mig-device"])
    [template] = objects.claim_templates
    request = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    objects.device_classes.append({"kind": "DeviceClass", "metadata": {"name": "any"}, "spec": {}})
    request["deviceClassName"] = "any"
    codes = {f.code for f in lint(objects).findings}
    assert codes == {"unguarded-attribute", "runtime-error"}


DOC_CASES = [
    (["docs/lint/untolerated-taint.yaml"], "untolerated-taint"),
    (["examples/07-all-gpus-on-node", "docs/lint/incomplete-pool.yaml"], "all-mode-incomplete-pool"),
    (["docs/lint/pod-nodes.yaml"], "no-device-on-pod-nodes"),
]


@pytest.mark.parametrize(("paths", "code"), DOC_CASES, ids=[c for _, c in DOC_CASES])
def test_the_documented_manifests_show_their_finding(paths: list[str], code: str) -> None:
    report = lint(load_manifests([*BASE, *(REPO / p for p in paths)]))
    assert [f.code for f in report.findings] == [code]
    docs = (REPO / "docs" / "deviceclasses.md").read_text(encoding="utf-8")
    # The page shows the very line lint prints, under the command that lints these files.
    assert report.findings[0].to_text() in docs
    assert all(p in docs for p in paths)
