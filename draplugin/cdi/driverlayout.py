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

# Driver capabilities, as NVIDIA's NVIDIA_DRIVER_CAPABILITIES names them: which of the driver's
# files a container gets. `graphics` is opt-in (`--driver-capabilities`): its libraries and ICD
# files are dead weight, and a larger surface, for the CUDA containers most nodes run.
COMPUTE, UTILITY, VIDEO, GRAPHICS = "compute", "utility", "video", "graphics"
CAPABILITIES = (COMPUTE, UTILITY, VIDEO, GRAPHICS)
DEFAULT_CAPABILITIES = frozenset((COMPUTE, UTILITY, VIDEO))

# Libraries named `<name>.so.<driver version>`, by capability: libnvidia-container's lists
# (`src/nvc_info.c`), with OptiX (`libnvidia-rtcore`, `libnvoptix`) under compute, as NVIDIA's
# generated CDI spec (every `*.so.<version>` of the driver) gives it to CUDA containers.
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
    "libnvidia-rtcore",
    "libnvoptix",
)
VIDEO_LIBRARIES = ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid")
GRAPHICS_LIBRARIES = (
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-tls",
    "libnvidia-glsi",
    "libnvidia-fbc",
    "libnvidia-ifr",
    "libGLX_nvidia",
    "libEGL_nvidia",
    "libGLESv2_nvidia",
    "libGLESv1_CM_nvidia",
    "libnvidia-glvkspirv",
    "libnvidia-cbl",
)
LIBRARIES_BY_CAPABILITY = {
    UTILITY: UTILITY_LIBRARIES,
    COMPUTE: COMPUTE_LIBRARIES,
    VIDEO: VIDEO_LIBRARIES,
    GRAPHICS: GRAPHICS_LIBRARIES,
}
# Libraries loaded from a subdirectory of the library directory: libvdpau opens its drivers as
# `<libdir>/vdpau/libvdpau_<name>.so.1`, so they are mounted there in the container.
CONTAINER_SUBDIRS = {"libvdpau_nvidia": "vdpau"}
# Libraries whose file name carries their own version, not the driver's: found by exact name.
# `libnvidia-nvvm70.so.4` is the NVVM of CUDA 11.x's JIT, kept by the driver for old applications.
FIXED_NAME_LIBRARIES = {COMPUTE: ("libnvidia-nvvm70.so.4",)}
# Every versioned name, required ones first, so their problems are reported before the optional ones'.
LIBRARIES = (
    "libcuda",
    "libnvidia-ml",
    *(n for names in LIBRARIES_BY_CAPABILITY.values() for n in names if n not in ("libcuda", "libnvidia-ml")),
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
# Debian keeps nvidia-smi and nvidia-debugdump in usr/lib/nvidia/current, reached from usr/bin through
# /etc/alternatives; a root whose links are missing (or not followed) still has them there.
BINARY_DIRS = ("usr/bin", "bin", "usr/sbin", "sbin", "usr/lib/nvidia/current")
HOOK_BINARIES = ("nvidia-cdi-hook", "nvidia-ctk")
HOOK_DIRS = ("usr/bin", "usr/local/bin", "bin")
FIRMWARE_DIRS = ("lib/firmware/nvidia", "usr/lib/firmware/nvidia")
PERSISTENCED_SOCKETS = ("run/nvidia-persistenced/socket", "var/run/nvidia-persistenced/socket")
# NVSwitch systems: CUDA asks the fabric manager about the fabric's state through it.
FABRICMANAGER_SOCKETS = ("run/nvidia-fabricmanager/socket", "var/run/nvidia-fabricmanager/socket")
# Files mounted at the path they have in the root (the first of each group found), by capability:
# the toolkit's graphics configs (`internal/discover/graphics.go`) and the OpenCL ICD.
CONFIG_FILES: dict[str, tuple[tuple[str, ...], ...]] = {
    COMPUTE: (
        # The OpenCL ICD loader finds the driver's OpenCL library through it.
        ("etc/OpenCL/vendors/nvidia.icd",),
        # OptiX's shader cache seed; libnvoptix looks for it here.
        ("usr/share/nvidia/nvoptix.bin", "etc/nvidia/nvoptix.bin"),
    ),
    GRAPHICS: (
        ("usr/share/glvnd/egl_vendor.d/10_nvidia.json", "etc/glvnd/egl_vendor.d/10_nvidia.json"),
        ("usr/share/vulkan/icd.d/nvidia_icd.json", "etc/vulkan/icd.d/nvidia_icd.json"),
        ("usr/share/vulkan/icd.d/nvidia_icd.x86_64.json",),
        ("usr/share/vulkan/icd.d/nvidia_icd.aarch64.json",),
        (
            "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
            "etc/vulkan/implicit_layer.d/nvidia_layers.json",
        ),
        (
            "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "etc/egl/egl_external_platform.d/15_nvidia_gbm.json",
        ),
        (
            "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
            "etc/egl/egl_external_platform.d/10_nvidia_wayland.json",
        ),
    ),
}
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
        """Where installs keep 64-bit libraries, most specific first (`usr/lib` is 32-bit on RHEL):
        the NVIDIA Container Toolkit's locator list (`pkg/lookup/library.go`) and three more."""
        return (
            f"usr/lib/{self.multiarch}",
            "usr/lib64",
            "usr/lib",
            f"usr/lib/{self.multiarch}/nvidia/current",  # Debian's packages, behind /etc/alternatives
            f"lib/{self.multiarch}",
            "lib64",
            "lib",
            f"lib/{self.multiarch}/nvidia/current",
            f"usr/lib/{self.multiarch}/vdpau",  # libvdpau's driver directory (the .run installer's)
            "usr/lib64/vdpau",
            "usr/lib64/nvidia",  # RPM Fusion's and negativo17's packages
            "usr/lib/nvidia/tesla",  # Bottlerocket's
            "",  # the root itself: a flat driver directory (GKE's installer)
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
    fabricmanager_socket: DriverFile | None = None
    # Configuration files (the OpenCL ICD, Vulkan/EGL ICD JSONs), mounted at their path in the root.
    configs: tuple[DriverFile, ...] = ()
    # Where the runtime finds the GPUs' device nodes on the host: the root's `dev` when it has one
    # (the GPU Operator's driver container; NVIDIA's `--dev-root`), else the host's `/dev`.
    host_dev_dir: str = "/dev"
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES

    def library(self, name: str) -> Library | None:
        return next((lib for lib in self.libraries if lib.name == name), None)
