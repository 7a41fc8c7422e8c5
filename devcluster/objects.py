"""Cluster objects the fixtures create: fake nodes and throw-away namespaces."""

from __future__ import annotations

import time
from collections.abc import Mapping

from kubernetes import client as k8s

from devcluster.wait import past_deadline
from dracommon.kubeapi import ApiError, KubeApi

FAKE_NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}


def create_fake_node(api: k8s.ApiClient, name: str, labels: Mapping[str, str] | None = None) -> None:
    """A Ready, untainted Node with no kubelet behind it.

    The apiserver keeps `status` on create (a kubelet registers the same way);
    with TaintNodesByCondition off and no node-lifecycle controller nothing
    ever marks it NotReady, so the scheduler keeps placing pods on it.
    """
    KubeApi(api).create("/api/v1/nodes", {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
        },
        "status": {
            "capacity": FAKE_NODE_CAPACITY,
            "allocatable": FAKE_NODE_CAPACITY,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "FakeNodeReady",
                "message": "fake node without a kubelet",
            }],
        },
    })  # fmt: skip


def _ignore_not_found(error: ApiError) -> None:
    if error.status != 404:
        raise error


def delete_fake_node(api: k8s.ApiClient, name: str) -> None:
    """Delete the Node and the ResourceSlices published for it."""
    rest = KubeApi(api)
    try:
        rest.delete(
            "/apis/resource.k8s.io/v1/resourceslices", query={"fieldSelector": f"spec.nodeName={name}"}
        )
    except ApiError as err:
        _ignore_not_found(err)
    try:
        rest.delete(f"/api/v1/nodes/{name}")
    except ApiError as err:
        _ignore_not_found(err)


def create_namespace(api: k8s.ApiClient, prefix: str = "test-", timeout: float = 30.0) -> str:
    """A fresh namespace whose `default` ServiceAccount exists (pods need it)."""
    rest = KubeApi(api)
    created = rest.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"generateName": prefix}})  # fmt: skip
    name: str = created["metadata"]["name"]
    started = time.monotonic()
    while True:
        try:
            rest.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            return name
        except ApiError as err:
            _ignore_not_found(err)
        over, how_long = past_deadline(started, timeout)  # stretched while the machine is loaded
        if over:
            raise TimeoutError(f"ServiceAccount {name}/default not created within {how_long}")
        time.sleep(0.1)


def delete_namespace(api: k8s.ApiClient, name: str) -> None:
    """Start deleting the namespace; the namespace controller finishes in the background."""
    try:
        KubeApi(api).delete(f"/api/v1/namespaces/{name}")
    except ApiError as err:
        _ignore_not_found(err)
