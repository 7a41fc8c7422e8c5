"""The conformance table's compile verdicts agree with a real kube-apiserver.

Every expression the table says upstream accepts must be accepted in a DeviceClass
selector (server-side dry-run create), and every one it says upstream rejects at
compile time must be rejected by the API server, for a comparable reason.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from controller.cel import CompileError, compile_selector
from tests.kube.controlplane import ControlPlane
from tests.kube.rest import KubeJSON
from tests.unit.cel.conformance import CASES, Case

pytestmark = pytest.mark.cluster

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"

# One case per expression: the compile verdict does not depend on the device.
UNIQUE: dict[str, Case] = {}
for _case in CASES:
    UNIQUE.setdefault(_case.expression, _case)


def _device_class(expression: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"cel-{uuid.uuid4().hex[:12]}"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def _dry_run_create(cluster: ControlPlane, expression: str) -> str | None:
    """None when the API server accepts the DeviceClass, else its rejection text."""
    with cluster.api_client() as api:
        try:
            KubeJSON(api).request("POST", DEVICE_CLASSES, _device_class(expression), query={"dryRun": "All"})
        except ApiException as err:
            assert err.status == 422, err.body
            return str(err.body)
    return None


@pytest.mark.parametrize("case", list(UNIQUE.values()), ids=lambda c: c.expression[:80])
def test_apiserver_agrees_on_compile_verdict(kube_cluster: ControlPlane, case: Case) -> None:
    rejection = _dry_run_create(kube_cluster, case.expression)
    if case.gated_in_apiserver:
        assert rejection is not None and "found no matching overload" in rejection
        return
    if case.apiserver_accepts:
        assert rejection is None, f"kube-apiserver rejected an expression we accept: {rejection}"
        compile_selector(case.expression, engine="cel-expr-python")
        return
    assert rejection is not None, "kube-apiserver accepted an expression we reject"
    assert "cel.expression" in rejection
    with pytest.raises(CompileError) as ours:
        compile_selector(case.expression, engine="cel-expr-python")
    if case.message:
        assert case.message in rejection, f"ours: {ours.value}; apiserver: {rejection}"
