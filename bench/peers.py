"""Running a peer harness (tests/cluster/peers, built by tests/cluster/build_peers.sh) on one job.

A peer reads its whole job as JSON and prints one JSON result holding its own timings, so
process start-up and JSON decoding stay outside every figure on both sides.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
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
    binary = peers_dir() / name
    if not binary.exists():
        raise PeerError(f"peer {binary} is missing (build it with {BUILD_SCRIPT})")
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix=f"{name}-") as job_file:
        json.dump(job, job_file)
        job_file.flush()
        done = subprocess.run(
            [str(binary), job_file.name], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    if done.returncode != 0:
        raise PeerError(f"{name} exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
