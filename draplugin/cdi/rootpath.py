"""Resolve paths inside a driver root as if it were `/`, never above it.

An absolute link target names a path of the driver's own tree (as it does
inside the GPU Operator's driver container, and for a host root mounted at
`/driver-root`), so it is re-rooted; a `..` that climbs above the root is
refused: a file outside the driver root is never mounted into a container.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from draplugin.cdi.driverlayout import (
    MAX_SYMLINKS,
    DriverFile,
    DriverRootError,
    Finding,
    LinkOutsideRoot,
    SymlinkLoop,
)


def resolve_in_root(root: Path, relative: PurePosixPath | str) -> PurePosixPath | None:
    """Resolve `relative` under `root` with `root` as `/`; None when it does not exist.

    Raises `SymlinkLoop` past MAX_SYMLINKS links and `LinkOutsideRoot` for a
    link whose `..` climbs above the root.
    """
    pending = [part for part in PurePosixPath(relative).parts if part != "/"]
    resolved: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not resolved:
                raise LinkOutsideRoot(
                    f"{root / relative}: a symbolic link on the way points above the driver root {root}; "
                    "files outside the driver root are never mounted into containers"
                )
            resolved.pop()
            continue
        here = root.joinpath(*resolved, part)
        try:
            info = os.lstat(here)
        except OSError:  # missing, a file where a directory should be, or unreadable: not there
            return None
        if not stat.S_ISLNK(info.st_mode):
            resolved.append(part)
            continue
        links += 1
        if links > MAX_SYMLINKS:
            raise SymlinkLoop(
                f"{root / relative}: more than {MAX_SYMLINKS} symbolic links (a link loop) under the "
                f"driver root {root}"
            )
        target = os.readlink(here)
        if target.startswith("/"):
            resolved = []  # absolute targets name paths of the driver's own tree
        pending = [p for p in PurePosixPath(target).parts if p != "/"] + pending
    return PurePosixPath(*resolved) if resolved else PurePosixPath(".")


def find_in_root(
    root: Path, relative: PurePosixPath, want: str, findings: list[Finding] | None
) -> DriverFile | None:
    """The file at `relative` if it resolves inside the root to a `want`: "file", "dir" or "nondir".

    A loop or an escape is raised when `findings` is None (the caller needs the
    file) and recorded as a finding otherwise (the file is optional).
    """
    try:
        real = resolve_in_root(root, relative)
    except DriverRootError as err:
        if findings is None:
            raise
        findings.append(Finding(err.reason, f"{err}; not mounted"))
        return None
    if real is None:
        return None
    try:
        mode = os.stat(root / real).st_mode
    except OSError:
        return None
    if (want == "file" and not stat.S_ISREG(mode)) or (want == "dir") != stat.S_ISDIR(mode):
        return None
    return DriverFile(relative, real)
