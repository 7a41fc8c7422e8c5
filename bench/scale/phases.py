"""kube-scheduler's rates from what the harness saw: when the scheduler started and when each pod
was seen bound (its watch event with spec.nodeName), for `bench.scale.scheduler`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SchedulingRun:
    """One run: every pod existed before kube-scheduler started (times in seconds, one clock)."""

    nodes: int
    pods: int
    started: float  # kube-scheduler's process spawned
    bound: tuple[float, ...]  # each bound pod's first event with a node, sorted

    @classmethod
    def from_events(
        cls, nodes: int, pods: int, started: float, bound_at: Mapping[str, float]
    ) -> SchedulingRun:
        return cls(nodes, pods, started, tuple(sorted(bound_at.values())))

    @property
    def complete(self) -> bool:
        return len(self.bound) == self.pods

    @property
    def start_to_last_s(self) -> float:
        """Start-up, informer sync and every decision and binding: what a user waits for."""
        return self.bound[-1] - self.started

    @property
    def first_to_last_s(self) -> float:
        """The scheduling phase alone: from the first pod bound to the last."""
        return self.bound[-1] - self.bound[0]

    @property
    def until_first_s(self) -> float:
        return self.bound[0] - self.started

    def pods_per_s(self) -> float:
        return len(self.bound) / self.start_to_last_s

    def phase_pods_per_s(self) -> float:
        """Pods bound after the first, over the time they took (the first marks the start)."""
        return (len(self.bound) - 1) / self.first_to_last_s if self.first_to_last_s > 0 else 0.0

    def ms_per_pod(self) -> float:
        return 1000 / self.phase_pods_per_s() if self.phase_pods_per_s() else 0.0
