"""docs/migration.md, run: every shell command of the page, in page order, on a local cluster with
a real kubelet, and the state the page promises checked between its steps.

The page is a walkthrough on one node (`$NODE`): the device plugin serves it, it is drained onto
DRA, a device-plugin-era workload is converted with `dra-controller migrate` and runs there on
the model its old nodeSelector named, and it is all rolled back. Here:

- the node is the session's kubelet node on containerd; this driver runs next to it as
  `draplugin run` with the examples' fake inventory and the default policy (`refuse`), looking
  again every second;
- NVIDIA's device plugin is played by a stand-in DaemonSet, selected by the GPU Operator's label
  `nvidia.com/gpu.deploy.device-plugin=true` as the real one is: its pod keeps a
  `nvidia-gpu.sock` in a device plugin directory of this module's own (the plugin's
  `DEVICE_PLUGIN_DIR`; the kubelet's real one is shared by every kubelet on this machine) for as
  long as it runs, and removes it when stopped. It registers nothing with the kubelet;
- the images the page's manifests name are the local workload image, tagged with those names.

Commands run with bash in a scratch directory that links the repository's `docs/` and
`examples/`, with `KUBECONFIG`, `NODE` and the built `kubectl` and our CLIs on `PATH`; each must
exit 0, or with the status tests/unit/test_docs.py lists for the page's offline commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.binaries import REPO_ROOT
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.manifests import DEVICE_CLASSES, collection_path, load_manifests
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from draplugin.devices import load_backend
from tests.e2e.plugin import running_plugin
from tests.unit.test_docs import EXPECTED_EXIT, shell_commands

pytestmark = pytest.mark.kubelet

PAGE = REPO_ROOT / "docs" / "migration.md"
PAGE_MANIFESTS = REPO_ROOT / "docs" / "migration"
DRIVER = "gpu.draplugin.dev"
DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
SOCKET = "nvidia-gpu.sock"
COMMAND_TIMEOUT = 420.0  # above the page's own `timeout 300` waits
WAIT = 120.0


# --- the stage ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpm-") as directory:
        path = Path(directory)
        path.chmod(0o755)
        yield path


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    socket_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PluginProcess]:
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        tmp_path_factory.mktemp("migration-plugin"),
        delete_slices_on_shutdown=True,
        extra_env={"REDISCOVER_INTERVAL": "1s", "DEVICE_PLUGIN_DIR": str(socket_dir)},
    ) as process:
        yield process


@pytest.fixture(scope="module")
def device_classes(api: KubeApi) -> Iterator[None]:
    """The chart's DeviceClasses; ones that already exist (another module's) are used as they are."""
    created: list[str] = []
    for doc in load_manifests(DEVICE_CLASSES):
        try:
            api.create(collection_path(doc, ""), doc)
            created.append(doc["metadata"]["name"])
        except ApiError as err:
            if err.status != 409:
                raise
    yield
    for name in created:
        api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{name}")


def page_images() -> set[str]:
    found: set[str] = set()
    for path in PAGE_MANIFESTS.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            spec = (doc or {}).get("spec") or {}
            pod_spec = spec.get("template", {}).get("spec") if doc.get("kind") != "Pod" else spec
            found.update(c["image"] for c in (pod_spec or {}).get("containers") or [])
    return found


@pytest.fixture(scope="module")
def page_images_tagged(kubelet_node: KubeletNode) -> None:
    """The images the page's manifests name, as the local workload image (nothing is pulled)."""
    containerd = kubelet_node.containerd
    assert containerd is not None, "the walkthrough runs pods: it needs the containerd node"
    for name in sorted(page_images()):
        subprocess.run(
            [str(containerd.ctr), "--address", str(containerd.socket), "--namespace", "k8s.io",
             "images", "tag", "--force", kubelet_node.workload_image, name],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip


def stand_in_device_plugin(image: str, socket_dir: Path) -> dict[str, Any]:
    script = (
        f"trap 'rm -f /device-plugins/{SOCKET}; exit 0' TERM; "
        f"touch /device-plugins/{SOCKET}; while true; do sleep 1; done"
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin-stand-in"},
        "spec": {
            "selector": {"matchLabels": {"app": "device-plugin-stand-in"}},
            "template": {
                "metadata": {"labels": {"app": "device-plugin-stand-in"}},
                "spec": {
                    "nodeSelector": {DEVICE_PLUGIN_LABEL: "true"},
                    "automountServiceAccountToken": False,
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {
                            "name": "device-plugin",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script],
                            "volumeMounts": [{"name": "device-plugins", "mountPath": "/device-plugins"}],
                        }
                    ],
                    "volumes": [
                        {"name": "device-plugins", "hostPath": {"path": str(socket_dir), "type": "Directory"}}
                    ],
                },
            },
        },
    }


def published(api: KubeApi, node: str) -> list[str]:
    return sorted(
        d["name"] for s in node_slices(api.api_client, node, DRIVER) for d in s["spec"].get("devices") or []
    )


def default_claims(api: KubeApi) -> list[dict[str, Any]]:
    items, _ = api.list("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims")
    return items


