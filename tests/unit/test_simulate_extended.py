"""simulate and explain on pods that ask for extended resources a DeviceClass maps (KEP-5004),
the way kube-scheduler 1.37's dynamicresources plugin builds the implicit claim."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from controller.allocation.nodes import Node
from controller.cli import main
from controller.objects import load_manifests
from controller.options import build_allocator
from controller.scheduler.extendedclaim import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    build_extended_claim,
    class_mappings,
    is_extended_resource_name,
)
from controller.simulate.command import simulate

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "device-plugin" / "extended-resource"
SLICES = REPO / "examples" / "resourceslices"
SELECT_GPUS = 'device.driver == "gpu.draplugin.dev" && device.attributes["gpu.draplugin.dev"].type == "gpu"'


def device_class(
    name: str, resource: str | None = None, created: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": SELECT_GPUS}}]}
    if resource:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": spec,
    }


def pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": containers, **spec},
    }


def container(name: str, limits: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": limits or {}}, **extra}


def test_extended_resource_names() -> None:
    assert is_extended_resource_name("nvidia.com/gpu")
    assert is_extended_resource_name("deviceclass.resource.kubernetes.io/gpu.draplugin.dev")
    assert not is_extended_resource_name("cpu")
    assert not is_extended_resource_name("kubernetes.io/foo")
    assert not is_extended_resource_name("requests.nvidia.com/gpu")


def test_mapping_explicit_implicit_and_clashes() -> None:
    mappings = class_mappings(
        [
            device_class("old.example", "nvidia.com/gpu", "2026-01-01T00:00:00Z"),
            device_class("new.example", "nvidia.com/gpu", "2026-02-01T00:00:00Z"),
            device_class("b.example", "example.com/tpu"),
            device_class("a.example", "example.com/tpu"),
        ]
    )
    assert mappings["nvidia.com/gpu"].device_class == "new.example"  # the newer class wins
    assert "also set by old.example" in mappings["nvidia.com/gpu"].why
    assert mappings["example.com/tpu"].device_class == "a.example"  # same time: the lower name
    assert mappings["deviceclass.resource.kubernetes.io/old.example"].device_class == "old.example"


def test_requests_follow_the_scheduler_naming() -> None:
    mappings = class_mappings([device_class("gpu.example", "nvidia.com/gpu"), device_class("other.example")])
    the_pod = pod(
        "p",
        [
            container("main", {"cpu": "1", "nvidia.com/gpu": 2}),
            container(
                "side", {"deviceclass.resource.kubernetes.io/other.example": "1", "nvidia.com/gpu": "1"}
            ),
        ],
        initContainers=[container("setup", {"nvidia.com/gpu": 3}), container("small", {"nvidia.com/gpu": 1})],
    )
    built = build_extended_claim(the_pod, mappings)
    assert built is not None
    requests = built.claim["spec"]["devices"]["requests"]
    # Containers are indexed init first (setup 0, small 1, main 2, side 3); j is the resource's index
    # among the container's sorted request names. The init containers reuse main's and side's
    # devices (3 and 1 of nvidia.com/gpu later in order): setup needs 3 <= 2+1, small 1 <= 2.
    assert [(r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"]) for r in requests] == [
        ("container-2-request-1", "gpu.example", 2),
        ("container-3-request-0", "other.example", 1),
        ("container-3-request-1", "gpu.example", 1),
    ]
    assert built.claim["metadata"]["annotations"] == {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    setup = [m for m in built.mapped if m.container == "setup"]
    assert [m.request for m in setup] == ["container-2-request-1", "container-3-request-1"]


def test_init_container_that_needs_more_gets_its_own_largest_request() -> None:
    mappings = class_mappings([device_class("gpu.example", "nvidia.com/gpu")])
    the_pod = pod(
        "p",
        [container("main", {"nvidia.com/gpu": 1})],
        initContainers=[container("a", {"nvidia.com/gpu": 3}), container("b", {"nvidia.com/gpu": 2})],
    )
    built = build_extended_claim(the_pod, mappings)
    assert built is not None
    counts = {r["name"]: r["exactly"]["count"] for r in built.claim["spec"]["devices"]["requests"]}
    assert counts == {"container-0-request-0": 2, "container-2-request-0": 1}  # a: 3-1; b's 1 extra merged
    assert {m.container: m.request for m in built.mapped if m.request.startswith("container-0")} == {
        "a": "container-0-request-0",
        "b": "container-0-request-0",
    }


def load_example() -> Any:
    return load_manifests([EXAMPLE, SLICES])


def test_simulate_allocates_the_implicit_claim_from_the_mapped_class() -> None:
    objects = load_example()
    results = simulate(objects, build_allocator(objects), [Node("gpu-node-1")])
    by_pod = {r.pod: r for r in results}
    assert by_pod["two-gpus-a"].allocated and len(by_pod["two-gpus-a"].results) == 2
    assert by_pod["two-gpus-a"].name == "two-gpus-a-extended-resources"
    assert "DeviceClass nvidia-gpu.draplugin.dev (its spec.extendedResourceName)" in str(
        by_pod["four-gpus"].extended
    )
    assert not by_pod["four-gpus"].allocated


def test_gate_off_means_no_implicit_claim() -> None:
    objects = load_example()
    assert simulate(objects, build_allocator(objects), [Node("gpu-node-1")], extended_resources=False) == []


def test_pod_mixing_a_claim_and_an_extended_resource() -> None:
    objects = load_example()
    objects.claim_templates.append(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": "default"},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": "nvidia-gpu.draplugin.dev"}}
                        ]
                    }
                }
            },
        }
    )
    mixed = pod(
        "mixed",
        [
            container(
                "a",
                {"nvidia.com/gpu": 2},
                resources={"limits": {"nvidia.com/gpu": 2}, "claims": [{"name": "extra"}]},
            )
        ],
        resourceClaims=[{"name": "extra", "resourceClaimTemplateName": "one-gpu"}],
    )
    objects.pods = [mixed]
    results = simulate(objects, build_allocator(objects), [Node("gpu-node-1")])
    assert [r.name for r in results] == ["mixed-extra", "mixed-extended-resources"]
    assert all(r.allocated for r in results)  # three whole GPUs: one + two, on the same node
    devices = [d["device"] for r in results for d in r.results]
    assert len(set(devices)) == 3


def test_existing_scheduler_claim_is_used_not_made_again() -> None:
    objects = load_example()
    (first, _) = objects.pods
    first["metadata"]["uid"] = "uid-a"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": "two-gpus-a-extended-resources-x7k2p",
            "namespace": "default",
            "annotations": {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            "ownerReferences": [{"kind": "Pod", "name": "two-gpus-a", "uid": "uid-a", "controller": True}],
        },
        "spec": {"devices": {"requests": []}},
    }
    objects.claims.append(copy.deepcopy(claim))
    results = simulate(objects, build_allocator(objects), [Node("gpu-node-1")])
    assert "two-gpus-a-extended-resources-x7k2p" in [r.name for r in results]


def run_explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["explain", *args])
    return code, capsys.readouterr().out


def test_explain_names_the_class_and_why_it_cannot_be_met(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_explain(capsys, "pod/four-gpus", "--objects", str(EXAMPLE), str(SLICES))
    assert code == 1
    assert "the implicit claim for the extended resources of pod default/four-gpus" in out
    assert (
        "nvidia.com/gpu: 4 for container cuda -> request container-0-request-0 on DeviceClass "
        "nvidia-gpu.draplugin.dev, mapped by its spec.extendedResourceName" in out
    )
    assert "needs 4): 3 usable" in out
    code, out = run_explain(capsys, "pod/four-gpus", "-o", "json", "--objects", str(EXAMPLE), str(SLICES))
    (claim,) = json.loads(out)["claims"]
    assert claim["extendedResources"][0]["deviceClass"] == "nvidia-gpu.draplugin.dev"
    assert claim["allocated"] is False


def test_explain_unmapped_resource_and_device_plugin_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = tmp_path / "extra.json"
    extra.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [
                    pod("tpu", [container("a", {"nvidia.com/gpu": 1, "example.com/tpu": 1})]),
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": "gpu-node-1"},
                        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
                    },
                ],
            }
        )
    )
    _, out = run_explain(
        capsys, "pod/tpu", "--objects", str(EXAMPLE / "deviceclass.yaml"), str(SLICES), str(extra)
    )
    assert "also asks for example.com/tpu: no DeviceClass maps it" in out
    assert "node gpu-node-1 advertises nvidia.com/gpu in its allocatable (a device plugin)" in out
    _, out = run_explain(
        capsys,
        "pod/tpu",
        "--kubernetes-version",
        "1.35",
        "--objects",
        str(EXAMPLE / "deviceclass.yaml"),
        str(SLICES),
        str(extra),
    )
    assert "has no resource claims" in out and "extended" not in out


def test_explain_follows_the_clusters_gate_over_the_releases_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """1.34 has DRAExtendedResource off by default: no implicit claim, unless --feature-gates says the
    cluster switched it on (and a 1.37 cluster that switched it off gets none)."""
    sources = ("--objects", str(EXAMPLE), str(SLICES), "-o", "json")
    _, out = run_explain(capsys, "pod/four-gpus", "--kubernetes-version", "1.34", *sources)
    assert json.loads(out)["claims"] == []
    gate_on = ("--kubernetes-version", "1.34", "--feature-gates", "DRAExtendedResource=true")
    _, out = run_explain(capsys, "pod/four-gpus", *gate_on, *sources)
    (claim,) = json.loads(out)["claims"]
    assert claim["extendedResources"][0]["deviceClass"] == "nvidia-gpu.draplugin.dev"
    _, out = run_explain(capsys, "pod/four-gpus", "--feature-gates", "DRAExtendedResource=false", *sources)
    assert json.loads(out)["claims"] == []


def test_malformed_feature_gates_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["simulate", "--objects", str(EXAMPLE), "--feature-gates", "DRAExtendedResource=maybe"])
    assert exited.value.code == 2
    assert "expected Name=true or Name=false" in capsys.readouterr().err
