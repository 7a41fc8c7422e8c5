"""The state directories of `make cluster` and `make demo` runs: owned, cleaned on exit, pruned later.

A run claims its directory with a marker file naming its process (pid and
start time, so a reused pid is not taken for the owner). On exit the run
removes everything but its logs (`keep`); a watchdog process, in a session
of its own and so out of reach of the terminal's Ctrl-C and of a kill of the
run's process group, does the same when the run dies without doing it
(SIGKILL after a grace period): it waits on a pipe only the run holds. What
neither could clean (the machine rebooted, the watchdog was killed too) is
pruned at the next start: a marker whose owner is gone. `python -m
devcluster.rundir prune --all` (`make clean-clusters`) also removes the logs
of finished runs and the state directories of runs from before markers.

Cleaning is devcluster.leftovers.remove_leftovers: the processes, runc
containers and mounts that point into the directory go first, then the files.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devcluster import leftovers
from devcluster.wait import wait_for

log = logging.getLogger(__name__)

MARKER = ".devcluster-run.json"
# The prefixes under the temp directory that runs create (localcluster, demo, the demo's node).
PREFIXES = ("draplugin-cluster-", "draplugin-demo-", "dra-demo-")
# Finished runs whose logs stay, newest first; older runs' logs go at the next start.
KEPT_RUN_LOGS = 10
WATCH_ENV = "DEVCLUSTER_WATCH_DIRS"
# How long the watchdog waits for an owner that closed its pipe but has not finished its clean-up.
OWNER_EXIT_S = 60.0


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat.rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None  # dead, not yet reaped by its parent
    return int(fields[19])


@dataclass(frozen=True)
class Marker:
    pid: int
    start_ticks: int
    keep: tuple[str, ...]
    finished: bool = False

    def owner_alive(self) -> bool:
        return not self.finished and start_ticks(self.pid) == self.start_ticks


def read_marker(directory: Path) -> Marker | None:
    """The directory's marker; None when it has none or an unreadable one (never trusted then)."""
    try:
        data = json.loads((directory / MARKER).read_text())
        return Marker(int(data["pid"]), int(data["start_ticks"]), tuple(data["keep"]), bool(data["finished"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_marker(directory: Path, marker: Marker) -> None:
    data = {"pid": marker.pid, "start_ticks": marker.start_ticks, "keep": list(marker.keep),
            "finished": marker.finished}  # fmt: skip
    tmp = directory / f"{MARKER}.tmp"
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(directory / MARKER)


def claim(directory: Path, keep: Sequence[str] = ()) -> None:
    """Mark `directory` as this process's run directory, whose `keep` paths (logs) outlive the run."""
    directory.mkdir(parents=True, exist_ok=True)
    ticks = start_ticks(os.getpid())
    assert ticks is not None  # we are alive
    write_marker(directory, Marker(os.getpid(), ticks, tuple(keep)))


def finish(directory: Path) -> leftovers.Removal:
    """Remove everything of the run below `directory` but its logs; the marker then says "finished".

    Idempotent, and safe on a directory whose run is gone in any way.
    """
    marker = read_marker(directory)
    keep = marker.keep if marker else ()
    removal = leftovers.remove_leftovers(directory, keep)
    if directory.exists() and marker is not None:
        write_marker(directory, Marker(marker.pid, marker.start_ticks, keep, finished=True))
    log.info("run directory=%s cleaned: %s", directory, removal.summary())
    return removal


class Watchdog:
    """A process that cleans the run's directories if this process dies without doing it.

    It reads a pipe whose write end only this process holds (not inherited
    by children: os.pipe's fds are close-on-exec); end of file means this
    process is gone, whatever killed it.
    """

    def __init__(self, directories: Sequence[Path]) -> None:
        read_fd, self._write_fd = os.pipe()
        try:
            # The directories go in the environment, not on the command line, so the clean-up of a
            # directory does not take the watchdog for one of the run's processes.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "devcluster.rundir", "watch"],
                stdin=read_fd,
                start_new_session=True,  # no terminal Ctrl-C, no kill of our process group
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
                     WATCH_ENV: json.dumps([str(d) for d in directories])},
            )  # fmt: skip
        finally:
            os.close(read_fd)

    def close(self) -> None:
        """Let it go: after this process's own clean-up it finds nothing to do and exits."""
        with contextlib.suppress(OSError):
            os.close(self._write_fd)


def _gone(marker: Marker) -> bool:
    return not marker.owner_alive()


def watch(directories: Sequence[Path]) -> int:
    """The watchdog's body: wait for the owner to go, then finish each directory its owner left."""
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(4096):
            pass
    for directory in directories:
        marker = read_marker(directory)
        if marker is None or marker.finished:
            continue  # the owner cleaned up itself
        # The pipe closes while a killed owner is still exiting (its files go before it is a
        # zombie): wait until it is gone rather than take it for alive.
        if not _gone(marker):
            print(
                f"devcluster watchdog: waiting for process {marker.pid} to exit", file=sys.stderr, flush=True
            )
        with contextlib.suppress(AssertionError):
            wait_for(f"process {marker.pid} to exit", functools.partial(_gone, marker), OWNER_EXIT_S)
        if _gone(marker):
            removal = finish(directory)
            print(f"devcluster watchdog: cleaned {directory}: {removal.summary()}", file=sys.stderr)
    return 0


def run_directories(tmp: Path | None = None) -> list[Path]:
    """Directories under the temp directory named like a run's, newest first."""
    base = tmp or Path(tempfile.gettempdir())
    found = [p for prefix in PREFIXES for p in base.glob(f"{prefix}*") if p.is_dir() and not p.is_symlink()]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _markerless_in_use(directory: Path) -> bool:
    """A directory without a marker (a run from before markers) is live while its control plane runs."""
    names = ("etcd", "kube-apiserver", "kubelet", "containerd")
    return any(Path(h.command.split(" ", 1)[0]).name in names for h in leftovers.processes_under(directory))


def prune(tmp: Path | None = None, *, everything: bool = False) -> list[Path]:
    """Clean the run directories whose owner is gone; returns those touched.

    Always: a run that died without cleaning is cleaned down to its logs, and
    finished runs beyond the newest KEPT_RUN_LOGS lose their logs too. With
    `everything` (make clean-clusters): finished runs' logs go, and so do
    directories without a marker whose control plane is not running.
    A directory whose owner is alive is never touched.
    """
    touched = []
    finished_seen = 0
    for directory in run_directories(tmp):
        marker = read_marker(directory)
        if marker is None:
            if everything and not _markerless_in_use(directory):
                leftovers.remove_leftovers(directory)
                touched.append(directory)
            continue
        if marker.owner_alive():
            continue
        if not marker.finished:
            finish(directory)
            touched.append(directory)
        finished_seen += 1
        if everything or finished_seen > KEPT_RUN_LOGS:
            shutil.rmtree(directory, ignore_errors=True)
            if directory not in touched:
                touched.append(directory)
    return touched


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.rundir", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prune_parser = sub.add_parser("prune", help="clean the state directories of runs that are gone")
    prune_parser.add_argument("--all", action="store_true", help="their logs too, and pre-marker runs")
    prune_parser.add_argument("--tmp", type=Path, help="where runs live (default: the temp directory)")
    sub.add_parser("watch", help=f"(internal) the watchdog of a run: the directories in ${WATCH_ENV}")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.command == "watch":
        return watch([Path(d) for d in json.loads(os.environ[WATCH_ENV])])
    for directory in prune(args.tmp, everything=args.all):
        print(f"removed {directory}" if not directory.exists() else f"cleaned {directory} (logs kept)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
