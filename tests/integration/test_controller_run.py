"""`dra-controller run` as a real process against the real API server, with the
real kube-scheduler and kube-controller-manager doing their part.

- An annotated standalone claim is pre-allocated on a fake node; two pods with
  two containers each, scheduled by kube-scheduler, share it (both in
  reservedFor, same devices); when they are gone it is pinned again, and it
  can be deleted.
- A claim no device fits, used by a pending pod, gets a CannotAllocate Event
  that names the filter that removed the devices.
- Two replicas: one holds the Lease and allocates; SIGTERM hands it over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controller.allocation.builders import device, resource_slice
from devcluster.controlplane import ControlPlane, free_port
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import version_from_info
from tests.integration.release import cluster_features

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = "gpu.draplugin.dev"
RESOURCE_V1 = "/apis/resource.k8s.io/v1"
PREALLOCATE = "gpu.draplugin.dev/preallocate"
ALLOCATED_BY = "gpu.draplugin.dev/allocated-by"
STOP_TIMEOUT = 30.0


@dataclass
class Controller:
    proc: subprocess.Popen[bytes]
    identity: str
    metrics_port: int
    log_path: Path

    def log_messages(self) -> list[dict[str, Any]]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def metric(self, name: str) -> float | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def healthz(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=5) as response:
            return int(response.status)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=STOP_TIMEOUT)


StartController = Callable[..., Controller]


@pytest.fixture
def start_controller(
    kube_cluster: ControlPlane, test_namespace: str, tmp_path: Path
) -> Iterator[StartController]:
    started: list[Controller] = []
    lease = f"dra-controller-{uuid.uuid4().hex[:6]}"

    def start(identity: str, *extra: str, kubeconfig: Path | None = None) -> Controller:
        port = free_port()
        log_path = tmp_path / f"{identity}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("DRA_CONTROLLER_")}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    *(
                        sys.executable,
                        "-m",
                        "controller.cli",
                        "run",
                        "--kubeconfig",
                        str(kubeconfig or kube_cluster.kubeconfig),
                    ),
                    *(
                        "--namespace",
                        test_namespace,
                        "--lease-namespace",
                        test_namespace,
                        "--lease-name",
                        lease,
                    ),
                    *("--identity", identity, "--metrics-port", str(port), "--log-format", "json"),
                    *("--event-after-seconds", "1"),
                    *extra,
                ],
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        controller = Controller(proc, identity, port, log_path)
        started.append(controller)
        return controller

    try:
        yield start
    finally:
        for controller in started:
            if controller.proc.poll() is None:
                controller.proc.kill()
                controller.proc.wait()


@dataclass
class ControllerScene:
    """What every test here starts from: a fake node with two GPUs in a ResourceSlice."""

    rest: KubeApi
    node: str
    namespace: str
    device_class: str
    start_controller: StartController


@pytest.fixture
def scene(
    kube_cluster: ControlPlane,
    fake_node: Callable[..., str],
    test_namespace: str,
    gpu_device_class: str,
    start_controller: StartController,
) -> Iterator[ControllerScene]:
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        node = fake_node()
        publish_two_gpus(rest, node)
        yield ControllerScene(rest, node, test_namespace, gpu_device_class, start_controller)


def publish_two_gpus(rest: KubeApi, node: str) -> None:
    gpus = [device(f"gpu-{i}", {"model": "FakeGPU", "index": i}) for i in range(2)]
    rest.create(
        f"{RESOURCE_V1}/resourceslices", resource_slice(f"{node}-gpus", gpus, node=node, driver=DRIVER)
    )


def claim_body(name: str, device_class: str, *, annotations: dict[str, str] | None = None,
               selector: str | None = None, count: int = 1) -> dict[str, Any]:  # fmt: skip
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod_body(name: str, claim: str, containers: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
                for i in range(containers)
            ],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }


def get_claim(rest: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return rest.get(f"{RESOURCE_V1}/namespaces/{namespace}/resourceclaims/{name}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise


def allocated(rest: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    claim = get_claim(rest, namespace, name)
    if claim is None or not (claim.get("status") or {}).get("allocation"):
        return None
    return claim


def devices_of(claim: dict[str, Any]) -> list[tuple[str, str]]:
    results = claim["status"]["allocation"]["devices"]["results"]
    return sorted((r["pool"], r["device"]) for r in results)


def test_preallocated_claim_is_shared_by_two_scheduled_pods(scene: ControllerScene) -> None:
    rest, node, ns = scene.rest, scene.node, scene.namespace
    controller = scene.start_controller("solo")
    rest.create(
        f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
        claim_body("shared", scene.device_class, annotations={PREALLOCATE: node}, count=2),
    )
    claim = wait_for("the controller to allocate the claim", lambda: allocated(rest, ns, "shared"), 60)
    assert claim["metadata"]["annotations"][ALLOCATED_BY] == "dra-controller"
    assert claim["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": [node]}
    ]
    devices = devices_of(claim)
    assert devices == [(node, "gpu-0"), (node, "gpu-1")]
    assert not (claim.get("status") or {}).get("reservedFor")
    # It allocates by the rules of the cluster's release, read from the API server.
    major, minor = version_from_info(rest.get("/version"))
    rules = "allocating by the rules of Kubernetes"
    said = [m for m in controller.log_messages() if m.get("msg") == rules]
    assert [m.get("release") for m in said] == [f"{major}.{minor}"]

    pods = {}
    for name in ("consumer-a", "consumer-b"):
        pods[name] = rest.create(f"/api/v1/namespaces/{ns}/pods", pod_body(name, "shared"))["metadata"]["uid"]

    def both_reserved() -> dict[str, Any] | None:
        current = get_claim(rest, ns, "shared")
        reserved = {r["uid"] for r in ((current or {}).get("status") or {}).get("reservedFor") or []}
        return current if reserved == set(pods.values()) else None

    claim = wait_for("both pods in reservedFor", both_reserved, 60)
    assert devices_of(claim) == devices  # the scheduler reused our allocation, devices unchanged
    for name in pods:
        pod = rest.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        assert pod["spec"]["nodeName"] == node
    assert controller.metric("dra_controller_leader") == 1.0
    assert controller.healthz() == 200

    # Pods gone: kube-controller-manager deallocates (upstream's finalizer); the controller
    # pins the claim again on the same node, with the same (only) devices.
    for name in pods:
        rest.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", {"gracePeriodSeconds": 0})

    def pinned_again() -> dict[str, Any] | None:
        if controller.metric('dra_controller_allocation_attempts_total{result="allocated"}') != 2.0:
            return None
        current = allocated(rest, ns, "shared")
        return current if current is not None and not current["status"].get("reservedFor") else None

    pinned = wait_for("the claim to be pinned again", pinned_again, 60)
    assert devices_of(pinned) == devices
    assert ALLOCATED_BY in pinned["metadata"]["annotations"]

    # Deleting the unused claim: nothing holds it up.
    rest.delete(f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims/shared")
    wait_for("the claim to be deleted", lambda: get_claim(rest, ns, "shared") is None, 60)
    assert controller.terminate() == 0


def test_preallocation_honours_device_taint_rules_where_served(
    scene: ControllerScene, kube_cluster: ControlPlane
) -> None:
    """A DeviceTaintRule on gpu-0 steers the pinned claim to gpu-1, as kube-scheduler would: from
    resource.k8s.io/v1 (1.37), or v1alpha3 where that is the version served (1.34 with its
    runtime config); where neither is served, nothing is read and gpu-0 is taken."""
    rest, node, ns = scene.rest, scene.node, scene.namespace
    served: str | None = None
    for version in ("v1", "v1alpha3"):
        try:
            rest.get(f"/apis/resource.k8s.io/{version}/devicetaintrules", {"limit": "1"})
        except ApiError as err:
            assert err.status == 404, err
            continue
        served = version
        break
    rules = f"/apis/resource.k8s.io/{served}/devicetaintrules"
    rule = f"taint-{node}"
    if served is not None:
        rest.create(
            rules,
            {
                "apiVersion": f"resource.k8s.io/{served}",
                "kind": "DeviceTaintRule",
                "metadata": {"name": rule},
                "spec": {
                    "deviceSelector": {"driver": DRIVER, "pool": node, "device": "gpu-0"},
                    "taint": {"key": "example.com/broken", "value": "ecc", "effect": "NoSchedule"},
                },
            },
        )
    try:
        # The scheduler's gates, as an admin passes them: on 1.34 DRADeviceTaints is alpha, off by
        # default, and a controller not told it is on allocates as a scheduler without it does.
        gates = kube_cluster.dra.feature_gates
        scene.start_controller("tainted", *(("--feature-gates", gates) if gates else ()))
        rest.create(
            f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
            claim_body("pinned", scene.device_class, annotations={PREALLOCATE: node}),
        )
        claim = wait_for("the controller to allocate the claim", lambda: allocated(rest, ns, "pinned"), 60)
        tainted = served is not None and cluster_features(kube_cluster).device_taints
        assert devices_of(claim) == [(node, "gpu-1" if tainted else "gpu-0")], served
    finally:
        if served is not None:
            rest.request("DELETE", f"{rules}/{rule}")


def test_stuck_claim_gets_event_naming_the_filter(scene: ControllerScene) -> None:
    rest, ns = scene.rest, scene.namespace
    controller = scene.start_controller("events")
    rest.create(
        f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
        claim_body(
            "impossible",
            scene.device_class,
            selector='device.attributes["gpu.draplugin.dev"].model == "none"',
        ),
    )
    rest.create(f"/api/v1/namespaces/{ns}/pods", pod_body("waiting", "impossible", containers=1))

    def events() -> list[dict[str, Any]] | None:
        found = [
            e
            for e in rest.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events").get("items") or []
            if e.get("reason") == "CannotAllocate" and e["regarding"]["name"] == "impossible"
        ]
        return found or None

    posted = wait_for("a CannotAllocate event on the claim", events, 60)
    assert len(posted) == 1
    event = posted[0]
    assert event["type"] == "Warning"
    assert event["regarding"]["kind"] == "ResourceClaim"
    assert "request selector removed 2" in event["note"], event["note"]
    assert event["reportingController"] == "gpu.draplugin.dev/dra-controller"
    # Rate limit: passes keep running (every few seconds), but no second event within the interval.
    wait_for(
        "several reconcile passes",
        lambda: (controller.metric('dra_controller_reconciles_total{result="success"}') or 0) >= 3,
        30,
    )
    assert len(events() or []) == 1
    assert controller.terminate() == 0


def test_two_replicas_one_leader_no_double_allocation(scene: ControllerScene) -> None:
    rest, node, ns = scene.rest, scene.node, scene.namespace
    first = scene.start_controller("replica-1")
    second = scene.start_controller("replica-2")

    def lease_holder() -> str | None:
        leases = rest.get(f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases").get("items") or []
        holder = leases[0]["spec"].get("holderIdentity") if leases else None
        return str(holder) if holder else None

    leader_id = wait_for("a leader", lease_holder, 60)
    leader, follower = (first, second) if leader_id == first.identity else (second, first)
    for i in range(3):  # three one-GPU claims on a two-GPU node: exactly two fit
        rest.create(
            f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
            claim_body(f"pinned-{i}", scene.device_class, annotations={PREALLOCATE: "any"}),
        )

    def two_allocated() -> list[dict[str, Any]] | None:
        claims = [allocated(rest, ns, f"pinned-{i}") for i in range(3)]
        done = [c for c in claims if c is not None]
        return done if len(done) == 2 else None

    done = wait_for("two claims allocated", two_allocated, 60)
    wait_for(
        "a few more passes",
        lambda: (leader.metric('dra_controller_reconciles_total{result="success"}') or 0) >= 3,
        30,
    )
    assert len([c for i in range(3) if (c := allocated(rest, ns, f"pinned-{i}"))]) == 2
    assert sorted(d for c in done for d in devices_of(c)) == [(node, "gpu-0"), (node, "gpu-1")]
    assert leader.metric("dra_controller_leader") == 1.0
    assert follower.metric("dra_controller_leader") == 0.0
    assert leader.metric('dra_controller_allocation_attempts_total{result="allocated"}') == 2.0
    assert follower.metric('dra_controller_allocation_attempts_total{result="allocated"}') == 0.0
    assert follower.metric('dra_controller_reconciles_total{result="success"}') == 0.0

    # SIGTERM: the leader releases the Lease and exits 0; the follower takes over.
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
    before = rest.get(leases)["items"][0]["spec"]
    assert leader.terminate() == 0
    wait_for("the follower to take the lease", lambda: lease_holder() == follower.identity, 30)
    after = rest.get(leases)["items"][0]["spec"]
    assert after["leaseTransitions"] == before["leaseTransitions"] + 1
    assert any(m.get("msg") == "lease released" for m in leader.log_messages())
    wait_for("the follower to lead", lambda: follower.metric("dra_controller_leader") == 1.0, 30)
    assert follower.terminate() == 0
