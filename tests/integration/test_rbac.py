"""The chart's RBAC and ResourceSlice admission policy, enforced by the real API server.

A kubelet plugin authenticates with its pod-bound ServiceAccount token, which
names the node the pod runs on. These tests install the chart's RBAC and
ValidatingAdmissionPolicy, bind a token to a pod on fake node A, and check
that it may write node A's ResourceSlices, is denied node B's, and is denied
everything RBAC does not grant.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from devcluster.controlplane import SERVICE_ACCOUNT_ISSUER, ControlPlane
from devcluster.wait import wait_for
from tests.integration.test_chart import DRIVER, render_chart

pytestmark = pytest.mark.cluster

# The typed client sends plain dicts as they are; they stand in for its models here.
Manifest = Any

SECURITY_TEMPLATES = (
    "templates/kubeletplugin-rbac.yaml",
    "templates/kubeletplugin-resourceslice-policy.yaml",
    "templates/controller-rbac.yaml",
)


@dataclass(frozen=True)
class Installed:
    namespace: str
    plugin_sa: str
    controller_sa: str


def make_slice(name: str, node: str, driver: str = DRIVER) -> Manifest:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}],
        },
    }


def forbidden(call: Callable[[], object]) -> str:
    """Run `call`, which must be refused with 403; return the server's message."""
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status == 403, info.value.body
    return str(info.value.body)


@pytest.fixture
def installed(kube_cluster: ControlPlane, test_namespace: str, tmp_path: Path) -> Iterator[Installed]:
    """The chart's RBAC and admission policy, created for real in the test namespace."""
    release = f"rbac-{uuid.uuid4().hex[:6]}"
    # deviceStatus (off by default) on, so that its grant is checked too.
    objects = render_chart(
        tmp_path,
        {"kubeletPlugin": {"deviceStatus": True}},
        release=release,
        namespace=test_namespace,
        show_only=SECURITY_TEMPLATES,
    )
    created: list[tuple[Any, str | None, str]] = []
    with kube_cluster.api_client() as api:
        dynamic = DynamicClient(api)  # type: ignore[no-untyped-call]
        try:
            for obj in objects:
                resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                namespace = test_namespace if resource.namespaced else None
                resource.create(body=obj, namespace=namespace)
                created.append((resource, namespace, obj["metadata"]["name"]))
            sas = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
            plugin_sa = next(name for name in sas if name.endswith("-kubelet-plugin"))
            controller_sa = next(name for name in sas if name.endswith("-controller"))
            yield Installed(test_namespace, plugin_sa, controller_sa)
        finally:
            for resource, namespace, name in reversed(created):
                if namespace is None:  # namespaced objects go with the test namespace
                    resource.delete(name=name)


@pytest.fixture
def admin(kube_cluster: ControlPlane) -> Iterator[k8s.ApiClient]:
    with kube_cluster.api_client() as api:
        yield api


@pytest.fixture
def slices(admin: k8s.ApiClient) -> Iterator[list[str]]:
    """Names of ResourceSlices a test created; deleted afterwards."""
    names: list[str] = []
    yield names
    resource = k8s.ResourceV1Api(admin)
    for name in names:
        try:
            resource.delete_resource_slice(name)
        except ApiException as err:
            if err.status != 404:
                raise


def pod_bound_token(admin: k8s.ApiClient, installed: Installed, node: str) -> str:
    """A token for the plugin ServiceAccount bound to a pod on `node`, as the kubelet mounts it."""
    core = k8s.CoreV1Api(admin)
    pod_manifest: Manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"plugin-{node}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": installed.plugin_sa,
            "automountServiceAccountToken": False,
            "containers": [{"name": "plugin", "image": "busybox:1.37"}],
        },
    }
    pod = core.create_namespaced_pod(installed.namespace, pod_manifest)
    assert pod.metadata is not None
    bound_to = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
    request: Manifest = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": [SERVICE_ACCOUNT_ISSUER],
            "expirationSeconds": 3600,
            "boundObjectRef": bound_to,
        },
    }
    response = core.create_namespaced_service_account_token(installed.plugin_sa, installed.namespace, request)
    assert response.status is not None and response.status.token
    return response.status.token


def unbound_token(admin: k8s.ApiClient, installed: Installed, sa: str) -> str:
    request: Manifest = {"spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": 3600}}
    response = k8s.CoreV1Api(admin).create_namespaced_service_account_token(sa, installed.namespace, request)
    assert response.status is not None and response.status.token
    return response.status.token


