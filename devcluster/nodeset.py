"""Several real kubelet nodes on this one machine, registered with one control plane.

Each node has its own containerd and kubelet, root, CDI and state
directories, ports, a loopback address of its own (127.0.0.2, 127.0.0.3, ...:
the kubelet serves there and host-network pods bind there), a node name and a
fake GPU inventory of its own (INVENTORIES: different models and MIG layouts
per node). Every node runs in its own mount namespace (devcluster.nodens), so
the chart's DaemonSet, whose hostPaths are the same for every pod, runs one
plugin pod per node on that node's directories; each plugin reads its node's
inventory from a file in its state directory (the chart's fake-GPU ConfigMap
is one inventory for every node, which is what a real fleet of identical
fake nodes would want, not this cluster).

The nodes carry NODE_SET_LABEL=<set name>, and the chart release of the set
selects them by it, so nodes other tests start on the same control plane get
no plugin pod of this release.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from devcluster import chart, images
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.nodens import NODE_VIEW
from devcluster.plugin import node_slices
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi

log = logging.getLogger(__name__)

NODE_SET_LABEL = "draplugin.dev/node-set"
PLUGIN_STATE = "plugin-state"
INVENTORY_FILE = "fake-gpus.yaml"
# What each node of a set has, in node order (cycled past the last): a different model and MIG
# layout per node, so a claim's selector can pick one node. Profiles are NVML's for each model.
INVENTORIES: tuple[dict[str, Any], ...] = (
    {"gpus": [{"model": "H100-80GB-HBM3", "count": 1}, {"model": "H100-80GB-HBM3", "count": 1,
                                                          "mig": ["3g.40gb", "2g.20gb", "1g.10gb"]}]},
    {"gpus": [{"model": "A100-SXM4-40GB", "count": 1}, {"model": "A100-SXM4-40GB", "count": 1,
                                                          "mig": ["3g.20gb", "2g.10gb"]}]},
    {"gpus": [{"model": "L4", "count": 1}, {"model": "L40S", "count": 1}]},
)  # fmt: skip


def node_ip(index: int) -> str:
    """Node `index` (0-based) of a set: 127.0.0.2 upwards (127.0.0.1 is the single-node clusters')."""
    if not 0 <= index < 250:
        raise ValueError(f"a node set has at most 250 nodes, not index {index}")
    return f"127.0.0.{index + 2}"


class NodeSet:
    """`count` kubelet nodes named `<prefix>-1`..., started side by side; stop() stops them all."""

    def __init__(
        self,
        cluster: ControlPlane,
        count: int,
        prefix: str = "gpu-node",
        base_dir: Path | None = None,
        remove_state_on_stop: bool = True,
    ) -> None:
        if count < 1:
            raise ValueError(f"a node set needs at least one node, not {count}")
        self.cluster = cluster
        self.name = prefix
        self.startup_seconds = 0.0
        self._pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix=f"nodeset-{prefix}")
        self.nodes = [
            KubeletNode(
                cluster,
                # Short paths: unix socket paths below the kubelet root are limited to 107 bytes.
                (base_dir / f"n{i + 1}") if base_dir else Path(tempfile.mkdtemp(prefix=f"dra-n{i + 1}-")),
                name=f"{prefix}-{i + 1}",
                remove_state_on_stop=remove_state_on_stop,
                node_ip=node_ip(i),
                labels={NODE_SET_LABEL: prefix},
                own_mount_namespace=True,
            )
            for i in range(count)
        ]

    def inventory(self, node: KubeletNode) -> dict[str, Any]:
        return INVENTORIES[self.nodes.index(node) % len(INVENTORIES)]

    def inventory_path(self, node: KubeletNode) -> Path:
        """Where the node's fake inventory is on this machine (the plugin reads it below NODE_VIEW)."""
        return node.state_dir / PLUGIN_STATE / INVENTORY_FILE

    def start(self) -> None:
        """Every node started and Ready, each with its inventory written; on failure all are stopped."""
        started = time.monotonic()
        errors: list[BaseException] = []

        def start(node: KubeletNode) -> None:
            try:
                node.start()
                path = self.inventory_path(node)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(yaml.safe_dump(self.inventory(node)))
            except BaseException as err:
                errors.append(err)

        self._each(start)
        if errors:
            self.stop()
            raise errors[0]
        self.startup_seconds = time.monotonic() - started
        log.info("node set ready nodes=%d seconds=%.1f", len(self.nodes), self.startup_seconds)

    def stop(self) -> None:
        self._each(lambda node: node.stop())

    def import_image(self, image: images.LocalImage) -> None:
        """`image` in every node's containerd (each node imports its own copy)."""
        self._each(lambda node: chart.import_image_into(node, image))

    def _each(self, action: Callable[[KubeletNode], object]) -> None:
        """`action` on every node at once, in the set's own threads: they live as long as the set,
        because a component dies with the thread that started it (PR_SET_PDEATHSIG is per thread)."""
        for _ in self._pool.map(action, self.nodes):
            pass

    def close(self) -> None:
        """Stop the nodes and the set's threads."""
        try:
            self.stop()
        finally:
            self._pool.shutdown(wait=True)


