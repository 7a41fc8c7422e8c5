"""Starting the real control plane a benchmark measures against, or saying why it cannot."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from devcluster.binaries import MissingBinariesError
from devcluster.controlplane import ControlPlane
from devcluster.procs import ComponentError


def start_control_plane(prefix: str) -> ControlPlane | None:
    """A running control plane in a new temporary directory; None, after telling stderr why, if
    it cannot start (the benchmark then exits 1 instead of a traceback)."""
    cluster = ControlPlane(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        cluster.start()
    except (MissingBinariesError, ComponentError) as err:
        print(
            f"cannot start the control plane (build it with tests/cluster/build.sh): {err}", file=sys.stderr
        )
        return None
    return cluster
