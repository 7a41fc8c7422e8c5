"""The Kubernetes release and allocator features of the control plane under test.

Tests that compare our behaviour with the real components ask the API server
for its release (`GET /version`) rather than trusting the binaries' directory,
and add the feature gates the fixtures switched on.
"""

from __future__ import annotations

from controller.allocation.features import Features, parse_feature_gates
from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import KubeApi
from dracommon.kubeversion import KubernetesVersion, server_version


def cluster_version(cluster: ControlPlane) -> KubernetesVersion:
    with cluster.api_client() as api:
        return server_version(KubeApi(api))


def cluster_features(cluster: ControlPlane) -> Features:
    """What kube-scheduler of this cluster honours: its release's defaults plus its gates."""
    _, minor = cluster_version(cluster)
    return Features.for_release(minor).with_gates(parse_feature_gates(cluster.dra.feature_gates))
