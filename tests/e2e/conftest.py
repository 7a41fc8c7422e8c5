"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devcluster.controlplane import ControlPlane
from devcluster.rest import KubeJSON


@pytest.fixture(scope="module")
def api(kube_cluster: ControlPlane) -> Iterator[KubeJSON]:
    with kube_cluster.api_client() as client:
        yield KubeJSON(client)
