"""Ctrl-C and SIGTERM for `make cluster` and `make demo`: the first stops, later ones cannot abort it.

The first SIGINT or SIGTERM raises StopRequested in the main thread, so it
ends start-up as promptly as the wait (a minute-long chart install, a pod
that never starts) instead of after it. Once the clean-up has begun (after
that signal, or on a normal exit), further signals only say that it is under
way: a second Ctrl-C a few seconds later no longer interrupts the clean-up
half-way, which is what left shims and containers running before. A SIGKILL
cannot be caught; devcluster.rundir's watchdog cleans up after it.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


class StopRequested(BaseException):
    """A stop signal arrived; a BaseException so that no `except Exception` on the way swallows it."""


class StopOnSignal:
    def __init__(self, program: str) -> None:
        self.program = program
        self.stopping = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def cleaning(self) -> None:
        """The clean-up starts: from now on signals no longer raise."""
        self.stopping = True

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            print(f"{self.program}: {name}: already stopping, the clean-up continues", file=sys.stderr,
                  flush=True)  # fmt: skip
            return
        self.stopping = True
        print(f"{self.program}: {name}: stopping", file=sys.stderr, flush=True)
        raise StopRequested(name)
