"""Where the plugin's two Unix sockets live, and their lifecycle on disk.

The kubelet finds a plugin by its registration socket in
`<kubelet-root>/plugins_registry/` and then talks DRA on the endpoint the plugin
names, by convention `<kubelet-root>/plugins/<driver>/dra.sock`. With a pod UID
(rolling updates: old and new driver pod run side by side) both names carry the
UID so the two instances never collide.

AF_UNIX paths are limited to 108 bytes including the terminating NUL. Long
kubelet roots or driver names can exceed that, so per-pod names fall back to
shorter hashed forms; a path that cannot be made to fit is a start-up error.
"""

from __future__ import annotations

import base64
import errno
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

# sizeof(sockaddr_un.sun_path) on Linux; the path needs one byte for its NUL.
SUN_PATH_SIZE: Final = 108
# gRPC refuses unix socket paths longer than this ("Path name should not have more than 107
# characters" already at 106 bytes): a path that fits AF_UNIX but not gRPC would stop the plugin
# instead of falling back to a hashed name.
MAX_SOCKET_PATH_BYTES: Final = SUN_PATH_SIZE - 3
DIR_MODE: Final = 0o750
REGISTRY_DIR_NAME: Final = "plugins_registry"
PLUGINS_DIR_NAME: Final = "plugins"

log = logging.getLogger(__name__)


class SocketPathError(ValueError):
    """A socket path cannot be built or used (too long, bad name, occupied by a non-socket)."""


@dataclass(frozen=True, slots=True)
class SocketPaths:
    """Where a driver's two sockets go: the registration socket and the DRA service's."""

    registration: Path
    dra: Path

    @property
    def registry_dir(self) -> Path:
        return self.registration.parent

    @property
    def plugin_dir(self) -> Path:
        return self.dra.parent


def fits(path: Path) -> bool:
    return len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES


def _short_hash(data: str, size: int) -> str:
    # Imported here: hashlib (with OpenSSL's bindings) is a millisecond of the plugin's start
    # before its sockets, for the rare path too long to use as it is.
    import hashlib

    digest = hashlib.sha256(data.encode()).digest()[:size]
    # URL-safe alphabet keeps '/' out of file names; padding adds nothing.
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _check_name_part(kind: str, value: str) -> None:
    if not value or value in (".", "..") or "/" in value or "\0" in value:
        raise SocketPathError(f"{kind} {value!r} cannot be used in a socket file name")


def _first_fitting(kind: str, candidates: list[Path]) -> Path:
    for candidate in candidates:
        if fits(candidate):
            return candidate
    shortest = min(candidates, key=lambda p: len(os.fsencode(p)))
    raise SocketPathError(
        f"{kind} socket path {str(shortest)!r} is {len(os.fsencode(shortest))} bytes, over the "
        f"limit of {MAX_SOCKET_PATH_BYTES} (AF_UNIX and gRPC); use a shorter kubelet root directory"
    )


def socket_paths(kubelet_root: Path, driver_name: str, pod_uid: str | None = None) -> SocketPaths:
    """Compute the registration and DRA socket paths for a driver (and optionally a pod)."""
    _check_name_part("driver name", driver_name)
    registry_dir = kubelet_root / REGISTRY_DIR_NAME
    plugin_dir = kubelet_root / PLUGINS_DIR_NAME / driver_name
    if pod_uid is None:
        registration = [registry_dir / f"{driver_name}-reg.sock"]
        dra = [plugin_dir / "dra.sock"]
    else:
        _check_name_part("pod UID", pod_uid)
        registration = [
            registry_dir / f"{driver_name}-{pod_uid}-reg.sock",
            registry_dir / f"{driver_name}-{_short_hash(pod_uid, 8)}-reg.sock",
            # The driver name itself may be what makes the path long: hash both,
            # with a separator so ("ab", "c") and ("a", "bc") differ.
            registry_dir / f"dra-{_short_hash(driver_name + chr(0) + pod_uid, 16)}-reg.sock",
        ]
        dra = [plugin_dir / f"dra-{pod_uid}.sock", plugin_dir / f"dra-{_short_hash(pod_uid, 8)}.sock"]
    return SocketPaths(
        registration=_first_fitting("registration", registration),
        dra=_first_fitting("DRA", dra),
    )


def ensure_dir(path: Path) -> None:
    """Create `path` (and parents) with mode 0750 if missing; existing directories are left as they are.

    The kubelet normally creates these; we only fill in for tests and bare setups,
    and never loosen or tighten permissions someone else chose.
    """
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        # mkdir's mode is filtered through the umask; set it exactly.
        directory.chmod(DIR_MODE)
    if not path.is_dir():
        raise SocketPathError(f"{path} exists and is not a directory")


def remove_stale_socket(path: Path) -> bool:
    """Remove a leftover socket file at `path` before binding. Returns whether one was removed.

    Anything that is not a socket is left alone and reported: it is not ours to delete.
    """
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise SocketPathError(f"{path} exists and is not a socket; refusing to replace it")
    path.unlink(missing_ok=True)
    log.info("removed stale socket", extra={"path": str(path)})
    return True


@dataclass(frozen=True, slots=True)
class SocketIdentity:
    """Which file we bound, so shutdown removes only our own socket."""

    path: Path
    device: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> SocketIdentity:
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode):
            raise SocketPathError(f"{path} is not a socket after binding")
        return cls(path=path, device=st.st_dev, inode=st.st_ino)

    def remove(self) -> bool:
        """Unlink the socket if it is still the one we created. Returns whether it was removed.

        A newer instance may have replaced the file at the same path; deleting
        that one would deregister a live plugin.
        """
        try:
            st = self.path.lstat()
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) != (self.device, self.inode):
            log.warning("socket was replaced by another process; leaving it", extra={"path": str(self.path)})
            return False
        try:
            self.path.unlink()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            return False
        return True
