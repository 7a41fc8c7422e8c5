"""Which of the feasible nodes kube-scheduler picks for a pod, as far as DRA decides it.

After Filter, the scheduler scores every feasible node with each Score plugin, normalizes,
weights and sums the scores, and binds the pod to a node with the highest total; ties are
broken at random (`selectHost`'s reservoir sampling in 1.34, a random `Randomizer` key in
1.37's `sortedNodeScores`). So where nodes tie, any of them may be chosen.

The DynamicResources plugin scores only from 1.35 on (kubernetes#134711; 1.34.4 has no
Score), and only with DRAPrioritizedList on: per claim allocated in this cycle, each
`firstAvailable` subrequest that got devices adds `8 - its index` (8 is
FirstAvailableDeviceRequestMaxSize), so nodes where better-ranked alternatives fit win
(1.37.2 `computeScore`). NormalizeScore scales to 0..100 (`100 * score // max`, all 0
when the maximum is 0); the plugin weight (2) does not change which node is best.
Claims allocated before the cycle add the same to every node and are left out here.

Except in 1.35 (checked up to 1.35.4; 1.36.0 and 1.36.1 too, fixed by 1.36.3): there
`computeScore` walks all of the pod's claims by index into the allocations of its
*pending* claims only, so a pod that has an allocated claim besides pending ones makes
Score fail with an error ("number of allocations N is smaller than number of claims");
Score runs only when more than one node fits, and its error fails the pod's scheduling
attempt (`ScoreError`). 1.35's Score runs whatever DRAPrioritizedList says.

What this does not see: the other default Score plugins (NodeResourcesFit and
NodeResourcesBalancedAllocation on CPU/memory, ImageLocality, TaintToleration,
NodeAffinity preferences, PodTopologySpread, InterPodAffinity). For "a pod with no
other constraints" on alike nodes they tie; elsewhere they may prefer another node,
which the text says.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.allocation.features import Features
from controller.scheduler.nodefilter import NodeOutcome

JSON = Mapping[str, Any]

FIRST_AVAILABLE_MAX_SIZE = 8  # resourceapi.FirstAvailableDeviceRequestMaxSize
MAX_NODE_SCORE = 100  # fwk.MaxNodeScore


# How the scheduler framework wraps a Score plugin's error (`RunScorePlugins`).
SCORE_ERROR_PREFIX = 'running Score plugins: plugin "DynamicResources" failed with: '


class ScoreError(Exception):
    """The DynamicResources Score fails, which fails the pod's scheduling attempt."""


@dataclass(frozen=True)
class NodeChoice:
    """The node a simulation continues with, and every node kube-scheduler may equally pick."""

    chosen: NodeOutcome
    candidates: tuple[NodeOutcome, ...]  # the best-scored nodes, `chosen` first
    scores: Mapping[str, int] = field(default_factory=dict)  # raw DRA score per feasible node, when scored

    @property
    def deterministic(self) -> bool:
        return len(self.candidates) == 1

    @property
    def candidate_names(self) -> list[str]:
        return [c.node_name for c in self.candidates]

    def describe(self, feasible: int, *, continuing: bool = True) -> str | None:
        """The choice in words (with `continuing`, which node a simulation goes on with); None when
        only one node fits."""
        if feasible <= 1:
            return None
        scores = ", ".join(f"{name} {score}" for name, score in self.scores.items())
        if self.deterministic:
            return (
                f"{feasible} nodes fit; kube-scheduler prefers {self.chosen.node_name}: its DynamicResources "
                f"score (prioritized list: better-ranked firstAvailable subrequests) is the highest "
                f"({scores}), other score plugins (CPU/memory fit, ...) being equal"
            )
        why = (
            f"the same DynamicResources score after normalizing (raw: {scores})"
            if self.scores
            else "DRA does not score nodes in this release"
        )
        return (
            f"any of these nodes may be chosen: {', '.join(self.candidate_names)} ({why}; kube-scheduler "
            "breaks ties at random, other score plugins such as CPU/memory fit may prefer one)"
            + (f"; continuing with {self.chosen.node_name}" if continuing else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.node_name,
            "candidates": self.candidate_names,
            "deterministic": self.deterministic,
            "scores": dict(self.scores),
        }


def _requests(claim: JSON) -> list[JSON]:
    return list(((claim.get("spec") or {}).get("devices") or {}).get("requests") or [])


def dra_score(claims: Sequence[JSON], allocations: Sequence[JSON]) -> int:
    """The DynamicResources Score of one node: `allocations[i]` is what `claims[i]` got there."""
    score = 0
    for claim, allocation in zip(claims, allocations, strict=True):
        allocated = {
            str(r.get("request", "")) for r in (allocation.get("devices") or {}).get("results") or []
        }
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            if request.get("exactly"):
                continue
            for index, sub in enumerate(request.get("firstAvailable") or []):
                if f"{request.get('name', '')}/{sub.get('name', '')}" in allocated:
                    score += FIRST_AVAILABLE_MAX_SIZE - index
    return score


def normalize(scores: Mapping[str, int]) -> dict[str, int]:
    """`helper.DefaultNormalizeScore(MaxNodeScore, false, ...)`."""
    highest = max(scores.values(), default=0)
    if highest == 0:
        return dict(scores)
    return {name: MAX_NODE_SCORE * score // highest for name, score in scores.items()}


def choose_node(
    feasible: Sequence[NodeOutcome], claims: Sequence[JSON], features: Features, *, allocated: int = 0
) -> NodeChoice | None:
    """The best-scored feasible nodes (in the given order); None when none is feasible.

    `claims` are the pod's pending claims (allocated together on each feasible node), and
    `allocated` counts its claims that were allocated before. Raises ScoreError where the
    release's Score fails.
    """
    if not feasible:
        return None
    if len(feasible) == 1:
        return NodeChoice(feasible[0], (feasible[0],))  # the scheduler does not score a single node
    if features.prioritized_list_scoring and features.score_fails_with_allocated_claims and allocated:
        raise ScoreError(
            "kube-scheduler's DynamicResources Score fails with an error (a bug of 1.35, fixed by 1.36.3) "
            "because the pod has an allocated claim besides the ones to allocate and more than one node "
            f"fits, which aborts the pod's scheduling attempt: {SCORE_ERROR_PREFIX}number of allocations "
            f"{len(claims)} is smaller than number of claims"
        )
    if not (features.prioritized_list and features.prioritized_list_scoring):
        return NodeChoice(feasible[0], tuple(feasible))
    if not any(request.get("firstAvailable") for claim in claims for request in _requests(claim)):
        # Only firstAvailable subrequests score: every node scores 0, read no allocation.
        raw = {entry.node_name: 0 for entry in feasible}
    else:
        raw = {entry.node_name: dra_score(claims, entry.outcome.allocations) for entry in feasible}
    normalized = normalize(raw)
    best = max(normalized.values())
    candidates = tuple(entry for entry in feasible if normalized[entry.node_name] == best)
    return NodeChoice(candidates[0], candidates, raw)


__all__ = ["SCORE_ERROR_PREFIX", "NodeChoice", "ScoreError", "choose_node", "dra_score", "normalize"]
