"""Polling helper for tests that wait on controllers, with deadlines that stretch with the machine's load."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# With more runnable tasks than CPUs everything a test waits for (a controller's informer, a
# kubelet's sync, a container start) is proportionally slower, so a deadline is stretched by the
# 1-minute load average per CPU when it is reached: at least 1, at most MAX_STRETCH, so a real
# failure still fails, at most MAX_STRETCH times later, and the message says by how much it waited.
MAX_STRETCH = 4.0


def load_stretch(load: float | None = None, cpus: int | None = None) -> float:
    """How much longer than on an idle machine a wait may take now (1.0 .. MAX_STRETCH)."""
    if load is None:
        load = os.getloadavg()[0]
    cpus = cpus or os.cpu_count() or 1
    return min(MAX_STRETCH, max(1.0, load / cpus))


def past_deadline(started: float, timeout: float) -> tuple[bool, str]:
    """Whether a wait begun at `started` (monotonic) with `timeout` is over, stretched for load;
    with a description of the deadline for the timeout message."""
    waited = time.monotonic() - started
    if waited <= timeout:
        return False, ""
    stretch = load_stretch()
    return waited > timeout * stretch, f"{waited:.0f}s (timeout {timeout:.0f}s, x{stretch:.1f} for load)"


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Call `probe` until it returns something other than None (or False) and return it.

    On timeout the AssertionError names `what` and the last value or exception
    seen, so a failing test says what never happened.
    """
    started = time.monotonic()
    last: object = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
            last = value
        except Exception as err:  # remember why the probe failed; keep polling
            last = err
        over, waited = past_deadline(started, timeout)
        if over:
            raise AssertionError(f"timed out after {waited} waiting for {what}; last: {last!r}")
        time.sleep(interval)