def wait_until_policy_denies(plugin: k8s.ResourceV1Api, other_node: str) -> None:
    """The admission policy reaches the API server's cache asynchronously; probe with dry runs."""

    def denied() -> bool:
        try:
            probe = make_slice(f"probe-{uuid.uuid4().hex[:6]}", other_node)
            plugin.create_resource_slice(probe, dry_run="All")
        except ApiException as err:
            return err.status == 403 and "may only write ResourceSlices" in str(err.body)
        return False

    wait_for("the ResourceSlice admission policy to be enforced", denied, timeout=30)


def test_plugin_writes_only_its_own_nodes_slices(
    kube_cluster: ControlPlane,
    admin: k8s.ApiClient,
    installed: Installed,
    fake_node: Callable[..., str],
    slices: list[str],
) -> None:
    node_a, node_b = fake_node(), fake_node()
    token = pod_bound_token(admin, installed, node_a)
    with kube_cluster.token_client(token) as api:
        plugin = k8s.ResourceV1Api(api)
        wait_until_policy_denies(plugin, node_b)

        # Node A: create, update, delete all allowed.
        name_a = f"{node_a}-{DRIVER}"
        slices.append(name_a)
        created = plugin.create_resource_slice(make_slice(name_a, node_a))
        body = created.to_dict()
        patch = {"spec": {"pool": {"generation": 2, "name": node_a, "resourceSliceCount": 1}}}
        updated = plugin.patch_resource_slice(name_a, patch)
        assert updated.spec.pool.generation == 2
        assert body["spec"]["node_name"] == node_a

        # Node B: refused, by the policy (RBAC alone would allow it).
        name_b = f"{node_b}-{DRIVER}"
        message = forbidden(lambda: plugin.create_resource_slice(make_slice(name_b, node_b)))
        assert f"the kubelet plugin on node {node_a} may only write ResourceSlices" in message
        assert node_b in message

        # A slice of node B that exists (published by node B's plugin): no update, no delete.
        slices.append(name_b)
        k8s.ResourceV1Api(admin).create_resource_slice(make_slice(name_b, node_b))
        forbidden(lambda: plugin.patch_resource_slice(name_b, {"metadata": {"labels": {"x": "y"}}}))
        forbidden(lambda: plugin.delete_resource_slice(name_b))
        # Moving node A's slice to node B is refused too (nodeName is immutable anyway).
        forbidden(lambda: plugin.create_resource_slice(make_slice(f"{name_a}-moved", node_b)))

        # Another driver's slice on its own node: refused.
        other_driver = make_slice(f"{node_a}-other", node_a, driver="other.example.com")
        message = forbidden(lambda: plugin.create_resource_slice(other_driver))
        assert f"may only write ResourceSlices of driver {DRIVER}" in message

        plugin.delete_resource_slice(name_a)
    assert k8s.ResourceV1Api(admin).read_resource_slice(name_b).spec.node_name == node_b


def test_token_without_node_binding_cannot_write_slices(
    kube_cluster: ControlPlane,
    admin: k8s.ApiClient,
    installed: Installed,
    fake_node: Callable[..., str],
) -> None:
    node_a = fake_node()
    # Wait for the policy with a bound token first, so the denial below is the policy's.
    with kube_cluster.token_client(pod_bound_token(admin, installed, node_a)) as bound:
        wait_until_policy_denies(k8s.ResourceV1Api(bound), fake_node())
    with kube_cluster.token_client(unbound_token(admin, installed, installed.plugin_sa)) as api:
        own_node = make_slice(f"{node_a}-x", node_a)
        message = forbidden(lambda: k8s.ResourceV1Api(api).create_resource_slice(own_node, dry_run="All"))
    assert "not bound to a node" in message


def test_plugin_rbac_grants_only_what_the_plugin_needs(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, installed: Installed, fake_node: Callable[..., str]
) -> None:
    node_a = fake_node()
    ns = installed.namespace
    with kube_cluster.token_client(pod_bound_token(admin, installed, node_a)) as api:
        core = k8s.CoreV1Api(api)
        resource = k8s.ResourceV1Api(api)
        # Granted: read its node, read a claim (404 = authorized, no such claim), list claims (start-up
        # recovery after a lost checkpoint), list slices.
        wait_for("RBAC to admit the plugin", lambda: core.read_node(node_a), timeout=30)
        with pytest.raises(ApiException) as info:
            resource.read_namespaced_resource_claim("no-such-claim", ns)
        assert info.value.status == 404
        resource.list_resource_slice(field_selector=f"spec.nodeName={node_a}")
        resource.list_resource_claim_for_all_namespaces(limit=1)
        event: Manifest = {
            "metadata": {"generateName": "plugin-"},
            "involvedObject": {"kind": "Pod", "namespace": ns, "name": f"plugin-{node_a}"},
            "reason": "Test",
            "message": "events are allowed",
            "type": "Normal",
        }
        core.create_namespaced_event(ns, event)

        # Not granted.
        claim: Manifest = {
            "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER}}]}},
        }
        forbidden(lambda: resource.create_namespaced_resource_claim(ns, claim))
        forbidden(lambda: resource.delete_device_class(DRIVER))
        # Pods: only in the release namespace, for the per-claim MPS daemon Pods (mpsDaemon: pod, the
        # default): read and list them, never patch them, never elsewhere.
        core.list_namespaced_pod(ns)
        forbidden(
            lambda: core.patch_namespaced_pod(f"plugin-{node_a}", ns, {"metadata": {"labels": {"x": "y"}}})
        )
        forbidden(lambda: core.list_namespaced_pod("default"))
        forbidden(lambda: core.list_pod_for_all_namespaces())
        forbidden(lambda: core.list_namespaced_secret(ns))
        forbidden(lambda: core.patch_node(node_a, {"metadata": {"labels": {"x": "y"}}}))
        forbidden(lambda: core.list_node())


