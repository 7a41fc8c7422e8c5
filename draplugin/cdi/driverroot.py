"""Find the NVIDIA driver's user-space files under a driver root, for CUDA containers.

CUDA images do not ship the driver's libraries: the node's driver provides
`libcuda.so.1`, `libnvidia-ml.so.1`, `nvidia-smi` and friends, and whoever
starts the container must mount them in. This module finds them; `driverfiles`
turns what it finds into CDI container edits.

A driver root is a directory tree holding a driver install: `/` when the
driver is installed on the host, `/run/nvidia/driver` when the GPU Operator's
driver container provides it. It has two names (`DriverRoot`): where the
container runtime finds it on the host (the paths written into CDI specs), and
where this process reads it (the chart mounts the host's root at
`/driver-root`).

Discovery, in order:
  1. the driver version: given by the caller (NVML knows it), else the NVRM line
     of `/proc/driver/nvidia/version` under the root, else the version in the
     `libcuda.so.<version>` file names when only one version is installed;
  2. the libraries of exactly that version (the NVIDIA Container Toolkit's
     "compute" and "utility" lists), first match in the usual library
     directories, of this machine's ELF class and architecture (RHEL's
     `usr/lib` holds the 32-bit copies), each with the SONAME read from the file;
  3. the binaries, the GSP firmware directory of that version, the
     persistenced socket, the node-wide device nodes, and whether a CDI hook
     binary exists.

Every path is resolved inside the root as if the root were `/`, never above
it (`rootpath`): a file outside the driver root is never mounted into a
container. The names and types are in `driverlayout`.

Problems that make the driver files unusable raise a `DriverRootError`
subclass (its `reason` is a CamelCase word for Events); problems that leave a
usable install are `Finding`s on the result, for the caller to log and post once.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from draplugin.cdi.driverlayout import (
    BINARIES,
    BINARY_DIRS,
    CONFIG_FILES,
    CONTROL_NODES,
    DEFAULT_CAPABILITIES,
    FABRICMANAGER_SOCKETS,
    FIRMWARE_DIRS,
    FIXED_NAME_LIBRARIES,
    HOOK_BINARIES,
    HOOK_DIRS,
    LIBRARIES,
    LIBRARIES_BY_CAPABILITY,
    PERSISTENCED_SOCKETS,
    REQUIRED_LIBRARIES,
    UVM_NODES,
    VERSION_FILE,
    AmbiguousDriverVersion,
    Arch,
    DriverFile,
    DriverInstall,
    DriverRoot,
    DriverRootMissing,
    DriverVersionMismatch,
    Finding,
    Library,
    MissingDriverLibrary,
    NoDriverLibraries,
    host_arch,
)
from draplugin.cdi.elf import ElfError, read_elf
from draplugin.cdi.libdirs import library_dirs
from draplugin.cdi.rootpath import find_in_root

_LIBRARY_FILE = re.compile(r"^(?P<name>lib[A-Za-z0-9_+-]+)\.so\.(?P<version>\d+(?:\.\d+){1,2})$")
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 ..." and the open
# module's "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build ...".
_NVRM_LINE = re.compile(r"^NVRM version:.*?Kernel Module(?: for \S+)?\s+(?P<version>\d+(?:\.\d+){1,2})\s")


# --- the driver version -----------------------------------------------------------------------------


def parse_version_file(text: str) -> str | None:
    """The kernel module version from `/proc/driver/nvidia/version`, or None if no NVRM line parses."""
    for line in text.splitlines():
        match = _NVRM_LINE.match(line.strip() + " ")
        if match:
            return match["version"]
    return None


def version_key(version: str) -> tuple[int, ...]:
    """Numeric form, so NVML's "580.95.5" (as published) matches the file names' "580.95.05"."""
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True, slots=True)
class _Candidate:
    name: str
    version: str
    path: PurePosixPath


def _scan_libraries(
    root: Path, arch: Arch, findings: list[Finding]
) -> tuple[list[_Candidate], list[PurePosixPath]]:
    """`lib<name>.so.<version>` files of our libraries in the library directories, in search order,
    and the directories searched (real paths inside the root)."""
    candidates: list[_Candidate] = []
    searched: list[PurePosixPath] = []
    for found in library_dirs(root, arch, LIBRARIES, findings):
        searched.append(found.real)
        try:
            names = sorted(os.listdir(root / found.real))
        except OSError as err:
            findings.append(Finding("DriverLibraryDirUnreadable", f"cannot list {root / found.real}: {err}"))
            continue
        for file_name in names:
            match = _LIBRARY_FILE.match(file_name)
            if match and match["name"] in LIBRARIES:
                candidates.append(_Candidate(match["name"], match["version"], found.real / file_name))
    return candidates, searched


def _choose_version(
    root: DriverRoot,
    candidates: Sequence[_Candidate],
    known: str | None,
    known_source: str,
    version_note: str,
    looked: str,
) -> tuple[str, str]:
    anchors = [c for c in candidates if c.name in REQUIRED_LIBRARIES]
    by_key: dict[tuple[int, ...], list[_Candidate]] = {}
    for candidate in anchors:
        by_key.setdefault(version_key(candidate.version), []).append(candidate)
    installed = "; ".join(
        f"{group[0].version} ({', '.join(str(c.path) for c in group)})" for group in by_key.values()
    )
    if not anchors:
        raise NoDriverLibraries(
            f"no NVIDIA driver libraries (libcuda.so.<version>, libnvidia-ml.so.<version>) under the driver "
            f"root {root.mounted}; looked in {looked}. Set --driver-root to where the driver is installed "
            "(/ on the host, /run/nvidia/driver with the GPU Operator)"
        )
    if known is not None:
        group = by_key.get(version_key(known))
        if group is None:
            raise DriverVersionMismatch(
                f"the driver version is {known} (from {known_source}) but the driver root {root.mounted} has "
                f"the libraries of {installed}: the user-space driver and the kernel module differ "
                "(was the driver upgraded without a reboot?)"
            )
        return group[0].version, known_source
    if len(by_key) > 1:
        raise AmbiguousDriverVersion(
            f"the driver root {root.mounted} has libraries of several driver versions: {installed}; "
            f"nothing says which one is loaded ({version_note}). Remove the stale version's files"
        )
    return anchors[0].version, "library file names"


# --- discovery ----------------------------------------------------------------------------------------


def discover(
    root: DriverRoot,
    *,
    known_version: str | None = None,
    arch: Arch | None = None,
    proc_root: Path | None = None,
    capabilities: frozenset[str] = DEFAULT_CAPABILITIES,
) -> DriverInstall:
    """The install under `root`; `known_version` is NVML's answer when the caller has one.

    `capabilities` choose the optional files (video, graphics); the required libraries and the
    utility binaries are looked for whatever they are.
    """
    arch = arch or host_arch()
    mounted = root.mounted
    if not mounted.is_dir():
        what = "is not a directory" if mounted.exists() else "does not exist"
        raise DriverRootMissing(
            f"the driver root {mounted} {what}: set --driver-root to where the NVIDIA driver is installed "
            "(/ on the host, /run/nvidia/driver with the GPU Operator)"
        )
    findings: list[Finding] = []
    source = "NVML"
    version_note = "no NVML answer"
    if known_version is None:
        known_version, source, version_note = _read_version_file(proc_root or mounted / "proc", findings)
    candidates, searched = _scan_libraries(mounted, arch, findings)
    looked = (
        ", ".join(d or "(the root itself)" for d in arch.library_dirs())
        + " and the directories of the root's etc/ld.so.cache and etc/ld.so.conf"
    )
    version, source = _choose_version(root, candidates, known_version, source, version_note, looked)
    key = version_key(version)
    wanted = {n for c in capabilities for n in LIBRARIES_BY_CAPABILITY.get(c, ())}
    libraries: list[Library] = []
    for name in LIBRARIES:
        required = name in REQUIRED_LIBRARIES
        if not required and name not in wanted:
            continue
        library = _library(
            mounted,
            arch,
            name,
            [c for c in candidates if c.name == name and version_key(c.version) == key],
            findings,
            required,
        )
        if library is not None:
            libraries.append(library)
        elif required:
            raise MissingDriverLibrary(
                f"{name}.so.{version} ({arch.name}) not found under the driver root {mounted}; looked in "
                f"{looked}. A CUDA container cannot run without it"
            )
    for capability in sorted(capabilities):
        for file_name in FIXED_NAME_LIBRARIES.get(capability, ()):
            library = _fixed_name_library(mounted, arch, file_name, searched, findings)
            if library is not None:
                libraries.append(library)
    host_dev_dir, device_nodes = _device_nodes(root, findings)
    return DriverInstall(
        root=root,
        arch=arch,
        version=version,
        version_source=source,
        libraries=tuple(libraries),
        binaries=tuple(_first_files(mounted, BINARIES, BINARY_DIRS, findings)),
        firmware_dir=_first(mounted, [PurePosixPath(d, version) for d in FIRMWARE_DIRS], "dir", findings),
        persistenced_socket=_first(
            mounted, [PurePosixPath(p) for p in PERSISTENCED_SOCKETS], "nondir", findings
        ),
        device_nodes=device_nodes,
        hook=next((f.found for f in _first_files(mounted, HOOK_BINARIES, HOOK_DIRS, findings)), None),
        findings=tuple(findings),
        fabricmanager_socket=_first(
            mounted, [PurePosixPath(p) for p in FABRICMANAGER_SOCKETS], "nondir", findings
        ),
        configs=tuple(
            found
            for capability in sorted(capabilities)
            for group in CONFIG_FILES.get(capability, ())
            if (found := _first(mounted, [PurePosixPath(p) for p in group], "file", findings)) is not None
        ),
        host_dev_dir=host_dev_dir,
        capabilities=frozenset(capabilities),
    )


def _fixed_name_library(
    root: Path, arch: Arch, file_name: str, searched: Sequence[PurePosixPath], findings: list[Finding]
) -> Library | None:
    """A library whose file name is its SONAME (`libnvidia-nvvm70.so.4`), first in the searched dirs."""
    name = file_name.partition(".so")[0]
    candidates = [_Candidate(name, "", directory / file_name) for directory in searched]
    library = _library(root, arch, name, candidates, findings, False)
    if library is None:
        return None
    # Mounted under its own name, which is also its SONAME: the file found may be a link to it.
    return Library(name, DriverFile(PurePosixPath(file_name), library.file.real), library.soname)


def _read_version_file(proc: Path, findings: list[Finding]) -> tuple[str | None, str, str]:
    path = proc / VERSION_FILE.relative_to("proc")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, "", f"no NVML answer and no readable {path}"
    version = parse_version_file(text)
    if version is None:
        first = text.strip().splitlines()[0][:120] if text.strip() else "(empty)"
        note = (
            f"{path} does not parse: no 'NVRM version: ... Kernel Module <version>' line "
            f"(first line {first!r})"
        )
        findings.append(Finding("DriverVersionUnreadable", note + "; using the library file names"))
        return None, "", note
    return version, str(path), ""


def _library(
    root: Path,
    arch: Arch,
    name: str,
    candidates: Sequence[_Candidate],
    findings: list[Finding],
    required: bool,
) -> Library | None:
    for candidate in candidates:
        found = find_in_root(root, candidate.path, "file", None if required else findings)
        if found is None:
            continue
        try:
            elf = read_elf(root / found.real)
        except (ElfError, OSError) as err:
            findings.append(Finding("DriverLibraryUnreadable", f"{err}; not mounted"))
            continue
        if elf.bits != 64 or elf.machine != arch.machine:
            continue  # a 32-bit or foreign-architecture copy: a container of this node cannot load it
        # The loader looks a library up by its SONAME; a file without one goes by the convention.
        return Library(name, found, elf.soname or f"{name}.so.1")
    return None


def _first(
    root: Path, paths: Sequence[PurePosixPath], want: str, findings: list[Finding]
) -> DriverFile | None:
    return next((f for f in (find_in_root(root, p, want, findings) for p in paths) if f is not None), None)


def _first_files(
    root: Path, names: Sequence[str], dirs: Sequence[str], findings: list[Finding]
) -> Iterator[DriverFile]:
    for name in names:
        found = _first(root, [PurePosixPath(d, name) for d in dirs], "file", findings)
        if found is not None:
            yield found


def _device_nodes(root: DriverRoot, findings: list[Finding]) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The host's dev directory for the GPUs' nodes and the control nodes that exist there: the
    root's `dev` when it has one, else this node's `/dev`.

    The GPU Operator's driver root has its own `/dev`; a host root's `dev` is the host's.
    Only character devices count: a runtime refuses a spec whose node is anything else.
    """
    if (root.mounted / "dev").is_dir():
        local, host = root.mounted / "dev", root.host / "dev"
    else:
        local, host = Path("/dev"), PurePosixPath("/dev")
    nodes = tuple((f"/dev/{n}", str(host / n)) for n in CONTROL_NODES if _is_char_device(local / n))
    present = {container for container, _ in nodes}
    missing_uvm = [f"/dev/{n}" for n in UVM_NODES if f"/dev/{n}" not in present]
    if missing_uvm:
        findings.append(
            Finding(
                "UvmDeviceNodesMissing",
                f"{' and '.join(missing_uvm)} missing (or not character devices) under {host}: CUDA needs "
                "them and containers get none until they exist; load the nvidia-uvm module and create "
                "them with `nvidia-modprobe -u -c=0`",
            )
        )
    if "/dev/nvidiactl" not in present:
        findings.append(
            Finding(
                "NvidiactlMissing",
                f"/dev/nvidiactl missing under {host}: is the NVIDIA kernel module loaded?",
            )
        )
    return str(host), nodes


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False
