"""`dra-controller run` under the chart's own ServiceAccount and RBAC.

The RBAC tests check rules one verb at a time; this one runs the real
controller with a token of the chart's controller ServiceAccount, so a verb
the controller needs but the chart forgot shows up as a controller that does
not do its job.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from devcluster.controlplane import ControlPlane, write_kubeconfig
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from tests.integration.test_controller_run import (  # fixtures are used by name
    PREALLOCATE,
    RESOURCE_V1,
    StartController,
    allocated,
    claim_body,
    devices_of,
    pod_body,
    publish_two_gpus,
    start_controller,
)
from tests.integration.test_rbac import Installed, admin, installed, unbound_token

pytestmark = pytest.mark.cluster

__all__ = ["admin", "installed", "start_controller"]


def test_controller_does_its_job_with_the_charts_rbac(
    kube_cluster: ControlPlane,
    admin: k8s.ApiClient,
    installed: Installed,
    fake_node: Callable[..., str],
    gpu_device_class: str,
    start_controller: StartController,
    tmp_path: Path,
) -> None:
    ns = installed.namespace
    token = unbound_token(admin, installed, installed.controller_sa)
    kubeconfig = write_kubeconfig(
        tmp_path / "controller.kubeconfig", kube_cluster.server, kube_cluster.ca_file, {"token": token}, "sa"
    )
    rest = KubeApi(admin)
    node = fake_node()
    publish_two_gpus(rest, node)
    controller = start_controller("chart-rbac", kubeconfig=kubeconfig)

    # Pre-allocation: annotate + finalizer (claims patch), allocation (status patch).
    rest.create(
        f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
        claim_body("pinned", gpu_device_class, annotations={PREALLOCATE: node}),
    )
    claim = wait_for("the controller to allocate the claim", lambda: allocated(rest, ns, "pinned"), 60)
    assert devices_of(claim) in ([(node, "gpu-0")], [(node, "gpu-1")])

    # Events for a claim a pending pod waits on (pods list/watch, events create).
    no_match = 'device.attributes["gpu.draplugin.dev"].model == "none"'
    rest.create(
        f"{RESOURCE_V1}/namespaces/{ns}/resourceclaims",
        claim_body("impossible", gpu_device_class, selector=no_match),
    )
    rest.create(f"/api/v1/namespaces/{ns}/pods", pod_body("waiting", "impossible", containers=1))

    def cannot_allocate_events() -> list[dict[str, Any]] | None:
        items = rest.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        found = [e for e in items if e.get("reason") == "CannotAllocate"]
        return found or None

    events = wait_for("a CannotAllocate event", cannot_allocate_events, 60)
    assert "request selector" in events[0]["note"]
    # A refused call logs as "HTTP 403: ..." (dracommon.kubeapi.ApiError) with reason Forbidden; a bare
    # "403" would also match a port number such as 40335 in the log.
    refused = re.compile(r"HTTP 403\b|\bForbidden\b")
    forbidden_lines = [line for line in controller.log_path.read_text().splitlines() if refused.search(line)]
    assert not forbidden_lines, forbidden_lines[:3]
    assert controller.terminate() == 0
