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


# transformMap / transformMapEntry (ext.TwoVarComprehensions, in the base environment since
# 1.32, so in every release we support): accepted by the API server and by us alike.
TWO_VAR_MAP_ACCEPTED = [
    'device.attributes["gpu.example.com"].transformMap(k, v, k == "model", v) == {"model": "H100"}',
    '["a", "b"].transformMap(i, v, device.attributes["gpu.example.com"].index + i)[1] > 2',
    "[1, 2, 3, 4].transformMap(i, v, v % 2 == 0, v * 2).size() == 2",
    '{"a": 1}.transformMapEntry(k, v, {k + "x": v}) == {"ax": 1}',
    '["a", "b"].transformMapEntry(i, v, i > 0, {v: i}).size() == 1',
]


@pytest.mark.parametrize("expression", TWO_VAR_MAP_ACCEPTED)
def test_apiserver_accepts_map_building_comprehensions_as_we_do(
    kube_cluster: ControlPlane, server_release: tuple[int, int], expression: str
) -> None:
    rejection = _dry_run_create(kube_cluster, expression)
    assert rejection is None, f"kube-apiserver rejected an expression we accept: {rejection}"
    compile_selector(expression, engine="cel-expr-python", kubernetes_version=server_release)


# Whose compile-time cost (controller.cel.cost's estimate of the macro against upstream's)
# decides the verdict: each must get the API server's verdict from us too.
TWO_VAR_MAP_COST_PROBES = [
    'device.capacity["gpu.example.com"].transformMap(k, v, v).size() == 1',
    'device.capacity["gpu.example.com"].transformMapEntry(k, v, {k: v}).size() == 1',
    'device.capacity["gpu.example.com"].transformMap(k, v, v).memory == quantity("80Gi")',
    '{"m": quantity("1Gi")}.transformMap(k, v, v)["m"] == quantity("1024Mi")',
    '{"m": quantity("1Gi")}.transformMap(k, v, v)["m"].isGreaterThan(quantity("1023Mi"))',
    'device.attributes["gpu.example.com"].transformMap(k, v, v).model == "H100"',
    '["a", "b"].transformMapEntry(i, v, {v: i})["a"] == 0',
    '["a", "b"].transformMap(i, v, v + v)[0] == "aa"',
]


@pytest.mark.parametrize("expression", TWO_VAR_MAP_COST_PROBES)
def test_apiserver_and_we_agree_on_map_building_comprehension_cost(
    kube_cluster: ControlPlane, server_release: tuple[int, int], expression: str
) -> None:
    rejection = _dry_run_create(kube_cluster, expression)
    try:
        compile_selector(expression, engine="cel-expr-python", kubernetes_version=server_release)
    except CompileError as err:
        assert rejection is not None, f"kube-apiserver accepted an expression we reject: {err}"
        assert "cost limit" in rejection and "cost limit" in err.message, (err, rejection)
    else:
        assert rejection is None, f"kube-apiserver rejected an expression we accept: {rejection}"
