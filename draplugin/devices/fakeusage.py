"""How busy a fake GPU looks: the `usage` key of a fake GPU entry, and its utilization over time.

Fake GPUs run no work, yet demos and tests need utilization that moves and
can be predicted: each fake GPU follows a sine wave around a busy level,
a function of its index and the wall clock only, so two runs at the same time
report the same numbers. A GPU with `usage: idle` stays at 0% busy (for idle
claim detection).

    gpus:
      - model: H100-80GB-HBM3
        count: 2
        usage: {busyPercent: 60, swingPercent: 30, period: 10m, memoryPercent: 40}
      - model: L4
        usage: idle

Without `usage` a GPU gets a busy level of its own (20, 35, 50 or 65% by
index) swinging by 20 points over 5 minutes plus 1 minute per index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dracommon.duration import parse_duration

IDLE = "idle"
_KEYS = {"busyPercent", "swingPercent", "period", "memoryPercent"}


@dataclass(frozen=True, slots=True)
class FakeUsage:
    """A fake GPU's utilization wave: `busy ± swing` percent over `period_s`, memory a fixed fraction."""

    busy_percent: float
    swing_percent: float
    period_s: float
    memory_percent: float

    def sm_ratio(self, phase: float, now: float) -> float:
        """Busy fraction (time a kernel ran) at wall time `now`; `phase` (0..1) offsets GPUs."""
        wave = math.sin(2 * math.pi * (now / self.period_s + phase))
        return min(1.0, max(0.0, (self.busy_percent + self.swing_percent * wave) / 100.0))

    def memory_ratio(self) -> float:
        return self.memory_percent / 100.0


IDLE_USAGE = FakeUsage(busy_percent=0.0, swing_percent=0.0, period_s=60.0, memory_percent=2.0)


def default_usage(index: int) -> FakeUsage:
    """The wave of a GPU whose entry names no `usage`: different per index, so a demo's GPUs differ."""
    busy = 20.0 + 15.0 * (index % 4)
    return FakeUsage(busy, 20.0, 300.0 + 60.0 * index, memory_percent=busy)


def parse_usage(where: str, value: Any) -> FakeUsage:
    """`idle`, or a mapping of the wave's keys; raises ValueError naming `where` and the key."""
    if value == IDLE:
        return IDLE_USAGE
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be 'idle' or a mapping with {', '.join(sorted(_KEYS))}")
    unknown = set(value) - _KEYS
    if unknown:
        raise ValueError(f"{where}: unknown keys: {', '.join(sorted(map(str, unknown)))}")

    def percent(key: str, default: float) -> float:
        raw = value.get(key, default)
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 <= raw <= 100:
            raise ValueError(f"{where}.{key}: must be a number from 0 to 100, got {raw!r}")
        return float(raw)

    busy = percent("busyPercent", 50.0)
    period_raw = value.get("period", "5m")
    try:
        period = parse_duration(str(period_raw))
    except ValueError as err:
        raise ValueError(f"{where}.period: {period_raw!r} {err}") from None
    if period <= 0:
        raise ValueError(f"{where}.period: must be longer than 0s")
    return FakeUsage(busy, percent("swingPercent", 0.0), period, percent("memoryPercent", busy))
