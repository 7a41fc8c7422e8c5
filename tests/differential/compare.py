"""What `simulate` and kube-scheduler must agree on for one scenario.

- The kind of outcome: placed, unschedulable, or a scheduling error (a Filter or Score error
  that fails the pod's attempt: PodScheduled reason SchedulerError).
- The node, where upstream is deterministic: when `simulate` says the choice is determined
  (no `possibleNodes`), the scheduler's node must be ours; where nodes tie, the scheduler's
  node must be among those we list.
- The devices, where upstream is deterministic: the node sees one slice with devices. With
  several slices (or pools) the scheduler's search order comes from Go maps and informer
  order, so another valid set may win; then only the kind and node are compared.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.scheduler.nodefilter import scheduling_error_message
from controller.simulate.command import ClaimResult
from tests.differential.scenario import Scenario

PLACED, UNSCHEDULABLE, ERROR, UNDECIDED, INVALID = "placed", "unschedulable", "error", "undecided", "invalid"

Device = tuple[str, str, str]  # (claim, request, device)
# How simulate's reason starts for a Filter error (nodefilter) and a Score error (nodescore).
ERROR_REASONS = (
    scheduling_error_message("", "").split(" on node ", 1)[0],
    "kube-scheduler's DynamicResources Score fails with an error",
)


@dataclass(frozen=True)
class Outcome:
    kind: str
    node: str | None = None
    devices: tuple[Device, ...] = ()
    possible_nodes: tuple[str, ...] = ()  # ours only: the nodes that tie (empty: one node is it)
    message: str = ""


def ours_outcome(results: Sequence[ClaimResult]) -> Outcome:
    """The outcome `simulate` reports for the pod, from its per-claim results (pod order)."""
    if results and all(r.allocated for r in results):
        devices = tuple(sorted((r.name, d["request"], d["device"]) for r in results for d in r.results))
        return Outcome(PLACED, results[0].node_name, devices, tuple(results[0].possible_nodes))
    reasons = [r.reason or "" for r in results if not r.allocated]
    message = reasons[0] if reasons else "no result"
    # A scheduling error is the pod's failure itself (simulate's reason then is the error); a
    # reason that only explains one claim on its own may mention an error that never happens
    # in the pod's Filter (there an earlier claim of the pod takes the device first).
    if any(reason.startswith(ERROR_REASONS) for reason in reasons):
        return Outcome(ERROR, message=message)
    return Outcome(UNSCHEDULABLE, message=message)


def devices_deterministic(scenario: Scenario, node: str) -> bool:
    slices = [s for s in scenario.slices if s["spec"].get("nodeName") == node and s["spec"].get("devices")]
    return len(slices) <= 1


def disagreement(
    scenario: Scenario, upstream: Outcome, ours: Outcome, ours_on: Callable[[str], Outcome]
) -> str | None:
    """Why the two disagree (the first word names the kind of disagreement), or None."""
    if upstream.kind in (UNDECIDED, INVALID):
        return f"{upstream.kind}: {upstream.message}"
    if upstream.kind != ours.kind:
        return (
            f"outcome: scheduler {upstream.kind} ({upstream.message}), simulate {ours.kind} ({ours.message})"
        )
    if upstream.kind != PLACED:
        return None
    assert upstream.node is not None
    if ours.possible_nodes:
        if upstream.node not in ours.possible_nodes:
            return f"node: scheduler chose {upstream.node}, simulate says one of {list(ours.possible_nodes)}"
    elif upstream.node != ours.node:
        return f"node: scheduler chose {upstream.node}, simulate {ours.node} (as the only choice)"
    mine = ours if ours.node == upstream.node else ours_on(upstream.node)
    if mine.kind != PLACED:
        return f"node: scheduler placed the pod on {upstream.node}, simulate cannot ({mine.message})"
    if devices_deterministic(scenario, upstream.node) and mine.devices != upstream.devices:
        return f"devices: scheduler {list(upstream.devices)}, simulate {list(mine.devices)}"
    return None
