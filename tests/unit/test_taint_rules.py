"""DeviceTaintRules as the allocator sees them: 1.34's v1alpha3 selectors (class, CEL) and where
the rules are read from (v1, else v1beta2, else v1alpha3)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice, results_of
from controller.allocation.taintrules import apply_taint_rules
from controller.objects import load_from_cluster
from controller.run.daemon import _served_taint_rules
from controller.scheduler.allocator import Allocator, Features, Node
from dracommon.kubeapi import ApiError

D = "gpu.draplugin.dev"
NODE = Node("node-a", {})
TAINT = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
V1 = "/apis/resource.k8s.io/v1/devicetaintrules"
V1BETA2 = "/apis/resource.k8s.io/v1beta2/devicetaintrules"
V1ALPHA3 = "/apis/resource.k8s.io/v1alpha3/devicetaintrules"


def gpus() -> list[dict[str, Any]]:
    return [
        resource_slice(
            "s",
            [
                device("gpu-0", {"model": "H100"}, {"memory": "80Gi"}),
                device("gpu-1", {"model": "A100"}, {"memory": "40Gi"}),
                device("gpu-2", {"model": "A100"}, {"memory": "80Gi"}),
            ],
            node="node-a",
            pool="node-a",
        )
    ]


def rule(selector: dict[str, Any] | None, name: str = "r") -> dict[str, Any]:
    spec: dict[str, Any] = {"taint": TAINT}
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule", "metadata": {"name": name},
            "spec": spec}  # fmt: skip


def cel(*expressions: str) -> list[dict[str, Any]]:
    return [{"cel": {"expression": e}} for e in expressions]


def tainted(slices: Sequence[Mapping[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"]["devices"] if d.get("taints")]


def view(rules: list[dict[str, Any]], classes: list[dict[str, Any]] | None = None) -> list[Mapping[str, Any]]:
    """The slices the allocator works on, with 1.34's features (DRADeviceTaints on)."""
    features = Features.for_release(34).with_gates({"DRADeviceTaints": True})
    allocator = Allocator(
        device_classes=classes or [device_class("gpu")], slices=gpus(), taint_rules=rules, features=features
    )
    return allocator.slices


def test_a_v1alpha3_rules_device_class_taints_only_the_devices_its_selectors_accept() -> None:
    classes = [device_class("gpu"), device_class("a100", [f'device.attributes["{D}"].model == "A100"'])]
    assert tainted(view([rule({"deviceClassName": "a100"})], classes)) == ["gpu-1", "gpu-2"]


def test_a_rule_naming_a_class_that_does_not_exist_taints_nothing() -> None:
    assert tainted(view([rule({"deviceClassName": "missing"})])) == []


def test_a_rules_cel_selectors_must_all_accept_the_device() -> None:
    selectors = cel(
        f'device.attributes["{D}"].model == "A100"',
        f'device.capacity["{D}"].memory.compareTo(quantity("64Gi")) > 0',
    )
    assert tainted(view([rule({"selectors": selectors})])) == ["gpu-2"]


def test_the_class_selectors_and_the_rules_own_apply_together_with_the_names() -> None:
    a100 = device_class("a100", [f'device.attributes["{D}"].model == "A100"'])
    small = cel(f'device.capacity["{D}"].memory.compareTo(quantity("64Gi")) < 0')
    selector = {"driver": D, "pool": "node-a", "deviceClassName": "a100", "selectors": small}
    assert tainted(view([rule(selector)], [device_class("gpu"), a100])) == ["gpu-1"]
    assert tainted(view([rule({**selector, "pool": "node-b"})], [device_class("gpu"), a100])) == []


def test_a_cel_runtime_error_leaves_the_device_untainted() -> None:
    # gpu-0 has no "missing" attribute: a runtime error there, not a non-match and not a failure.
    selectors = cel(f'device.attributes["{D}"].model == "H100" || device.attributes["{D}"].missing == 1')
    assert tainted(view([rule({"selectors": selectors})])) == ["gpu-0"]


def test_a_class_selector_runtime_error_leaves_the_device_untainted() -> None:
    broken = device_class("broken", [f'device.attributes["{D}"].missing == 1'])
    assert tainted(view([rule({"deviceClassName": "broken"})], [device_class("gpu"), broken])) == []


