"""What a stopped (or killed) test cluster left behind under its state directory, found and removed.

A cluster's processes, containers and mounts all point into its state
directory, which is how they are recognised after the process that started
them is gone (SIGKILL, a crash): containerd's shims carry the socket path on
their command line, etcd and the kubelet their data directories, a
container's mounts come from the node's containerd root, and runc keeps every
container's state below the node's runc root. Nothing outside the directory
is ever signalled or unmounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

RUNC = Path("/usr/sbin/runc")
# runc roots of a node's containerd (devcluster/containerd.py: <node>/containerd/runc/<namespace>),
# seen from containerd's own directory, the node's, or a run's with the node one level down.
RUNC_STATE_GLOBS = (
    "runc/*/*/state.json",
    "containerd/runc/*/*/state.json",
    "*/containerd/runc/*/*/state.json",
)
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field_text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (\\040 ...)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field_text)


def _under(path: str, directory: str, keep: Sequence[str] = ()) -> bool:
    """Whether `path` is `directory` or below it, and not below one of the kept subpaths."""
    if path != directory and not path.startswith(directory + os.sep):
        return False
    return not any(path == k or path.startswith(k + os.sep) for k in keep)


@dataclass(frozen=True)
class Mount:
    device: str  # major:minor
    root: str  # the mounted directory within its filesystem
    point: str  # where it is mounted, in the reading process's namespace


def read_mounts(pid: int | str = "self") -> list[Mount]:
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return []
    mounts = []
    for line in lines:
        fields = line.split()
        if len(fields) >= 5:
            mounts.append(Mount(fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return mounts


def _namespace(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


@dataclass(frozen=True)
class RootMount:
    device: str
    root: str
    options: str  # the filesystem's own options (an overlay's lowerdir/upperdir)


def _root_mount(pid: int | str) -> RootMount | None:
    """The mount on "/" of the process's namespace, with its super options."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last mount on "/" is the one in effect
        fields = line.split()
        if len(fields) >= 5 and _unescape(fields[4]) == "/":
            tail = line.split(" - ", 1)[1].split() if " - " in line else []
            return RootMount(fields[2], _unescape(fields[3]), _unescape(tail[2]) if len(tail) > 2 else "")
    return None


def mount_points_under(directory: Path, keep: Sequence[str] = ()) -> list[str]:
    """Mount points of this mount namespace at or below `directory`, deepest first."""
    top = str(directory.resolve())
    points = {m.point for m in read_mounts() if _under(m.point, top, keep)}
    return sorted(points, key=lambda p: (p.count(os.sep), p), reverse=True)


def unmount_under(directory: Path) -> list[str]:
    """Lazily unmount everything at or below `directory`, deepest first; returns what was unmounted.

    Lazy (MNT_DETACH) so a mount a dying process still holds cannot make this
    fail; repeated because a mount may hide others stacked below it.
    """
    done: list[str] = []
    for _ in range(8):
        points = mount_points_under(directory)
        if not points:
            break
        for point in points:
            if _libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
                done.append(point)
            else:
                log.warning("umount point=%s failed: %s", point, os.strerror(ctypes.get_errno()))
    return done


@dataclass(frozen=True)
class _Location:
    """Where a directory lies within its filesystem, as other mount namespaces' mountinfo names it."""

    device: str
    fs_path: str


def _location(directory: str) -> _Location | None:
    best: Mount | None = None
    for mount in read_mounts():
        contains = mount.point == os.sep or _under(directory, mount.point.rstrip(os.sep))
        if contains and (best is None or len(mount.point) >= len(best.point)):
            best = mount
    if best is None:
        return None
    rest = directory[len(best.point.rstrip(os.sep)) :]
    return _Location(best.device, (best.root.rstrip(os.sep) + rest) or os.sep)


def _ancestors() -> set[int]:
    """This process, its ancestors and init: never signalled (a shell sitting in a log directory, make)."""
    pids, pid = {1}, os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


@dataclass
class Holder:
    """A process that points into the directory, and why we think so."""

    pid: int
    command: str
    evidence: list[str] = field(default_factory=list)


