"""PID → container cgroup → pod UID and container ID, read from `/proc/<pid>/cgroup`.

NVML names the processes on a GPU by their host PIDs, even when asked from
inside a container (the driver does not know PID namespaces), so the node's
`/proc` is read (mounted into the plugin's pod; no host PID namespace needed).
The kubelet puts every pod in a
cgroup named after the pod's UID and the runtime puts each container in one
named after its container ID, in one of these shapes (cgroup v1 lists one line
per controller, v2 a single `0::` line; the path is the same):

    cgroupfs driver: /kubepods/burstable/pod<uid>/<container id>
                     /kubepods/pod<uid>/<container id>                  (Guaranteed QoS)
    systemd driver:  /kubepods.slice/kubepods-burstable.slice/
                     kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope
                     (also docker-<id>.scope, crio-<id>.scope)

Inside a container with its own cgroup namespace the path is relative to it
(`/../../kubepods...`); the pod and container parts are found anywhere in it.
A kubelet without pod cgroups (`cgroupsPerQOS: false`, as on the project's
local test node) leaves the pod out: the runtime then puts the container at
`<cgroup root>/<container id>`, and the container ID alone is returned, for
the caller to find the pod by its containers' IDs. A process outside any pod
(the host, a daemon) is counted as unattributed by the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)
# A container cgroup: the runtime's 64-hex ID, bare (cgroupfs) or in a systemd scope.
_CONTAINER_ID = re.compile(r"^(?:[a-z-]+-)?([0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class PodProcess:
    """Where a process runs: its pod's UID and, when the cgroup names one, its container's ID."""

    pod_uid: str
    container_id: str = ""


def _paths(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        _, _, rest = line.partition(":")
        _, _, path = rest.partition(":")
        out.append(path)
    return out


def parse_cgroup(text: str) -> PodProcess | None:
    """The pod and container of a `/proc/<pid>/cgroup` file's content; None outside any container.

    `pod_uid` is empty when the path names a container but no pod (no pod cgroups).
    """
    paths = _paths(text)
    for path in paths:
        match = _POD_UID.search(path)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-")
        rest = path[match.end() :].strip("/")
        container = ""
        if rest:
            found = _CONTAINER_ID.match(rest.split("/")[0])
            container = found.group(1) if found else ""
        return PodProcess(uid, container)
    for path in paths:
        found = _CONTAINER_ID.match(path.rstrip("/").rpartition("/")[2])
        if found is not None:
            return PodProcess("", found.group(1))
    return None


def pod_process(proc_root: Path, pid: int) -> PodProcess | None:
    """The pod of process `pid` under `proc_root` (`/proc`, or the host's mounted elsewhere).

    None when the process is gone, unreadable, or not in a pod.
    """
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parse_cgroup(text)
