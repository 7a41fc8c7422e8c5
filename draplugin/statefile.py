"""The plugin's own state files: one atomic writer, one reader that survives any content, one sweep.

Every file the plugin keeps across restarts (the claim checkpoint, the sharing
ledger, the fake MIG "hardware", each MPS claim's `mps.json`, the CDI specs) is
written by `atomic_write`: a temp file next to the target, named
`.<target name>.<8 random characters>.tmp` (mkstemp's), fsynced, renamed over
the target, the directory fsynced. A kill -9 between the create and the rename
leaves that temp file behind; `remove_stale_temp_files` is the start-up sweep
that removes them, by that one naming scheme, in each state directory.

Files read back at start go through `read_state`, which never raises for what
is on disk: a missing file is "nothing recorded"; anything else it cannot turn
into a value (garbage, binary, empty, deeper nesting than the JSON parser
recurses, integers past Python's digit limit, wrong types, a file larger than
`MAX_STATE_BYTES`, a directory, FIFO or device in the file's place, a read
error) is logged and moved aside to `<name>.corrupt-<UTC time>-<pid>`, kept for
a person to look at, and the caller starts from nothing. A daemon must never
crash-loop on its own state.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

TEMP_SUFFIX = ".tmp"
# What `atomic_write`'s mkstemp names look like: "." + target name + "." + random + ".tmp" (mkstemp's
# 8 of [a-z0-9_] today; any run of word characters, so an older release's temp files match too).
_TEMP_NAME = re.compile(r"^\.(?P<target>.+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX) + r"$")
# The files the plugin writes with `atomic_write` in its state directory (and `mps/<claim uid>/`),
# by name: the start-up sweep removes temp files of these targets only, never another program's.
# Named here rather than imported from their modules, which import this one; tests/unit/
# test_statefile_sweep.py checks the list against those modules' constants.
STATE_FILE_NAMES: frozenset[str] = frozenset(
    {"checkpoint.json", "sharing-ledger.json", "fake-mig.json", "mps.json"}
)
# Far above any real state file (a node holds at most a few hundred claims, a few KiB each), far
# below what would hurt to read into memory: a larger file is not ours, or not intact.
MAX_STATE_BYTES = 64 << 20
CORRUPT_INFIX = ".corrupt-"
# How deep the start-up sweep descends below a state directory (the state directory itself is 0;
# `mps/<claim uid>/` is 2). Bounded so a sweep never wanders into a daemon's working files.
SWEEP_DEPTH = 2


class StateFormatError(ValueError):
    """The file was read but its content is not what the plugin writes."""


@dataclass(frozen=True, slots=True)
class StateRead(Generic[T]):
    """What `read_state` found: `value` (None when the file was missing or set aside), and when it
    was set aside, why (`problem`) and where it went (`moved_to`, None if even the move failed)."""

    value: T | None = None
    problem: str | None = None
    moved_to: Path | None = None


# --- writing --------------------------------------------------------------------------------------------


def atomic_write(
    path: Path,
    content: bytes,
    mode: int = 0o644,
    *,
    durable: bool = True,
    sync_dir: bool = True,
    fsync: Callable[[int], None] | None = None,
) -> None:
    """Replace `path` with `content` all at once: temp file, rename. `durable`: also fsync the file
    before the rename and (with `sync_dir`) the directory after it, so the new content survives a
    power loss too.

    `durable` without `sync_dir` syncs the file alone: after a power loss the name holds either
    the old content or the new one, each whole (both were synced before their rename), but the
    rename itself may be lost with the power. For a caller whose newest content may go back to the
    one before it after a reboot (`draplugin.checkpoint` says when), that is one sync less.

    Without `durable` the write is still atomic for every reader and survives the writer being
    killed (-9 included: the page cache outlives the process); only a kernel crash or power loss,
    which always comes back as a new boot, may undo it.

    `fsync` replaces `os.fsync` for both syncs (tests count and hold them through it).
    """
    sync = os.fsync if fsync is None else fsync
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as tmp:
            tmp.write(content)
            tmp.flush()
            os.fchmod(tmp.fileno(), mode)
            if durable:
                sync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    if durable and sync_dir:
        fsync_dir(path.parent, sync)


def fsync_dir(directory: Path, fsync: Callable[[int], None] | None = None) -> None:
    """Make a rename or unlink in `directory` durable: it is only on disk once the directory is."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (os.fsync if fsync is None else fsync)(fd)
    finally:
        os.close(fd)


def temp_target(name: str) -> str | None:
    """The target whose `atomic_write` temp file `name` would be; None if it is not one."""
    found = _TEMP_NAME.match(name)
    return None if found is None else found.group("target")


