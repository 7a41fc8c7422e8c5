"""`dra-controller cel`: text and JSON output, errors and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.allocation.builders import device, resource_slice
from controller.cli import main

GPU = "gpu.example.com"
SLICE_1 = resource_slice(
    "node1-gpu",
    [
        device("gpu-0", {"model": "H100"}, {"memory": "80Gi"}),
        device("gpu-1", {"model": "A100"}, {"memory": "40Gi"}),
    ],
    node="node1",
    driver=GPU,
)
SLICE_2 = resource_slice("node2-gpu", [device("gpu-0", {"index": 0})], node="node2", driver=GPU)
OTHER_DRIVER = resource_slice(
    "nic", [device("eth0", {"model": "H100"})], node="node1", pool="node1-nic", driver="nic.example.com"
)
MODEL = 'device.attributes["gpu.example.com"].model == "H100"'


@pytest.fixture
def slices(tmp_path: Path) -> Path:
    path = tmp_path / "slices.yaml"
    path.write_text(yaml.safe_dump_all([SLICE_1, {"apiVersion": "v1", "kind": "List", "items": [SLICE_2]}]))
    return path


def test_text_output_one_line_per_device(slices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cel", MODEL, "-f", str(slices)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["node1/gpu-0: match", "node1/gpu-1: no match", "node2/gpu-0: error: no such key: model"]
    assert code == 1


def test_json_output_shape(slices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cel", MODEL, "-f", str(slices), "-o", "json"])
    assert json.loads(capsys.readouterr().out) == {
        "matches": ["node1/gpu-0"],
        "errors": [{"device": "node2/gpu-0", "error": "no such key: model"}],
    }
    assert code == 1


def test_all_devices_evaluated_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(SLICE_1))
    code = main(
        [
            "cel",
            'device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("50Gi"))',
            "-f",
            str(path),
            "-o",
            "json",
            "--engine",
            "cel-python",
        ]
    )
    assert json.loads(capsys.readouterr().out) == {"matches": ["node1/gpu-0"], "errors": []}
    assert code == 0


def test_several_files_and_driver_filter(
    slices: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nic = tmp_path / "nic.yaml"
    nic.write_text(yaml.safe_dump(OTHER_DRIVER))
    main(
        [
            "cel",
            'device.attributes[device.driver].model == "H100"',
            "-f",
            str(slices),
            "-f",
            str(nic),
            "-o",
            "json",
        ]
    )
    both = json.loads(capsys.readouterr().out)
    assert both["matches"] == ["node1/gpu-0", "node1-nic/eth0"]
    main(["cel", "true", "-f", str(slices), "-f", str(nic), "--driver", "nic.example.com", "-o", "json"])
    assert json.loads(capsys.readouterr().out) == {"matches": ["node1-nic/eth0"], "errors": []}


def test_compile_error_exit_2_with_line_and_column(slices: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["cel", "device.driver ==", "-f", str(slices)])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert "line 1, column 17:" in captured.err


def test_unreadable_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: ResourceSlice\nspec: [unclosed\n")
    assert main(["cel", "true", "-f", str(bad)]) == 2
    assert "not valid YAML or JSON" in capsys.readouterr().err
    assert main(["cel", "true", "-f", str(tmp_path / "missing.yaml")]) == 2
    # Said as simulate, explain and lint say it (controller.manifests).
    assert "missing.yaml: no such file or directory" in capsys.readouterr().err
    wrong = tmp_path / "pod.yaml"
    wrong.write_text("kind: Pod\nspec: {}\n")
    assert main(["cel", "true", "-f", str(wrong)]) == 2
    assert "expected kind ResourceSlice" in capsys.readouterr().err
    not_objects = tmp_path / "scalars.yaml"
    not_objects.write_text("kind: List\nitems: [3]\n")
    assert main(["cel", "true", "-f", str(not_objects)]) == 2
    assert "expected a Kubernetes object, got int" in capsys.readouterr().err
