"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import KubeApi


@pytest.fixture(scope="module")
def api(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)
