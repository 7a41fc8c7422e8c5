"""One command run to its end, timed like a user's shell would: wall time and peak RSS.

bench.peers.run_measured polls its child every 50 ms, fine for peers that time themselves;
here the wall time of the whole command is the figure (explain takes about a second), so the
child is waited for with a blocking wait4, which returns the moment it exits, with its rusage.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass


class RunError(RuntimeError):
    """A measured command that failed or ran too long, with its own words."""


@dataclass(frozen=True)
class Measured:
    wall_s: float
    peak_mib: float
    # user + system CPU of the child: steadier than wall time when other work shares the cores
    cpu_s: float
    returncode: int
    stdout: str
    stderr: str


def run_timed(command: list[str], timeout_s: float) -> Measured:
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        # Killing on time is the timer's job; wait4 itself blocks until the child is gone.
        killer = threading.Timer(timeout_s, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if wall >= timeout_s and proc.returncode < 0:
        raise RunError(f"{command[0]} ran past {timeout_s:.0f}s")
    cpu = usage.ru_utime + usage.ru_stime
    return Measured(wall, usage.ru_maxrss / 1024, cpu, proc.returncode, stdout, stderr)  # maxrss: KiB
