"""Two `draplugin run` processes under one node name against the real API server.

Each has its own state directory (so its own writer id) and a different number
of fake GPUs, as two machines given one name would. Without the duplicate check
they repair the pool to their own devices in turn, without end; with it the
first plugin logs the duplicate, posts a `DuplicateNodeName` Warning Event on
the Node and writes no more, so the pool's resourceVersions stand still.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.integration.test_node_daemon import _cleanup, _start, node_slices, published_devices

pytestmark = pytest.mark.cluster

QUIET_WINDOW_S = 10.0


def _versions(rest: KubeApi, node: str) -> dict[str, str]:
    return {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in node_slices(rest, node)}


def test_a_second_plugin_under_one_node_name_stops_the_first_with_an_event(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    node = fake_node()
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        first = _start(kube_cluster, node, "--fake-gpus", "4")
        second = None
        try:
            wait_for("4 published devices", lambda: published_devices(rest, node, first, 4), timeout=60)
            second = _start(kube_cluster, node, "--fake-gpus", "2")

            def duplicate_line() -> dict[str, Any] | None:
                lines = [line for line in first.log_lines() if line["msg"].startswith("duplicate node name")]
                return lines[0] if lines else None

            line = wait_for("the duplicate line", duplicate_line, timeout=60)
            assert line["node"] == node and line["other_writer"] != line["writer"]

            def event() -> dict[str, Any] | None:
                found = rest.get("/apis/events.k8s.io/v1/namespaces/default/events")["items"]
                ours = [
                    e for e in found if e["reason"] == "DuplicateNodeName" and e["regarding"]["name"] == node
                ]
                return ours[0] if ours else None

            posted = wait_for("the DuplicateNodeName Event", event, timeout=30)
            assert posted["type"] == "Warning" and node in posted["note"]

            before = _versions(rest, node)
            time.sleep(QUIET_WINDOW_S)  # a fixed window in which a write loop would write many times
            assert _versions(rest, node) == before
            devices = [d["name"] for s in node_slices(rest, node) for d in s["spec"].get("devices", [])]
            assert devices == ["gpu-0", "gpu-1"]  # the newer writer keeps the pool
            assert first.proc.poll() is None and second.proc.poll() is None
        finally:
            _cleanup(first)
            if second is not None:
                _cleanup(second)
