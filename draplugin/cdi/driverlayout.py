"""What an NVIDIA driver install looks like, and what can be wrong with one.

The names, directories and data types that `driverroot` discovers and
`driverfiles` renders; the `DriverRootError` family says why a driver root
cannot give containers their driver files.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar

from draplugin.cdi.elf import EM_AARCH64, EM_X86_64

UTILITY_LIBRARIES = ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq")
COMPUTE_LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-opencl",
    "libnvidia-gpucomp",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-allocator",
    "libnvidia-compiler",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nvvm",
    "libnvidia-tileiras",
)
# Required ones first, so their problems are reported before the optional ones'.
LIBRARIES = (
    "libcuda",
    "libnvidia-ml",
    *(n for n in UTILITY_LIBRARIES + COMPUTE_LIBRARIES if n not in ("libcuda", "libnvidia-ml")),
)
# Without these a CUDA container is broken: the spec is refused rather than written without them.
REQUIRED_LIBRARIES = ("libcuda", "libnvidia-ml")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
BINARY_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin")
HOOK_BINARIES = ("nvidia-cdi-hook", "nvidia-ctk")
HOOK_DIRS = ("usr/bin", "usr/local/bin", "bin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
PERSISTENCED_SOCKETS = ("run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket")
VERSION_FILE = PurePosixPath("proc/driver/nvidia/version")
# Node-wide nodes every CUDA process opens. The per-GPU `/dev/nvidiaN` and a MIG
# device's own `nvidia-caps` access nodes come with each device: handing every
# claim all of `/dev/nvidia-caps` would give it every MIG instance of the node.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
UVM_NODES = ("nvidia-uvm", "nvidia-uvm-tools")
# Linux gives up after 40 links in one lookup (ELOOP); so do we.
MAX_SYMLINKS = 40


class DriverRootError(Exception):
    """The driver files cannot be given to containers; the message says what is missing.

    Each kind of problem is a subclass whose `reason` (a CamelCase word, for
    Events and metrics) is given where it is declared.
    """

    reason: ClassVar[str] = "DriverFilesUnavailable"

    def __init_subclass__(cls, reason: str = "", **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.reason = reason or cls.__name__


class DriverRootMissing(DriverRootError, reason="DriverRootMissing"): ...


class NoDriverLibraries(DriverRootError, reason="DriverLibrariesMissing"): ...


class MissingDriverLibrary(DriverRootError, reason="DriverLibraryMissing"): ...


class AmbiguousDriverVersion(DriverRootError, reason="DriverVersionAmbiguous"): ...


class DriverVersionMismatch(DriverRootError, reason="DriverVersionMismatch"): ...


class SymlinkLoop(DriverRootError, reason="DriverFileSymlinkLoop"): ...


class LinkOutsideRoot(DriverRootError, reason="DriverFileOutsideRoot"): ...


class UnsupportedArchitecture(DriverRootError, reason="UnsupportedArchitecture"): ...


@dataclass(frozen=True, slots=True)
class Finding:
    """Something wrong that still leaves a usable install: logged and posted as an Event once."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Arch:
    name: str
    machine: int  # ELF e_machine of its libraries
    multiarch: str  # Debian's multiarch tuple: the library directory containers search

    def library_dirs(self) -> tuple[str, ...]:
        """Where installs keep 64-bit libraries, most specific first (`usr/lib` is 32-bit on RHEL)."""
        return (
            f"usr/lib/{self.multiarch}",
            "usr/lib64",
            "usr/lib",
            f"lib/{self.multiarch}",
            "lib64",
            "lib",
        )


ARCHES = {
    "x86_64": Arch("x86_64", EM_X86_64, "x86_64-linux-gnu"),
    "aarch64": Arch("aarch64", EM_AARCH64, "aarch64-linux-gnu"),
}
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_arch(machine: str | None = None) -> Arch:
    """The architecture of this node (containers run the node's architecture)."""
    name = (machine or platform.machine()).lower()
    arch = ARCHES.get(_ARCH_ALIASES.get(name, name))
    if arch is None:
        raise UnsupportedArchitecture(
            f"no NVIDIA driver layout known for architecture {name!r} (known: {', '.join(ARCHES)})"
        )
    return arch


@dataclass(frozen=True, slots=True)
class DriverRoot:
    """A driver root as the container runtime sees it (`host`) and as this process reads it."""

    host: PurePosixPath
    mounted: Path

    @classmethod
    def at(cls, host: str, mounted: str | None = None) -> DriverRoot:
        return cls(PurePosixPath(host), Path(mounted if mounted is not None else host))

    def host_path(self, relative: PurePosixPath) -> str:
        return str(self.host / relative)

    def local(self, relative: PurePosixPath) -> Path:
        return self.mounted / relative


@dataclass(frozen=True, slots=True)
class DriverFile:
    """A file of the install: `found` is the name it was found under, `real` the file it resolves to."""

    found: PurePosixPath
    real: PurePosixPath


@dataclass(frozen=True, slots=True)
class Library:
    name: str  # "libcuda"
    file: DriverFile  # found as `usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05`
    soname: str  # "libcuda.so.1"

    @property
    def file_name(self) -> str:
        return self.file.found.name


@dataclass(frozen=True, slots=True)
class DriverInstall:
    root: DriverRoot
    arch: Arch
    version: str  # as the library file names spell it: "580.95.05"
    version_source: str  # "NVML", the version file, or "library file names"
    libraries: tuple[Library, ...]
    binaries: tuple[DriverFile, ...]
    firmware_dir: DriverFile | None
    persistenced_socket: DriverFile | None
    # Node-wide device nodes that exist: (path in the container, path on the host).
    device_nodes: tuple[tuple[str, str], ...]
    hook: PurePosixPath | None  # nvidia-cdi-hook / nvidia-ctk under the root, when present
    findings: tuple[Finding, ...] = ()

    def library(self, name: str) -> Library | None:
        return next((lib for lib in self.libraries if lib.name == name), None)
