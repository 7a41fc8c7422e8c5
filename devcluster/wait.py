"""Polling helper for tests that wait on controllers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2) -> T:
    """Call `probe` until it returns something other than None (or False) and return it.

    On timeout the AssertionError names `what` and the last value or exception
    seen, so a failing test says what never happened.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
            if value is not None and value is not False:
                return value
            last = value
        except Exception as err:  # remember why the probe failed; keep polling
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
        time.sleep(interval)
