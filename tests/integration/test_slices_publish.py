"""The slice publisher against the real kube-apiserver, and the real kube-scheduler allocating from it."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from controller.allocation.builders import claim, device_class, exactly
from controller.allocation.nodes import Node
from controller.scheduler.allocator import Allocator
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from dracommon.kubeversion import server_version
from draplugin.devices.fake import FakeBackend, config_from_flags, parse_config
from draplugin.devices.health import HealthTracker
from draplugin.slices.api import KubeSliceApi
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.plan import layout_for
from draplugin.slices.publisher import DevicesSource, SlicePublisher, backend_source
from tests.integration.release import cluster_features

pytestmark = pytest.mark.cluster

DRIVER = "gpu.draplugin.dev"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"


def make_publisher(api: KubeApi, node: str, source: DevicesSource, **kw: Any) -> SlicePublisher:
    return SlicePublisher(
        KubeSliceApi(api),
        node_name=node,
        driver=DRIVER,
        source=source,
        metrics=SliceMetrics(CollectorRegistry()),
        **kw,
    )


def our_slices(rest: KubeApi, node: str) -> list[dict[str, Any]]:
    result = rest.get(
        f"{RESOURCE_V1}/resourceslices", query={"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
    )
    return sorted(result["items"], key=lambda s: s["metadata"]["name"])


def test_thousand_devices_are_accepted_then_shrink_bumps_generation_and_removes_stale(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    state = {"devices": FakeBackend(node, config_from_flags(1000, "H100-80GB-HBM3")).discover()}
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        pub = make_publisher(rest, node, lambda: (state["devices"], []))
        first = pub.sync()
        slices = our_slices(rest, node)
        assert (first.created, first.generation) == (8, 1)
        assert [len(s["spec"]["devices"]) for s in slices] == [128] * 7 + [104]
        node_uid = rest.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]
        for s in slices:
            assert s["spec"]["pool"] == {"name": node, "generation": 1, "resourceSliceCount": 8}
            assert s["metadata"]["ownerReferences"][0]["uid"] == node_uid
        # The server stored every attribute we sent (nothing dropped, nothing renamed).
        sent = {d.name: d.to_api() for d in state["devices"]}
        stored = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
        assert stored == sent

        state["devices"] = state["devices"][:200]
        second = pub.sync()
        assert second.generation == 2 and second.deleted == 6 and second.updated == 2
        slices = our_slices(rest, node)
        assert [s["spec"]["pool"]["generation"] for s in slices] == [2, 2]
        assert [s["spec"]["pool"]["resourceSliceCount"] for s in slices] == [2, 2]


def test_static_mig_and_partitionable_layouts_are_accepted(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    config = parse_config({"gpus": [{"model": "H100-80GB-HBM3", "count": 2}], "partitionable": True})
    backend = FakeBackend(node, config)
    with kube_cluster.api_client() as api:
        pub = make_publisher(KubeApi(api), node, backend_source(backend))
        result = pub.sync()
        slices = our_slices(KubeApi(api), node)
        version = server_version(KubeApi(api))
        assert pub.layout() is layout_for(version)
        if version >= (1, 35):
            # Counter sets in a slice of their own, then the devices.
            assert result.created == len(slices) == 2
            assert "devices" not in slices[0]["spec"]
            assert all("sharedCounters" not in s["spec"] for s in slices[1:])
        else:
            # 1.34: each counter set in the slice of its consumers (here: one slice for both GPUs).
            assert result.created == len(slices) == 1
            assert len(slices[0]["spec"]["devices"]) == len(backend.discover())
        assert [c["name"] for c in slices[0]["spec"]["sharedCounters"]] == [
            "gpu-0-counters",
            "gpu-1-counters",
        ]
        # Either stored as sent, or the server dropped partitionable fields (gate off): both must be stable.
        assert pub.sync().writes == 0
        # Our allocator reads the pool in either layout: a MIG device, then the whole GPU
        # it came from is blocked by the shared counters while the other GPU is free.
        allocator = Allocator(
            device_classes=[device_class("gpu", ['device.driver == "gpu.draplugin.dev"'])],
            slices=slices,
            allocated_claims=[],
            features=cluster_features(kube_cluster),
        )
        mig = claim(
            "mig",
            [exactly("mig", "gpu", selectors=['device.attributes["gpu.draplugin.dev"].type == "mig"'])],
        )
        outcome = allocator.allocate([mig], Node(node))
        assert outcome.ok, outcome.failure
        chosen = outcome.allocations[0]["devices"]["results"][0]["device"]
        assert chosen.startswith("gpu-0-mig-")


def test_deleted_slices_come_back_and_idle_publisher_writes_nothing(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    devices = FakeBackend(node, config_from_flags(200, "L4")).discover()
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        pub = make_publisher(rest, node, lambda: (devices, []), settle_s=0.1)
        pub.start()
        try:
            wait_for("the pool published in 2 slices", lambda: len(our_slices(rest, node)) == 2, 30)
            # Idle: measure writes over a window with the watch running.
            time.sleep(1.0)
            before = sum(pub.writes.values())
            time.sleep(5.0)
            assert sum(pub.writes.values()) == before

            # What the kubelet does on start-up: delete all of the node's slices.
            for s in our_slices(rest, node):
                rest.delete(f"{RESOURCE_V1}/resourceslices/{s['metadata']['name']}")
            wait_for("the deleted slices republished", lambda: len(our_slices(rest, node)) == 2, 15)
            assert {s["spec"]["pool"]["resourceSliceCount"] for s in our_slices(rest, node)} == {2}
        finally:
            pub.stop(delete=True)
        assert our_slices(rest, node) == []


def test_slice_edited_behind_our_back_is_repaired_by_resync_and_by_the_watch(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    """Resyncs skip slices whose resourceVersion they have seen: an edit by someone else must still
    be noticed (new resourceVersion) and undone, with one write each time and none after."""
    node = fake_node()
    devices = FakeBackend(node, config_from_flags(200, "L4")).discover()
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        pub = make_publisher(rest, node, lambda: (devices, []), settle_s=0.1)
        pub.sync()
        published = our_slices(rest, node)

        def tamper(index: int) -> None:
            edited = our_slices(rest, node)[index]
            edited["spec"]["devices"][0]["attributes"]["productName"] = {"string": "not-this-gpu"}
            rest.replace(f"{RESOURCE_V1}/resourceslices/{edited['metadata']['name']}", edited)

        def specs() -> list[dict[str, Any]]:
            return [s["spec"] for s in our_slices(rest, node)]

        assert pub.sync().writes == 0
        tamper(1)
        result = pub.sync()
        assert (result.updated, result.created, result.deleted, result.generation) == (1, 0, 0, 1)
        assert specs() == [s["spec"] for s in published]
        assert pub.sync().writes == 0

        pub.start()
        try:
            time.sleep(0.5)  # the loop's first pass and the watch's start
            before = sum(pub.writes.values())
            tamper(0)
            wait_for("the edited slice repaired", lambda: specs() == [s["spec"] for s in published], 15)
            time.sleep(1.0)
            assert sum(pub.writes.values()) == before + 1
        finally:
            pub.stop(delete=True)


def test_unhealthy_device_taint_is_published_in_place(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    backend = FakeBackend(node, config_from_flags(4, "A10G"))
    tracker = HealthTracker(DRIVER)
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        pub = make_publisher(rest, node, backend_source(backend, tracker.apply), expect_taints=True)
        pub.sync()
        tracker.report_unhealthy(["gpu-2"], "NoExecute", "xid-79", "fell off the bus")
        result = pub.sync()
        assert (result.generation, result.updated) == (1, 1)
        (stored,) = our_slices(rest, node)
        taints = {d["name"]: d.get("taints") for d in stored["spec"]["devices"]}
        assert taints["gpu-2"] is not None and taints["gpu-2"][0]["key"] == f"{DRIVER}/unhealthy"
        assert taints["gpu-2"][0]["effect"] == "NoExecute" and "timeAdded" in taints["gpu-2"][0]
        assert pub.sync().writes == 0


@pytest.fixture
def selector_device_class(kube_cluster: ControlPlane) -> Iterator[str]:
    name = f"a100-40gi-{uuid.uuid4().hex[:8]}"
    expression = (
        f'device.driver == "{DRIVER}" && '
        f'device.attributes["{DRIVER}"].productName == "NVIDIA A100-SXM4-40GB" && '
        f'device.capacity["{DRIVER}"].memory.compareTo(quantity("40Gi")) >= 0'
    )
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        rest.create(
            f"{RESOURCE_V1}/deviceclasses",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            },
        )
        try:
            yield name
        finally:
            rest.delete(f"{RESOURCE_V1}/deviceclasses/{name}")


def test_scheduler_allocates_by_product_name_and_memory(
    kube_cluster: ControlPlane,
    fake_node: Callable[..., str],
    test_namespace: str,
    selector_device_class: str,
) -> None:
    label = {"draplugin.dev/test": uuid.uuid4().hex[:8]}
    node = fake_node(labels=label)
    # Two L4s (no match) before one A100-40GB: the scheduler must pick by selector, not order.
    config = parse_config({"gpus": [{"model": "L4", "count": 2}, {"model": "A100-SXM4-40GB"}]})
    backend = FakeBackend(node, config)
    ns = f"/api/v1/namespaces/{test_namespace}"
    resource_ns = f"{RESOURCE_V1}/namespaces/{test_namespace}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        make_publisher(rest, node, backend_source(backend)).sync()
        rest.create(
            f"{resource_ns}/resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "big-gpu"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": selector_device_class}}]
                    }
                },
            },
        )
        rest.create(
            f"{ns}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "gpu-user"},
                "spec": {
                    "nodeSelector": label,
                    "automountServiceAccountToken": False,
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": "big-gpu"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]},
                        }
                    ],
                },
            },
        )

        def allocated() -> dict[str, Any] | None:
            claim = rest.get(f"{resource_ns}/resourceclaims/big-gpu")
            return claim if claim.get("status", {}).get("allocation") else None

        claim = wait_for("the scheduler to allocate the claim", allocated, 60)
        pod = rest.get(f"{ns}/pods/gpu-user")
    results = [
        (r["driver"], r["pool"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]
    ]
    assert results == [(DRIVER, node, "gpu-2")]
    assert pod["spec"]["nodeName"] == node


NUMA_NODE = "resource.kubernetes.io/numaNode"


def test_scheduler_aligns_two_gpus_on_one_numa_node_by_the_standard_attribute(
    kube_cluster: ControlPlane,
    fake_node: Callable[..., str],
    test_namespace: str,
    gpu_device_class: str,
) -> None:
    label = {"draplugin.dev/test": uuid.uuid4().hex[:8]}
    node = fake_node(labels=label)
    # gpu-0 alone on node 0, gpu-1 and gpu-2 on node 1, gpu-3 with no affinity (no attribute):
    # two GPUs that must share a NUMA node can only be gpu-1 and gpu-2.
    config = parse_config({
        "gpus": [
            {"model": "L4", "numaNode": 0},
            {"model": "L4", "count": 2, "numaNode": 1},
            {"model": "L4"},
        ],
    })  # fmt: skip
    backend = FakeBackend(node, config)
    ns = f"/api/v1/namespaces/{test_namespace}"
    resource_ns = f"{RESOURCE_V1}/namespaces/{test_namespace}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        make_publisher(rest, node, backend_source(backend)).sync()
        # The server keeps the scalar int form on every release we support (no gate needed for it).
        stored = {
            d["name"]: d["attributes"].get(NUMA_NODE)
            for s in our_slices(rest, node)
            for d in s["spec"]["devices"]
        }
        assert stored == {"gpu-0": {"int": 0}, "gpu-1": {"int": 1}, "gpu-2": {"int": 1}, "gpu-3": None}
        rest.create(f"{resource_ns}/resourceclaims", {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "two-near"},
            "spec": {"devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": gpu_device_class, "count": 2}}],
                "constraints": [{"matchAttribute": NUMA_NODE}],
            }},
        })  # fmt: skip
        rest.create(f"{ns}/pods", {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "numa-user"},
            "spec": {
                "nodeSelector": label,
                "automountServiceAccountToken": False,
                "resourceClaims": [{"name": "gpus", "resourceClaimName": "two-near"}],
                "containers": [{
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpus"}]},
                }],
            },
        })  # fmt: skip

        def allocated() -> dict[str, Any] | None:
            claim = rest.get(f"{resource_ns}/resourceclaims/two-near")
            return claim if claim.get("status", {}).get("allocation") else None

        claim = wait_for("the scheduler to allocate the claim", allocated, 60)
    devices = sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"])
    assert devices == ["gpu-1", "gpu-2"]