def subject_access(admin: k8s.ApiClient, user: str, **attributes: str) -> bool:
    request: Manifest = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts"], "resourceAttributes": attributes},
    }
    review = k8s.AuthorizationV1Api(admin).create_subject_access_review(request)
    assert review.status is not None
    return review.status.allowed


def test_device_status_verbs_are_limited_to_our_driver(admin: k8s.ApiClient, installed: Installed) -> None:
    """Kubernetes 1.36+ authorizes status.devices writes per driver on resourceclaims/driver."""
    plugin = f"system:serviceaccount:{installed.namespace}:{installed.plugin_sa}"
    common = {"group": "resource.k8s.io", "resource": "resourceclaims", "subresource": "driver"}
    assert subject_access(admin, plugin, verb="associated-node:patch", name=DRIVER, **common)
    assert subject_access(admin, plugin, verb="associated-node:update", name=DRIVER, **common)
    assert not subject_access(admin, plugin, verb="associated-node:patch", name="other.example.com", **common)
    assert not subject_access(admin, plugin, verb="arbitrary-node:patch", name=DRIVER, **common)
    # Allocation is the scheduler's (or our controller's) job, never the plugin's.
    binding = {"group": "resource.k8s.io", "resource": "resourceclaims", "subresource": "binding"}
    assert not subject_access(admin, plugin, verb="update", **binding)
    # Claims: read and list (start-up recovery), never watched, written or deleted.
    claims = {"group": "resource.k8s.io", "resource": "resourceclaims"}
    assert subject_access(admin, plugin, verb="list", **claims)
    for verb in ("watch", "update", "patch", "delete", "create"):
        assert not subject_access(admin, plugin, verb=verb, **claims)


def test_controller_rbac(kube_cluster: ControlPlane, admin: k8s.ApiClient, installed: Installed) -> None:
    controller = f"system:serviceaccount:{installed.namespace}:{installed.controller_sa}"
    claims = {"group": "resource.k8s.io", "resource": "resourceclaims"}
    slices = {"group": "resource.k8s.io", "resource": "resourceslices"}
    classes = {"group": "resource.k8s.io", "resource": "deviceclasses"}
    leases = {"group": "coordination.k8s.io", "resource": "leases"}
    for verb in ("get", "list", "watch"):
        assert subject_access(admin, controller, verb=verb, **claims)
        assert subject_access(admin, controller, verb=verb, **slices)
        assert subject_access(admin, controller, verb=verb, **classes)
    assert subject_access(admin, controller, verb="update", subresource="status", **claims)
    assert subject_access(admin, controller, verb="update", subresource="binding", **claims)
    assert subject_access(admin, controller, verb="update", namespace=installed.namespace, **leases)
    # Pre-allocation marks claims (annotation, finalizer); events need pending pods.
    assert subject_access(admin, controller, verb="patch", **claims)
    for verb in ("list", "watch"):
        assert subject_access(admin, controller, verb=verb, resource="pods")
    # Leases only in its own namespace; never slices, claim creation or deletion, pod writes.
    assert not subject_access(admin, controller, verb="update", namespace="kube-system", **leases)
    assert not subject_access(admin, controller, verb="create", **slices)
    assert not subject_access(admin, controller, verb="delete", **claims)
    assert not subject_access(admin, controller, verb="create", **claims)
    assert not subject_access(admin, controller, verb="delete", resource="pods")
    assert not subject_access(admin, controller, verb="list", resource="secrets")
    # And for real, with its token.
    with kube_cluster.token_client(unbound_token(admin, installed, installed.controller_sa)) as api:
        resource = k8s.ResourceV1Api(api)
        wait_for("RBAC to admit the controller", lambda: resource.list_resource_slice(), timeout=30)
        forbidden(lambda: k8s.CoreV1Api(api).list_namespaced_secret(installed.namespace))
