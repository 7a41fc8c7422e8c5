"""The NVIDIA driver's tools (`nvidia-smi`, `nvidia-cuda-mps-control`) as this process can run them.

They come from the driver root the CDI specs mount (`draplugin.cdi.driverfiles`),
so the plugin runs the tools of exactly the driver the node has loaded.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRootError
from draplugin.prepare.errors import PlanError


class DriverTools:
    def __init__(self, files: DriverFiles) -> None:
        self._files = files

    def path(self, name: str) -> Path:
        """Where this process finds the tool, or PlanError(DriverToolMissing) saying where it looked."""
        try:
            install = self._files.install()
        except DriverRootError as err:
            raise PlanError(err.reason, f"the NVIDIA driver's {name} is needed: {err}") from None
        for binary in install.binaries:
            if binary.found.name == name:
                return install.root.local(binary.found)
        raise PlanError(
            "DriverToolMissing",
            f"{name} is not in the NVIDIA driver root {install.root.host} (looked in its usr/bin, bin, "
            "usr/sbin, sbin)",
        )

    def library_path(self) -> str:
        """The directories of the driver's libraries as this process sees them, `:`-joined (for the
        LD_LIBRARY_PATH of a tool that loads them, like the MPS server loading libcuda)."""
        try:
            install = self._files.install()
        except DriverRootError as err:
            raise PlanError(err.reason, f"the NVIDIA driver's libraries are needed: {err}") from None
        return ":".join(sorted({str(install.root.local(lib.file.found).parent) for lib in install.libraries}))


def run_tool(
    command: Sequence[str],
    *,
    error: type[PlanError],
    reason: str,
    what: str,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    new_session: bool = False,
) -> str:
    """Run one driver tool to completion; its stdout, or `error(reason, ...)` saying what failed.

    `what` names the step in the message ("starting nvidia-cuda-mps-control -d"); the tool's
    own stderr (else stdout) follows a non-zero exit, since that is what tells an admin why."""
    try:
        done = subprocess.run(
            list(command), input=stdin, env=dict(env) if env is not None else None, capture_output=True,
            text=True, timeout=timeout_s, start_new_session=new_session, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as err:
        raise error(reason, f"{what} failed: {err}") from None
    if done.returncode != 0:
        raise error(reason, f"{what} exited with {done.returncode}: {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()
