"""explain CLAIM for a claim a pod makes from a template, and explain pod/NAME."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OBJECTS = [
    "--objects",
    str(EXAMPLES / "deviceclasses.yaml"),
    str(EXAMPLES / "resourceslices" / "fake-node.yaml"),
]


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    rc = main(["explain", *args, "-o", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_generated_claim_name_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = explain(
        capsys, "big-memory-pod-gpu", *OBJECTS, str(EXAMPLES / "04-select-by-model-and-memory")
    )
    assert rc == 0
    assert data["claim"] == "default/big-memory-pod-gpu"
    assert (data["pod"], data["generatedFrom"]) == ("default/big-memory-pod", "by-memory")
    [node] = data["nodes"]
    assert node["requests"][0]["usable"] == 1  # only the H100 has 64Gi or more


def test_generated_claim_text_says_it_is_generated(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["explain", "gpu-pair-gpus", *OBJECTS, str(EXAMPLES / "05-same-pcie-root")])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith(
        "ResourceClaim default/gpu-pair-gpus: generated here from ResourceClaimTemplate gpu-pair"
    )


def test_pod_explains_every_claim(capsys: pytest.CaptureFixture[str]) -> None:
    rc, data = explain(capsys, "pod/notebook", *OBJECTS, str(EXAMPLES / "03-preallocated-shared-claim"))
    assert rc == 0
    assert (data["pod"], data["nodes"]) == ("default/notebook", ["gpu-node-1"])
    [entry] = data["claims"]
    assert (entry["claim"], entry["podClaimName"], entry["generatedFrom"]) == (
        "default/team-gpu",
        "gpu",
        None,
    )
    assert entry["nodes"][0]["allocatable"] is True


def test_pod_with_an_impossible_node_selector(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = (EXAMPLES / "01-single-gpu" / "single-gpu.yaml").read_text()
    (tmp_path / "pod.yaml").write_text(
        manifest.replace("  restartPolicy: Never", "  restartPolicy: Never\n  nodeSelector: {zone: west}")
    )
    rc, data = explain(capsys, "pod/single-gpu", *OBJECTS, str(tmp_path))
    assert rc == 1
    assert data["nodes"] == []
    [entry] = data["claims"]
    assert "none of 1 node(s) matches nodeSelector zone=west" in entry["summary"]


def test_missing_template_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    manifest = (EXAMPLES / "01-single-gpu" / "single-gpu.yaml").read_text()
    (tmp_path / "pod.yaml").write_text(manifest.split("---", 1)[1])  # the pod without its template
    rc, data = explain(capsys, "pod/single-gpu", *OBJECTS, str(tmp_path))
    assert rc == 1
    [entry] = data["claims"]
    assert (
        entry["summary"]
        == "claim default/single-gpu-gpu: resource claim template default/single-gpu not found"
    )


def test_unknown_claim_or_pod_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "nope", *OBJECTS]) == 2
    assert "ResourceClaim default/nope not found" in capsys.readouterr().err
    assert main(["explain", "pod/nope", *OBJECTS]) == 2
    assert "Pod default/nope not found" in capsys.readouterr().err