def remove_stale_temp_files(
    directory: Path,
    before: float,
    *,
    names: Collection[str] = (),
    prefix: str | None = None,
    suffix: str = "",
    depth: int = 0,
) -> list[Path]:
    """Remove the temp files `atomic_write` left in `directory` (and its plain subdirectories down
    to `depth` levels) for targets in `names`, or named `prefix...suffix`, if last changed before
    `before`. Younger ones may be writes in flight of the other plugin process in a rolling update.
    Mount points below `directory` (an MPS claim's shared-memory tmpfs) are never entered."""

    def ours(name: str) -> bool:
        target = temp_target(name)
        if target is None:
            return False
        return target in names or (
            prefix is not None and target.startswith(prefix) and target.endswith(suffix)
        )

    try:
        top = directory.lstat()
    except FileNotFoundError:
        return []
    removed: list[Path] = []
    for folder in _folders(directory, top.st_dev, depth):
        here = []
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if not ours(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode) or info.st_mtime >= before:
                    continue
                os.unlink(entry.path)
            except FileNotFoundError:
                continue
            here.append(Path(entry.path))
        if here:
            fsync_dir(folder)
            removed.extend(here)
    return removed  # the caller logs them, once for all its directories


def sweep_state_dirs(directories: Collection[Path], before: float) -> list[Path]:
    """Start-up: the temp files every writer of ours left in each state directory (and in
    `mps/<claim uid>/` below it), older than `before`."""
    return [
        path
        for directory in sorted(set(directories))
        for path in remove_stale_temp_files(directory, before, names=STATE_FILE_NAMES, depth=SWEEP_DEPTH)
    ]


def _folders(directory: Path, device: int, depth: int) -> Iterator[Path]:
    yield directory
    if depth <= 0:
        return
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        try:
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
            yield from _folders(Path(entry.path), device, depth - 1)


# --- reading --------------------------------------------------------------------------------------------


def decode_json(raw: bytes) -> Any:
    """`json.loads` whose every failure is a `StateFormatError` (never a RecursionError)."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as err:
        # ValueError covers decode errors, bad UTF-8 and integers past the digit limit; deep
        # nesting ends in RecursionError. All of them are a corrupt file, never a crash loop.
        raise StateFormatError(f"not JSON: {type(err).__name__}: {err}") from None


def read_state(
    path: Path,
    parse: Callable[[bytes], T],
    *,
    what: str,
    max_bytes: int = MAX_STATE_BYTES,
) -> StateRead[T]:
    """Read `path` and `parse` its bytes; never raises for what is on disk (see the module doc).

    `parse` raises `ValueError` (`StateFormatError` is one) for content it does not accept; a
    `TypeError`, `KeyError`, `IndexError` or `RecursionError` from it counts as corrupt content too,
    so a parser that trusted a shape too far still cannot crash the daemon. `what` names the file
    in the log line ("sharing ledger").
    """
    try:
        raw = _read_regular(path, max_bytes)
    except FileNotFoundError:
        return StateRead()
    except StateFormatError as err:
        return set_aside(path, str(err), what=what)
    except OSError as err:
        return set_aside(path, f"cannot read: {err}", what=what)
    try:
        value = parse(raw)
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as err:
        reason = str(err) if isinstance(err, StateFormatError) else f"{type(err).__name__}: {err}"
        return set_aside(path, reason, what=what)
    return StateRead(value=value)


def _read_regular(path: Path, max_bytes: int) -> bytes:
    # O_NONBLOCK: a FIFO in the file's place must not hang start-up; it is refused below.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateFormatError(f"not a regular file (mode {stat.filemode(info.st_mode)})")
        if info.st_size > max_bytes:
            raise StateFormatError(f"{info.st_size} bytes, more than the {max_bytes} a state file may have")
        chunks = []
        left = max_bytes + 1  # a file growing while we read is cut here and refused
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise StateFormatError(f"more than the {max_bytes} bytes a state file may have")
        return b"".join(chunks)
    finally:
        os.close(fd)


def set_aside(path: Path, reason: str, *, what: str) -> StateRead[Any]:
    """Move a bad state file (or whatever is in its place) to `<name>.corrupt-<time>-<pid>`, log it,
    and answer "nothing recorded". Kept, not deleted: it is what a person debugging needs."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = path.with_name(f"{path.name}{CORRUPT_INFIX}{stamp}-{os.getpid()}")
    n = 1
    while os.path.lexists(target):  # a second bad file within the same second keeps the first
        target = path.with_name(f"{path.name}{CORRUPT_INFIX}{stamp}-{os.getpid()}.{n}")
        n += 1
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return StateRead()  # gone already: the other plugin process (rolling update) set it aside
    except OSError as err:
        log.error(
            "state file unreadable and cannot be moved aside: starting empty",
            extra={"file": what, "path": str(path), "reason": reason, "error": str(err)},
        )
        return StateRead(problem=reason)
    log.error(
        "state file unreadable: moved aside, starting empty",
        extra={"file": what, "path": str(path), "reason": reason, "moved_to": str(target)},
    )
    return StateRead(problem=reason, moved_to=target)
