"""The fault suite's common rig: `draplugin run` with fake GPUs, its API traffic through a
`FaultProxy`, in a short temporary root (the 107-byte socket path limit).

One place for what every fault test file starts the same way; each file keeps its own claims,
deadlines and clean-up checks.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, TypeVar

from devcluster.controlplane import ControlPlane
from devcluster.plugin import PluginProcess
from tests.faultproxy import FaultProxy

P = TypeVar("P", bound=PluginProcess)


def proxied_plugin(
    kube_cluster: ControlPlane,
    node: str,
    *,
    prefix: str,
    gpus_yaml: str,
    api_deadline_s: float,
    plugin_class: type[P],
    extra_env: dict[str, str] | None = None,
    **plugin_kwargs: Any,
) -> tuple[Path, FaultProxy, P]:
    """A root directory, a proxy to `kube_cluster` (50 ms per chunk, so stalls can be placed) and
    a plugin (not started) for `node` with the GPUs of `gpus_yaml`, its API reads bounded by
    `api_deadline_s`."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    proxy = FaultProxy(int(kube_cluster.server.rsplit(":", 1)[1]), delay_s=0.05)
    gpus = root / "gpus.yaml"
    gpus.write_text(gpus_yaml)
    plugin = plugin_class(
        kubeconfig=proxy.kubeconfig(kube_cluster.kubeconfig, root / "kubeconfig"),
        node_name=node,
        kubelet_root_dir=root / "kubelet",
        cdi_root=root / "cdi",
        state_dir=root / "state",
        fake_config=gpus,
        extra_env={
            "PREPARE_API_DEADLINE": f"{api_deadline_s:g}s",
            "DRAPLUGIN_FAKE_DEVICE_DIR": str(root / "dev"),
            **(extra_env or {}),
        },
        **plugin_kwargs,
    )
    return root, proxy, plugin
