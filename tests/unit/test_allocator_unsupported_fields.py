"""resource.k8s.io/v1 fields of 1.36 and 1.37: modelled (binding conditions) or refused by name."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.cli import main
from controller.scheduler.allocator import Allocator, Node
from controller.scheduler.nodefilter import filter_nodes

Mutation = Callable[[dict[str, Any], dict[str, Any]], None]  # (slice, claim) edited in place


def _list_attribute(s: dict[str, Any], _c: dict[str, Any]) -> None:
    s["spec"]["devices"][0]["attributes"] = {"numaNodes": {"ints": [0, 1]}}


def _node_allocatable(s: dict[str, Any], _c: dict[str, Any]) -> None:
    s["spec"]["devices"][0]["nodeAllocatableResources"] = {"memory": {"overhead": {"quantity": "1Gi"}}}


def _compatibility_groups(s: dict[str, Any], _c: dict[str, Any]) -> None:
    s["spec"]["sharedCounters"] = [{"name": "gpu-0-set", "counters": {"memory": {"value": "8Gi"}}}]
    s["spec"]["devices"][0]["consumesCounters"] = [
        {"counterSet": "gpu-0-set", "counters": {"memory": {"value": "1Gi"}}, "compatibilityGroups": ["a"]}
    ]


def _partition_type(s: dict[str, Any], _c: dict[str, Any]) -> None:
    s["spec"]["partitionTypeAttribute"] = "gpu.example.com/profile"


def _skip_node_operations(s: dict[str, Any], _c: dict[str, Any]) -> None:
    s["spec"]["skipNodeOperations"] = ["*"]


def _derived_attributes(_s: dict[str, Any], c: dict[str, Any]) -> None:
    c["spec"]["devices"]["requests"][0]["exactly"]["derivedAttributes"] = [
        {"name": "derived/numa", "expression": "device.attributes['x'].numa"}
    ]


def _derived_attributes_in_subrequest(_s: dict[str, Any], c: dict[str, Any]) -> None:
    c["spec"]["devices"]["requests"] = [
        first_available("gpu", {"name": "big", "exactly": {"deviceClassName": "gpu", "derivedAttributes": [
            {"name": "derived/numa", "expression": "1"}]}})
    ]  # fmt: skip


REFUSED = [
    (_list_attribute, "not supported yet: list-typed device attribute (ints/bools/strings/versions) "
     "(DRAListTypeAttributes, Kubernetes 1.36) in ResourceSlice s1, device gpu-0, attribute numaNodes"),
    (_node_allocatable, "not supported yet: device nodeAllocatableResources (DRANodeAllocatableResources, "
     "Kubernetes 1.36) in ResourceSlice s1, device gpu-0"),
    (_compatibility_groups, "not supported yet: consumesCounters[].compatibilityGroups "
     "(DRADeviceCompatibilityGroups, Kubernetes 1.37) in ResourceSlice s1, device gpu-0, "
     "counter set gpu-0-set"),
    (_partition_type, "not supported yet: ResourceSlice spec.partitionTypeAttribute "
     "(DRAPartitionableDevicesType, Kubernetes 1.37) in ResourceSlice s1"),
    (_skip_node_operations, "not supported yet: ResourceSlice spec.skipNodeOperations "
     "(DRAOptionalNodeOperations, Kubernetes 1.37) in ResourceSlice s1"),
    (_derived_attributes, "not supported yet: request derivedAttributes (DRADerivedAttributes, "
     "Kubernetes 1.37) in ResourceClaim default/c1, request gpu"),
    (_derived_attributes_in_subrequest, "not supported yet: request derivedAttributes (DRADerivedAttributes, "
     "Kubernetes 1.37) in ResourceClaim default/c1, request gpu/big"),
]  # fmt: skip


def scenario(mutate: Mutation | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    s = resource_slice("s1", [device("gpu-0")], node="node-1")
    c = claim("c1", [exactly("gpu", "gpu")])
    if mutate is not None:
        mutate(s, c)
    return s, c


def allocate(slice_obj: dict[str, Any], claim_obj: dict[str, Any]) -> Any:
    allocator = Allocator(device_classes=[device_class("gpu")], slices=[slice_obj])
    return allocator.allocate([claim_obj], Node("node-1"))


def test_the_unmutated_scenario_allocates() -> None:
    assert allocate(*scenario()).ok


@pytest.mark.parametrize(("mutate", "message"), REFUSED, ids=[m.__name__.strip("_") for m, _ in REFUSED])
def test_each_unsupported_field_is_refused_as_an_error(mutate: Mutation, message: str) -> None:
    outcome = allocate(*scenario(mutate))
    assert outcome.failure is not None
    assert (outcome.failure.message, outcome.failure.error) == (message, True)


def test_an_unsupported_field_on_one_node_fails_the_pod_as_a_filter_error() -> None:
    broken, c = scenario(_skip_node_operations)
    fine = resource_slice("s2", [device("gpu-0")], node="node-2")
    allocator = Allocator(device_classes=[device_class("gpu")], slices=[broken, fine])
    filtered = filter_nodes(allocator, [c], [Node("node-1"), Node("node-2")])
    assert filtered.chosen is None
    assert filtered.error is not None and filtered.error.node_name == "node-1"


def test_slices_of_other_nodes_do_not_block_this_node() -> None:
    broken, c = scenario(_partition_type)
    fine = resource_slice("s2", [device("gpu-0")], node="node-2")
    allocator = Allocator(device_classes=[device_class("gpu")], slices=[broken, fine])
    assert allocator.allocate([c], Node("node-2")).ok


def test_binding_conditions_are_modelled_not_refused() -> None:
    s = resource_slice(
        "s1",
        [device("gpu-0", bindingConditions=["Ready"], bindingFailureConditions=["Failed"], bindsToNode=True)],
        pool="shared",
        all_nodes=True,
    )
    outcome = allocate(s, claim("c1", [exactly("gpu", "gpu")]))
    assert outcome.ok
    [result] = outcome.allocations[0]["devices"]["results"]
    assert (result["bindingConditions"], result["bindingFailureConditions"]) == (["Ready"], ["Failed"])
    assert outcome.allocations[0]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-1"
    ]


@pytest.mark.parametrize("command", ["simulate", "explain"])
def test_simulate_and_explain_name_the_field(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s, c = scenario(_list_attribute)
    (tmp_path / "objects.yaml").write_text(yaml.safe_dump_all([device_class("gpu"), s, c]))
    args = [command, *(["c1"] if command == "explain" else []), "--objects", str(tmp_path), "-o", "json"]
    assert main(args) == 1
    out = json.loads(capsys.readouterr().out)
    text = json.dumps(out)
    assert "not supported yet: list-typed device attribute" in text
    assert "DRAListTypeAttributes, Kubernetes 1.36" in text
