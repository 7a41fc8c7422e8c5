"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import chart, images
from devcluster.binaries import MissingBinariesError
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.manifests import EXAMPLES, collection_path, load_manifests
from devcluster.nodeset import NodeSet, node_set_release
from devcluster.nodeset import wait_published as wait_set_published
from devcluster.objects import create_namespace, delete_namespace
from devcluster.plugin import PluginProcess
from devcluster.procs import ComponentError
from dracommon.kubeapi import ApiError, KubeApi
from tests import nvidia_roots
from tests.driverroot_layout import debian_layout
from tests.e2e import nvml_double
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin

POD_TIMEOUT = 120.0
DOUBLE_GPUS = nvml_double.DOUBLE_GPUS
# The nodes of the several-node tests: enough for "elsewhere" after one node is lost or drained.
NODE_SET_SIZE = 3
EXTENDED_RESOURCE_CLASS = EXAMPLES / "device-plugin" / "extended-resource" / "deviceclass.yaml"


@pytest.fixture(scope="module")
def api(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


@pytest.fixture(scope="module")
def driver_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Debian-layout driver install whose nvidia-smi and nvidia-cuda-mps-control are recording stand-ins."""
    return debian_layout().build(tmp_path_factory.mktemp("driver-root"))


@pytest.fixture(scope="module")
def driver_root_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    driver_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    """One plugin for the module, with the driver root: CDI specs mount its files, and MPS daemons
    and time-slices run through its tools. It deletes its slices when stopped."""
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("plugin"),
        delete_slices_on_shutdown=True,
        extra_env={"DRIVER_ROOT": str(driver_root)},
    ) as process:
        yield process


@pytest.fixture(scope="module")
def extended_resource_class(api: KubeApi) -> Iterator[str]:
    """The DeviceClass of examples/device-plugin/extended-resource/, which maps nvidia.com/gpu to our
    whole GPUs (`extendedResourceName`), for the module."""
    (doc,) = load_manifests(EXTENDED_RESOURCE_CLASS)
    try:
        api.create(collection_path(doc, ""), doc)
    except ApiError as err:
        if err.status != 409:
            raise
        yield doc["metadata"]["name"]  # another module's, as the file has it: left to that module
        return
    yield doc["metadata"]["name"]
    api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{doc['metadata']['name']}")


@pytest.fixture
def restarting_namespace(test_namespace: str, api: KubeApi, plugin: PluginProcess) -> Iterator[str]:
    """The test's namespace (for tests that stop the module's `plugin`): afterwards the plugin runs
    again and every GPU the namespace used is free."""
    yield test_namespace
    if not plugin.running:
        plugin.start()
        plugin.wait_registered()
    release_namespace(api, plugin, test_namespace, POD_TIMEOUT)


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> nvidia_roots.NvidiaRoot:
    """NVIDIA's real 550.163.01 files (flat layout) whose NVML is the double, with DOUBLE_GPUS GPUs' nodes."""
    return nvml_double.build_root(tmp_path_factory.mktemp("nvidia") / "root", DOUBLE_GPUS)


@pytest.fixture(scope="module")
def double_configs(tmp_path_factory: pytest.TempPathFactory) -> nvml_double.DoubleConfigs:
    """The double's DGX H100 (MIG off) for the plugin and, seen through `/dev`, for the containers."""
    return nvml_double.write_configs(tmp_path_factory.mktemp("nvml-double"), DOUBLE_GPUS)


@pytest.fixture(scope="module")
def nvml_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    nvidia_root: nvidia_roots.NvidiaRoot,
    double_configs: nvml_double.DoubleConfigs,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    """The plugin on the NVML path (`--backend nvml`) over the double, its driver root `nvidia_root`."""
    with nvml_double.running_nvml_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("plugin"),
        nvidia_root,
        double_configs,
        expected_devices=[f"gpu-{i}" for i in range(DOUBLE_GPUS)],
    ) as process:
        yield process


@pytest.fixture(scope="module")
def node_set(kube_cluster: ControlPlane) -> Iterator[NodeSet]:
    """NODE_SET_SIZE kubelet nodes (devcluster.nodeset: each its own containerd, directories, address,
    name and fake GPU inventory) for the module; stopped, and their Node objects deleted, after it."""
    nodes = NodeSet(kube_cluster, NODE_SET_SIZE)
    try:
        nodes.start()
    except (MissingBinariesError, ComponentError) as err:
        pytest.fail(f"cannot start {NODE_SET_SIZE} kubelet nodes: {err}", pytrace=False)
    try:
        yield nodes
    finally:
        nodes.close()


@pytest.fixture(scope="module")
def node_set_chart(
    kube_cluster: ControlPlane, node_set: NodeSet, api: KubeApi
) -> Iterator[chart.ChartRelease]:
    """The chart installed over `node_set` in a namespace of its own: one plugin pod per node, each
    node's inventory published by its own plugin; uninstalled after the module."""
    image = images.our_image()
    node_set.import_image(image)
    namespace = create_namespace(api.api_client, prefix="dra-set-")
    home = Path(tempfile.mkdtemp(prefix="dra-helm-"))
    release = node_set_release(kube_cluster, node_set, api, image, home=home, namespace=namespace)
    release.create_namespace = False
    try:
        with chart.installed(release):
            wait_set_published(release, node_set)
            yield release
    finally:
        delete_namespace(api.api_client, namespace)
        shutil.rmtree(home, ignore_errors=True)
