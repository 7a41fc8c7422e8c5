"""Re-discovery against the real kube-apiserver: the published slices follow a fake GPU that disappears
and comes back, and a fault on it clears when it returns (`--health-recovery=on-reset`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import KubeApi
from draplugin.devices.fake import FakeBackend, load_config
from draplugin.devices.health import HealthTracker
from draplugin.devices.watch import DeviceChange, DeviceWatcher
from draplugin.slices.api import KubeSliceApi
from draplugin.slices.metrics import SliceMetrics
from draplugin.slices.publisher import SlicePublisher, backend_source
from tests.integration.test_slices_publish import DRIVER, our_slices

pytestmark = pytest.mark.cluster

THREE_L4 = "gpus:\n  - model: L4\n    count: 3\n"
TWO_L4 = "gpus:\n  - model: L4\n    count: 2\n"


def published(rest: KubeApi, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in our_slices(rest, node) for d in s["spec"]["devices"]}


def test_slices_follow_a_fake_gpu_that_disappears_and_comes_back(
    kube_cluster: ControlPlane, fake_node: Callable[..., str], tmp_path: Path
) -> None:
    node = fake_node()
    path = tmp_path / "gpus.yaml"
    path.write_text(THREE_L4)
    backend = FakeBackend(node, load_config(path), config_file=path)
    tracker = HealthTracker(DRIVER)
    watcher = DeviceWatcher(backend, tracker, interval_s=0)
    changes: list[DeviceChange] = []
    watcher.add_listener(changes.append)
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        publisher = SlicePublisher(
            KubeSliceApi(rest),
            node_name=node,
            driver=DRIVER,
            source=backend_source(backend, tracker.apply),
            expect_taints=True,
            metrics=SliceMetrics(CollectorRegistry()),
        )
        first = publisher.sync()
        assert sorted(published(rest, node)) == ["gpu-0", "gpu-1", "gpu-2"]

        tracker.report_unhealthy(["gpu-2"], "NoSchedule", "xid-79", "fell off the bus")
        publisher.sync()
        assert published(rest, node)["gpu-2"]["taints"][0]["value"] == "xid-79"

        # The GPU falls off the bus: the node's inventory loses it.
        path.write_text(TWO_L4)
        change = watcher.check()
        assert change is not None and change.removed == ("gpu-2",)
        gone = publisher.sync()
        assert sorted(published(rest, node)) == ["gpu-0", "gpu-1"]
        # One slice changed: an in-place update (the publisher's rule), not a new pool generation.
        assert (gone.updated, gone.generation) == (1, first.generation)
        assert set(tracker.faults()) == {"gpu-2"}  # not back yet: the fault is kept

        # Reset and back: published again, without the stale taint.
        path.write_text(THREE_L4 + "# back after a reset\n")
        change = watcher.check()
        assert change is not None and change.added == ("gpu-2",)
        publisher.sync()
        devices = published(rest, node)
        assert sorted(devices) == ["gpu-0", "gpu-1", "gpu-2"]
        assert "taints" not in devices["gpu-2"]
        assert publisher.sync().writes == 0  # nothing changed since: nothing written
        assert [len(c.devices) for c in changes] == [2, 3]
