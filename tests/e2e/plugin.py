"""The plugin daemon for a module of end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import FAKE_GPUS, PluginProcess, delete_node_slices, node_slices, wait_published
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi


@contextmanager
def running_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    state_dir: Path,
    *,
    delete_slices_on_shutdown: bool,
    extra_env: Mapping[str, str] | None = None,
    fake_config: Path = FAKE_GPUS,
    metrics_port: int = 0,
    backend_args: tuple[str, ...] = ("--backend", "fake"),
    expected_devices: Sequence[str] | None = None,
    command_prefix: tuple[str, ...] = (),
    driver_name: str = DEFAULT_DRIVER_NAME,
) -> Iterator[PluginProcess]:
    """`draplugin run` for the kubelet node, registered and with its slices published.

    Whatever the plugin leaves behind (it may be killed by a test, or keep its
    slices across restarts on purpose) is removed when the module is done.
    """
    process = PluginProcess(
        kubeconfig=kube_cluster.kubeconfig,
        node_name=kubelet_node.name,
        kubelet_root_dir=kubelet_node.root_dir,
        cdi_root=kubelet_node.cdi_root,
        state_dir=state_dir,
        fake_config=fake_config,
        delete_slices_on_shutdown=delete_slices_on_shutdown,
        extra_env=dict(extra_env or {}),
        metrics_port=metrics_port,
        backend_args=backend_args,
        command_prefix=command_prefix,
        driver_name=driver_name,
    )
    try:
        process.start()
        process.wait_registered()
        wait_published(process, api.api_client, expected_devices=expected_devices)
        yield process
    finally:
        process.stop()
        if node_slices(api.api_client, kubelet_node.name, driver_name):
            delete_node_slices(api.api_client, kubelet_node.name, driver_name)
