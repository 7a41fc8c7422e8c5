"""The plugin on the NVML path over the C-ABI NVML double, and workload pods that see the same machine.

Shared by the real-container proofs (`test_nvidia_smi_container.py`,
`test_triton_libcuda_container.py`, `test_rhel_loader_container.py`,
`test_mig_caps_container.py`): a driver root of NVIDIA's real 550.163.01 files
whose NVML library is the double (`tests/nvidia_roots.py`), the double's
configuration for the plugin and for the container (one machine, two views:
the container's double lists only the GPUs whose `/dev/nvidiaN` the runtime
injected), and pods that reach the container's configuration through a
hostPath volume (the test's, not our spec's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster import pods
from devcluster.binaries import REPO_ROOT
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode
from devcluster.plugin import PluginProcess, node_slices
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi
from tests import nvidia_roots
from tests.e2e.cleanup import release_namespace
from tests.e2e.plugin import running_plugin
from tests.e2e.workloads import claim_pod

RESOURCE = "/apis/resource.k8s.io/v1"
CONTAINER_DOUBLE_DIR = "/nvml-double"
# The machine of the shared fixtures (conftest): two GPUs, so one claimed shows the other is not.
DOUBLE_GPUS = 2
# Printed by every container command here when it is done, with its exit status.
EXIT_MARK = "exit="
# For a pod of an image with NVIDIA's files to start, and for the namespace's GPUs to be free again.
POD_TIMEOUT = 180.0


@dataclass(frozen=True)
class DoubleConfigs:
    """Where the plugin's double reads its machine, and the directory the pods mount."""

    plugin_config: Path
    container_dir: Path
    proc_root: Path | None = None  # the double's /proc files (`procRoot`), when asked for


def build_root(path: Path, gpus: int) -> nvidia_roots.NvidiaRoot:
    """NVIDIA's real files in the `.run` installer's flat layout, NVML the double, `gpus` device nodes."""
    root = nvidia_roots.build_root("flat", path, gpus=gpus, nvml=nvidia_roots.nvml_double_library())
    assert root.nvml_double, "the root's NVML library must be the double"
    assert len([n for n in root.device_nodes if n.name.startswith("nvidia") and n.name[6:].isdigit()]) == gpus
    return root


def write_configs(
    base: Path,
    gpus: int,
    *,
    gpu_overrides: list[dict[str, Any]] | None = None,
    with_proc: bool = False,
    shared_state: bool = False,
) -> DoubleConfigs:
    """The double's configuration files under `base`.

    `shared_state` puts the state file (MIG instances) where the container's double reads it
    too, so that `nvidia-smi -L` in a pod sees the MIG devices the plugin made."""
    container_dir = base / "container"
    container_dir.mkdir(parents=True)
    machine: dict[str, Any] = {"machine": "dgxh100", "gpuCount": gpus, "driverVersion": nvidia_roots.VERSION}
    if gpu_overrides:
        machine["gpus"] = gpu_overrides
    plugin_config = base / "plugin.json"
    state = container_dir / "state.json" if shared_state else base / "state.json"
    plugin: dict[str, Any] = {**machine, "stateFile": str(state)}
    proc_root = base / "proc" if with_proc else None
    if proc_root is not None:
        plugin["procRoot"] = str(proc_root)
    plugin_config.write_text(json.dumps(plugin))
    # In the container the double sees the GPUs whose device nodes the runtime injected.
    container = {**machine, "devRoot": "/dev", "stateFile": f"{CONTAINER_DOUBLE_DIR}/state.json"}
    (container_dir / "config.json").write_text(json.dumps(container))
    container_dir.chmod(0o777)
    if shared_state:
        state.touch()
        state.chmod(0o666)
    return DoubleConfigs(plugin_config, container_dir, proc_root)


