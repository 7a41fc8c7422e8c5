"""One command run to its end, timed like a user's shell would: wall time, CPU time, peak RSS.

The figure is the whole command's wall time (explain takes about a second), so the command is
waited for with a blocking wait4, which returns the moment it exits, with its rusage (the 50 ms
poll of bench.peers.run_measured is fine for peers that time themselves, not here).

The command is started by a small launcher process (`python -c LAUNCHER`) rather than by this
one: Linux carries a process's RSS high-water mark across exec (exec_mmap keeps the old image's
hiwater in signal->maxrss), and a child spawned by vfork or fork starts from its parent's image,
so a command spawned from this process (which holds simulate's parsed answers, hundreds of MiB
at 5,000 nodes) reported this process's peak instead of its own. The launcher is a fresh, small
image; the command it spawns reports its own peak. The launcher times the command itself, so
its own start-up is outside the wall time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

LAUNCHER = (
    "import json, os, sys, time\n"
    "report, command = sys.argv[1], sys.argv[2:]\n"
    "started = time.perf_counter()\n"
    "pid = os.posix_spawnp(command[0], command, os.environ)\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "wall = time.perf_counter() - started\n"
    "with open(report, 'w') as out:\n"
    "    json.dump({'wall_s': wall, 'maxrss_kib': usage.ru_maxrss,\n"
    "               'cpu_s': usage.ru_utime + usage.ru_stime,\n"
    "               'returncode': os.waitstatus_to_exitcode(status)}, out)\n"
)


class RunError(RuntimeError):
    """A measured command that failed or ran too long, with its own words."""


@dataclass(frozen=True)
class Measured:
    wall_s: float
    peak_mib: float
    # user + system CPU of the command: steadier than wall time when other work shares the cores
    cpu_s: float
    returncode: int
    stdout: str
    stderr: str


def run_timed(command: list[str], timeout_s: float) -> Measured:
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        tempfile.TemporaryDirectory(prefix="run-timed-") as scratch,
    ):
        report = Path(scratch) / "report.json"
        launcher = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(report), *command],
            stdout=out, stderr=err, text=True, start_new_session=True,
        )  # fmt: skip
        # On time, the launcher's whole session goes (the command with it).
        killer = threading.Timer(timeout_s, lambda: os.killpg(launcher.pid, signal.SIGKILL))
        killer.start()
        try:
            launcher.wait()
        finally:
            killer.cancel()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        if not report.exists():
            if launcher.returncode == -signal.SIGKILL:
                raise RunError(f"{command[0]} ran past {timeout_s:.0f}s")
            raise RunError(f"{command[0]} could not be started: {stderr.strip()[-2000:]}")
        figures = json.loads(report.read_text())
    return Measured(
        figures["wall_s"],
        figures["maxrss_kib"] / 1024,
        figures["cpu_s"],
        figures["returncode"],
        stdout,
        stderr,
    )  # maxrss: KiB on Linux
