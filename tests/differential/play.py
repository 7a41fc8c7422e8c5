"""Play scenarios against the real kube-scheduler and against `simulate`, many at once.

One batch: a fresh namespace (labelled for admin access); every scenario's nodes, classes,
slices, earlier claims (their allocation written to status) and claims created by a few
threads; a pause so the scheduler's informers have them; then every pod. A watch on the
namespace's pods waits until each pod is bound or marked unschedulable / SchedulerError, and a
short settle re-reads them (a pod the scheduler judged before an object reached its cache
would be retried and placed). Meanwhile `simulate` runs in-process on each scenario's own
objects, with the cluster's release rules and feature gates. Afterwards the batch's objects go
(pods forcibly, with grace period 0: no kubelet will confirm).
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from controller.allocation.features import Features
from controller.allocation.nodes import Node
from controller.objects import RESOURCE_API, ClusterObjects
from controller.options import selector_compiler
from controller.scheduler.allocator import Allocator
from controller.simulate.command import simulate
from devcluster.controlplane import ControlPlane
from devcluster.objects import create_fake_node
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import KubernetesVersion
from tests.differential.compare import (
    ERROR,
    INVALID,
    PLACED,
    UNDECIDED,
    UNSCHEDULABLE,
    Outcome,
    disagreement,
    ours_outcome,
)
from tests.differential.scenario import JSON, Scenario

log = logging.getLogger(__name__)

BATCH_LABEL = "diff.draplugin.dev/batch"
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
WORKERS = 6
INFORMER_PAUSE_S = 1.0
SETTLE_S = 2.0
DECIDE_TIMEOUT_S = 180.0
WATCH_S = 5  # between checks that kube-scheduler still runs


class SchedulerCrashed(RuntimeError):
    """kube-scheduler exited while a batch played: an upstream error, not a disagreement."""


@dataclass(frozen=True)
class Verdict:
    scenario: Scenario
    upstream: Outcome
    ours: Outcome
    problem: str | None  # None: they agree


class Player:
    def __init__(self, cluster: ControlPlane, features: Features, release: KubernetesVersion) -> None:
        self.cluster, self.features, self.release = cluster, features, release
        self._resources = ExitStack()
        self.api_client = self._resources.enter_context(cluster.api_client())
        self.api = KubeApi(self.api_client)

    def close(self) -> None:
        self._resources.close()

    # ----- ours

    def simulate(self, scenario: Scenario, namespace: str, only: str | None = None) -> Outcome:
        claims = scenario.in_namespace(scenario.blockers, namespace) + scenario.in_namespace(
            scenario.claims, namespace
        )
        objects = ClusterObjects(
            device_classes=scenario.classes,
            slices=scenario.slices,
            claims=claims,
            pods=[scenario.pod(namespace)],
        )
        allocator = Allocator(
            device_classes=scenario.classes,
            slices=scenario.slices,
            allocated_claims=[c for c in claims if (c.get("status") or {}).get("allocation")],
            features=self.features,
            compiler=selector_compiler(self.release),
        )
        labels = scenario.node_labels()
        nodes = [Node(name, {"kubernetes.io/hostname": name, **labels}) for name in sorted(scenario.nodes)]
        target = next((n for n in nodes if n.name == only), None) if only else None
        results = simulate(objects, allocator, nodes, target, extended_resources=False)
        return ours_outcome([r for r in results if r.pod == f"{scenario.tag}-pod"])

    # ----- the cluster

    def play(self, scenarios: Sequence[Scenario]) -> list[Verdict]:
        batch = uuid.uuid4().hex[:10]
        with self._namespace(batch) as namespace, ThreadPoolExecutor(WORKERS) as pool:
            try:
                created = list(pool.map(lambda s: self._create(s, namespace, batch), scenarios))
                time.sleep(INFORMER_PAUSE_S)
                playing = [s for s, problem in zip(scenarios, created, strict=True) if problem is None]
                list(pool.map(lambda s: self._create_pod(s, namespace), playing))
                pods = self._wait(namespace, {s.pod(namespace)["metadata"]["name"] for s in playing})
                claims = {
                    c["metadata"]["name"]: c
                    for c in self.api.list(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims")[0]
                }
                verdicts = []
                for s, problem in zip(scenarios, created, strict=True):
                    upstream = (
                        Outcome(INVALID, message=problem)
                        if problem is not None
                        else upstream_outcome(s, pods.get(f"{s.tag}-pod"), claims)
                    )
                    ours = self.simulate(s, namespace)
                    on_node = functools.partial(self.simulate, s, namespace)
                    verdicts.append(Verdict(s, upstream, ours, disagreement(s, upstream, ours, on_node)))
                return verdicts
            finally:
                self._clean_up(namespace, batch)

    @contextmanager
    def _namespace(self, batch: str) -> Iterator[str]:
        name = f"diff-{batch}"
        self.api.create("/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {ADMIN_ACCESS_LABEL: "true", BATCH_LABEL: batch}},
        })  # fmt: skip
        try:
            yield name
        finally:
            self._ignore_missing(lambda: self.api.delete(f"/api/v1/namespaces/{name}"))

    def _create(self, s: Scenario, namespace: str, batch: str) -> str | None:
        """Every object but the pod; a reason when the API server refuses one (the scenario is invalid)."""
        try:
            for node in s.nodes:
                create_fake_node(self.api_client, node, {**s.node_labels(), BATCH_LABEL: batch})
            for obj in [*s.classes, *s.slices]:
                labelled = {**obj, "metadata": {**obj["metadata"], "labels": {
                    **(obj["metadata"].get("labels") or {}), BATCH_LABEL: batch}}}  # fmt: skip
                kind = "deviceclasses" if obj["kind"] == "DeviceClass" else "resourceslices"
                self.api.create(f"{RESOURCE_API}/{kind}", labelled)
            claims_path = f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims"
            for blocker in s.in_namespace(s.blockers, namespace):
                status = blocker.pop("status")
                created = self.api.create(claims_path, blocker)
                created["status"] = status
                self.api.replace(f"{claims_path}/{blocker['metadata']['name']}/status", created)
            for c in s.in_namespace(s.claims, namespace):
                self.api.create(claims_path, c)
        except ApiError as err:
            return f"the API server refused an object: {err}"
        return None

    def _create_pod(self, s: Scenario, namespace: str) -> None:
        self.api.create(f"/api/v1/namespaces/{namespace}/pods", s.pod(namespace))

    def _wait(self, namespace: str, names: set[str]) -> dict[str, JSON]:
        """The pods once each is decided (or at the deadline), re-read after a settle."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        deadline = time.monotonic() + DECIDE_TIMEOUT_S
        items, version = self.api.list(path)
        pods = {p["metadata"]["name"]: p for p in items}
        while not all(decided(pods.get(n)) for n in names) and time.monotonic() < deadline:
            self._check_scheduler()
            try:
                for event in self.api.watch(path, version, timeout_s=WATCH_S):
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        pods[obj["metadata"]["name"]] = obj
                        if all(decided(pods.get(n)) for n in names):
                            break
            except ApiError as err:  # Gone or a broken stream: list again
                log.info("pod watch restarts: %s", err)
                items, version = self.api.list(path)
                pods = {p["metadata"]["name"]: p for p in items}
        time.sleep(SETTLE_S)
        self._check_scheduler()
        return {p["metadata"]["name"]: p for p in self.api.list(path)[0]}

    def _check_scheduler(self) -> None:
        for component in self.cluster.processes.components:
            if component.name == "kube-scheduler" and not component.alive():
                panic = [line for line in component.log_tail().splitlines() if line.startswith("panic:")]
                raise SchedulerCrashed(
                    f"upstream error: kube-scheduler exited ({panic[0] if panic else 'no panic line'}); "
                    f"log: {component.log_path}"
                )

    def _clean_up(self, namespace: str, batch: str) -> None:
        by_batch = {"labelSelector": f"{BATCH_LABEL}={batch}"}
        pods = f"/api/v1/namespaces/{namespace}/pods"
        self._ignore_missing(lambda: self.api.delete(pods, {"gracePeriodSeconds": 0}))
        self._ignore_missing(lambda: self.api.delete(f"{RESOURCE_API}/resourceslices", query=by_batch))
        self._ignore_missing(lambda: self.api.delete(f"{RESOURCE_API}/deviceclasses", query=by_batch))
        self._ignore_missing(lambda: self.api.delete("/api/v1/nodes", query=by_batch))

    @staticmethod
    def _ignore_missing(call: Any) -> None:
        try:
            call()
        except ApiError as err:
            if err.status != 404:
                log.warning("clean-up: %s", err)


def decided(pod: JSON | None) -> bool:
    if pod is None:
        return False
    if pod["spec"].get("nodeName"):
        return True
    condition = scheduled_condition(pod)
    return condition is not None and condition.get("status") == "False"


def scheduled_condition(pod: JSON) -> JSON | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled":
            return dict(condition)
    return None


def upstream_outcome(s: Scenario, pod: JSON | None, claims: dict[str, JSON]) -> Outcome:
    if pod is None or not decided(pod):
        status = (pod or {}).get("status")
        return Outcome(UNDECIDED, message=f"kube-scheduler did not decide in time (crashed?): {status}")
    node = pod["spec"].get("nodeName")
    if node:
        devices = []
        for c in s.claims:
            name = c["metadata"]["name"]
            allocation = ((claims.get(name) or {}).get("status") or {}).get("allocation") or {}
            devices += [
                (name, r["request"], r["device"])
                for r in (allocation.get("devices") or {}).get("results", [])
            ]
        return Outcome(PLACED, str(node), tuple(sorted(devices)))
    condition = scheduled_condition(pod) or {}
    kind = ERROR if condition.get("reason") == "SchedulerError" else UNSCHEDULABLE
    return Outcome(kind, message=str(condition.get("message", "")))
