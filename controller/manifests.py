"""Which manifest files a command reads, each once, and the objects two of them both define.

`-f/--filename` reads a directory's own manifests, and with `-R/--recursive` those below it
too, as kubectl does; `--objects` (the older flag) always reads directories recursively. A
file reached twice (a directory given twice, or a file and the directory holding it) is read
once: read twice, each ResourceSlice would count twice and its pool would look incomplete
(more slices than `resourceSliceCount`). Two different files defining the same object are an
error naming both files: which copy is meant cannot be guessed.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from controller.objects import MANIFEST_SUFFIXES, ClusterObjects, ManifestError, load_manifests

# Kinds without a namespace: the same name in two namespaces would be the same object.
CLUSTER_SCOPED_KINDS = ("DeviceClass", "ResourceSlice", "DeviceTaintRule", "Node")


@dataclass(frozen=True)
class Source:
    """A path as given on the command line, and whether a directory is read below its top."""

    path: str
    recursive: bool


@dataclass
class ManifestFiles:
    files: list[Path] = field(default_factory=list)
    # Files reached more than once, read once: worth a note, since the user did not mean it.
    repeated: list[Path] = field(default_factory=list)


def collect(sources: Iterable[Source]) -> ManifestFiles:
    """Files named directly, and the *.yaml/*.yml/*.json files of named directories (sorted), in
    the order given, each once (by device and inode: through links and other spellings too).
    ManifestError for a path that does not exist."""
    found = ManifestFiles()
    seen: set[tuple[int, int]] = set()
    for source in sources:
        for path, status in _files(source):
            inode = (status.st_dev, status.st_ino)
            if inode in seen:
                if path not in found.repeated:
                    found.repeated.append(path)
                continue
            seen.add(inode)
            found.files.append(path)
    return found


def _files(source: Source) -> list[tuple[Path, os.stat_result]]:
    """The source's files, each with its status (one stat a file: 1,000 nodes' slices are 1,000
    files named one by one)."""
    path = Path(source.path)
    status = _status(path)
    if status is not None and stat.S_ISDIR(status.st_mode):
        below = path.rglob("*") if source.recursive else path.glob("*")
        files = [(p, _status(p)) for p in sorted(below) if p.suffix in MANIFEST_SUFFIXES]
        return [(p, s) for p, s in files if s is not None and stat.S_ISREG(s.st_mode)]
    if status is not None and stat.S_ISREG(status.st_mode):
        return [(path, status)]
    raise ManifestError(f"{path}: no such file or directory")


def _status(path: Path) -> os.stat_result | None:
    """The file's status through links; None where there is none (a dangling link, no file)."""
    try:
        return os.stat(path)
    except OSError:
        return None


def identity(obj: Mapping[str, Any]) -> str | None:
    """`Kind namespace/name` (`Kind name` when cluster-scoped); None for an object without a name."""
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return None
    kind = str(obj.get("kind", ""))
    if kind in CLUSTER_SCOPED_KINDS:
        return f"{kind} {name}"
    return f"{kind} {meta.get('namespace') or 'default'}/{name}"


def _identities(objects: ClusterObjects) -> list[str]:
    found: list[str] = []
    for attribute in fields(objects):
        for obj in getattr(objects, attribute.name):
            key = identity(obj)
            if key is not None:
                found.append(key)
    return found


def duplicates(objects: ClusterObjects, files: Sequence[Path]) -> list[str]:
    """One line per object defined more than once: which object and in which files (each file
    is read again on its own, only when there is a duplicate to report)."""
    counts = Counter(_identities(objects))
    repeated = sorted(key for key, count in counts.items() if count > 1)
    if not repeated:
        return []
    where: dict[str, list[str]] = {key: [] for key in repeated}
    for path in files:
        for key in _identities(load_manifests([path])):
            if key in where:
                where[key].append(str(path))
    return [f"{key} is defined more than once: in {', '.join(where[key])}" for key in repeated]
