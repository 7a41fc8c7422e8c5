"""A view of the host where /sys/fs/cgroup is cgroup v2, for NVIDIA's memory-limit hook and the
plugin's discovery, which look for v2 there (docs/sharing.md). On a hybrid host (v1 controllers,
v2 at /sys/fs/cgroup/unified) a command runs in a private mount namespace with the unified
hierarchy bound over /sys/fs/cgroup; on a v2 host it runs as it is."""

from __future__ import annotations

from pathlib import Path

import pytest

BIND_V2 = 'mount --make-rprivate / && mount --bind /sys/fs/cgroup/unified /sys/fs/cgroup && exec "$@"'


def fstype(path: str) -> str | None:
    """The file system type mounted last at `path`, as /proc/self/mounts lists it."""
    found = None
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[1] == path:
            found = fields[2]
    return found


def v2_view() -> tuple[Path, tuple[str, ...]]:
    """Where cgroup v2 directories are in this process's view, and the argv prefix that runs a
    command where /sys/fs/cgroup is cgroup v2 (empty on a cgroup v2 host)."""
    if fstype("/sys/fs/cgroup") == "cgroup2":
        return Path("/sys/fs/cgroup"), ()
    if fstype("/sys/fs/cgroup/unified") == "cgroup2":
        prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", BIND_V2, "sh")
        return Path("/sys/fs/cgroup/unified"), prefix
    pytest.fail("no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified", pytrace=False)
