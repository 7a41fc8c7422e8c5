"""Where a driver root keeps the NVIDIA libraries: the directories to search, in order.

1. the fixed directories of the usual installs (`Arch.library_dirs`: the NVIDIA
   Container Toolkit's locator list, `nvidia/current` of Debian's packages
   included, plus `usr/lib64/nvidia` and Bottlerocket's `usr/lib/nvidia/tesla`);
2. the directories of the root's own `etc/ld.so.cache` entries for the wanted
   libraries, both where the entry points and where its links lead inside the
   root (libnvidia-container's source of truth: what the host's loader loads);
3. the directories the root's `etc/ld.so.conf` (and its includes) names, for a
   cache that is stale or missing.

Each directory is resolved inside the root (`rootpath`) and listed once.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path, PurePosixPath

from draplugin.cdi import ldcache
from draplugin.cdi.driverlayout import Arch, DriverFile, DriverRootError, Finding
from draplugin.cdi.elf import ElfError, read_elf
from draplugin.cdi.rootpath import find_in_root, resolve_in_root


def library_dirs(
    root: Path, arch: Arch, wanted: Collection[str], findings: list[Finding] | None = None
) -> list[DriverFile]:
    """The library directories of the root, `found` as named and `real` as resolved, each real one once.

    `wanted` are library base names ("libcuda"): only their cache entries add directories.
    """
    notes: list[Finding] = [] if findings is None else findings
    found: list[DriverFile] = []
    seen: set[PurePosixPath] = set()
    for name in candidate_dirs(root, arch, wanted):
        directory = find_in_root(root, name, "dir", notes)
        if directory is None or directory.real in seen:
            continue  # merged /usr: `lib` is often a link to `usr/lib`; search each directory once
        seen.add(directory.real)
        found.append(directory)
    return found


def candidate_dirs(root: Path, arch: Arch, wanted: Collection[str]) -> list[PurePosixPath]:
    """The directory names to search, in order, once each, whether they exist or not."""
    names: list[PurePosixPath] = [PurePosixPath(d) for d in arch.library_dirs()]
    for entry in ldcache.read_cache(root):
        if not entry.is_arch(arch.name) or _base(entry.name) not in wanted:
            continue
        link = PurePosixPath(entry.path.lstrip("/"))
        names.append(link.parent)
        try:
            real = resolve_in_root(root, link)
        except DriverRootError:
            continue  # reported when the file itself is looked at
        if real is not None:
            names.append(real.parent)
    names += [PurePosixPath(d.lstrip("/")) for d in ldcache.conf_dirs(root)]
    return list(dict.fromkeys(names))


def find_library_file(root: Path, file_name: str, arch: Arch) -> tuple[DriverFile | None, list[str]]:
    """The first `file_name` (`libnvidia-ml.so.1`) in the library dirs that is this arch's ELF object,
    links resolved inside the root; and the directories looked in (for the message when none is)."""
    wanted = {_base(file_name)}
    looked = [str(root / name) for name in candidate_dirs(root, arch, wanted)]
    for directory in library_dirs(root, arch, wanted):
        candidate = find_in_root(root, directory.real / file_name, "file", [])
        if candidate is None:
            continue
        try:
            elf = read_elf(root / candidate.real)
        except (ElfError, OSError):
            elf = None  # not ours to judge: the loader says what is wrong with it
        if elf is None or (elf.bits == 64 and elf.machine == arch.machine):
            return DriverFile(directory.found / file_name, candidate.real), looked
    return None, looked


def _base(file_name: str) -> str:
    """`libcuda.so.1` → `libcuda`."""
    return file_name.partition(".so")[0]
