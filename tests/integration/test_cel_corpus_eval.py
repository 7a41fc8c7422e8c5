"""Our CEL engine evaluates a generated corpus as upstream does, device by device.

The corpus is tests/celcorpus.py's (the one test_cel_corpus_apiserver.py compares compile and
cost on), evaluated on its `fleet` (whole and MIG GPUs with their own UUIDs, addresses, indexes
and driver versions, some lacking attributes so that unguarded reads err):

* against cel-go as kube-scheduler runs it: the celpeer harness (tests/cluster/peers, upstream's
  k8s.io/dynamic-resource-allocation/cel) evaluates every expression that compiles on both
  sides on every device; match / no match / runtime error must agree on every pair;
* against the real kube-scheduler on a sample: per expression one scenario of the scheduler
  differential (tests/differential): one node whose slice is the fleet and a claim with
  `allocationMode: All` and the expression as its selector. The scheduler then allocates
  exactly the matching devices, finds the pod unschedulable when none matches, and fails the
  attempt (SchedulerError) when the expression errs on a device; that must be what our engine
  predicts from the fleet, and what `simulate` says (the differential's own comparison).

transformMap / transformMapEntry join the corpus only in their own test, so that the default
corpus stays the one the apiserver comparison checks.
CEL_EVAL_CORPUS (default 2000) sets the corpus size, CEL_EVAL_SCHEDULER_SAMPLE (default 150)
the scheduler's sample.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench.peers import run_peer
from controller.allocation.builders import claim, device_class, exactly, resource_slice
from controller.allocation.features import Features
from controller.cel import CompileError, EvaluationError, Selector, compile_selector
from devcluster.controlplane import ControlPlane
from dracommon.kubeversion import KubernetesVersion
from tests.celcorpus import FLEET_DRIVER, corpus, fleet
from tests.differential.compare import ERROR, PLACED, UNSCHEDULABLE, Outcome
from tests.differential.play import Player
from tests.differential.scenario import SCENARIO_LABEL, Scenario, driver_name
from tests.integration.release import cluster_features, cluster_version

pytestmark = pytest.mark.cluster

CORPUS_SIZE = int(os.environ.get("CEL_EVAL_CORPUS", "2000"))
SCHEDULER_SAMPLE = int(os.environ.get("CEL_EVAL_SCHEDULER_SAMPLE", "150"))
SEED = 20261201
MATCH, NO_MATCH, FAILS = "match", "no match", "error"
REQUEST = "r0"
# The release of k8s.io/dynamic-resource-allocation celpeer is built from (tests/cluster/peers/go.mod).
# For another release only its verdicts on what both sides compile are compared: what compiles
# there is that release's apiserver's business (test_cel_corpus_apiserver.py).
CELPEER_RELEASE = (1, 37)

Device = dict[str, Any]


# ---------------------------------------------------------------------- verdicts per device


def our_verdicts(selector: Selector, driver: str, devices: Sequence[Device]) -> list[tuple[str, str]]:
    """(verdict, error message or "") per device, by our engine (memoized, as the allocator runs it)."""
    verdicts = []
    for device in devices:
        try:
            verdicts.append((MATCH if selector.matches(driver, device) else NO_MATCH, ""))
        except EvaluationError as err:
            verdicts.append((FAILS, str(err)))
    return verdicts


def peer_verdicts(result: dict[str, Any], index: int, size: int) -> list[tuple[str, str]]:
    verdicts = [(NO_MATCH, "")] * size
    for device in result["matches"][index]:
        verdicts[device] = (MATCH, "")
    for device, message in zip(result["errors"][index], result["error_messages"][index], strict=True):
        verdicts[device] = (FAILS, message)
    return verdicts


def ours_compiled(expression: str, release: KubernetesVersion) -> Selector | CompileError:
    try:
        return compile_selector(expression, kubernetes_version=release)
    except CompileError as err:
        return err


@dataclass
class Agreement:
    expressions: int = 0  # compiled on both sides and evaluated
    pairs: int = 0
    agreed: int = 0
    spread: dict[str, int] = field(default_factory=dict)  # how the expressions' outcomes vary
    disagreements: list[str] = field(default_factory=list)  # per expression and verdict pair
    only_ours: list[str] = field(default_factory=list)  # compiles with us, not with cel-go
    only_theirs: list[str] = field(default_factory=list)  # cel-go compiles, we refuse (not for cost)
    over_cost: int = 0  # we (and the apiserver) refuse for cost: the scheduler never sees them
    seconds_ours: float = 0.0
    seconds_peer: float = 0.0
    engine: str = ""  # ours: cel-expr-python unless it failed to load (then cel-python, which differs)

    def summary(self, label: str) -> str:
        rate = 100.0 * self.agreed / self.pairs if self.pairs else 0.0
        return (
            f"{label} (our engine: {self.engine}): evaluation agreement {self.agreed}/{self.pairs} "
            "(expression, device) pairs "
            f"({rate:.2f}%) over {self.expressions} expressions; outcome spread {self.spread}; "
            f"compiles only with us: {len(self.only_ours)}, only with cel-go: {len(self.only_theirs)}, "
            f"refused for cost: {self.over_cost}; ours {self.seconds_ours:.1f}s "
            f"(compile + evaluate), cel-go {self.seconds_peer:.1f}s (process, compile, evaluate)"
        )


def _spread_kind(verdicts: Sequence[str]) -> str:
    kinds = sorted(set(verdicts))
    return "+".join(kinds)


def against_cel_go(expressions: Sequence[str], release: KubernetesVersion, features: Features) -> Agreement:
    devices = fleet(shareable=features.consumable_capacity)
    report = Agreement()
    started = time.monotonic()
    compiled = [ours_compiled(e, release) for e in expressions]
    report.seconds_ours = time.monotonic() - started
    report.engine = compile_selector("true", kubernetes_version=release).engine
    # Refused for cost by us and by the apiserver (test_cel_corpus_apiserver): such a selector
    # never reaches the scheduler, whose compiler does not estimate; cel-go would only run it
    # up to its runtime cost limit, slowly.
    sent = [
        i
        for i, c in enumerate(compiled)
        if not (isinstance(c, CompileError) and "exceeds cost limit" in c.message)
    ]
    report.over_cost = len(expressions) - len(sent)
    started = time.monotonic()
    peer = run_peer(
        "celpeer",
        {
            "driver": FLEET_DRIVER,
            "selectors": [expressions[i] for i in sent],
            "devices": devices,
            "report_compile_errors": True,
            "error_messages": True,
            "skip_timing": True,
            # The scheduler's CEL environment for the cluster's gates (1.34's cluster turns
            # DRAConsumableCapacity on; list-typed attributes stay off everywhere we test).
            "features": {"consumable_capacity": features.consumable_capacity, "list_type_attributes": False},
        },
        timeout_s=600,
    )
    report.seconds_peer = time.monotonic() - started
    started = time.monotonic()
    for position, index in enumerate(sent):
        expression, ours = expressions[index], compiled[index]
        theirs_error = peer["compile_errors"][position]
        if isinstance(ours, CompileError):
            if not theirs_error:
                report.only_theirs.append(f"ours: {ours.message}: {expression}")
            continue
        if theirs_error:
            report.only_ours.append(f"cel-go: {theirs_error}: {expression}")
            continue
        report.expressions += 1
        mine = our_verdicts(ours, FLEET_DRIVER, devices)
        upstream = peer_verdicts(peer, position, len(devices))
        kind = _spread_kind([v for v, _ in mine])
        report.spread[kind] = report.spread.get(kind, 0) + 1
        # One line per expression and pair of verdicts, naming every device it holds for.
        differing: dict[tuple[str, str, str], list[str]] = {}
        for device, (a, b) in enumerate(zip(mine, upstream, strict=True)):
            report.pairs += 1
            if a[0] == b[0]:
                report.agreed += 1
            else:
                theirs_text = f"{b[0]} ({b[1]})" if b[1] else b[0]
                ours_text = f"{a[0]} ({a[1].split(': ', 1)[-1]})" if a[1] else a[0]
                differing.setdefault((theirs_text, ours_text, expression), []).append(
                    str(devices[device]["name"])
                )
        for (theirs_text, ours_text, _), names in differing.items():
            report.disagreements.append(
                f"on {', '.join(names)}: cel-go {theirs_text}; ours {ours_text}: {expression}"
            )
    report.seconds_ours += time.monotonic() - started
    return report


def _print(report: Agreement, label: str, release: KubernetesVersion) -> str:
    summary = report.summary(label)
    if release != CELPEER_RELEASE:
        major, minor = CELPEER_RELEASE
        summary += f" (celpeer compiles as {major}.{minor} does: compile counts are not compared)"
    print(f"\n{summary}")
    for title, lines in (
        ("disagreement", report.disagreements),
        ("compiles only with us", report.only_ours),
        ("compiles only with cel-go", report.only_theirs),
    ):
        for line in lines:
            print(f"- {title}: {line}")
    return summary


def test_evaluation_agrees_with_cel_go_over_generated_corpus(kube_cluster: ControlPlane) -> None:
    release = cluster_version(kube_cluster)
    report = against_cel_go(corpus(CORPUS_SIZE), release, cluster_features(kube_cluster))
    summary = _print(
        report, f"cel-go (kube-scheduler's DRA CEL) vs ours for {release[0]}.{release[1]}", release
    )
    # The corpus must reach every verdict on one expression's devices, or agreement says little.
    mixed = sum(n for kind, n in report.spread.items() if "+" in kind)
    erring = sum(n for kind, n in report.spread.items() if FAILS in kind and kind != FAILS)
    assert report.expressions >= CORPUS_SIZE // 2, summary
    assert mixed >= report.expressions // 5, f"too few expressions vary over the fleet: {summary}"
    assert erring >= report.expressions // 10, f"too few expressions err on some devices only: {summary}"
    assert report.agreed == report.pairs, summary + "\n" + "\n".join(report.disagreements[:50])
    if release == CELPEER_RELEASE:
        # What the scheduler compiles and we refuse (or the reverse), the cost limit aside.
        assert not report.only_ours and not report.only_theirs, summary


def test_transform_map_evaluation_agrees_with_cel_go(kube_cluster: ControlPlane) -> None:
    """The corpus with transformMap / transformMapEntry: compiled and evaluated as cel-go does."""
    release = cluster_version(kube_cluster)
    expressions = [e for e in corpus(CORPUS_SIZE, transform_map=True) if ".transformMap" in e]
    report = against_cel_go(expressions, release, cluster_features(kube_cluster))
    summary = _print(report, f"transformMap corpus, cel-go vs ours for {release[0]}.{release[1]}", release)
    assert len(expressions) >= CORPUS_SIZE // 10, summary
    if release == CELPEER_RELEASE:
        assert not report.only_theirs, summary + f" (first: {report.only_theirs[0]})"
        assert not report.only_ours, summary + f" (first: {report.only_ours[0]})"
    assert report.expressions >= len(expressions) // 2, summary
    assert report.agreed == report.pairs, summary + "\n" + "\n".join(report.disagreements[:50])


# ---------------------------------------------------------------------- the real kube-scheduler


def scheduler_scenario(tag: str, minor: int, expression: str, devices: Sequence[Device]) -> Scenario:
    """One node whose slice is the fleet; the pod's one claim wants All devices the expression selects."""
    driver, node = driver_name(tag), f"{tag}-n0"
    slices = [resource_slice(f"{node}-s0", devices, node=node, pool=node, driver=driver)]
    classes = [device_class(f"{tag}-any", [f'device.driver == "{driver}"'])]
    for obj in (*slices, *classes):
        obj["metadata"]["labels"] = {SCENARIO_LABEL: tag}
    request = exactly(REQUEST, classes[0]["metadata"]["name"], mode="All", selectors=[expression])
    claims = [claim(f"{tag}-claim0", [request], namespace="")]
    return Scenario(tag=tag, minor=minor, nodes=[node], slices=slices, classes=classes, claims=claims)


