"""Our compile-time cost estimate agrees with a real kube-apiserver over a generated corpus.

Thousands of seeded random DRA selectors (tests/celcorpus.py), sent as DeviceClass dry-run
creates with 32 selectors each; the per-selector verdicts come back as status.details.causes
keyed by `spec.selectors[i].cel.expression`. Each is compared with `compile_selector` for the
server's release: accept / reject for cost / reject for another reason. The test prints the
agreement as a number and lists every disagreement with both verdicts and our estimate.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence

import pytest

from controller.allocation.builders import device_class
from controller.cel import CompileError, analysis, compile_selector
from controller.cel.selector import MAX_COST
from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import KubernetesVersion
from tests.celcorpus import corpus
from tests.integration.release import cluster_version

pytestmark = pytest.mark.cluster

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"
CORPUS_SIZE = 2000
# resource.k8s.io/v1 allows at most 32 selectors per DeviceClass.
BATCH = 32
ACCEPT, COST, OTHER = "accept", "reject (cost)", "reject (other)"
_SELECTOR_FIELD = re.compile(r"^spec\.selectors\[(\d+)\]\.cel\.expression$")


def _verdict_of_message(message: str) -> str:
    return COST if "exceeds cost limit" in message else OTHER


def dry_run_batches(api: KubeApi, expressions: Sequence[str]) -> list[str]:
    """The API server's verdict per expression, 32 selectors per dry-run DeviceClass."""
    verdicts: list[str] = []
    for start in range(0, len(expressions), BATCH):
        batch = list(expressions[start : start + BATCH])
        found = [ACCEPT] * len(batch)
        try:
            api.request(
                "POST",
                DEVICE_CLASSES,
                device_class(f"corpus-{uuid.uuid4().hex[:12]}", batch),
                query={"dryRun": "All"},
            )
        except ApiError as err:
            assert err.status == 422, err.body
            body = json.loads(err.body) if isinstance(err.body, str) else err.body
            causes = body.get("details", {}).get("causes", [])
            assert causes, f"a rejection without per-selector causes: {body}"
            for cause in causes:
                match = _SELECTOR_FIELD.match(cause.get("field", ""))
                assert match, f"a cause outside the selectors: {cause}"
                index = int(match.group(1))
                # Several causes for one selector: a cost rejection wins (it is what we compare).
                if found[index] != COST:
                    found[index] = _verdict_of_message(cause.get("message", ""))
        verdicts.extend(found)
    return verdicts


def our_verdict(expression: str, release: KubernetesVersion) -> tuple[str, str]:
    """(verdict, detail) from compile_selector for that release; detail says our estimate."""
    try:
        selector = compile_selector(expression, kubernetes_version=release)
    except CompileError as err:
        return _verdict_of_message(err.message), f"{err.message}; estimated cost {_estimate(expression)}"
    return ACCEPT, f"estimated cost {selector.estimated_cost}"


def _estimate(expression: str) -> str:
    try:
        return str(analysis.analyze(expression).cost)
    except CompileError as err:
        return f"n/a ({err.message})"


def _cost_or_zero(expression: str) -> int:
    try:
        return analysis.analyze(expression).cost
    except CompileError:
        return 0


def compare(
    expressions: Sequence[str], verdicts: Sequence[str], release: KubernetesVersion
) -> tuple[int, list[str]]:
    """(number agreeing, a line per disagreement)."""
    agree = 0
    disagreements: list[str] = []
    for expression, theirs in zip(expressions, verdicts, strict=True):
        ours, detail = our_verdict(expression, release)
        if ours == theirs:
            agree += 1
        else:
            disagreements.append(f"apiserver: {theirs}; ours: {ours} ({detail}): {expression}")
    return agree, disagreements


@pytest.mark.parametrize(
    ("size", "transform_map"),
    # The second corpus also draws transformMap/transformMapEntry (off in the first, which is
    # kept as it was so its verdicts stay comparable between runs).
    [(CORPUS_SIZE, False), (CORPUS_SIZE // 2, True)],
    ids=["corpus", "transformMap-corpus"],
)
def test_cost_estimate_agrees_with_apiserver_over_generated_corpus(
    kube_cluster: ControlPlane, size: int, transform_map: bool
) -> None:
    release = cluster_version(kube_cluster)
    expressions = corpus(size, transform_map=transform_map)
    with kube_cluster.api_client() as client:
        verdicts = dry_run_batches(KubeApi(client), expressions)
    # The corpus must span the limit, or agreement would say nothing about the estimate.
    assert verdicts.count(ACCEPT) > size // 10, "the corpus barely has accepted expressions"
    assert verdicts.count(COST) > size // 20, "the corpus barely reaches the cost limit"
    near = sum(1 for e in expressions if MAX_COST // 2 <= _cost_or_zero(e) <= 2 * MAX_COST)
    assert near >= size // 100, f"only {near} expressions within a factor 2 of the limit"
    agree, disagreements = compare(expressions, verdicts, release)
    counts = ", ".join(f"{verdicts.count(v)} {v}" for v in (ACCEPT, COST, OTHER))
    summary = (
        f"kube-apiserver {release[0]}.{release[1]}{' (transformMap corpus)' if transform_map else ''}:"
        f" agreement {agree}/{len(expressions)}"
        f" (apiserver: {counts}; {near} estimated within a factor 2 of the limit)"
    )
    print(summary)
    for line in disagreements:
        print(line)
    assert agree == len(expressions), summary + "\n" + "\n".join(disagreements)
