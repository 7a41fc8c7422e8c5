"""The kubelet's deadline for the call being served, handed down to the driver's API work.

The servicer reads the gRPC deadline (`context.time_remaining()`) and the
`ClaimRunner` sets it here for the tasks of that call (asyncio tasks copy the
context they are created in), so a driver can bound its own work below it
without a deadline argument on every method of the `Driver` contract.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import Final

# A `time.monotonic()` instant; None: the caller set no deadline.
CALL_DEADLINE: Final[ContextVar[float | None]] = ContextVar("draplugin_call_deadline", default=None)
# When the call arrived (`time.monotonic()`): a driver's own time limits count from here, not from
# when a claim got its turn, so claims queued behind others are not given extra time.
CALL_STARTED: Final[ContextVar[float | None]] = ContextVar("draplugin_call_started", default=None)
# Answer this much before the kubelet's deadline: the answer still has to travel back to it.
ANSWER_MARGIN_S: Final = 0.5


def deadline_from_remaining(remaining_s: float | None) -> float | None:
    """The instant to answer by, from the seconds a gRPC caller has left (None: no deadline)."""
    if remaining_s is None:
        return None
    return time.monotonic() + max(0.0, remaining_s - ANSWER_MARGIN_S)


def call_deadline() -> float | None:
    return CALL_DEADLINE.get()


def call_started() -> float:
    """When the call being served arrived; now, outside of one."""
    started = CALL_STARTED.get()
    return time.monotonic() if started is None else started
