"""Two allocators, one GPU, next to a real kubelet: while an NVIDIA device plugin serves the node the
plugin publishes no GPU (default `refuse`) and says why on the Node; when it goes, the GPUs come back.

The device plugin is stood in for by what the plugin looks at: a listening unix socket named as
NVIDIA's device plugin names its own (`nvidia-gpu.sock`), and the Node advertising
`nvidia.com/gpu` in its status, patched through the API server the way node-level extended
resources are advertised (the kubelet keeps such capacity). The kubelet's device plugin
directory is the fixed `/var/lib/kubelet/device-plugins` (the default `--device-plugin-dir`),
which every kubelet on this machine shares, whatever its `--root-dir`: the socket goes to a
directory of this module's own instead (`DEVICE_PLUGIN_DIR`), so other tests' plugins do not see
it. The plugin runs as `draplugin run` with the default policy and looks again every second
(`REDISCOVER_INTERVAL=1s`).
"""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin.devices import load_backend
from draplugin.devices.deviceplugin_guard import (
    DEFAULT_DEVICE_PLUGIN_DIR,
    DETECTED_REASON,
    GONE_REASON,
    SETTING_HINT,
)
from tests.e2e.plugin import running_plugin

pytestmark = pytest.mark.kubelet

DRIVER = "gpu.draplugin.dev"
WAIT = 60.0


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    # Short, under /tmp: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="dp-") as directory:
        yield Path(directory)


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("guard-plugin"),
        delete_slices_on_shutdown=True,
        extra_env={"REDISCOVER_INTERVAL": "1s", "DEVICE_PLUGIN_DIR": str(socket_dir)},
    ) as process:
        yield process


def inventory(plugin: PluginProcess) -> list[str]:
    return sorted(
        d.name for d in load_backend("fake", plugin.node_name, config_file=str(plugin.fake_config)).discover()
    )


def published(api: KubeApi, plugin: PluginProcess) -> list[str] | None:
    """The device names of the plugin's slices; None while it has published none at all."""
    slices = node_slices(api.api_client, plugin.node_name, DRIVER)
    if not slices:
        return None
    return sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])


def node_events(api: KubeApi, node: str, reason: str) -> list[dict[str, Any]]:
    items, _ = api.list("/apis/events.k8s.io/v1/namespaces/default/events")
    return [
        e
        for e in items
        if e.get("reason") == reason
        and (e.get("regarding") or {}).get("kind") == "Node"
        and (e.get("regarding") or {}).get("name") == node
        and e.get("reportingController") == DRIVER
    ]


def wait_devices(api: KubeApi, plugin: PluginProcess, expected: list[str], what: str) -> None:
    def done() -> bool:
        if not plugin.running:
            raise RuntimeError(f"plugin exited:\n{plugin.log_tail()}")
        return published(api, plugin) == expected

    wait_for(what, done, WAIT, interval=0.2)


def test_the_kubelet_keeps_device_plugin_sockets_at_the_default_dir_whatever_its_root_dir(
    kubelet_node: KubeletNode,
) -> None:
    assert not (kubelet_node.root_dir / "device-plugins").exists()
    assert (Path(DEFAULT_DEVICE_PLUGIN_DIR) / "kubelet.sock").is_socket()


def test_a_device_plugin_socket_withdraws_every_gpu_with_an_event_and_its_removal_brings_them_back(
    api: KubeApi, plugin: PluginProcess, socket_dir: Path
) -> None:
    everything = inventory(plugin)
    wait_devices(api, plugin, everything, "every device published before the device plugin comes")
    directory = socket_dir
    gone_before = len(node_events(api, plugin.node_name, GONE_REASON))
    path = directory / "nvidia-gpu.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen()
        wait_devices(api, plugin, [], "no device published while the device plugin socket is there")

        def detected() -> dict[str, Any] | None:
            # Events are listed by name, not time, and other modules' plugins post on this Node too.
            mine = [e for e in node_events(api, plugin.node_name, DETECTED_REASON) if str(path) in e["note"]]
            return mine[0] if mine else None

        event: dict[str, Any] = wait_for("the DevicePluginDetected Event on the Node", detected, WAIT)
        assert event["type"] == "Warning"
        assert str(path) in event["note"] and "policy refuse" in event["note"]
        assert SETTING_HINT in event["note"]
        assert "device plugin detected on this node" in plugin.log_text()
    finally:
        server.close()
        path.unlink(missing_ok=True)
    wait_devices(api, plugin, everything, "every device back once the socket is gone")
    wait_for(
        "the DevicePluginGone Event on the Node",
        lambda: len(node_events(api, plugin.node_name, GONE_REASON)) > gone_before,
        WAIT,
    )


def test_the_node_advertising_nvidia_gpu_is_enough(
    api: KubeApi, plugin: PluginProcess, kubelet_node: KubeletNode
) -> None:
    everything = inventory(plugin)
    wait_devices(api, plugin, everything, "every device published")
    node_path = f"/api/v1/nodes/{kubelet_node.name}"
    try:
        api.patch_status(node_path, {"status": {"capacity": {"nvidia.com/gpu": "2"}}})
        wait_devices(api, plugin, [], "no device while the Node advertises nvidia.com/gpu")
        # Events are listed by name, not time, and other modules' plugins post on this Node too:
        # look for the one that names the Node's resource.
        wait_for(
            "an Event naming the Node's nvidia.com/gpu",
            lambda: any(
                "Node resource nvidia.com/gpu=2" in e.get("note", "")
                for e in node_events(api, plugin.node_name, DETECTED_REASON)
            ),
            30,
        )
    finally:
        api.patch_status(
            node_path,
            {"status": {"capacity": {"nvidia.com/gpu": None}, "allocatable": {"nvidia.com/gpu": None}}},
        )
    wait_devices(api, plugin, everything, "every device back once the Node no longer advertises it")
