"""What counts as a device fault, the taint it gets, and when it clears: the `--health-*`
settings (`draplugin.devices.health` applies them).

Apart from the health tracker so that `draplugin.config` checks these settings without importing
the tracker and its asyncio stream (the kubelet plugin's imports before its sockets open,
`tests/unit/test_plugin_start_imports.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dracommon.duration import parse_duration

if TYPE_CHECKING:
    from draplugin.devices.model import TaintEffect

# XIDs caused by applications (bad kernels, MMU faults from user code, resets they asked for):
# they say nothing about the GPU, so they do not taint it. The NVIDIA device plugin and DRA
# driver skip the same six by default: graphics engine exception (13), MMU fault (31), reset
# channel verification (43), preemptive cleanup (45), video processor exception (68), context
# switch timeout (109).
DEFAULT_APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
# XIDs after which running work is lost or the GPU is gone: double-bit ECC (48), row-remap
# failure (64), NVLink (74), fallen off the bus (79), uncontained ECC (94, 95), GSP errors
# (119, 120), unrecovered ECC (140). These take `--health-taint-effect`; other XIDs NoSchedule.
DEFAULT_FATAL_XIDS = frozenset({48, 64, 74, 79, 94, 95, 119, 120, 140})
# The NVIDIA DRA driver's choice: no new pods, running ones keep going.
DEFAULT_TAINT_EFFECT: TaintEffect = "NoSchedule"
TAINT_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "NoExecute")

RecoveryMode = Literal["never", "on-reset", "after"]


@dataclass(frozen=True, slots=True)
class Recovery:
    """When a fault clears: `never`, `on-reset` (the device came back), or `after` `quiet_s`
    seconds without a new fault (a device that comes back clears then too)."""

    mode: RecoveryMode = "on-reset"
    quiet_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Recovery:
        """`never`, `on-reset` or `after:<duration>`; ValueError saying what is accepted."""
        raw = text.strip()
        if raw in ("never", "on-reset"):
            return cls(raw)  # type: ignore[arg-type]
        head, sep, duration = raw.partition(":")
        if head == "after" and sep:
            try:
                return cls("after", parse_duration(duration, positive=True))
            except ValueError as err:
                raise ValueError(f"after:<duration>: {err}") from None
        raise ValueError(f"{text!r} is not one of never, on-reset, after:<duration> (e.g. after:10m)")

    @property
    def on_reset(self) -> bool:
        return self.mode != "never"

    def __str__(self) -> str:
        return f"after:{self.quiet_s:g}s" if self.mode == "after" else self.mode


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """What a fault is, which taint it gets and when it clears (the `--health-*` settings)."""

    application_xids: frozenset[int] = DEFAULT_APPLICATION_XIDS
    fatal_xids: frozenset[int] = DEFAULT_FATAL_XIDS
    fatal_effect: TaintEffect = DEFAULT_TAINT_EFFECT
    recovery: Recovery = field(default_factory=Recovery)

    def effect_for_xid(self, xid: int) -> TaintEffect | None:
        """None: ignore (application error); the fatal effect for fatal XIDs; NoSchedule otherwise."""
        if xid in self.application_xids:
            return None
        return self.fatal_effect if xid in self.fatal_xids else "NoSchedule"


def parse_xids(text: str) -> frozenset[int]:
    """`13,31, 43` → {13, 31, 43}; empty → none. ValueError naming the bad entry."""
    xids: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) == 0:
            raise ValueError(f"{item!r} is not an XID (a positive whole number)")
        xids.add(int(item))
    return frozenset(xids)
