"""`simulate` against the real kube-scheduler on random scenarios across several nodes.

Generator, runner and shrinker: tests/differential/. Each scenario is one pod on its own nodes
(1 to 3), driver and classes; all of a batch play at once. Required: the same outcome (placed,
unschedulable, or a scheduling error), the same node where the scheduler's choice is
determined (else the scheduler's node is among those simulate lists), and the same devices
where the scheduler's search order is (one slice on the node). A disagreement fails the test
and is printed shrunk, as a case for tests/integration/test_differential_cases.py.

`make test` plays DIFFERENTIAL_SCENARIOS (default 300); `make differential` plays 2,000 per release.
"""

from __future__ import annotations

import os

import pytest

from devcluster.controlplane import ControlPlane
from tests.differential import campaign
from tests.differential.play import Player
from tests.integration.release import cluster_features, cluster_version

pytestmark = pytest.mark.cluster

SCENARIOS = int(os.environ.get("DIFFERENTIAL_SCENARIOS", "300"))
SEED = 20261201


def test_simulate_agrees_with_kube_scheduler_across_nodes(kube_cluster: ControlPlane) -> None:
    player = Player(kube_cluster, cluster_features(kube_cluster), cluster_version(kube_cluster))
    try:
        report = campaign.run(player, SEED, SCENARIOS)
    finally:
        player.close()
    print(f"\n{report.summary}")
    for verdict in report.disagreements:
        print(f"- {verdict.scenario.tag}: {verdict.problem}")
    for case in report.cases:
        print(f"\n# ----- shrunk disagreement, ready to commit:\n{case}")
    assert report.upstream_crash is None, report.upstream_crash
    assert report.played == SCENARIOS
    assert not report.disagreements, report.summary
