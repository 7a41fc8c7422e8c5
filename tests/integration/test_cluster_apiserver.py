"""The real control plane serves resource.k8s.io/v1 and validates DRA objects itself."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes import config as k8s_config

from controller.allocation import builders
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi

pytestmark = pytest.mark.cluster

DEVICE_CLASSES = "/apis/resource.k8s.io/v1/deviceclasses"


def device_class(selector: str) -> dict[str, Any]:
    return builders.device_class(f"test-{uuid.uuid4().hex[:8]}", [selector])


def rejection_message(cluster: ControlPlane, body: dict[str, Any]) -> str:
    with cluster.api_client() as api, pytest.raises(ApiError) as caught:
        KubeApi(api).create(DEVICE_CLASSES, body)
    assert caught.value.status == 422, caught.value.body
    status = json.loads(str(caught.value.body))
    assert status["reason"] == "Invalid"
    message: str = status["message"]
    return message


def test_apiserver_serves_resource_v1(kube_cluster: ControlPlane) -> None:
    group = kube_cluster.get_json("/apis/resource.k8s.io")
    assert "resource.k8s.io/v1" in {v["groupVersion"] for v in group["versions"]}
    resources = {r["name"] for r in kube_cluster.get_json("/apis/resource.k8s.io/v1")["resources"]}
    assert {"deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices"} <= resources
    assert kube_cluster.get_json("/version")["gitVersion"] == kube_cluster.kubernetes_version


def test_kubeconfig_reaches_apiserver_with_verified_tls(kube_cluster: ControlPlane) -> None:
    api = k8s_config.new_client_from_config(config_file=str(kube_cluster.kubeconfig))  # type: ignore[no-untyped-call]
    with api:
        assert api.configuration.verify_ssl
        namespaces = KubeApi(api).get("/api/v1/namespaces")
    assert "kube-system" in {n["metadata"]["name"] for n in namespaces["items"]}


def test_apiserver_rejects_device_class_with_cel_syntax_error(kube_cluster: ControlPlane) -> None:
    message = rejection_message(kube_cluster, device_class('device.attributes["x"].foo =='))
    assert "spec.selectors[0].cel.expression" in message
    assert "compilation failed" in message
    assert "Syntax error: mismatched input '<EOF>'" in message


def test_apiserver_rejects_device_class_with_cel_type_error(kube_cluster: ControlPlane) -> None:
    message = rejection_message(kube_cluster, device_class("device.driver == 1"))
    assert "spec.selectors[0].cel.expression" in message
    assert "found no matching overload for '_==_' applied to '(string, int)'" in message


def test_apiserver_accepts_valid_device_class(kube_cluster: ControlPlane) -> None:
    body = device_class('device.driver == "gpu.draplugin.dev"')
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        created = rest.create(DEVICE_CLASSES, body)
        rest.delete(f"{DEVICE_CLASSES}/{body['metadata']['name']}")
    assert created["spec"]["selectors"] == body["spec"]["selectors"]


def test_service_account_client_is_subject_to_rbac(kube_cluster: ControlPlane, test_namespace: str) -> None:
    pods = f"/api/v1/namespaces/{test_namespace}/pods"
    with kube_cluster.service_account_client(test_namespace, "reader") as reader:
        with pytest.raises(ApiError) as caught:
            KubeApi(reader).get(pods)
        assert caught.value.status == 403
        assert f"system:serviceaccount:{test_namespace}:reader" in str(caught.value.body)

        rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{test_namespace}"
        with kube_cluster.api_client() as admin:
            KubeApi(admin).create(f"{rbac}/roles", {
                "metadata": {"name": "pod-reader"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
            })  # fmt: skip
            KubeApi(admin).create(f"{rbac}/rolebindings", {
                "metadata": {"name": "reader-reads-pods"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": test_namespace}],
            })  # fmt: skip
        # The RBAC authorizer sees the binding once its informer catches up.
        listed = wait_for("the RoleBinding to take effect", lambda: KubeApi(reader).get(pods), timeout=20)
    assert listed["items"] == []
