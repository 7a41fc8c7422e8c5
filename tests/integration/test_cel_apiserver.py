"""The conformance table's compile verdicts agree with a real kube-apiserver.

Every expression the table says upstream accepts must be accepted in a DeviceClass
selector (server-side dry-run create), and every one it says upstream rejects at
compile time must be rejected by the API server, for a comparable reason.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from controller.allocation.builders import device_class
from controller.cel import CompileError, compile_selector
from devcluster.controlplane import ControlPlane
from dracommon.kubeapi import ApiError, KubeApi
from tests.integration.release import cluster_version
from tests.unit.cel.conformance import CASES, Case

pytestmark = pytest.mark.cluster

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"

# One case per expression: the compile verdict does not depend on the device.
UNIQUE: dict[str, Case] = {}
for _case in CASES:
    UNIQUE.setdefault(_case.expression, _case)


def _device_class(expression: str) -> dict[str, Any]:
    return device_class(f"cel-{uuid.uuid4().hex[:12]}", [expression])


def _dry_run_create(cluster: ControlPlane, expression: str) -> str | None:
    """None when the API server accepts the DeviceClass, else its rejection text."""
    with cluster.api_client() as api:
        try:
            KubeApi(api).request("POST", DEVICE_CLASSES, _device_class(expression), query={"dryRun": "All"})
        except ApiError as err:
            assert err.status == 422, err.body
            return str(err.body)
    return None


@pytest.fixture(scope="module")
def server_release(kube_cluster: ControlPlane) -> tuple[int, int]:
    """The API server's release, from GET /version (not from the binaries' directory)."""
    return cluster_version(kube_cluster)


@pytest.mark.parametrize("case", list(UNIQUE.values()), ids=lambda c: c.expression[:80])
def test_apiserver_agrees_on_compile_verdict(
    kube_cluster: ControlPlane, server_release: tuple[int, int], case: Case
) -> None:
    rejection = _dry_run_create(kube_cluster, case.expression)
    if not case.available_in(server_release):
        # A library this release does not accept in new selectors: upstream and we say the same.
        assert rejection is not None, (
            f"kube-apiserver {server_release} accepted it; the table says {case.since}"
        )
        with pytest.raises(CompileError) as ours:
            compile_selector(case.expression, engine="cel-expr-python", kubernetes_version=server_release)
        assert ours.value.message in rejection, f"ours: {ours.value}; apiserver: {rejection}"
        assert f"<input>:{ours.value.line}:{ours.value.column}:" in rejection.replace("\\u003c", "<").replace(
            "\\u003e", ">"
        ), f"ours: {ours.value}; apiserver: {rejection}"
        return
    if case.gated_in_apiserver:
        assert rejection is not None and "found no matching overload" in rejection
        return
    if case.apiserver_accepts:
        assert rejection is None, f"kube-apiserver rejected an expression we accept: {rejection}"
        compile_selector(case.expression, engine="cel-expr-python", kubernetes_version=server_release)
        return
    assert rejection is not None, "kube-apiserver accepted an expression we reject"
    assert "cel.expression" in rejection
    with pytest.raises(CompileError) as ours:
        compile_selector(case.expression, engine="cel-expr-python", kubernetes_version=server_release)
    if case.message:
        assert case.message in rejection, f"ours: {ours.value}; apiserver: {rejection}"