def set_label(api: KubeApi, node: str, value: str | None) -> None:
    api.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {DEVICE_PLUGIN_LABEL: value}}})


def delete_quietly(api: KubeApi, path: str) -> None:
    try:
        api.delete(path)
    except ApiError as err:
        if err.status != 404:
            raise


# --- the page -------------------------------------------------------------------------------------


def scratch_dir(tmp_path: Path) -> Path:
    """Where the page's commands run: its relative paths resolve, the files it writes stay here."""
    for name in ("docs", "examples"):
        (tmp_path / name).symlink_to(REPO_ROOT / name)
    return tmp_path


def run_page_command(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )


def test_every_command_of_the_migration_page_runs_in_order_on_a_local_cluster(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    plugin: PluginProcess,
    socket_dir: Path,
    device_classes: None,
    page_images_tagged: None,
    test_namespace: str,
    tmp_path: Path,
) -> None:
    node = kubelet_node.name
    backend = load_backend("fake", node, config_file=str(plugin.fake_config))
    inventory = sorted(d.name for d in backend.discover())
    product = {d.name: d.attributes.get("productName") for d in backend.discover()}
    commands = list(shell_commands(PAGE.read_text(encoding="utf-8")))
    assert len(commands) > 20, "the page's command blocks were not found"
    assert not default_claims(api), "the walkthrough waits for every claim of namespace default to go"

    def node_has_the_device_plugin() -> None:
        assert (socket_dir / SOCKET).exists()
        assert published(api, node) == [], "refuse: nothing published while the device plugin serves"

    def node_is_on_dra() -> None:
        assert not (socket_dir / SOCKET).exists(), "the stand-in device plugin left with its label"
        wait_for("every GPU published", lambda: published(api, node) == inventory, WAIT)
        spec = api.get(f"/api/v1/nodes/{node}")["spec"]
        assert not spec.get("unschedulable")

    def converted_pod_has_the_model_it_asked_for() -> None:
        (claim,) = default_claims(api)
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [product[r["device"]] for r in results] == ["NVIDIA A100-SXM4-40GB"], results
        pods, _ = api.list("/api/v1/namespaces/default/pods", query={"labelSelector": "app=inference"})
        assert [p["status"]["phase"] for p in pods] == ["Running"]

    def rolled_back() -> None:
        wait_for("the stand-in device plugin's socket", lambda: (socket_dir / SOCKET).exists(), WAIT)
        assert published(api, node) == []
        assert not default_claims(api)
        deployment = api.get("/apis/apps/v1/namespaces/default/deployments/inference")
        containers = deployment["spec"]["template"]["spec"]["containers"]
        assert containers[0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}, "the original is back"

    # After the n-th occurrence of a command, what the page says holds then.
    checks: dict[tuple[str, int], Callable[[], None]] = {
        (commands[0], 1): node_has_the_device_plugin,
        ('kubectl uncordon "$NODE"', 1): node_is_on_dra,
        (
            "kubectl rollout status deployment/inference --timeout=5m",
            1,
        ): converted_pod_has_the_model_it_asked_for,
        ('kubectl uncordon "$NODE"', 2): rolled_back,
    }
    for command, _ in checks:
        assert command in commands, f"the page no longer has {command!r}: update the checks"

    api.create(
        f"/apis/apps/v1/namespaces/{test_namespace}/daemonsets",
        stand_in_device_plugin(kubelet_node.workload_image, socket_dir),
    )
    cwd = scratch_dir(tmp_path)
    env = {
        **os.environ,
        "KUBECONFIG": str(kube_cluster.kubeconfig),
        "NODE": node,
        "PATH": os.pathsep.join(
            [str(kube_cluster.bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
    }
    seen: Counter[str] = Counter()
    try:
        set_label(api, node, "true")
        wait_for("the stand-in device plugin's socket", lambda: (socket_dir / SOCKET).exists(), WAIT)
        wait_for("the GPUs withdrawn", lambda: published(api, node) == [], WAIT)
        for command in commands:
            started = time.monotonic()
            done = run_page_command(command, cwd, env)
            expected = EXPECTED_EXIT.get(command, 0)
            assert done.returncode == expected, (
                f"{command}\nexit {done.returncode} (expected {expected}), "
                f"{time.monotonic() - started:.0f}s"
                f"\n{done.stderr}{done.stdout}\nplugin log:\n{plugin.log_tail()}"
            )
            seen[command] += 1
            check = checks.get((command, seen[command]))
            if check is not None:
                check()
        assert all(seen[c] >= n for c, n in checks), "a check never ran"
    finally:
        api.merge_patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": None}})
        for path in (
            "/apis/apps/v1/namespaces/default/deployments/inference",
            *(f"/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates/{t['metadata']['name']}"
              for t in api.list("/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates")[0]),
        ):  # fmt: skip
            delete_quietly(api, path)
        set_label(api, node, None)
        wait_for("the stand-in device plugin gone", lambda: not (socket_dir / SOCKET).exists(), WAIT)
        wait_for("no claim left in namespace default", lambda: not default_claims(api), WAIT)
