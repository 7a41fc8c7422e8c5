"""devcluster.nodeset without a cluster: the nodes' addresses, inventories and the chart values."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster import images
from devcluster.nodens import NODE_VIEW
from devcluster.nodeset import INVENTORIES, NODE_SET_LABEL, node_ip, release_values
from draplugin.devices import load_backend


def test_every_node_of_a_set_has_a_loopback_address_of_its_own() -> None:
    addresses = [node_ip(i) for i in range(250)]
    assert len(set(addresses)) == 250
    assert "127.0.0.1" not in addresses  # the single-node clusters' address
    with pytest.raises(ValueError):
        node_ip(250)


def test_the_inventories_are_valid_and_no_two_nodes_share_a_model(tmp_path: Path) -> None:
    products = []
    for i, inventory in enumerate(INVENTORIES):
        path = tmp_path / f"n{i}.yaml"
        path.write_text(yaml.safe_dump(inventory))
        devices = load_backend("fake", f"node-{i}", config_file=str(path)).discover()
        products.append({d.attributes["productName"] for d in devices})
    assert all(a.isdisjoint(b) for i, a in enumerate(products) for b in products[i + 1 :]), products
    assert sum(any("mig" in d for d in map(str, inv["gpus"])) for inv in INVENTORIES) >= 2


def test_the_release_points_every_plugin_at_its_nodes_view_and_its_own_inventory() -> None:
    node = types.SimpleNamespace(root_dir=Path("/x/root"), cdi_root=Path("/x/cdi"))
    nodes: Any = types.SimpleNamespace(nodes=[node], name="set-a")
    cluster: Any = types.SimpleNamespace(server="https://127.0.0.1:6443")
    image = images.LocalImage("localhost/draplugin:test", Path("/nowhere.tar"))
    values = release_values(cluster, nodes, image)
    plugin = values["kubeletPlugin"]
    assert (plugin["kubeletRootDir"], plugin["cdiRoot"]) == (f"{NODE_VIEW}/root", f"{NODE_VIEW}/cdi")
    assert plugin["stateDir"].startswith(f"{NODE_VIEW}/")
    assert plugin["fakeGpus"] is None
    env = {e["name"]: e["value"] for e in plugin["extraEnv"]}
    assert env["DRAPLUGIN_FAKE_CONFIG"].startswith(plugin["stateDir"] + "/")
    assert plugin["nodeSelector"] == values["controller"]["nodeSelector"] == {NODE_SET_LABEL: "set-a"}
