"""The NVIDIA driver's tools (`nvidia-smi`, `nvidia-cuda-mps-control`) as this process can run them.

They come from the driver root the CDI specs mount (`draplugin.cdi.driverfiles`),
so the plugin runs the tools of exactly the driver the node has loaded.
"""

from __future__ import annotations

from pathlib import Path

from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRootError
from draplugin.prepare.plan import PlanError


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
