"""What a pod's containers got, checked from inside them (helpers on top of devcluster.pods)."""

from __future__ import annotations

from collections.abc import Sequence

from devcluster.pods import container_log, exec_in
from dracommon.kubeapi import KubeApi
from draplugin.prepare.plan import env_key

# Every GPU's CDI device injects these besides its own /dev/nvidia<index>.
CONTROL_NODES = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


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


def container_got(
    api: KubeApi, namespace: str, pod: str, container: str, devices: Sequence[str]
) -> dict[str, str]:
    """Check, from inside the container, that it got every one of `devices` (names); return its variables.

    Each device's variables are in the container's log (the workload image and
    the examples print them), and its device nodes, `/dev/nvidia<index>` and the
    control nodes, are character devices the container can open.
    """
    env = log_env(container_log(api, namespace, pod, container))
    nodes = list(CONTROL_NODES)
    for device in devices:
        key = env_key(device)
        assert env.get(f"DRAPLUGIN_DEVICE_{key}_NAME") == device, (
            f"{pod}/{container}: {device} missing: {env}"
        )
        assert env[f"DRAPLUGIN_DEVICE_{key}_UUID"], env
        nodes.append(f"/dev/nvidia{env[f'DRAPLUGIN_DEVICE_{key}_INDEX']}")
    found = device_nodes_in(api, namespace, pod, container, nodes)
    assert found == dict.fromkeys(nodes, "ok"), f"{pod}/{container}: device nodes {found}"
    return env