def test_a_selector_that_does_not_compile_leaves_the_slice_out_as_upstream_does() -> None:
    # The tracker keeps no patched copy of a slice it failed to patch: the allocator never sees it.
    assert view([rule({"selectors": cel("device.attributes[")})]) == []
    # A device the rule's names exclude never reaches the expression.
    assert tainted(view([rule({"device": "gpu-9", "selectors": cel("device.attributes[")})])) == []


def test_the_tracker_shows_cel_no_allow_multiple_allocations() -> None:
    shared = [resource_slice("s", [device("gpu-0", allowMultipleAllocations=True)], node="node-a")]
    reads = rule({"selectors": cel("device.allowMultipleAllocations")})
    negated = rule({"selectors": cel("!device.allowMultipleAllocations")})
    assert tainted(apply_taint_rules(shared, [reads])) == []
    assert tainted(apply_taint_rules(shared, [negated])) == ["gpu-0"]


def test_no_device_selector_matches_every_device_on_1_34_and_none_on_1_37() -> None:
    assert tainted(view([rule(None)])) == ["gpu-0", "gpu-1", "gpu-2"]
    newest = Allocator(device_classes=[device_class("gpu")], slices=gpus(), taint_rules=[rule(None)])
    assert tainted(newest.slices) == []
    # An empty selector is another thing: every device, on every release.
    assert tainted(Allocator(device_classes=[], slices=gpus(), taint_rules=[rule({})]).slices) == [
        "gpu-0", "gpu-1", "gpu-2",
    ]  # fmt: skip


def test_a_claim_avoids_the_devices_a_class_selected_rule_taints() -> None:
    a100 = device_class("a100", [f'device.attributes["{D}"].model == "A100"'])
    features = Features.for_release(34).with_gates({"DRADeviceTaints": True})
    allocator = Allocator(
        device_classes=[device_class("gpu"), a100],
        slices=gpus(),
        taint_rules=[rule({"deviceClassName": "a100"})],
        features=features,
    )
    outcome = allocator.allocate([claim("c", [exactly("gpu", "a100")])], NODE)
    assert outcome.failure is not None and not outcome.failure.error
    outcome = allocator.allocate([claim("c", [exactly("gpu")])], NODE)
    assert results_of(outcome.allocations[0]) == [("gpu", "gpu-0")]


class Api:
    """Serves the DeviceTaintRule collections of `served` (path -> items); others answer `missing`."""

    def __init__(self, served: dict[str, list[dict[str, Any]]], missing: int = 404) -> None:
        self.served = served
        self.missing = missing
        self.asked: list[str] = []

    def list(self, path: str, *, kind: str | None = None) -> tuple[list[dict[str, Any]], str]:
        self.asked.append(path)
        if "devicetaintrules" in path and path not in self.served:
            raise ApiError(self.missing, "not served")
        return list(self.served.get(path, [])), "1"

    def get(self, path: str, query: object = None) -> dict[str, Any]:
        self.asked.append(path)
        if path not in self.served:
            raise ApiError(self.missing, "not served")
        return {"items": self.served[path]}


@pytest.mark.parametrize("path", [V1, V1BETA2, V1ALPHA3])
def test_rules_are_read_from_the_newest_version_served(path: str) -> None:
    api = Api({path: [rule({"pool": "node-a"})]})
    objects = load_from_cluster(api)  # type: ignore[arg-type]
    assert [r["spec"]["deviceSelector"] for r in objects.taint_rules] == [{"pool": "node-a"}]
    assert _served_taint_rules(api) == path  # type: ignore[arg-type]


def test_no_version_served_means_no_rules() -> None:
    api = Api({})
    assert load_from_cluster(api).taint_rules == []  # type: ignore[arg-type]
    assert _served_taint_rules(api) is None  # type: ignore[arg-type]


def test_rules_not_readable_are_an_error_offline_and_skipped_by_the_daemon() -> None:
    api = Api({}, missing=403)
    with pytest.raises(ApiError):
        load_from_cluster(api)  # type: ignore[arg-type]
    assert _served_taint_rules(api) is None  # type: ignore[arg-type]
    assert api.asked[-1] == V1  # 403 on v1: older versions are not tried
