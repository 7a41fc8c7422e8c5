"""simulate: claims allocated in order across nodes, JSON shape, CLI exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.cli import main
from controller.scheduler.allocator import Allocator, Node
from controller.simulate.command import Simulator, pending_claims


def objects() -> list[dict[str, object]]:
    return [
        device_class("gpu"),
        resource_slice("a", [device("gpu-0"), device("gpu-1")], node="node-a"),
        resource_slice("b", [device("gpu-0")], node="node-b"),
        claim("two", [exactly("gpu", count=2)], namespace="ns"),
        claim("one", [exactly("gpu")], namespace="ns"),
        claim("three", [exactly("gpu", count=3)], namespace="ns"),
        claim(
            "pinned",
            [exactly("gpu")],
            namespace="ns",
            annotations={"gpu.draplugin.dev/preallocate": "node-a"},
        ),
    ]


def test_claims_fill_nodes_in_order() -> None:
    objs = objects()
    allocator = Allocator(device_classes=[objs[0]], slices=objs[1:3])
    results = Simulator(allocator, [Node("node-a"), Node("node-b")]).run(pending_claims(objs[3:]))
    assert [(r.name, r.allocated, r.node_name) for r in results] == [
        ("two", True, "node-a"),
        ("one", True, "node-b"),
        ("three", False, None),
        ("pinned", False, None),
    ]
    assert "in use removed 3" in (results[2].reason or "")


def test_cli_json_output_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(objects()))
    rc = main(["simulate", "--objects", str(tmp_path), "-o", "json", "--node", "node-a"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert data["claims"][0] == {
        "namespace": "ns",
        "name": "two",
        "allocated": True,
        "results": [
            {"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "node-a", "device": "gpu-0"},
            {"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "node-a", "device": "gpu-1"},
        ],
        "nodeName": "node-a",
        "reason": None,
        "pod": None,
    }
    assert [c["allocated"] for c in data["claims"]] == [True, False, False, False]


def test_cli_bad_manifest_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    assert main(["simulate", "--objects", str(tmp_path)]) == 2
    assert "invalid YAML" in capsys.readouterr().err


def test_cli_explain_and_lint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(objects()))
    assert main(["explain", "three", "-n", "ns", "--objects", str(tmp_path), "-o", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["nodes"][0]["requests"][0]["needed"] == "3"
    assert main(["lint", "--objects", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no findings"


def test_shares_show_what_they_consume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared_gpu = device("gpu-0", capacity={"memory": "80Gi"}, allowMultipleAllocations=True)
    objs = [
        device_class("gpu"),
        resource_slice("a", [shared_gpu], node="node-a"),
        claim("small", [exactly("gpu", capacity={"requests": {"memory": "10Gi"}})], namespace="ns"),
        claim("big", [exactly("gpu", capacity={"requests": {"memory": "60Gi"}})], namespace="ns"),
    ]
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all(objs))
    assert main(["simulate", "--objects", str(tmp_path), "-o", "json"]) == 0
    results = [c["results"] for c in json.loads(capsys.readouterr().out)["claims"]]
    assert results == [
        [{**entry, "consumedCapacity": {"memory": amount}, "shared": True}]
        for entry, amount in (
            ({"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "node-a", "device": "gpu-0"}, "10Gi"),
            ({"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "node-a", "device": "gpu-0"}, "60Gi"),
        )
    ]
    assert main(["simulate", "--objects", str(tmp_path)]) == 0
    assert "gpu=node-a/gpu-0 (shared, consumes memory 60Gi)" in capsys.readouterr().out
