"""Our allocator against the real kube-scheduler on the same random scenarios.

Every scenario gets its own fake node, pool and DeviceClass (the class selects
only that scenario's devices), so hundreds run at once in one namespace. The
scheduler places one pod per scenario using the scenario's claim; we allocate
the same claim on the same node from the same objects. Required: the same
feasibility, and every result (ours and the scheduler's) satisfies the
selectors, constraints, taints and in-use rules. The chosen devices may differ.

Size: one file because generation, both runs and the checks form one differential.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from controller.allocation.builders import (
    claim,
    device,
    device_class,
    exactly,
    first_available,
    resource_slice,
)
from controller.allocation.constraints import build_constraints, lookup_attribute
from controller.allocation.features import Features
from controller.allocation.nodes import Node
from controller.allocation.pools import DeviceID
from controller.allocation.requests import Request, blocking_taint
from controller.cel import compile_selector
from controller.objects import RESOURCE_API
from controller.scheduler.allocator import Allocator
from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import ApiError, KubeApi
from tests.integration.release import cluster_features

pytestmark = pytest.mark.cluster
log = logging.getLogger(__name__)

D = "gpu.draplugin.dev"
SCENARIOS = int(os.environ.get("DRA_DIFF_SCENARIOS", "320"))
BATCH = 40
SEED = 20261129
MODELS = ("h100", "a100", "l4")


@dataclass
class Scenario:
    index: int
    node: str
    devices: list[dict[str, Any]]
    device_class: dict[str, Any]
    claim: dict[str, Any]
    blocked: list[str] = field(default_factory=list)  # devices held by an allocated claim

    @property
    def pool(self) -> str:
        return self.node


def make_scenario(rng: random.Random, index: int, node: str, namespace: str) -> Scenario:
    devices = []
    for i in range(rng.randint(1, 8)):
        attributes: dict[str, object] = {
            "model": rng.choice(MODELS),
            "numa": rng.randint(0, 2),
            "scenario": index,
        }
        if rng.random() < 0.6:
            attributes["memory"] = rng.choice((16, 40, 80))
        extra: dict[str, Any] = {}
        # NoSchedule only: with NoExecute the device-taint eviction controller may
        # delete a scheduled pod, which is about eviction, not allocation.
        if rng.random() < 0.1:
            extra["taints"] = [{"key": "maintenance", "value": "x", "effect": "NoSchedule"}]
        devices.append(device(f"gpu-{i}", attributes, **extra))
    cls = device_class(
        f"diff-{index}", [f'device.driver == "{D}" && device.attributes["{D}"].scenario == {index}']
    )
    class_name = cls["metadata"]["name"]

    def one_request(name: str) -> dict[str, Any]:
        selectors = []
        if rng.random() < 0.4:
            selectors.append(f'device.attributes["{D}"].model == "{rng.choice(MODELS)}"')
        if rng.random() < 0.3:
            memory = rng.choice((16, 40))
            selectors.append(
                f'"memory" in device.attributes["{D}"] && device.attributes["{D}"].memory >= {memory}'
            )
        extra: dict[str, Any] = {}
        if rng.random() < 0.15:
            extra["tolerations"] = [{"key": "maintenance", "operator": "Exists"}]
        if rng.random() < 0.1:
            return exactly(name, class_name, mode="All", selectors=selectors, **extra)
        return exactly(name, class_name, count=rng.randint(1, 3), selectors=selectors, **extra)

    requests: list[dict[str, Any]] = []
    for r in range(rng.choice((1, 1, 2))):
        if rng.random() < 0.2:
            requests.append(first_available(f"r{r}", one_request("big"), one_request("small")))
        else:
            requests.append(one_request(f"r{r}"))
    constraints = []
    if rng.random() < 0.35:
        constraints.append({"matchAttribute": f"{D}/numa"})
    elif rng.random() < 0.15 and len(requests) == 2:
        constraints.append({"distinctAttribute": f"{D}/numa"})
    scenario = Scenario(
        index=index,
        node=node,
        devices=devices,
        device_class=cls,
        claim=claim(f"claim-{index}", requests, namespace=namespace, constraints=constraints),
    )
    if rng.random() < 0.3:
        scenario.blocked = [rng.choice(devices)["name"]]
    return scenario


# ----- checking a result -----------------------------------------------------------------


def violations(scenario: Scenario, results: list[Mapping[str, Any]], features: Features) -> list[str]:
    """What is wrong with an allocation of the scenario's claim under a release's rules (empty: valid)."""
    problems: list[str] = []
    by_name = {d["name"]: d for d in scenario.devices}
    class_selector = compile_selector(scenario.device_class["spec"]["selectors"][0]["cel"]["expression"])
    requests = {r["name"]: r for r in scenario.claim["spec"]["devices"]["requests"]}
    used: set[str] = set()
    per_request: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        name = result["device"]
        dev = by_name.get(name)
        if result["pool"] != scenario.pool or dev is None:
            problems.append(f"{name}: not a device of this scenario")
            continue
        if name in used:
            problems.append(f"{name}: allocated twice")
        used.add(name)
        if name in scenario.blocked:
            problems.append(f"{name}: already allocated to another claim")
        main, _, sub = result["request"].partition("/")
        request = requests[main]
        spec = next(s for s in request["firstAvailable"] if s["name"] == sub) if sub else request["exactly"]
        if not class_selector.matches(D, dev):
            problems.append(f"{name}: fails the class selector")
        for selector in selecting_spec(request, sub, features).get("selectors", []):
            if not compile_selector(selector["cel"]["expression"]).matches(D, dev):
                problems.append(f"{name}: fails request selector {selector['cel']['expression']}")
        if blocking_taint(dev, Request(name=sub or main, parent=main if sub else "", spec=spec)) is not None:
            problems.append(f"{name}: untolerated taint")
        per_request.setdefault(result["request"], []).append(dev)
    for request_name, devs in per_request.items():
        main, _, sub = request_name.partition("/")
        request = requests[main]
        wanted = expected_count(request, sub, per_request, features)
        if wanted is not None and len(devs) != wanted:
            problems.append(f"request {request_name}: {len(devs)} devices instead of {wanted}")
    if len({r["request"].partition("/")[0] for r in results}) != len(requests):
        problems.append("not every request got devices")
    for constraint in scenario.claim["spec"]["devices"].get("constraints", []):
        attribute = constraint.get("matchAttribute") or constraint.get("distinctAttribute")
        values = [
            lookup_attribute(by_name[r["device"]], DeviceID(D, scenario.pool, r["device"]), attribute)
            for r in results
        ]
        if constraint.get("matchAttribute") and len(set(values)) > 1:
            problems.append(f"matchAttribute {attribute} violated: {values}")
        if constraint.get("distinctAttribute") and not distinct_holds(
            scenario, constraint, results, features
        ):
            problems.append(
                f"distinctAttribute {attribute} violated ({features.distinct_rule.value}): {values}"
            )
    return problems


def is_all(spec: Mapping[str, Any]) -> bool:
    return bool(spec.get("allocationMode") == "All")


def selecting_spec(request: Mapping[str, Any], sub: str, features: Features) -> Mapping[str, Any]:
    """The (sub)request whose selectors chose the devices of `request`/`sub` under the release's rules.

    Its own, except in 1.34/1.35 for an All subrequest at index 1 after an All subrequest
    (Features.all_subrequest_selects_as_previous): that one got index 0's selection.
    """
    if not sub:
        spec: Mapping[str, Any] = request["exactly"]
        return spec
    subs: list[Mapping[str, Any]] = request["firstAvailable"]
    index = next(i for i, s in enumerate(subs) if s["name"] == sub)
    if features.all_subrequest_selects_as_previous and index == 1 and is_all(subs[0]) and is_all(subs[1]):
        return subs[0]
    return subs[index]


def expected_count(
    request: Mapping[str, Any], sub: str, per_request: Mapping[str, list[Any]], features: Features
) -> int | None:
    """How many devices `request`/`sub` must have under the release's rules (None: All, not checked).

    In 1.34/1.35 (Features.all_subrequest_continues_with_first) an All subrequest after the
    first one got one device, after which the search went on with the first subrequest's
    second device: that one then has one device fewer than its count.
    """
    spec = next(s for s in request["firstAvailable"] if s["name"] == sub) if sub else request["exactly"]
    count = None if is_all(spec) else int(spec.get("count", 1))
    if not (sub and features.all_subrequest_continues_with_first):
        return count
    subs = request["firstAvailable"]
    if not any(is_all(s) and f"{request['name']}/{s['name']}" in per_request for s in subs[1:]):
        return count
    # A later All subrequest was chosen: it has one device, the first subrequest the rest.
    if sub == subs[0]["name"]:
        return None if count is None else count - 1
    return 1


def distinct_holds(
    scenario: Scenario, constraint: Mapping[str, Any], results: list[Mapping[str, Any]], features: Features
) -> bool:
    """Replay the devices, in result order (the order they were chosen), through the release's rule.

    From 1.37 on this means all values differ; 1.34 to 1.36 compared each device with fewer
    others (see DistinctRule), and kube-scheduler of those releases places claims accordingly.
    A clean replay: under the 1.35/1.36 rule a search that backtracked may have forgotten a
    request's value, so there this check is stricter than the scheduler (1.34 and 1.37: exact).
    """
    only = {"spec": {"devices": {"constraints": [constraint]}}}
    (rule,) = build_constraints(only, features)
    by_name = {d["name"]: d for d in scenario.devices}
    for r in results:
        main, _, sub = r["request"].partition("/")
        if not rule.add(main, sub, by_name[r["device"]], DeviceID(D, scenario.pool, r["device"])):
            return False
    return True


def brief(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """Results as request=device, for failure messages."""
    return [f"{r['request']}={r['device']}" for r in results]


# ----- cluster plumbing --------------------------------------------------------------------


def pod(name: str, namespace: str, claim_name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def wait_decided(
    api: KubeApi, namespace: str, count: int, timeout: float = 150.0
) -> dict[str, dict[str, Any]]:
    """Pods by name once each is bound or has been found unschedulable."""
    deadline = time.monotonic() + timeout
    while True:
        pods = api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        decided = {}
        for p in pods:
            conditions = {c["type"]: c for c in (p.get("status") or {}).get("conditions") or []}
            scheduled = conditions.get("PodScheduled")
            if p["spec"].get("nodeName") or (scheduled and scheduled["status"] == "False"):
                decided[p["metadata"]["name"]] = p
        if len(decided) >= count or time.monotonic() > deadline:
            return decided
        time.sleep(1.0)


@pytest.fixture
def cluster_objects(kube_cluster: Any) -> Iterator[tuple[KubeApi, list[Callable[[], object]]]]:
    api_client = kube_cluster.api_client()
    api = KubeApi(api_client)
    cleanups: list[Callable[[], object]] = []
    try:
        yield api, cleanups
    finally:
        for cleanup in reversed(cleanups):
            try:
                cleanup()
            except ApiError as err:
                log.warning("cleanup failed: %s", err)
        api_client.close()


def run_round(
    api: KubeApi,
    fake_node: Callable[..., str],
    test_namespace: str,
    rng: random.Random,
    indices: range,
    features: Features,
) -> tuple[int, list[str], list[str]]:
    """One batch of scenarios: (agreeing scenarios, disagreements, invalid results)."""
    scenarios = []
    for index in indices:
        node = fake_node(
            f"diff-{index}-{rng.randrange(10**6):06d}", {"diff.draplugin.dev/scenario": str(index)}
        )
        scenarios.append(make_scenario(rng, index, node, test_namespace))

    blockers: list[dict[str, Any]] = []
    for s in scenarios:
        s.device_class["metadata"]["labels"] = {"diff": "1"}
        api.request("POST", f"{RESOURCE_API}/deviceclasses", s.device_class)
        slice_obj = resource_slice(f"diff-{s.index}", s.devices, node=s.node, pool=s.pool)
        slice_obj["metadata"]["labels"] = {"diff": "1"}
        api.request("POST", f"{RESOURCE_API}/resourceslices", slice_obj)
        if s.blocked:
            blocker = claim(
                f"blocker-{s.index}",
                [exactly("gpu", s.device_class["metadata"]["name"])],
                namespace=test_namespace,
            )
            created = api.request(
                "POST", f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaims", blocker
            )
            created["status"] = {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": D, "pool": s.pool, "device": s.blocked[0]}]
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [s.node]}]}
                        ]
                    },
                }
            }
            api.request(
                "PUT",
                f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaims/blocker-{s.index}/status",
                created,
            )
            blockers.append(created)
        api.request("POST", f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaims", s.claim)
    # Our allocator sees exactly what the scheduler sees: every class, slice and allocated claim.
    allocator = Allocator(
        device_classes=[s.device_class for s in scenarios],
        slices=[resource_slice(f"diff-{s.index}", s.devices, node=s.node, pool=s.pool) for s in scenarios],
        allocated_claims=blockers,
        features=features,
    )
    ours = {
        s.index: allocator.allocate([s.claim], Node(s.node, {"diff.draplugin.dev/scenario": str(s.index)}))
        for s in scenarios
    }

    for s in scenarios:
        api.request(
            "POST",
            f"/api/v1/namespaces/{test_namespace}/pods",
            pod(f"pod-{s.index}", test_namespace, f"claim-{s.index}"),
        )
    decided = wait_decided(api, test_namespace, indices.stop)
    claims = {
        c["metadata"]["name"]: c
        for c in api.get(f"{RESOURCE_API}/namespaces/{test_namespace}/resourceclaims")["items"]
    }

    agree = 0
    disagreements: list[str] = []
    invalid: list[str] = []
    for s in scenarios:
        p = decided.get(f"pod-{s.index}")
        if p is None:
            state = api.get(f"/api/v1/namespaces/{test_namespace}/pods/pod-{s.index}")
            pytest.fail(f"scheduler did not decide pod-{s.index} in time: {state.get('status')}")
        placed = bool(p["spec"].get("nodeName"))
        outcome = ours[s.index]
        theirs: list[Mapping[str, Any]] = []
        if placed:
            assert p["spec"]["nodeName"] == s.node
            theirs = claims[f"claim-{s.index}"]["status"]["allocation"]["devices"]["results"]
            for problem in violations(s, theirs, features):
                invalid.append(f"scheduler, scenario {s.index}: {problem}; results={brief(theirs)}")
        if outcome.ok:
            mine = outcome.allocations[0]["devices"]["results"]
            for problem in violations(s, mine, features):
                invalid.append(
                    f"ours, scenario {s.index}: {problem}; results={brief(mine)}, scheduler's={brief(theirs)}"
                )
        if placed == outcome.ok:
            agree += 1
        else:
            disagreements.append(
                f"scenario {s.index}: scheduler placed={placed}, ours={outcome.ok} "
                f"({outcome.failure.message if outcome.failure else ''}); "
                f"claim={s.claim['spec']}, devices={s.devices}"
            )
    return agree, disagreements, invalid


def test_allocator_agrees_with_kube_scheduler(
    kube_cluster: ControlPlane,
    cluster_objects: tuple[KubeApi, list[Callable[[], object]]],
    fake_node: Callable[..., str],
    test_namespace: str,
) -> None:
    api, cleanups = cluster_objects
    # The rules of the release we run against (GET /version) and the gates the fixtures set.
    features = cluster_features(kube_cluster)
    cleanups.append(lambda: api.delete(f"{RESOURCE_API}/deviceclasses", query={"labelSelector": "diff=1"}))
    cleanups.append(lambda: api.delete(f"{RESOURCE_API}/resourceslices", query={"labelSelector": "diff=1"}))
    rng = random.Random(SEED)
    started = time.monotonic()
    agree = 0
    disagreements: list[str] = []
    invalid: list[str] = []
    # Batches keep each round short: fake nodes have no kubelet, and a long
    # set-up lets the node lifecycle controller act on them before the pods land.
    for start in range(0, SCENARIOS, BATCH):
        agreed, disagreed, wrong = run_round(
            api, fake_node, test_namespace, rng, range(start, min(start + BATCH, SCENARIOS)), features
        )
        agree += agreed
        disagreements += disagreed
        invalid += wrong
    elapsed = time.monotonic() - started
    print(
        f"\ndifferential: {agree}/{SCENARIOS} scenarios agree on feasibility ({elapsed:.1f}s, "
        f"distinctAttribute rule {features.distinct_rule.value})"
    )
    for line in disagreements + invalid:
        print(line)
    assert not invalid
    assert not disagreements
