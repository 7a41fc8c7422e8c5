"""cdicheck judges CDI specs with the reference CDI library, as runtimes do."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from devcluster.binaries import MissingBinariesError, bin_dir, require_binaries

pytestmark = pytest.mark.cluster

VALID_SPEC = {
    "cdiVersion": "0.5.0",
    "kind": "gpu.draplugin.dev/gpu",
    "containerEdits": {"env": ["DRAPLUGIN_SPEC=1"]},
    "devices": [
        {
            "name": "gpu-0",
            "containerEdits": {
                "env": ["DRAPLUGIN_VISIBLE_DEVICES=0"],
                "deviceNodes": [{"path": "/dev/null"}],
                "mounts": [{"hostPath": "/tmp", "containerPath": "/opt/gpu", "options": ["ro", "bind"]}],
                "hooks": [{"hookName": "createContainer", "path": "/bin/true", "args": ["true"]}],
            },
        },
        {"name": "gpu-1", "containerEdits": {"env": ["DRAPLUGIN_VISIBLE_DEVICES=1"]}},
    ],
}


@pytest.fixture(scope="module")
def cdicheck() -> Path:
    directory = bin_dir()
    try:
        require_binaries(directory, ("cdicheck",))
    except MissingBinariesError as err:
        pytest.fail(str(err), pytrace=False)
    return directory / "cdicheck"


def run(cdicheck: Path, cdi_dir: Path, *devices: str) -> subprocess.CompletedProcess[str]:
    argv = [str(cdicheck), "--cdi-dir", str(cdi_dir)]
    for device in devices:
        argv += ["--device", device]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def write_spec(directory: Path, name: str, spec: dict[str, Any]) -> Path:
    path = directory / name
    path.write_text(json.dumps(spec))
    return path


def test_valid_spec_resolves_and_prints_edits(cdicheck: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "gpu.draplugin.dev-gpu.json", VALID_SPEC)
    result = run(cdicheck, tmp_path, "gpu.draplugin.dev/gpu=gpu-0")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["specs"] == [str(spec)]
    assert report["devices"] == ["gpu.draplugin.dev/gpu=gpu-0", "gpu.draplugin.dev/gpu=gpu-1"]
    edits = report["edits"]
    assert edits["env"] == ["DRAPLUGIN_SPEC=1", "DRAPLUGIN_VISIBLE_DEVICES=0"]
    # The library fills type and numbers from the host node, as a runtime does.
    assert edits["deviceNodes"] == [
        {"path": "/dev/null", "type": "c", "major": 1, "minor": 3, "fileMode": 438}
    ]
    assert edits["mounts"] == [{"destination": "/opt/gpu", "source": "/tmp", "options": ["ro", "bind"]}]
    assert edits["hooks"] == {"createContainer": [{"path": "/bin/true", "args": ["true"]}]}


def test_spec_with_unknown_field_is_rejected_with_library_message(cdicheck: Path, tmp_path: Path) -> None:
    bad = {**VALID_SPEC, "devices": [{"name": "gpu-0", "containerEdit": {}}]}
    path = write_spec(tmp_path, "bad.json", bad)
    result = run(cdicheck, tmp_path)
    assert result.returncode == 1
    assert str(path) in result.stderr
    assert "field containerEdit not found in type specs.Device" in result.stderr


def test_spec_with_invalid_device_name_is_rejected(cdicheck: Path, tmp_path: Path) -> None:
    bad = {**VALID_SPEC, "devices": [{"name": "-gpu", "containerEdits": {"env": ["A=1"]}}]}
    write_spec(tmp_path, "bad.json", bad)
    result = run(cdicheck, tmp_path)
    assert result.returncode == 1
    assert 'invalid CDI Spec: failed add device "-gpu"' in result.stderr
    assert "should start with a letter or digit" in result.stderr


def test_unresolvable_device_is_rejected(cdicheck: Path, tmp_path: Path) -> None:
    write_spec(tmp_path, "gpu.json", VALID_SPEC)
    result = run(cdicheck, tmp_path, "gpu.draplugin.dev/gpu=gpu-7")
    assert result.returncode == 1
    assert "unresolvable CDI devices gpu.draplugin.dev/gpu=gpu-7" in result.stderr
    assert result.stdout == ""
