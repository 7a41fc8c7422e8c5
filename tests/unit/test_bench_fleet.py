"""bench.fleet: the fleet fixtures are what `draplugin devices` prints, in both formats, and the
claims it makes select devices the fleet has (or, for the unfittable one, none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench import fleet
from controller.allocation.nodes import Node
from controller.objects import load_manifests
from controller.scheduler.allocator import Allocator
from draplugin.cli import main


def test_a_node_is_what_draplugin_devices_prints(capsys: pytest.CaptureFixture[str]) -> None:
    index = 2
    args = ["devices", "--node-name", fleet.node_name(index), "--backend", "fake"]
    args += ["--fake-gpus", "8", "--fake-model", fleet.node_model(index), "-o", "json"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)["items"]
    assert fleet.node_slices(index, 8) == printed


def test_models_vary_by_node_and_mig_nodes_are_spread() -> None:
    assert {fleet.node_model(i) for i in range(len(fleet.MODELS))} == set(fleet.MODELS)
    assert [i for i in range(8) if fleet.is_mig_node(i, 0.25)] == [3, 7]
    mig = fleet.node_slices(0, 2, mig=True)
    kinds = {d["attributes"]["type"]["string"] for s in mig for d in s["spec"]["devices"]}
    assert kinds == {"mig"}
    with pytest.raises(ValueError, match="mig_fraction"):
        fleet.is_mig_node(0, 1.5)


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_written_fleet_loads_as_the_same_objects(tmp_path: Path, fmt: fleet.Format) -> None:
    claims = fleet.whole_gpu_claims(3)
    files = fleet.write_fleet(tmp_path, nodes=4, gpus_per_node=2, fmt=fmt, claims=claims)
    assert len(files.slice_files) == 4 and files.devices == 8
    assert files.bytes == sum(p.stat().st_size for p in files.paths)
    loaded = load_manifests(files.paths)
    expected = fleet.fleet_objects(4, 2, claims=claims)
    assert loaded.device_classes == [o for o in expected if o["kind"] == "DeviceClass"]
    assert loaded.slices == [o for o in expected if o["kind"] == "ResourceSlice"]
    assert [c["metadata"]["name"] for c in loaded.claims] == ["claim-00000", "claim-00001", "claim-00002"]
    if fmt == "yaml":
        # The same text `draplugin devices` prints (PyYAML's safe_dump_all).
        first = files.slice_files[0]
        assert first.read_text() == yaml.safe_dump_all(fleet.node_slices(0, 2), sort_keys=False)


def test_claims_fit_the_fleet_and_the_unfittable_one_fits_nowhere() -> None:
    objects = fleet.fleet_objects(len(fleet.MODELS), 1)
    classes = [o for o in objects if o["kind"] == "DeviceClass"]
    slices = [o for o in objects if o["kind"] == "ResourceSlice"]
    allocator = Allocator(device_classes=classes, slices=slices)
    nodes = [Node(fleet.node_name(i)) for i in range(len(fleet.MODELS))]
    claims = fleet.whole_gpu_claims(2 * len(fleet.MODELS), by="mixed")
    selectors = {
        c["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"] for c in claims
    }
    assert any("productName" in s for s in selectors) and any("memory" in s for s in selectors)
    for claim in claims:
        assert any(allocator.allocate([claim], node).ok for node in nodes), claim["metadata"]["name"]
    assert not any(allocator.allocate([fleet.unfittable_claim()], node).ok for node in nodes)