def release_values(
    cluster: ControlPlane, nodes: NodeSet, image: images.LocalImage, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The chart's values for a node set: devcluster.chart.live_values with the paths every node sees
    below NODE_VIEW, each plugin reading its node's inventory, plugin and controller on the set."""
    values = chart.live_values(cluster, nodes.nodes[0], image, NODE_VIEW / PLUGIN_STATE)
    plugin = values["kubeletPlugin"]
    selector = {NODE_SET_LABEL: nodes.name}
    local = {
        "kubeletPlugin": {
            "kubeletRootDir": str(NODE_VIEW / "root"),
            "cdiRoot": str(NODE_VIEW / "cdi"),
            "fakeGpus": None,  # no shared ConfigMap: each node's own file
            "nodeSelector": selector,
            "extraEnv": [
                *plugin["extraEnv"],
                {"name": "DRAPLUGIN_FAKE_CONFIG", "value": str(NODE_VIEW / PLUGIN_STATE / INVENTORY_FILE)},
            ],
        },
        "controller": {"nodeSelector": selector},
    }
    return chart.deep_merge(chart.deep_merge(values, local), overrides or {})


def node_set_release(
    cluster: ControlPlane,
    nodes: NodeSet,
    api: KubeApi,
    image: images.LocalImage,
    *,
    home: Path,
    name: str = "draplugin",
    namespace: str = "draplugin",
    overrides: dict[str, Any] | None = None,
) -> chart.ChartRelease:
    """The chart's release over a node set: install() waits for one Ready plugin pod per node."""
    return chart.ChartRelease(
        api, cluster.kubeconfig, home, namespace, release_values(cluster, nodes, image, overrides),
        name=name, create_namespace=True, plugin_pod_count=len(nodes.nodes),
    )  # fmt: skip


def wait_published(release: chart.ChartRelease, nodes: NodeSet) -> dict[str, list[dict[str, Any]]]:
    """Each node's ResourceSlices once they list exactly the devices of the node's own inventory
    (the names the fake backend, the plugin's code, gives that file)."""
    from draplugin.devices import load_backend

    expected = {
        node.name: sorted(
            d.name
            for d in load_backend("fake", node.name, config_file=str(nodes.inventory_path(node))).discover()
        )
        for node in nodes.nodes
    }
    driver = release.values.get("driverName") or DEFAULT_DRIVER_NAME

    def published() -> dict[str, list[dict[str, Any]]] | None:
        found = {}
        for node in nodes.nodes:
            slices = node_slices(release.api.api_client, node.name, driver)
            if (
                sorted(d["name"] for s in slices for d in s["spec"].get("devices") or [])
                != expected[node.name]
            ):
                return None
            found[node.name] = slices
        return found

    return release.wait(f"every plugin of {len(nodes.nodes)} nodes to publish its inventory", published)


def plugin_pod_of(release: chart.ChartRelease, node: str) -> dict[str, Any]:
    """The release's running plugin pod on `node`."""
    pods = [
        p for p in release.plugin_pods()
        if p["spec"].get("nodeName") == node and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip
    if len(pods) != 1:
        raise chart.ChartError(f"{len(pods)} plugin pods of release {release.name} on node {node}, not 1")
    return pods[0]


def print_summary(nodes: Sequence[KubeletNode]) -> None:
    for node in nodes:
        print(f"# kubelet node {node.name} ({node.node_ip}): root dir {node.root_dir}, "
              f"CDI dir {node.cdi_root}, containerd socket {node.cri_socket}", flush=True)  # fmt: skip
