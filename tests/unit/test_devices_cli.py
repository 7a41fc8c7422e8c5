"""`draplugin devices` prints the slices the node would publish and fails clearly on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draplugin.cli import main


def test_json_output_lists_the_pool(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "devices",
            "--node-name",
            "n1",
            "--backend",
            "fake",
            "--fake-gpus",
            "130",
            "--fake-model",
            "T4",
            "-o",
            "json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert [len(s["spec"]["devices"]) for s in out["items"]] == [128, 2]
    assert {s["spec"]["pool"]["name"] for s in out["items"]} == {"n1"}


def test_yaml_output_is_one_document_per_slice(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--node-name", "n1", "--backend", "fake", "--fake-gpus", "2"]) == 0
    (doc,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert doc["kind"] == "ResourceSlice" and [d["name"] for d in doc["spec"]["devices"]] == [
        "gpu-0",
        "gpu-1",
    ]


# The console script's entry point, as `draplugin` runs it.
CLI = "import sys; from draplugin.cli import main; sys.exit(main(sys.argv[1:]))"


def test_missing_nvml_exits_nonzero_with_one_clear_line() -> None:
    # A process of its own: once a test has loaded the NVML double into this one, the dynamic
    # loader finds libnvidia-ml.so.1 by its soname and NVML is no longer missing here.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "NVML_DOUBLE_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-c", CLI, "devices", "--node-name", "n1", "--backend", "nvml"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.startswith("draplugin devices: error: NVML library libnvidia-ml.so.1 not found")
    assert "Traceback" not in done.stderr


def test_bad_fake_model_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--node-name", "n1", "--backend", "fake", "--fake-model", "GTX-480"]) == 2
    assert "unknown model 'GTX-480'" in capsys.readouterr().err


def test_slices_name_the_configured_driver(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["devices", "--node-name", "n1", "--backend", "fake", "--driver-name", "gpu.example.com"]
    assert main([*args, "-o", "json"]) == 0
    (slice_,) = json.loads(capsys.readouterr().out)["items"]
    assert slice_["spec"]["driver"] == "gpu.example.com"


def test_a_bad_driver_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--node-name", "n1", "--backend", "fake", "--driver-name", "GPU_X"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draplugin devices: error: driver name 'GPU_X' must be a lowercase DNS subdomain")
