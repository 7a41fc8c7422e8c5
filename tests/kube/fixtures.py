"""Pytest fixtures that run real Kubernetes components.

- `kube_cluster` (session): etcd, kube-apiserver, kube-scheduler and
  kube-controller-manager on loopback, started once per session.
- `fake_node` (function): factory for Ready Node objects without a kubelet.
- `kubelet_node` (session): a real kubelet on containerd with runc (pods
  really run), started only when a test asks for it.
- `fakecri_node` (session): a second real kubelet on the recording fake CRI,
  for the tests that check what the kubelet sent to the runtime and gain
  nothing from running containers.
- `test_namespace` (function): a fresh namespace with its default ServiceAccount.
- `gpu_device_class` (function): a DeviceClass selecting every device of our driver.

Missing binaries fail the tests (with the command that builds them); they
never skip.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from devcluster.binaries import MissingBinariesError
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.objects import create_fake_node, create_namespace, delete_fake_node, delete_namespace
from devcluster.procs import ComponentError
from dracommon.kubeapi import KubeApi

log = logging.getLogger(__name__)

FakeNodeFactory = Callable[..., str]
DRIVER = "gpu.draplugin.dev"


def _keep_logs(logs: Path) -> None:
    """Copy component logs to $DRA_KEEP_CLUSTER_LOGS (for CI artifacts)."""
    target = os.environ.get("DRA_KEEP_CLUSTER_LOGS")
    if target:
        shutil.copytree(logs, Path(target), dirs_exist_ok=True)


def _start(start: Callable[[], None]) -> str | None:
    """Run a start() and return why it failed, if it did (reported by the
    caller with pytest.fail outside the except block, so the report shows the
    reason once, without a chained traceback)."""
    try:
        start()
    except (MissingBinariesError, ComponentError) as err:
        return str(err)
    return None


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cluster = ControlPlane(tmp_path_factory.mktemp("kube"))
    failure = _start(cluster.start)
    if failure:
        _keep_logs(cluster.logs)
        pytest.fail(f"cannot start the Kubernetes control plane: {failure}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
        _keep_logs(cluster.logs)


@pytest.fixture(scope="session")
def kubelet_node(kube_cluster: ControlPlane) -> Iterator[KubeletNode]:
    yield from _kubelet(KubeletNode(kube_cluster, _short_dir("dra-kubelet-")))


@pytest.fixture(scope="session")
def fakecri_node(kube_cluster: ControlPlane) -> Iterator[KubeletNode]:
    node = KubeletNode(kube_cluster, _short_dir("dra-fakecri-"), name="fakecri-node", runtime="fakecri")
    yield from _kubelet(node)


def _short_dir(prefix: str) -> Path:
    # Unix socket paths are limited to 107 bytes: keep the kubelet root (and
    # the plugin sockets below it) short instead of under pytest's deep tmp dir.
    return Path(tempfile.mkdtemp(prefix=prefix))


def _kubelet(node: KubeletNode) -> Iterator[KubeletNode]:
    kube_cluster = node.cluster
    failure = _start(node.start)
    if failure:
        _keep_logs(kube_cluster.logs)
        pytest.fail(f"cannot start the kubelet node: {failure}", pytrace=False)
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def fake_node(kube_cluster: ControlPlane) -> Iterator[FakeNodeFactory]:
    created: list[str] = []
    with kube_cluster.api_client() as api:

        def make(name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
            node_name = name or f"fake-node-{uuid.uuid4().hex[:8]}"
            create_fake_node(api, node_name, labels)
            created.append(node_name)
            return node_name

        try:
            yield make
        finally:
            for node_name in created:
                delete_fake_node(api, node_name)


@pytest.fixture
def test_namespace(kube_cluster: ControlPlane) -> Iterator[str]:
    with kube_cluster.api_client() as api:
        name = create_namespace(api)
        try:
            yield name
        finally:
            delete_namespace(api, name)


@pytest.fixture
def gpu_device_class(kube_cluster: ControlPlane) -> Iterator[str]:
    """A DeviceClass (unique name) that selects every device of our driver; deleted afterwards."""
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    with kube_cluster.api_client() as api:
        rest = KubeApi(api)
        rest.create("/apis/resource.k8s.io/v1/deviceclasses", {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        })  # fmt: skip
        try:
            yield name
        finally:
            rest.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
