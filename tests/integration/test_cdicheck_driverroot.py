"""Specs with driver files, judged by the reference CDI library (cdicheck) as a runtime reads them.

`draplugin cdi-spec` renders the spec for fake GPUs and a driver root laid out
like a real install; cdicheck loads it and injects its devices into an empty
OCI spec. The mounts it produces must make `libcuda.so.1`, `libnvidia-ml.so.1`
and `nvidia-smi` resolve in the container, from files inside the driver root.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from draplugin import cli, config
from draplugin.cdi.driverlayout import host_arch
from draplugin.cdi.preview import PREVIEW_CLAIM
from tests.driverroot_layout import DriverLayout, debian_layout, lib64_layout
from tests.integration import test_cluster_cdicheck as reference

pytestmark = pytest.mark.cluster

# The reference tests' fixture (the built cdicheck binary, failing when missing), found here by name.
cdicheck = reference.cdicheck

KIND = "gpu.draplugin.dev/gpu"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for option in config.RUN_OPTIONS:
        monkeypatch.delenv(option.env, raising=False)


def native(layout: DriverLayout) -> DriverLayout:
    """The layout for this machine's architecture: cdi-spec reads the real platform."""
    arch = host_arch()
    if layout.lib_dir.startswith("usr/lib/"):
        layout.lib_dir = f"usr/lib/{arch.multiarch}"
    layout.machine = arch.machine
    return layout


def checked(
    cdicheck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], root: Path, *devices: str
) -> dict[str, Any]:
    code = cli.main(
        [
            "cdi-spec",
            "--node-name",
            "node-1",
            "--backend",
            "fake",
            "--fake-gpus",
            "2",
            "--driver-root",
            str(root),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    (cdi_dir / "gpu.draplugin.dev-claim_preview.json").write_text(out)
    ids = [f"{KIND}={PREVIEW_CLAIM.uid}-{d}" for d in devices]
    result = reference.run(cdicheck, cdi_dir, *ids)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


@pytest.mark.parametrize(
    "layout", [debian_layout(persistenced_socket=True), lib64_layout(hook=True)], ids=["debian", "lib64"]
)
def test_driver_files_resolve_in_the_container(
    cdicheck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: DriverLayout
) -> None:
    root = native(layout).build(tmp_path / "driver")
    edits = checked(cdicheck, tmp_path, capsys, root, "gpu-0")["edits"]
    lib_dir = f"/usr/lib/{host_arch().multiarch}"
    mounts = {m["destination"]: m for m in edits["mounts"]}
    versioned = mounts[f"{lib_dir}/libcuda.so.{layout.version}"]
    for name in ("libcuda.so.1", "libcuda.so"):
        # Two mounts of one host file: no link, no hook needed.
        assert mounts[f"{lib_dir}/{name}"]["source"] == versioned["source"]
    assert Path(versioned["source"]).is_relative_to(root) and Path(versioned["source"]).is_file()
    assert mounts[f"{lib_dir}/libcuda.so.1"]["options"] == ["ro", "nosuid", "nodev", "rbind", "rprivate"]
    assert Path(mounts[f"{lib_dir}/libnvidia-ml.so.1"]["source"]).name == f"libnvidia-ml.so.{layout.version}"
    assert mounts["/usr/bin/nvidia-smi"]["source"] == str(root / layout.bin_dir / "nvidia-smi")
    assert f"/lib/firmware/nvidia/{layout.version}" in mounts
    assert "NVIDIA_VISIBLE_DEVICES=void" in edits["env"]
    assert edits["hooks"] == {}
    # The library stats the host nodes, as a runtime does: they must be real character devices.
    nodes = {n["path"]: n for n in edits["deviceNodes"]}
    for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert nodes[path]["type"] == "c" and (nodes[path]["major"], nodes[path]["minor"]) == (1, 3)


def test_spec_without_uvm_nodes_is_still_accepted(
    cdicheck: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = native(debian_layout(dev_nodes=())).build(tmp_path / "driver")
    report = checked(cdicheck, tmp_path, capsys, root, "gpu-0", "gpu-1")
    destinations = [m["destination"] for m in report["edits"]["mounts"]]
    assert f"/usr/lib/{host_arch().multiarch}/libcuda.so.1" in destinations
    # Both devices of the claim share one copy of the driver files.
    assert len(destinations) == len(set(destinations))
    assert not any(n["path"].startswith("/dev/nvidia") for n in report["edits"]["deviceNodes"])
