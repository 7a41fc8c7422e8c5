"""The driver's user-space files as CDI container edits, shared by every device of a claim.

Every library is bind-mounted from the same host file at its versioned name
(`libcuda.so.580.95.05`) and at its SONAME (`libcuda.so.1`, what the loader and
`dlopen` look for), into the default library directory of both image families:
`/usr/lib/<multiarch>` (Debian, Ubuntu: the CUDA images' usual base) and
`/usr/lib64` (RHEL, UBI, Rocky, Fedora, SUSE). Each loader ignores the other
family's directory, so the second copy costs a mount and nothing else, and no
`LD_LIBRARY_PATH` (the image's own) is touched.

Symbolic links and a refreshed `ld.so.cache` would be the usual way, but a CDI
spec can only make them through hook binaries (`nvidia-cdi-hook
create-symlinks`, `update-ldcache`) that may not exist on the node, or may not
match its driver; mounts need nothing but the runtime. `libcuda` also gets
`libcuda.so`, which compilers that link `-lcuda` at run time look for, and
`TRITON_LIBCUDA_PATH` names its directory: Triton (torch.compile, vLLM) reads
that before it asks `/sbin/ldconfig -p`, whose cache of the image's does not
list our mounts. We therefore never emit hooks, even where `nvidia-cdi-hook`
exists: the spec behaves the same on every node. `docs/cdi.md` has the rest.

Host paths are the resolved files inside the driver root, so the runtime
follows no link that could lead outside it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from draplugin.cdi.driverlayout import (
    CONTAINER_SUBDIRS,
    DEFAULT_CAPABILITIES,
    DriverInstall,
    DriverRoot,
    DriverRootError,
    Finding,
)
from draplugin.cdi.driverroot import discover
from draplugin.cdi.spec import ContainerEdits, DeviceNode, Mount
from draplugin.devices.model import DeviceBackend, DriverVersionSource

log = logging.getLogger(__name__)

# Read-only, no set-uid, no device files: a container may use the driver, never change it.
FILE_MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind", "rprivate")
# The persistenced and fabric manager sockets are only talked to; nothing there is executable.
SOCKET_MOUNT_OPTIONS = (*FILE_MOUNT_OPTIONS, "noexec")
CONTAINER_BIN_DIR = PurePosixPath("/usr/bin")
# RHEL-family loaders search /lib64 and /usr/lib64 (one directory on merged-/usr images).
RHEL_LIB_DIR = PurePosixPath("/usr/lib64")
PERSISTENCED_SOCKET = PurePosixPath("/run/nvidia-persistenced/socket")
FABRICMANAGER_SOCKET = PurePosixPath("/run/nvidia-fabricmanager/socket")
# Dev names besides the SONAME, for compilers that link against the library in the container: run-time
# compilers `-lcuda` (Triton), builds of NVML tools `-lnvidia-ml`, of the Video Codec and Optical Flow
# SDKs' programs `-lnvcuvid -lnvidia-encode -lnvidia-opticalflow`. The driver's packages ship exactly
# these `.so` links for the default capabilities, and NVIDIA's generated spec mirrors them.
EXTRA_NAMES = {
    "libcuda": ("libcuda.so",),
    "libnvidia-ml": ("libnvidia-ml.so",),
    "libnvcuvid": ("libnvcuvid.so",),
    "libnvidia-encode": ("libnvidia-encode.so",),
    "libnvidia-opticalflow": ("libnvidia-opticalflow.so",),
}
# Triton's `libcuda_dirs()` returns this directory before it runs `/sbin/ldconfig -p`.
TRITON_LIBCUDA_ENV = "TRITON_LIBCUDA_PATH"


@dataclass(frozen=True, slots=True)
class DriverEdits(ContainerEdits):
    """The claim-wide edits, plus where the GPUs' own device nodes are on the host (per-device
    nodes are the plan's to write, so it needs to know)."""

    host_dev_dir: str = "/dev"


