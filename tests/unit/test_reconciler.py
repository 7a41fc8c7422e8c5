"""Reconciler decisions on a fake API: pre-allocation, already-allocated claims,
double-allocation repair, the deallocation rule, events and their rate limit.

Size: one file for the reconciler's decisions, which share one fake API.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.run.api import Conflict, NotFound
from controller.run.metrics import ControllerMetrics
from controller.run.preallocation import preallocate_annotation
from controller.run.reconciler import (
    FINALIZER,
    Reconciler,
    ReconcilerSettings,
    Snapshot,
    allocated_by_annotation,
)

JSON = dict[str, Any]
D = "gpu.draplugin.dev"
PREALLOCATE_ANNOTATION = preallocate_annotation(D)
ALLOCATED_BY_ANNOTATION = allocated_by_annotation(D)
WALL = "2026-01-01T00:00:00Z"


def merge(target: JSON, patch: Mapping[str, Any]) -> JSON:
    """RFC 7386 JSON merge patch."""
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


class FakeApi:
    """Claims in memory with resourceVersion preconditions (409 on mismatch)."""

    def __init__(self, claims: list[JSON], nodes: Sequence[str] = ()) -> None:
        self.version = 100
        self.claims: dict[str, JSON] = {}
        for c in claims:
            self._store(c)
        self.nodes = set(nodes)
        self.events: list[JSON] = []
        self.writes: list[tuple[str, str, JSON]] = []
        self.conflict_next = 0  # answer the next N writes with 409
        self.before_write: Any = None  # hook: change the stored claim before the next write

    def _store(self, obj: JSON) -> JSON:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        stored["metadata"].setdefault("uid", "uid-" + stored["metadata"]["name"])
        self.claims[f"{stored['metadata']['namespace']}/{stored['metadata']['name']}"] = stored
        return copy.deepcopy(stored)

    def get_claim(self, namespace: str, name: str) -> JSON | None:
        found = self.claims.get(f"{namespace}/{name}")
        return copy.deepcopy(found) if found else None

    def _patch(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook(self)
        key = f"{namespace}/{name}"
        if key not in self.claims:
            raise NotFound(key)
        self.writes.append((kind, key, copy.deepcopy(dict(patch))))
        current = self.claims[key]
        if (
            self.conflict_next
            or patch["metadata"]["resourceVersion"] != current["metadata"]["resourceVersion"]
        ):
            self.conflict_next = max(0, self.conflict_next - 1)
            raise Conflict(key)
        if kind == "status":
            if (current.get("status") or {}).get("reservedFor") and patch["status"].get("allocation") is None:
                raise AssertionError("cleared the allocation of a reserved claim")
            updated = merge(current, {"status": patch["status"]})
        else:
            updated = merge(
                current, {"metadata": {k: v for k, v in patch["metadata"].items() if k != "resourceVersion"}}
            )
        if updated["metadata"].get("deletionTimestamp") and not updated["metadata"].get("finalizers"):
            del self.claims[key]
            return copy.deepcopy(updated)
        return self._store(updated)

    def patch_claim(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        return self._patch("metadata", namespace, name, patch)

    def patch_claim_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> JSON:
        return self._patch("status", namespace, name, patch)

    def get_node(self, name: str) -> JSON | None:
        return {"metadata": {"name": name, "labels": {}}} if name in self.nodes else None

    def create_event(self, namespace: str, event: Mapping[str, Any]) -> None:
        self.events.append(dict(event))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def gpus(node: str, count: int = 2, model: str = "h100") -> JSON:
    return resource_slice(
        f"{node}-gpus", [device(f"gpu-{i}", {"model": model}) for i in range(count)], node=node
    )


CLASSES = [device_class("gpu", [f'device.driver == "{D}"'])]


def pinned(name: str, node: str = "any", count: int = 1, **kwargs: Any) -> JSON:
    return claim(name, [exactly("gpu", count=count)], annotations={PREALLOCATE_ANNOTATION: node}, **kwargs)


def allocation(node: str, *devices: str) -> JSON:
    return {
        "devices": {"results": [{"request": "gpu", "driver": D, "pool": node, "device": d} for d in devices]},
        "nodeSelector": {
            "nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
            ]
        },
    }


def ours(c: JSON, alloc: JSON | None, reserved: bool = False) -> JSON:
    c = copy.deepcopy(c)
    c["metadata"].setdefault("annotations", {})[ALLOCATED_BY_ANNOTATION] = "dra-controller"
    c["metadata"]["finalizers"] = [FINALIZER]
    status: JSON = {}
    if alloc is not None:
        status["allocation"] = alloc
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-uid"}]
    c["status"] = status
    return c


def pending_pod(name: str, claim_name: str) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}]},
        "status": {"phase": "Pending"},
    }


class World:
    def __init__(
        self,
        claims: list[JSON],
        slices: list[JSON],
        pods: Sequence[JSON] = (),
        nodes: Sequence[str] = (),
        leader: bool = True,
        **settings: Any,
    ) -> None:
        self.api = FakeApi(claims, nodes)
        self.slices = slices
        self.pods = list(pods)
        self.clock = Clock()
        self.registry = CollectorRegistry()
        self.leader = leader
        self.reconciler = Reconciler(
            self.api,
            lambda: Snapshot(
                CLASSES, self.slices, [copy.deepcopy(c) for c in self.api.claims.values()], self.pods
            ),
            metrics=ControllerMetrics(self.registry),
            settings=ReconcilerSettings(**settings),
            is_leader=lambda: self.leader,
            clock=self.clock,
            wall_time=lambda: WALL,
        )

    def claim(self, name: str) -> JSON:
        return self.api.claims[f"default/{name}"]

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return value or 0.0


def devices(c: JSON) -> list[tuple[str, str]]:
    return [(r["pool"], r["device"]) for r in c["status"]["allocation"]["devices"]["results"]]


# ------------------------------------------------------------------ pre-allocation


def test_preallocates_an_annotated_claim_on_the_named_node() -> None:
    world = World([pinned("shared", "node-b", count=2)], [gpus("node-a"), gpus("node-b")], nodes=["node-b"])
    report = world.reconciler.reconcile()
    assert report.allocated == ["default/shared"]
    c = world.claim("shared")
    assert devices(c) == [("node-b", "gpu-0"), ("node-b", "gpu-1")]
    assert c["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        "node-b"
    ]
    assert c["status"]["allocation"]["allocationTimestamp"] == WALL
    assert c["metadata"]["annotations"][ALLOCATED_BY_ANNOTATION] == "dra-controller"
    assert c["metadata"]["finalizers"] == [FINALIZER]
    # Marked first, then the status, each with the version just read.
    assert [kind for kind, _, _ in world.api.writes] == ["metadata", "status"]
    assert world.metric("dra_controller_allocation_attempts_total", result="allocated") == 1


def test_annotation_keys_follow_the_configured_driver_name() -> None:
    other = "gpu.example.com"
    claims = [
        claim("theirs", [exactly("gpu")], annotations={preallocate_annotation(other): "any"}),
        pinned("default-key"),  # the default driver's annotation means nothing to this controller
    ]
    world = World(claims, [gpus("node-a")], driver_name=other)
    assert world.reconciler.reconcile().allocated == ["default/theirs"]
    annotations = world.claim("theirs")["metadata"]["annotations"]
    assert annotations == {
        "gpu.example.com/preallocate": "any",
        "gpu.example.com/allocated-by": "dra-controller",
    }
    assert "allocation" not in (world.claim("default-key").get("status") or {})


def test_any_spreads_claims_over_free_devices_within_one_pass() -> None:
    world = World([pinned("a"), pinned("b"), pinned("c")], [gpus("node-1", 1), gpus("node-2", 1)])
    report = world.reconciler.reconcile()
    assert sorted(report.allocated) == ["default/a", "default/b"]
    assert report.unschedulable == ["default/c"]
    assert sorted(devices(world.claim("a")) + devices(world.claim("b"))) == [
        ("node-1", "gpu-0"),
        ("node-2", "gpu-0"),
    ]
    assert "allocation" not in (world.claim("c").get("status") or {})


def test_true_means_any_node() -> None:
    world = World([pinned("a", "true")], [gpus("node-1", 1)])
    assert world.reconciler.reconcile().allocated == ["default/a"]
    assert devices(world.claim("a")) == [("node-1", "gpu-0")]


def prioritized(name: str) -> JSON:
    """An "any" claim that prefers an H100 and takes an L4 otherwise."""
    wants = first_available(
        "gpu",
        exactly("h100", selectors=[f'device.attributes["{D}"].model == "h100"']),
        exactly("l4", selectors=[f'device.attributes["{D}"].model == "l4"']),
    )
    return claim(name, [wants], annotations={PREALLOCATE_ANNOTATION: "any"})


def test_any_prefers_the_node_where_a_better_ranked_subrequest_fits() -> None:
    # node-a comes first and fits only the second choice; kube-scheduler 1.35+ scores node-b
    # higher (its DynamicResources Score), so the pre-allocation follows it there.
    slices = [gpus("node-a", 1, model="l4"), gpus("node-b", 1, model="h100")]
    world = World([prioritized("pref")], slices)
    assert world.reconciler.reconcile().allocated == ["default/pref"]
    assert devices(world.claim("pref")) == [("node-b", "gpu-0")]
    results = world.claim("pref")["status"]["allocation"]["devices"]["results"]
    assert [r["request"] for r in results] == ["gpu/h100"]


def test_any_on_1_34_takes_the_first_node_that_fits() -> None:
    # 1.34's DynamicResources plugin has no Score: every feasible node ties.
    slices = [gpus("node-a", 1, model="l4"), gpus("node-b", 1, model="h100")]
    world = World([prioritized("pref")], slices, release=(1, 34))
    assert world.reconciler.reconcile().allocated == ["default/pref"]
    assert devices(world.claim("pref")) == [("node-a", "gpu-0")]


def test_allocates_by_the_rules_of_the_configured_release() -> None:
    # Device taints are alpha and off in 1.34: its scheduler allocates a tainted device, 1.37's does not.
    tainted = resource_slice(
        "node-a-gpus",
        [device("gpu-0", {"model": "h100"}, taints=[{"key": "broken", "effect": "NoSchedule"}])],
        node="node-a",
    )
    on_1_37 = World([pinned("a")], [tainted])
    assert on_1_37.reconciler.reconcile().unschedulable == ["default/a"]
    on_1_34 = World([pinned("a")], [tainted], release=(1, 34))
    assert on_1_34.reconciler.reconcile().allocated == ["default/a"]
    on_1_34_gate_on = World(
        [pinned("a")], [tainted], release=(1, 34), feature_gates={"DRADeviceTaints": True}
    )
    assert on_1_34_gate_on.reconciler.reconcile().unschedulable == ["default/a"]


def test_skips_allocated_claims_and_avoids_their_devices() -> None:
    taken = claim("other", [exactly("gpu")])
    taken["status"] = {"allocation": allocation("node-1", "gpu-0")}
    already = pinned("done", "node-1")
    already["status"] = {"allocation": allocation("node-1", "gpu-1")}
    world = World([taken, already, pinned("new", "node-1")], [gpus("node-1", 3)], nodes=["node-1"])
    report = world.reconciler.reconcile()
    assert report.allocated == ["default/new"]
    assert devices(world.claim("new")) == [("node-1", "gpu-2")]
    assert all(key == "default/new" for _, key, _ in world.api.writes)
    assert world.reconciler.reconcile().allocated == []  # nothing left to do: no writes
    assert len(world.api.writes) == 2


def test_conflict_rereads_and_retries() -> None:
    world = World([pinned("a", "node-1")], [gpus("node-1")], nodes=["node-1"])
    world.api.conflict_next = 1
    report = world.reconciler.reconcile()
    assert report.conflicts == ["default/a"]
    assert report.allocated == ["default/a"]
    assert devices(world.claim("a")) == [("node-1", "gpu-0")]
    assert world.metric("dra_controller_allocation_attempts_total", result="conflict") == 1


def test_conflict_with_an_allocation_made_elsewhere_gives_up() -> None:
    world = World([pinned("a", "node-1")], [gpus("node-1")], nodes=["node-1"])

    def scheduler_allocates(api: FakeApi) -> None:
        api._store(merge(api.claims["default/a"], {"status": {"allocation": allocation("node-1", "gpu-1")}}))

    world.api.before_write = scheduler_allocates
    report = world.reconciler.reconcile()
    assert report.allocated == []
    assert devices(world.claim("a")) == [("node-1", "gpu-1")]  # the other writer's allocation stands


def test_invalid_annotation_value_writes_nothing() -> None:
    world = World([pinned("a", "Not A Node!")], [gpus("node-1")])
    world.reconciler.reconcile()
    assert world.api.writes == []
    assert world.metric("dra_controller_allocation_attempts_total", result="invalid") == 1


def test_followers_do_nothing() -> None:
    world = World([pinned("a")], [gpus("node-1")], leader=False)
    assert world.reconciler.reconcile().skipped
    assert world.api.writes == []
    assert world.metric("dra_controller_reconciles_total", result="skipped-not-leader") == 1


# ------------------------------------------------------------------ double allocation


def test_double_allocation_deallocates_our_unreserved_claim_and_retries() -> None:
    scheduler_claim = claim("sched", [exactly("gpu")])
    scheduler_claim["status"] = {"allocation": allocation("node-1", "gpu-0")}
    mine = ours(pinned("mine", "node-1"), allocation("node-1", "gpu-0"))
    world = World([scheduler_claim, mine], [gpus("node-1", 2)], nodes=["node-1"])
    report = world.reconciler.reconcile()
    assert report.deallocated == ["default/mine"]
    assert report.allocated == ["default/mine"]
    assert devices(world.claim("mine")) == [("node-1", "gpu-1")]
    assert devices(world.claim("sched")) == [("node-1", "gpu-0")]
    assert world.metric("dra_controller_double_allocations_total") == 1
    assert world.metric("dra_controller_deallocations_total", reason="double-allocation") == 1


def test_double_allocation_leaves_a_reserved_claim_alone() -> None:
    scheduler_claim = claim("sched", [exactly("gpu")])
    scheduler_claim["status"] = {"allocation": allocation("node-1", "gpu-0")}
    mine = ours(pinned("mine", "node-1"), allocation("node-1", "gpu-0"), reserved=True)
    world = World([scheduler_claim, mine], [gpus("node-1", 2)], nodes=["node-1"])
    world.reconciler.reconcile()
    assert world.api.writes == []
    assert world.metric("dra_controller_double_allocations_total") == 1


# ------------------------------------------------------------------ deallocation rule


def released(name: str, *, reserved: bool = False) -> JSON:
    c = ours(claim(name, [exactly("gpu")]), allocation("node-1", "gpu-0"), reserved=reserved)
    return c  # no preallocate annotation: the user released the pin


def test_released_unreserved_claim_is_deallocated_and_unmarked() -> None:
    world = World([released("a")], [gpus("node-1")])
    report = world.reconciler.reconcile()
    assert report.deallocated == ["default/a"]
    c = world.claim("a")
    assert "allocation" not in c["status"]
    assert ALLOCATED_BY_ANNOTATION not in c["metadata"].get("annotations", {})
    assert FINALIZER not in c["metadata"].get("finalizers", [])
    assert world.metric("dra_controller_deallocations_total", reason="released") == 1


def test_released_but_reserved_claim_keeps_its_allocation() -> None:
    world = World([released("a", reserved=True)], [gpus("node-1")])
    world.reconciler.reconcile()
    assert world.api.writes == []


def test_released_claim_that_a_pending_pod_uses_keeps_its_allocation() -> None:
    world = World([released("a")], [gpus("node-1")], pods=[pending_pod("p", "a")])
    world.reconciler.reconcile()
    assert world.api.writes == []


def test_still_pinned_claim_stays_allocated_after_its_reservations_drop() -> None:
    world = World([ours(pinned("a", "node-1"), allocation("node-1", "gpu-0"))], [gpus("node-1")])
    world.reconciler.reconcile()
    assert world.api.writes == []
    assert devices(world.claim("a")) == [("node-1", "gpu-0")]


def test_deleting_claims_are_left_to_kube_controller_manager() -> None:
    for reserved in (False, True):
        c = ours(pinned("a", "node-1"), allocation("node-1", "gpu-0"), reserved=reserved)
        c["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        world = World([c], [gpus("node-1")])
        world.reconciler.reconcile()
        assert world.api.writes == []


def test_claim_deallocated_after_its_last_pod_is_pinned_again() -> None:
    # kube-controller-manager cleared the allocation and upstream's finalizer when reservedFor emptied.
    c = ours(pinned("a", "node-1"), None)
    c["metadata"]["finalizers"] = []
    world = World([c], [gpus("node-1")], nodes=["node-1"])
    assert world.reconciler.reconcile().allocated == ["default/a"]
    assert devices(world.claim("a")) == [("node-1", "gpu-0")]
    assert world.claim("a")["metadata"]["finalizers"] == [FINALIZER]


def test_marked_claim_released_before_allocation_is_unmarked() -> None:
    c = ours(claim("a", [exactly("gpu")]), None)  # crash between marking and the status write
    world = World([c], [gpus("node-1")])
    assert world.reconciler.reconcile().unmarked == ["default/a"]
    assert ALLOCATED_BY_ANNOTATION not in world.claim("a")["metadata"].get("annotations", {})
    assert world.claim("a")["metadata"]["finalizers"] == []


# ------------------------------------------------------------------ events


def stuck_world(**settings: Any) -> World:
    impossible = claim("stuck", [exactly("gpu", selectors=[f'device.attributes["{D}"].model == "a100"'])])
    return World(
        [impossible],
        [gpus("node-1", 2, model="h100")],
        pods=[pending_pod("waiting", "stuck")],
        event_after_s=30,
        event_interval_s=600,
        **settings,
    )


def test_event_after_the_threshold_names_the_filter() -> None:
    world = stuck_world()
    world.reconciler.reconcile()
    world.clock.now = 29
    world.reconciler.reconcile()
    assert world.api.events == []
    world.clock.now = 30
    report = world.reconciler.reconcile()
    assert report.events == ["default/stuck"]
    (event,) = world.api.events
    assert event["reason"] == "CannotAllocate"
    assert event["type"] == "Warning"
    assert event["regarding"]["name"] == "stuck"
    assert event["regarding"]["uid"] == "uid-stuck"
    assert "request selector removed 2" in event["note"]
    assert event["reportingController"] == "gpu.draplugin.dev/dra-controller"
    assert world.api.writes == []  # not annotated: never allocated by us


def test_event_reports_as_the_configured_driver() -> None:
    world = stuck_world(driver_name="gpu.example.com")
    world.reconciler.reconcile()  # the claim starts waiting
    world.clock.now = 30
    world.reconciler.reconcile()
    (event,) = world.api.events
    assert event["reportingController"] == "gpu.example.com/dra-controller"


def test_events_are_rate_limited_per_claim() -> None:
    world = stuck_world()
    world.reconciler.reconcile()
    for now in range(30, 630, 5):
        world.clock.now = now
        world.reconciler.reconcile()
    assert len(world.api.events) == 1
    world.clock.now = 630
    world.reconciler.reconcile()
    assert len(world.api.events) == 2
    assert world.metric("dra_controller_events_total", reason="CannotAllocate") == 2


def test_no_event_without_a_pending_pod() -> None:
    world = stuck_world()
    world.pods.clear()
    world.clock.now = 1000
    world.reconciler.reconcile()
    world.clock.now = 2000
    world.reconciler.reconcile()
    assert world.api.events == []


def test_namespace_scope_ignores_other_claims() -> None:
    world = World([pinned("a", "node-1")], [gpus("node-1")], nodes=["node-1"], namespace="other")
    world.reconciler.reconcile()
    assert world.api.writes == []