def predicted(scenario: Scenario, selector: Selector, devices: Sequence[Device]) -> Outcome:
    """What allocationMode All makes of our per-device verdicts."""
    verdicts = our_verdicts(selector, scenario.driver, devices)
    if any(v == FAILS for v, _ in verdicts):
        return Outcome(ERROR, message=next(m for v, m in verdicts if v == FAILS))
    claim_name = scenario.claims[0]["metadata"]["name"]
    chosen = tuple(
        sorted(
            (claim_name, REQUEST, d["name"])
            for d, (v, _) in zip(devices, verdicts, strict=True)
            if v == MATCH
        )
    )
    if not chosen:
        return Outcome(UNSCHEDULABLE)
    return Outcome(PLACED, scenario.nodes[0], chosen)


def _outcome_text(outcome: Outcome) -> str:
    if outcome.kind == PLACED:
        return f"placed {[d for _, _, d in outcome.devices]}"
    return f"{outcome.kind} ({outcome.message[:300]})" if outcome.message else outcome.kind


def test_kube_scheduler_allocates_exactly_the_matching_devices(kube_cluster: ControlPlane) -> None:
    release, features = cluster_version(kube_cluster), cluster_features(kube_cluster)
    # 1.34.4's scheduler panics on shareable devices (see tests/differential/generator.py).
    devices = fleet(shareable=features.consumable_capacity and release[1] >= 35)
    accepted: list[tuple[str, Selector]] = []
    for expression in corpus(CORPUS_SIZE):
        compiled = ours_compiled(expression, release)
        if isinstance(compiled, Selector):  # what the apiserver accepts (test_cel_corpus_apiserver)
            accepted.append((expression, compiled))
    sample = random.Random(f"{SEED}-{release[1]}").sample(accepted, min(SCHEDULER_SAMPLE, len(accepted)))
    scenarios = [scheduler_scenario(f"cev{i:05d}", release[1], e, devices) for i, (e, _) in enumerate(sample)]
    expected = [predicted(s, selector, devices) for s, (_, selector) in zip(scenarios, sample, strict=True)]
    kinds = {kind: sum(1 for o in expected if o.kind == kind) for kind in (PLACED, UNSCHEDULABLE, ERROR)}
    assert all(kinds.values()), f"the sample does not reach every outcome: {kinds}"

    player = Player(kube_cluster, features, release)
    started = time.monotonic()
    try:
        verdicts = player.play(scenarios)
    finally:
        player.close()
    seconds = time.monotonic() - started
    engine_agree, simulate_agree, problems = 0, 0, []
    for (expression, _), verdict, ours in zip(sample, verdicts, expected, strict=True):
        upstream = verdict.upstream
        same = upstream.kind == ours.kind and (upstream.kind != PLACED or upstream.devices == ours.devices)
        engine_agree += same
        simulate_agree += verdict.problem is None
        if not same:
            problems.append(
                f"engine: scheduler {_outcome_text(upstream)}; ours {_outcome_text(ours)}: {expression}"
            )
        if verdict.problem is not None:
            problems.append(f"simulate: {verdict.problem}: {expression}")
    total = len(sample)
    summary = (
        f"kube-scheduler {release[0]}.{release[1]} on {total} corpus expressions over a "
        f"{len(devices)}-device fleet (predicted {kinds}): our engine agrees on {engine_agree}/{total} "
        f"({100.0 * engine_agree / total:.2f}%), simulate on {simulate_agree}/{total}; {seconds:.0f}s"
    )
    print(f"\n{summary}")
    for line in problems:
        print(f"- {line}")
    assert engine_agree == total and simulate_agree == total, summary + "\n" + "\n".join(problems)
