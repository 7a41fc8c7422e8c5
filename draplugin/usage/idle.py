"""Idle claims: every device of a claim below a utilization threshold for a duration.

Information for people, nothing more: when a claim crosses the duration it
gets one Event (reason `ClaimIdle`, type Normal) on the ResourceClaim and on
each of its pods, and `draplugin_claim_idle` turns 1. Nothing is evicted or
changed. A pass where any of its devices is at or above the threshold makes
the claim busy again; the next idle stretch earns a new Event. A device
whose utilization is unknown (NVML gives none) counts as busy: no claim is
called idle on a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from draplugin.kubelet.interface import ClaimRef
from draplugin.usage.holders import Holder, PodRef

IDLE_REASON = "ClaimIdle"
EVENT_ACTION = "Usage"


class IdleEvents(Protocol):
    def claim_event(
        self, claim: ClaimRef, reason: str, note: str, *, warning: bool = True, action: str = ...
    ) -> None: ...

    def pod_event(
        self, pod: PodRef, reason: str, note: str, *, warning: bool = True, action: str = ...
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ClaimIdleness:
    namespace: str
    claim: str
    idle_seconds: float
    idle: bool


@dataclass
class _State:
    since: float | None = None  # when the current idle stretch began
    ratio_sum: float = 0.0  # the claim's utilization summed over the stretch's passes
    passes: int = 0
    reported: bool = False


def format_duration(seconds: float) -> str:
    """45m, 1h5m, 30s: the way people say how long."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    hours, minutes = divmod(whole // 60, 60)
    if not hours:
        return f"{minutes}m"
    return f"{hours}h{minutes}m" if minutes else f"{hours}h"


def idle_note(holder: Holder, models: Mapping[str, str], mean_ratio: float, seconds: float) -> str:
    """ "gpu-0 (NVIDIA H100 80GB HBM3) held by team-a/train-7 at 2% busy for 45m": busy is the time
    a kernel ran (NVML's utilization), not SM occupancy."""
    devices = ", ".join(f"{d} ({models[d]})" if models.get(d) else d for d in holder.devices)
    return (
        f"{devices} held by {holder.namespace}/{holder.name} at {mean_ratio * 100:.0f}% busy "
        f"for {format_duration(seconds)}"
    )


class IdleTracker:
    """Idle state per claim, fed once per sampling pass. Not thread-safe: the sampler's thread only."""

    def __init__(self, threshold_ratio: float, after_s: float, events: IdleEvents | None) -> None:
        self.threshold_ratio = threshold_ratio
        self.after_s = after_s
        self._events = events
        self._states: dict[str, _State] = {}

    def update(
        self,
        now: float,
        holders: Sequence[Holder],
        ratios: Mapping[tuple[str, str], float | None],
        models: Mapping[str, str],
    ) -> list[ClaimIdleness]:
        """`ratios[(claim uid, device)]`: the claim's utilization on that device this pass."""
        out: list[ClaimIdleness] = []
        for holder in holders:
            state = self._states.setdefault(holder.uid, _State())
            values = [ratios.get((holder.uid, d)) for d in holder.devices]
            known = [v for v in values if v is not None]
            if not known or len(known) < len(values) or max(known) >= self.threshold_ratio:
                self._states[holder.uid] = _State()
                out.append(ClaimIdleness(holder.namespace, holder.name, 0.0, False))
                continue
            if state.since is None:
                state.since = now
            state.ratio_sum += max(known)
            state.passes += 1
            seconds = now - state.since
            idle = seconds >= self.after_s
            if idle and not state.reported:
                state.reported = True
                self._report(holder, models, state.ratio_sum / state.passes, seconds)
            out.append(ClaimIdleness(holder.namespace, holder.name, seconds, idle))
        for uid in set(self._states) - {h.uid for h in holders}:
            del self._states[uid]  # unprepared: forget it, and its series go with the snapshot
        return out

    def _report(self, holder: Holder, models: Mapping[str, str], mean: float, seconds: float) -> None:
        if self._events is None:
            return
        note = idle_note(holder, models, mean, seconds)
        claim = ClaimRef(holder.namespace, holder.uid, holder.name)
        self._events.claim_event(claim, IDLE_REASON, note, warning=False, action=EVENT_ACTION)
        for pod in holder.pods:
            self._events.pod_event(pod, IDLE_REASON, note, warning=False, action=EVENT_ACTION)