def container_lib_dir(install: DriverInstall) -> PurePosixPath:
    return PurePosixPath("/usr/lib") / install.arch.multiarch


def container_lib_dirs(install: DriverInstall) -> tuple[PurePosixPath, ...]:
    """Where libraries are mounted: the Debian family's directory first, then the RHEL family's."""
    return (container_lib_dir(install), RHEL_LIB_DIR)


def container_edits(install: DriverInstall) -> DriverEdits:
    """Mounts, environment and node-wide device nodes that give a container the install's driver files."""
    root = install.root
    mounts: list[Mount] = []
    for lib_dir in container_lib_dirs(install):
        for library in install.libraries:
            host = root.host_path(library.file.real)
            names = dict.fromkeys((library.file_name, library.soname, *EXTRA_NAMES.get(library.name, ())))
            target = lib_dir / CONTAINER_SUBDIRS.get(library.name, "")
            mounts += [Mount(host, str(target / name), FILE_MOUNT_OPTIONS) for name in names]
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
    for config in install.configs:
        mounts.append(
            Mount(root.host_path(config.real), str(PurePosixPath("/") / config.found), FILE_MOUNT_OPTIONS)
        )
    for socket, container in (
        (install.persistenced_socket, PERSISTENCED_SOCKET),
        (install.fabricmanager_socket, FABRICMANAGER_SOCKET),
    ):
        if socket is not None:
            mounts.append(Mount(root.host_path(socket.real), str(container), SOCKET_MOUNT_OPTIONS))
    nodes = tuple(
        DeviceNode(path=path, host_path=None if host == path else host) for path, host in install.device_nodes
    )
    env = (f"{TRITON_LIBCUDA_ENV}={container_lib_dir(install)}",) if install.library("libcuda") else ()
    return DriverEdits(env=env, device_nodes=nodes, mounts=tuple(mounts), host_dev_dir=install.host_dev_dir)


Report = Callable[[str, str], None]


def log_report(reason: str, message: str) -> None:
    log.warning("NVIDIA driver files problem", extra={"reason": reason, "detail": message})


def for_backend(
    root: DriverRoot,
    backend: DeviceBackend,
    report: Report = log_report,
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES,
) -> DriverFiles:
    """Driver files for the node's backend: NVML's driver version picks the libraries; a fake
    backend's version is made up, so its driver root speaks for itself.

    The driver's own version string, never the published `driverVersion` attribute: that is its
    semver form, padded for two-part releases ("550.135" is published as 550.135.0), which
    names no library file (`libcuda.so.550.135`)."""
    if backend.name == "nvml" and isinstance(backend, DriverVersionSource):
        return DriverFiles(
            root, known_version=backend.driver_version, report=report, capabilities=capabilities
        )
    return DriverFiles(root, report=report, capabilities=capabilities)


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
        capabilities: frozenset[str] = DEFAULT_CAPABILITIES,
    ) -> None:
        self.root = root
        self.capabilities = capabilities
        self._known_version = known_version
        self._report = report
        self._discover = discover_install
        self._lock = threading.Lock()
        self._cached: tuple[DriverInstall, DriverEdits] | None = None
        self._reported: set[tuple[str, str]] = set()

    def install(self) -> DriverInstall:
        """The current install, discovering it if needed; raises `DriverRootError` saying what is missing."""
        return self._current()[0]

    @property
    def discovered(self) -> bool:
        """Whether an install was found and kept: `edits` then checks that its libraries are still
        there (a stat each) instead of searching the driver root (a walk of its directories)."""
        return self._cached is not None

    def edits(self) -> DriverEdits:
        """The container edits of the current install; raises `DriverRootError` like `install`."""
        return self._current()[1]

    def _current(self) -> tuple[DriverInstall, DriverEdits]:
        with self._lock:
            if self._cached is not None and self._still_there(self._cached[0]):
                return self._cached
            self._cached = None
            try:
                install = self._discover(
                    self.root, known_version=self._known_version(), capabilities=self.capabilities
                )
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