def processes_under(directory: Path, keep: Sequence[str] = ()) -> list[Holder]:
    """Processes whose command line, working directory, executable, root or mounts point at or below
    `directory` (paths below a kept subpath do not count: a `tail -f` on a kept log is no leftover)."""
    top = str(directory.resolve())
    kept = [os.path.join(top, k) for k in keep]
    location = _location(top)
    kept_fs = [location.fs_path + k[len(top) :] for k in kept] if location else []
    skip = _ancestors()
    own_namespace = _namespace("self")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile
        if not argv:
            continue  # a kernel thread, or a zombie
        holder = Holder(int(entry.name), " ".join(argv)[:200])
        for arg in argv:
            # --data-dir=/x, -address /x, key=/x,other=/y: every absolute path in the argument.
            for candidate in re.findall(r"(/[^\s=,:;]*)", arg):
                if _under(os.path.normpath(candidate), top, kept):
                    holder.evidence.append(f"argument {arg[:120]}")
                    break
        for link in ("cwd", "exe", "root"):
            with contextlib.suppress(OSError):
                target = os.readlink(entry / link)
                if _under(target, top, kept):
                    holder.evidence.append(f"{link} {target}")
        # A container in a mount namespace of its own whose root filesystem comes from the
        # directory (an overlay with its layers there, or a bind of a rootfs there). Only the
        # root mount counts: every process of a namespace lists all of the namespace's mounts,
        # ours included, so any other mount says nothing about the process.
        if own_namespace is not None and _namespace(entry.name) not in (None, own_namespace):
            root_mount = _root_mount(entry.name)
            if root_mount is not None and (
                (location is not None and root_mount.device == location.device
                 and _under(root_mount.root, location.fs_path, kept_fs))
                or any(_under(os.path.normpath(p), top, kept) for p in re.findall(r"(/[^\s=,:;]*)",
                                                                                  root_mount.options))
            ):  # fmt: skip
                holder.evidence.append(f"root filesystem {root_mount.root} {root_mount.options[:120]}")
        if holder.evidence:
            found.append(holder)
    return found


def runc_containers(directory: Path) -> list[tuple[Path, str]]:
    """(runc root, container id) of every container whose runc state lies below `directory`."""
    found = []
    for pattern in RUNC_STATE_GLOBS:
        for state in directory.glob(pattern):
            found.append((state.parent.parent, state.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_processes_under(directory: Path, keep: Sequence[str] = (), timeout_s: float = 30.0) -> list[Holder]:
    """SIGKILL what points into `directory` (runc's containers first, through runc), until none is left.

    Returns the processes that were killed. Raises if some survive `timeout_s`
    (a process stuck in the kernel): the caller reports it rather than
    removing a directory still in use.
    """
    for root, container in runc_containers(directory):
        if RUNC.exists():
            try:
                subprocess.run([str(RUNC), "--root", str(root), "delete", "--force", container],
                               capture_output=True, check=False, timeout=30)  # fmt: skip
            except subprocess.TimeoutExpired:  # its processes are killed below all the same
                log.warning("runc delete container=%s root=%s timed out", container, root)
    killed: dict[int, Holder] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        holders = [h for h in processes_under(directory, keep) if _alive(h.pid)]
        if not holders:
            return list(killed.values())
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"processes under {directory} survived SIGKILL for {timeout_s:.0f}s: "
                + "; ".join(f"{h.pid} {h.command}" for h in holders)
            )
        for holder in holders:
            killed.setdefault(holder.pid, holder)
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder.pid, signal.SIGKILL)
        time.sleep(0.1)  # the kernel tears the killed processes down; then look again


@dataclass
class Removal:
    """What `remove_leftovers` found and did, for the log line and for tests."""

    killed: list[Holder] = field(default_factory=list)
    unmounted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.killed)} processes killed, {len(self.unmounted)} mounts removed, "
            f"kept {', '.join(self.kept) or 'nothing'}"
        )

    def to_json(self) -> str:
        return json.dumps({
            "killed": [{"pid": h.pid, "command": h.command, "evidence": h.evidence} for h in self.killed],
            "unmounted": self.unmounted,
            "kept": self.kept,
        })  # fmt: skip


def remove_leftovers(directory: Path, keep: Iterable[str] = ()) -> Removal:
    """Kill what runs from `directory`, unmount what is mounted below it, and delete it all but `keep`.

    `keep` names paths relative to `directory` (log folders) that stay, with
    their parents; everything else goes. Idempotent: a second call finds
    nothing to do.
    """
    kept = [k for k in keep if (directory / k).exists()]
    removal = Removal(kept=[str(directory / k) for k in kept])
    if not directory.exists():
        return removal
    removal.killed = kill_processes_under(directory, kept)
    removal.unmounted = unmount_under(directory)
    _remove_all_but(directory, {Path(k) for k in kept})
    return removal


def _remove_all_but(directory: Path, keep: set[Path], relative: Path = Path()) -> None:
    """Delete `directory`'s entries, descending only into parents of kept paths."""
    for entry in list(directory.iterdir()):
        rel = relative / entry.name
        if rel in keep:
            continue
        if any(rel in k.parents for k in keep) and entry.is_dir() and not entry.is_symlink():
            _remove_all_but(entry, keep, rel)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
    if not keep and relative == Path():
        with contextlib.suppress(OSError):
            directory.rmdir()


def still_in_use(directories: Iterable[Path]) -> list[str]:
    """One line per mount and per process left at or below any of `directories` (missing ones skipped)."""
    lines = []
    for directory in directories:
        if not directory.exists():
            continue
        lines += [f"mounted: {point}" for point in mount_points_under(directory)]
        lines += [
            f"running: pid {h.pid} {h.command} ({'; '.join(h.evidence)})" for h in processes_under(directory)
        ]
    return lines