def init_double(configs: DoubleConfigs) -> None:
    """One `nvmlInit_v2` in a child process: the double writes its state and `procRoot` files."""
    code = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "rc = lib.nvmlInit_v2(); lib.nvmlShutdown(); sys.exit(rc)"
    )
    env = {**os.environ, "NVML_DOUBLE_CONFIG": str(configs.plugin_config)}
    library = str(nvidia_roots.nvml_double_library())
    done = subprocess.run(
        [sys.executable, "-c", code, library],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"nvmlInit_v2 on the double returned {done.returncode}: {done.stderr}"


def backend_device_names(
    root: nvidia_roots.NvidiaRoot, configs: DoubleConfigs, partitionable: bool
) -> list[str]:
    """The devices the plugin's NVML backend discovers on this double (what its slices must list).

    In a child process: the double is loaded there, not into pytest's process."""
    code = (
        "import sys; from draplugin.devices import load_backend; "
        "b = load_backend('nvml', 'probe', lib_path=sys.argv[1], partitionable=sys.argv[2] == '1'); "
        "print('\\n'.join(d.name for d in b.discover()))"
    )
    env = {**os.environ, "NVML_DOUBLE_CONFIG": str(configs.plugin_config)}
    done = subprocess.run(
        [sys.executable, "-c", code, str(root.path), "1" if partitionable else "0"],
        env=env, capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, f"discovering the double's devices failed: {done.stderr[-3000:]}"
    return done.stdout.split()


@contextmanager
def running_nvml_plugin(
    kube_cluster: ControlPlane,
    kubelet_node: KubeletNode,
    api: KubeApi,
    state_dir: Path,
    root: nvidia_roots.NvidiaRoot,
    configs: DoubleConfigs,
    *,
    expected_devices: Sequence[str],
    backend_args: tuple[str, ...] = (),
    command_prefix: tuple[str, ...] = (),
) -> Iterator[PluginProcess]:
    """The plugin on the NVML path (`--backend nvml`, then `backend_args`) over the double, its
    driver root `root`. It deletes its slices when stopped."""
    with running_plugin(
        kube_cluster,
        kubelet_node,
        api,
        state_dir,
        delete_slices_on_shutdown=True,
        extra_env={"DRIVER_ROOT": str(root.path), "NVML_DOUBLE_CONFIG": str(configs.plugin_config)},
        backend_args=("--backend", "nvml", "--nvml-lib-path", str(root.path), *backend_args),
        expected_devices=expected_devices,
        command_prefix=command_prefix,
    ) as process:
        yield process


def published_devices(api: KubeApi, node: str) -> dict[str, dict[str, Any]]:
    """Our devices in the node's slices, by name: their attributes."""
    found: dict[str, dict[str, Any]] = {}
    for item in node_slices(api.api_client, node, DEFAULT_DRIVER_NAME):
        for device in item["spec"].get("devices", []):
            found[device["name"]] = device.get("attributes", {})
    return found


def published_uuids(api: KubeApi, node: str) -> dict[str, str]:
    return {name: attrs["uuid"]["string"] for name, attrs in published_devices(api, node).items()}


def allocated_devices(api: KubeApi, namespace: str, claim: str) -> list[str]:
    status: dict[str, Any] = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}")["status"]
    return [result["device"] for result in status["allocation"]["devices"]["results"]]


def create_claim(api: KubeApi, namespace: str, name: str, device_class: str, cel: str | None = None) -> None:
    request: dict[str, Any] = {"deviceClassName": device_class}
    if cel is not None:
        request["selectors"] = [{"cel": {"expression": cel}}]
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    })  # fmt: skip


def double_pod(
    name: str,
    image: str,
    claim: str,
    script: str,
    configs: DoubleConfigs,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod that runs `script` under `sh -c`, then prints `exit=<status>` and sleeps (for execs).

    Its double reads the container's configuration from the hostPath volume."""
    pod = claim_pod(
        name,
        image,
        {"resourceClaimName": claim},
        command=["sh", "-c", f"{script}\necho {EXIT_MARK}$?; sleep 3600"],
        restartPolicy="Never",
        volumes=[{"name": "double", "hostPath": {"path": str(configs.container_dir), "type": "Directory"}}],
    )
    container = pod["spec"]["containers"][0]
    variables = {"NVML_DOUBLE_CONFIG": f"{CONTAINER_DOUBLE_DIR}/config.json", **(env or {})}
    container["env"] = [{"name": key, "value": value} for key, value in variables.items()]
    container["volumeMounts"] = [{"name": "double", "mountPath": CONTAINER_DOUBLE_DIR}]
    return pod


def script_log(api: KubeApi, namespace: str, pod: str, timeout_s: float = 60.0) -> str:
    """The container's log once its script is done (`exit=` printed)."""

    def done() -> str | None:
        text = pods.container_log(api, namespace, pod, "app")
        return text if EXIT_MARK in text else None

    log: str = wait_for(f"the script of pod {pod}", done, timeout_s, interval=0.5)
    return log


@contextmanager
def script_pod(
    api: KubeApi,
    plugin: PluginProcess,
    kubelet_node: KubeletNode,
    namespace: str,
    name: str,
    image: str,
    script: str,
    configs: DoubleConfigs,
    *,
    device_class: str,
    claim: str = "gpu",
    cel: str | None = None,
) -> Iterator[str]:
    """A claim of `device_class` (`cel` its selector) and a `double_pod` `name` with it that runs
    `script`: yields the script's log once it exited 0; afterwards every GPU the namespace used is free."""
    create_claim(api, namespace, claim, device_class, cel)
    api.create(f"/api/v1/namespaces/{namespace}/pods", double_pod(name, image, claim, script, configs))
    try:
        pods.wait_running(api, namespace, name, POD_TIMEOUT, kubelet_node.cdi_root)
        log = script_log(api, namespace, name)
        assert f"{EXIT_MARK}0" in log, log
        yield log
    finally:
        release_namespace(api, plugin, namespace, POD_TIMEOUT)
