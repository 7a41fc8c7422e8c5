"""The driver's user-space files as CDI container edits, shared by every device of a claim.

Every library is bind-mounted twice from the same host file: at its versioned
name (`libcuda.so.580.95.05`) and at its SONAME (`libcuda.so.1`, what the
loader and `dlopen` look for), in the architecture's multiarch directory,
which is on the default library path of Debian/Ubuntu images (the CUDA
images' base). Symbolic links would be the usual way, but a CDI spec can only
create them through a hook binary (`nvidia-cdi-hook create-symlinks`) that may
not exist on the node, or may not match its driver; two mounts of one file need
nothing but the runtime. `libcuda` also gets `libcuda.so`, which compilers that
link `-lcuda` at run time (Triton) look for. We therefore never emit hooks,
even where `nvidia-cdi-hook` exists: the spec behaves the same on every node.

Host paths are the resolved files inside the driver root, so the runtime
follows no link that could lead outside it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import PurePosixPath

from draplugin.cdi.driverlayout import DriverInstall, DriverRoot, DriverRootError, Finding
from draplugin.cdi.driverroot import discover
from draplugin.cdi.spec import ContainerEdits, DeviceNode, Mount
from draplugin.devices.model import DeviceBackend, DriverVersionSource

log = logging.getLogger(__name__)

# Read-only, no set-uid, no device files: a container may use the driver, never change it.
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# The persistenced socket is the only thing a container talks to; nothing there is executable.
SOCKET_MOUNT_OPTIONS = (*FILE_MOUNT_OPTIONS, "noexec")
CONTAINER_BIN_DIR = PurePosixPath("/usr/bin")
PERSISTENCED_SOCKET = PurePosixPath("/run/nvidia-persistenced/socket")
# Dev names besides the SONAME, for run-time compilers that link against the library.
EXTRA_NAMES = {"libcuda": ("libcuda.so",)}


def container_lib_dir(install: DriverInstall) -> PurePosixPath:
    return PurePosixPath("/usr/lib") / install.arch.multiarch


def container_edits(install: DriverInstall) -> ContainerEdits:
    """Mounts and device nodes that give a container the install's driver files."""
    root = install.root
    lib_dir = container_lib_dir(install)
    mounts: list[Mount] = []
    for library in install.libraries:
        host = root.host_path(library.file.real)
        names = dict.fromkeys((library.file_name, library.soname, *EXTRA_NAMES.get(library.name, ())))
        mounts += [Mount(host, str(lib_dir / name), FILE_MOUNT_OPTIONS) for name in names]
    for binary in install.binaries:
        mounts.append(
            Mount(root.host_path(binary.real), str(CONTAINER_BIN_DIR / binary.found.name), FILE_MOUNT_OPTIONS)
        )
    if install.firmware_dir is not None:
        # Same path as on the host: the firmware directory's name carries the driver version.
        mounts.append(
            Mount(
                root.host_path(install.firmware_dir.real),
                str(PurePosixPath("/") / install.firmware_dir.found),
                FILE_MOUNT_OPTIONS,
            )
        )
    if install.persistenced_socket is not None:
        mounts.append(
            Mount(
                root.host_path(install.persistenced_socket.real),
                str(PERSISTENCED_SOCKET),
                SOCKET_MOUNT_OPTIONS,
            )
        )
    nodes = tuple(
        DeviceNode(path=path, host_path=None if host == path else host) for path, host in install.device_nodes
    )
    return ContainerEdits(device_nodes=nodes, mounts=tuple(mounts))


Report = Callable[[str, str], None]


def log_report(reason: str, message: str) -> None:
    log.warning("NVIDIA driver files: %s", message, extra={"reason": reason})


def for_backend(root: DriverRoot, backend: DeviceBackend, report: Report = log_report) -> DriverFiles:
    """Driver files for the node's backend: NVML's driver version picks the libraries; a fake
    backend's version is made up, so its driver root speaks for itself.

    The driver's own version string, never the published `driverVersion` attribute: that is its
    semver form, padded for two-part releases ("550.135" is published as 550.135.0), which
    names no library file (`libcuda.so.550.135`)."""
    if backend.name == "nvml" and isinstance(backend, DriverVersionSource):
        return DriverFiles(root, known_version=backend.driver_version, report=report)
    return DriverFiles(root, report=report)


class DriverFiles:
    """The claim-wide driver edits for prepare: discovered once, and again when that fails.

    A failed discovery is retried at the next prepare (the GPU Operator's
    driver container may fill the root after we start); a good one is kept
    while its libraries are still there (a driver upgrade removes them). Each
    distinct problem is reported once through `report` (log line and Node Event).
    """

    def __init__(
        self,
        root: DriverRoot,
        *,
        known_version: Callable[[], str | None] = lambda: None,
        report: Report = log_report,
        discover_install: Callable[..., DriverInstall] = discover,
    ) -> None:
        self.root = root
        self._known_version = known_version
        self._report = report
        self._discover = discover_install
        self._lock = threading.Lock()
        self._cached: tuple[DriverInstall, ContainerEdits] | None = None
        self._reported: set[tuple[str, str]] = set()

    def install(self) -> DriverInstall:
        """The current install, discovering it if needed; raises `DriverRootError` saying what is missing."""
        return self._current()[0]

    def edits(self) -> ContainerEdits:
        """The container edits of the current install; raises `DriverRootError` like `install`."""
        return self._current()[1]

    def _current(self) -> tuple[DriverInstall, ContainerEdits]:
        with self._lock:
            if self._cached is not None and self._still_there(self._cached[0]):
                return self._cached
            self._cached = None
            try:
                install = self._discover(self.root, known_version=self._known_version())
            except DriverRootError as err:
                self._report_once(err.reason, str(err))
                raise
            for finding in install.findings:
                self._report_once(finding.reason, finding.message)
            log.info(
                "NVIDIA driver files found",
                extra={
                    "root": str(self.root.host),
                    "version": install.version,
                    "version_source": install.version_source,
                    "libraries": len(install.libraries),
                    "binaries": len(install.binaries),
                    "hook": str(install.hook) if install.hook else "",
                },
            )
            self._cached = (install, container_edits(install))
            return self._cached

    def findings(self) -> tuple[Finding, ...]:
        cached = self._cached
        return cached[0].findings if cached is not None else ()

    def _still_there(self, install: DriverInstall) -> bool:
        return all(os.path.isfile(self.root.local(lib.file.real)) for lib in install.libraries)

    def _report_once(self, reason: str, message: str) -> None:
        if (reason, message) in self._reported:
            return
        self._reported.add((reason, message))
        try:
            self._report(reason, message)
        except Exception:  # reporting is best effort; it must never fail a prepare
            log.exception("reporting a driver files problem failed", extra={"reason": reason})
