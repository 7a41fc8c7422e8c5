"""The NVIDIA-compatible mode refuses a node where NVIDIA's own DRA driver runs.

Under `--driver-name=gpu.nvidia.com` (`--device-naming=nvidia`) we and NVIDIA's
kubelet plugin would be one driver to the kubelet and to the scheduler: the
kubelet keeps one registered plugin per driver name, the publisher deletes
every slice of its driver on the node that it did not write (NVIDIA's), and
the same GPUs would be offered twice. So before anything is published or
registered, the plugin looks for NVIDIA's driver and, on any sign of it, logs
what it saw, posts a Warning Event on the Node and stops (exit status 1).

Signs, either is enough:

- a live registration socket `<kubelet-root>/plugins_registry/gpu.nvidia.com-reg.sock`:
  the name NVIDIA's kubelet plugin registers under (it serves the kubelet
  plugin helper's default `<driver>-reg.sock`; its health check dials the same
  path, k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/health.go). Live means a
  connect succeeds; a leftover file nobody serves is not a sign. Our own
  per-pod sockets carry the pod's UID, so a rolling update of ours is not
  mistaken for it (without a pod UID ours would take that very name, and a
  live one there is another plugin of the same driver either way);
- a ResourceSlice of driver `gpu.nvidia.com` on this node that we did not
  write: ours are named `<node>-<driver>-<index>` (`slices.render`), the
  helper's `<index>-<driver>-<node>-<random>`. An API error here is logged
  and the socket decides alone, so a plugin that starts before the API server
  answers is not stopped for it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from dracommon.kubeapi import ApiError
from draplugin.devices.naming import NVIDIA_DRIVER_NAME
from draplugin.kubelet.sockets import REGISTRY_DIR_NAME
from draplugin.slices.render import is_our_slice_name

log = logging.getLogger(__name__)

REGISTRATION_SOCKET: Final = f"{NVIDIA_DRIVER_NAME}-reg.sock"
REASON: Final = "NvidiaDraDriverPresent"
CONNECT_TIMEOUT_S: Final = 1.0

SliceLister = Callable[[str], tuple[list[dict[str, Any]], str]]


class NvidiaDriverPresent(RuntimeError):
    """NVIDIA's DRA driver runs on this node; the message says what showed it and what to change."""


def _live(path: Path) -> bool:
    """A process accepts connections on the Unix socket `path` (a leftover file refuses them)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(CONNECT_TIMEOUT_S)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def registration_signs(kubelet_root_dir: Path) -> list[str]:
    path = kubelet_root_dir / REGISTRY_DIR_NAME / REGISTRATION_SOCKET
    if path.is_socket() and _live(path):
        return [f"a kubelet plugin serves {path}, NVIDIA's DRA driver's registration socket"]
    return []


def slice_signs(list_slices: SliceLister, node_name: str) -> list[str]:
    selector = f"spec.driver={NVIDIA_DRIVER_NAME},spec.nodeName={node_name}"
    try:
        slices, _ = list_slices(selector)
    except ApiError as err:
        log.warning(
            "cannot list ResourceSlices to look for NVIDIA's DRA driver; its socket decides alone",
            extra={"node": node_name, "error": str(err)},
        )
        return []
    foreign = sorted(
        str(obj["metadata"]["name"])
        for obj in slices
        if not is_our_slice_name(str(obj["metadata"]["name"]), node_name, NVIDIA_DRIVER_NAME)
    )
    if not foreign:
        return []
    names = ", ".join(foreign)
    return [f"ResourceSlices of driver {NVIDIA_DRIVER_NAME} on this node that we did not write: {names}"]


def refusal(signs: Sequence[str]) -> str:
    return (
        f"NVIDIA's DRA driver runs on this node ({'; '.join(signs)}): --device-naming=nvidia would "
        f"register and publish as {NVIDIA_DRIVER_NAME} beside it, so the plugin does not start. Remove "
        "NVIDIA's kubelet plugin from this node, or run ours with --device-naming=draplugin and its own "
        "--driver-name (chart: kubeletPlugin.deviceNaming, driverName)"
    )


def check(
    *,
    kubelet_root_dir: Path,
    node_name: str,
    list_slices: SliceLister,
    node_event: Callable[[str, str], None],
) -> None:
    """Raise `NvidiaDriverPresent` (after a log line and a Node Event) on any sign of NVIDIA's driver."""
    signs = registration_signs(kubelet_root_dir) + slice_signs(list_slices, node_name)
    if not signs:
        return
    message = refusal(signs)
    log.error("NVIDIA's DRA driver runs on this node", extra={"node": node_name, "signs": list(signs)})
    node_event(REASON, message)
    raise NvidiaDriverPresent(message)
