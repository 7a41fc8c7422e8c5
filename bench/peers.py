"""Running a peer harness (tests/cluster/peers, built by tests/cluster/build_peers.sh) on one job.

A peer reads its whole job as JSON and prints one JSON result holding its own timings, so
process start-up and JSON decoding stay outside every figure on both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

PEERS_ENV = "DRA_PEERS_BIN_DIR"
BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "cluster" / "build_peers.sh"


class PeerError(RuntimeError):
    """A peer could not be built or run, with its own message."""


def peers_dir() -> Path:
    """$DRA_PEERS_BIN_DIR, else the (cached, idempotent) build's directory."""
    chosen = os.environ.get(PEERS_ENV)
    if chosen:
        return Path(chosen)
    done = subprocess.run([str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise PeerError(f"{BUILD_SCRIPT} failed with exit {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


def run_peer(name: str, job: dict[str, Any], timeout_s: float = 1800) -> dict[str, Any]:
    """Run peer `name` once on `job` and return its JSON result."""
    return run_peer_measured(name, job, timeout_s)[0]


def run_peer_measured(
    name: str, job: dict[str, Any], timeout_s: float = 1800
) -> tuple[dict[str, Any], float]:
    """Run peer `name` once on `job`: its JSON result and its peak RSS in MiB."""
    binary = peers_dir() / name
    if not binary.exists():
        raise PeerError(f"peer {binary} is missing (build it with {BUILD_SCRIPT})")
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix=f"{name}-") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        returncode, stdout, stderr, peak_mib = run_measured([str(binary), job_file.name], timeout_s)
    if returncode != 0:
        raise PeerError(f"{name} exited {returncode}: {stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(stdout)
    return result, peak_mib


def run_measured(command: list[str], timeout_s: float) -> tuple[int, str, str, float]:
    """Run a command to its end: exit status, stdout, stderr and the process's peak RSS (MiB),
    read from its own rusage (wait4), so every side is measured the same way."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                os.wait4(proc.pid, 0)
                raise PeerError(f"{command[0]} ran past {timeout_s:.0f}s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss / 1024  # Linux: KiB
