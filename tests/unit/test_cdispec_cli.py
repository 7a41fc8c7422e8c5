"""`draplugin cdi-spec`: the spec prepare would write, printed offline, and its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from draplugin import cli, config
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot, host_arch
from draplugin.cdi.preview import PREVIEW_CLAIM
from draplugin.devices import load_backend
from tests.driverroot_layout import DriverLayout, debian_layout
from tests.unit.test_driverroot_prepare import gpu_driver
from tests.unit.test_prepare_driver import FakeClaims
from tests.unit.test_prepare_plan import NODE, claim_doc, result


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in config.RUN_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)


def cdi_spec(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["cdi-spec", "--node-name", NODE, *args])
    out, err = capsys.readouterr()
    return code, out, err


def native_layout(**overrides: Any) -> DriverLayout:
    """A Debian layout of this machine's architecture (the command reads the real platform)."""
    arch = host_arch()
    return debian_layout(lib_dir=f"usr/lib/{arch.multiarch}", machine=arch.machine, **overrides)


async def test_prints_byte_for_byte_what_prepare_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = native_layout(persistenced_socket=True).build(tmp_path / "driver")
    code, out, err = cdi_spec(capsys, "--backend", "fake", "--fake-gpus", "2", "--driver-root", str(root))
    assert code == 0, err
    # The same claim through the prepare driver.
    backend = load_backend("fake", NODE, gpus=2)
    claims = FakeClaims()
    ref = claims.add(
        claim_doc(
            uid=PREVIEW_CLAIM.uid,
            results=[result("gpu", "gpu-0", pool=NODE), result("gpu", "gpu-1", pool=NODE)],
        )
    )
    driver = gpu_driver(tmp_path, claims, DriverFiles(DriverRoot.at(str(root))), backend.discover())
    await driver.prepare_claim(ref)
    assert out == driver.cdi.path_for(PREVIEW_CLAIM.uid).read_text()
    spec = json.loads(out)
    lib_dir = f"/usr/lib/{host_arch().multiarch}"
    by_path = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so.580.95.05"):
        assert by_path[f"{lib_dir}/{name}"].startswith(str(root) + "/")
    assert by_path["/usr/bin/nvidia-smi"] == str(root / "usr/bin/nvidia-smi")
    assert "NVIDIA_VISIBLE_DEVICES=void" in spec["containerEdits"]["env"]
    assert [d["name"] for d in spec["devices"]] == [
        f"{PREVIEW_CLAIM.uid}-gpu-0",
        f"{PREVIEW_CLAIM.uid}-gpu-1",
    ]


def test_named_devices_and_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cdi_spec(
        capsys, "--backend", "fake", "--fake-gpus", "3", "--device", "gpu-2", "-o", "yaml"
    )
    assert code == 0, err
    spec = yaml.safe_load(out)
    assert [d["name"] for d in spec["devices"]] == [f"{PREVIEW_CLAIM.uid}-gpu-2"]
    # Fake GPUs without a driver root: device nodes and environment only, never the legacy hook.
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}


def test_driver_root_comes_from_the_environment_like_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = native_layout().build(tmp_path / "driver-root")
    monkeypatch.setenv("DRIVER_ROOT", "/run/nvidia/driver")
    monkeypatch.setenv("DRIVER_ROOT_MOUNT", str(root))
    code, out, err = cdi_spec(capsys, "--backend", "fake")
    assert code == 0, err
    hosts = [m["hostPath"] for m in json.loads(out)["containerEdits"]["mounts"]]
    assert hosts and all(h.startswith("/run/nvidia/driver/") for h in hosts)


def test_unknown_device_lists_the_node_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cdi_spec(capsys, "--backend", "fake", "--fake-gpus", "2", "--device", "gpu-9")
    assert (code, out) == (2, "")
    assert "no device gpu-9 on node node-a; it has: gpu-0, gpu-1" in err


def test_broken_driver_root_fails_like_prepare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cdi_spec(capsys, "--backend", "fake", "--driver-root", str(tmp_path / "missing"))
    assert (code, out) == (1, "")
    assert "prepare would fail this claim: the driver root" in err and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, _, err = cdi_spec(capsys, "--backend", "fake", "--driver-root", str(tmp_path / "empty"))
    assert code == 1 and "no NVIDIA driver libraries" in err


def test_findings_are_warnings_and_the_spec_still_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = native_layout(dev_nodes=("nvidiactl",)).build(tmp_path / "driver")
    code, out, err = cdi_spec(capsys, "--backend", "fake", "--driver-root", str(root))
    assert code == 0
    assert (
        "warning: /dev/nvidia-uvm and /dev/nvidia-uvm-tools missing" in err
        and "(UvmDeviceNodesMissing)" in err
    )
    nodes = [n["path"] for n in json.loads(out)["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidiactl"]


def test_relative_driver_root_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cdi_spec(capsys, "--backend", "fake", "--driver-root", "driver")
    assert code == 2 and "must be an absolute path" in err
