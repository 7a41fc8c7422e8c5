"""What a pod's containers got, checked from inside them (helpers on top of devcluster.pods)."""

from __future__ import annotations

from devcluster.pods import exec_in
from dracommon.kubeapi import KubeApi


def log_env(log: str) -> dict[str, str]:
    """NAME=value lines of a log (the examples print their variables with `env | grep`)."""
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line and not line.startswith(" "))


# Each node: a character device that opens for reading and for writing.
_CHECK_NODES = (
    'for d in "$@"; do '
    'if [ -c "$d" ] && : < "$d" && : > "$d"; then echo "$d ok"; else echo "$d bad"; fi; '
    "done"
)


def device_nodes_in(
    api: KubeApi, namespace: str, pod: str, container: str, nodes: list[str]
) -> dict[str, str]:
    """For each path, 'ok' if the container has it as a character device it can open read and write."""
    code, out, err = exec_in(api, namespace, pod, container, ["sh", "-c", _CHECK_NODES, "check", *nodes])
    assert code == 0, f"checking {nodes} in {namespace}/{pod}/{container}: exit {code}: {err}"
    return dict(line.rsplit(" ", 1) for line in out.splitlines() if line.strip())


def mounts_in(api: KubeApi, namespace: str, pod: str, container: str) -> set[str]:
    """The container's mount points, from its own /proc/self/mounts."""
    code, out, err = exec_in(api, namespace, pod, container, ["cat", "/proc/self/mounts"])
    assert code == 0, err
    return {line.split()[1] for line in out.splitlines() if line.strip()}
