"""SMOKE TEST of the peer benchmarks (bench.cel, bench.allocate, bench.slices) at tiny sizes.

Each Go peer (tests/cluster/build_peers.sh, cached) is started once on a tiny job, so a
broken harness or a disagreement with upstream shows up in `make test`, not only in
`make bench`. No figure is checked here: timings at these sizes mean nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bench.allocate.__main__ import main as allocate_main
from bench.cel.__main__ import main as cel_main
from bench.slices.__main__ import ours, upstream
from devcluster.controlplane import ControlPlane
from draplugin.devices.fake import FakeBackend, config_from_flags
from draplugin.slices.plan import plan_slices

pytestmark = pytest.mark.cluster


def test_smoke_cel_peer_returns_the_same_match_sets_as_ours() -> None:
    # main() exits 1 when any device's match or error differs between ours and cel-go.
    assert cel_main(["--devices", "64", "--runs", "1"]) == 0


def test_smoke_allocate_peer_places_validly_beside_ours() -> None:
    # main() exits 1 when either side's placements break a rule (device twice, selector, NUMA).
    assert allocate_main(["--nodes", "4", "--claims", "20", "--memory-nodes", "4"]) == 0


def test_smoke_slices_peer_and_ours_make_the_same_writes(
    kube_cluster: ControlPlane, fake_node: Callable[..., str]
) -> None:
    ours_node, peer_node = fake_node(), fake_node()
    devices = list(FakeBackend(ours_node, config_from_flags(8, "H100-80GB-HBM3")).discover())
    slices = len(plan_slices(devices))
    with kube_cluster.api_client() as api:
        mine = ours(api, ours_node, devices, resyncs=1, idle_s=0.5)
    theirs = upstream(str(kube_cluster.kubeconfig), peer_node, devices, resyncs=1, idle_s=0.5)
    expected = {"first publish": slices, "change of one device": 1, "resync, no change": 0, "idle": 0}
    assert {phase: writes for phase, (_, writes) in mine.items()} == expected
    assert {phase: writes for phase, (_, writes) in theirs.items()} == expected
