"""`python -m devcluster.demo` (`make demo`): the plugin on a local cluster with a real kubelet and fake GPUs.

It starts the test cluster (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) and a real kubelet on containerd with runc, runs
`draplugin run --backend fake` against that kubelet (a host process), waits
for the ResourceSlices the plugin publishes for the node, applies
`examples/02-shared-claim-two-containers` (two containers sharing one claim;
their image swapped for the locally built workload image, since no registry
is reachable), and prints the allocation, the CDI spec the plugin wrote and
what each container got, from the container's own log and from `exec` into
it (`kubectl logs` / `kubectl exec`). Then it stays up for your own specs until
Ctrl-C (or exits with --once).

Run from a source checkout: the cluster comes from `tests/kube` and the
binaries from `tests/cluster/build.sh` (`make demo` builds them).

`PluginProcess` is also what the end-to-end tests use to run, kill and
restart the plugin.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from dracommon.drivername import DEFAULT_DRIVER_NAME
from draplugin.kubelet.sockets import socket_paths
from draplugin.prepare.wiring import BOOT_ID_FILE_ENV, FAKE_CONFIG_ENV

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
FAKE_GPUS = EXAMPLES / "fake-gpus.yaml"
DEVICE_CLASSES = EXAMPLES / "deviceclasses.yaml"
SHARED_CLAIM_EXAMPLE = EXAMPLES / "02-shared-claim-two-containers" / "shared-claim.yaml"
DEMO_NAMESPACE = "demo"
RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"


# --- the plugin as a child process --------------------------------------------------------------------


@dataclass
class PluginProcess:
    """`draplugin run --backend fake` for one kubelet, restartable, with its log in a file."""

    kubeconfig: Path
    node_name: str
    kubelet_root_dir: Path
    cdi_root: Path
    state_dir: Path
    fake_config: Path = FAKE_GPUS
    driver_name: str = DEFAULT_DRIVER_NAME
    boot_id: str = "demo-boot-1"
    extra_env: Mapping[str, str] = field(default_factory=dict)
    # On: SIGTERM makes the plugin delete its slices (a plugin that is not restarted).
    # Off: a restart keeps them, as in production, and the scheduler goes on allocating.
    delete_slices_on_shutdown: bool = False
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def log_path(self) -> Path:
        return self.state_dir / "plugin.log"

    @property
    def checkpoint_path(self) -> Path:
        return self.state_dir / "checkpoint.json"

    @property
    def boot_id_file(self) -> Path:
        return self.state_dir / "boot_id"

    @property
    def registration_socket(self) -> Path:
        return socket_paths(self.kubelet_root_dir, self.driver_name, None).registration

    def start(self, crash_at: str | None = None, timeout_s: float = 30.0) -> None:
        """Start the plugin (optionally armed to SIGKILL itself at a crash point); wait for its sockets."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("plugin is already running")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.boot_id_file.write_text(self.boot_id + "\n")
        env = dict(os.environ)
        env.pop("DRAPLUGIN_CRASH_AT", None)
        env.update(self.extra_env)
        env[FAKE_CONFIG_ENV] = str(self.fake_config)
        env[BOOT_ID_FILE_ENV] = str(self.boot_id_file)
        if crash_at:
            env["DRAPLUGIN_CRASH_AT"] = crash_at
        command = [
            sys.executable, "-m", "draplugin.cli", "run",
            "--backend", "fake",
            "--driver-name", self.driver_name,
            "--node-name", self.node_name,
            "--kubelet-root-dir", str(self.kubelet_root_dir),
            "--cdi-root", str(self.cdi_root),
            "--state-dir", str(self.state_dir),
            "--kubeconfig", str(self.kubeconfig),
            "--metrics-port", "0",
            f"--delete-slices-on-shutdown={str(self.delete_slices_on_shutdown).lower()}",
        ]  # fmt: skip
        before = self._socket_identity()
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts + 1} crash_at={crash_at or '-'}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT
            )
        self.starts += 1
        # A killed plugin leaves its socket file behind: wait for a new one.
        while self._socket_identity() in (None, before):
            if self.process.poll() is not None:
                raise RuntimeError(f"plugin exited with {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() - started > timeout_s:
                raise RuntimeError(
                    f"plugin sockets did not appear within {timeout_s:.0f}s:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _socket_identity(self) -> tuple[int, int] | None:
        try:
            info = self.registration_socket.stat()
        except FileNotFoundError:
            return None
        return info.st_ino, info.st_mtime_ns

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Wait until the kubelet has registered this start of the plugin (its log says so)."""
        deadline = time.monotonic() + timeout_s
        marker = f"--- start {self.starts} "
        while True:
            current = self.log_text().rpartition(marker)[2]
            if "kubelet registered the plugin" in current:
                return
            if not self.running:
                raise RuntimeError(f"plugin exited before registering:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kubelet did not register the plugin within {timeout_s:.0f}s")
            time.sleep(0.05)

    def wait_exit(self, timeout_s: float) -> int:
        if self.process is None:
            raise RuntimeError("plugin was never started")
        return self.process.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM and wait (the plugin removes its sockets); SIGKILL if it does not stop."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def node_slices(api_client: Any, node_name: str, driver: str) -> list[dict[str, Any]]:
    """The ResourceSlices of `driver` for the node, as the API server has them."""
    from dracommon.kubeapi import KubeApi

    query = {"fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}"}
    items: list[dict[str, Any]] = KubeApi(api_client).get(RESOURCE_SLICES, query)["items"]
    return items


def wait_published(plugin: PluginProcess, api_client: Any, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Wait until the plugin's own ResourceSlices list exactly the devices of its fake inventory.

    The expected names come from the same inventory file the plugin reads;
    nothing is published from here. Slices left by an earlier run with other
    devices do not count: the plugin replaces them.
    """
    from devcluster.wait import wait_for
    from draplugin.devices import load_backend

    expected = sorted(
        d.name for d in load_backend("fake", plugin.node_name, config_file=str(plugin.fake_config)).discover()
    )

    def published() -> list[dict[str, Any]] | None:
        if not plugin.running:
            raise RuntimeError(f"plugin exited:\n{plugin.log_tail()}")
        slices = node_slices(api_client, plugin.node_name, plugin.driver_name)
        names = sorted(d["name"] for s in slices for d in s["spec"].get("devices", []))
        return slices if names == expected else None

    what = f"the plugin to publish {len(expected)} devices for node {plugin.node_name}"
    slices: list[dict[str, Any]] = wait_for(what, published, timeout_s, interval=0.1)
    return slices


def delete_node_slices(api_client: Any, node_name: str, driver: str) -> None:
    """Remove what a plugin stopped without --delete-slices-on-shutdown left behind."""
    from dracommon.kubeapi import KubeApi

    query = {"fieldSelector": f"spec.nodeName={node_name},spec.driver={driver}"}
    KubeApi(api_client).delete(RESOURCE_SLICES, query=query)


# --- applying manifests without kubectl ---------------------------------------------------------------

_COLLECTIONS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("resource.k8s.io/v1", "DeviceClass"): "/apis/resource.k8s.io/v1/deviceclasses",
    ("resource.k8s.io/v1", "ResourceClaim"): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
    (
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
    ): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
}


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def collection_path(doc: Mapping[str, Any], namespace: str) -> str:
    key = (str(doc.get("apiVersion")), str(doc.get("kind")))
    template = _COLLECTIONS.get(key)
    if template is None:
        known = ", ".join(f"{kind} ({version})" for version, kind in _COLLECTIONS)
        raise ValueError(f"cannot apply {key[1]} {key[0]}: this tool knows {known}")
    return template.format(ns=doc.get("metadata", {}).get("namespace") or namespace)


def apply(api_client: Any, docs: Sequence[Mapping[str, Any]], namespace: str, out: IO[str]) -> None:
    """Create each object; an existing one is reported and left as it is."""
    from dracommon.kubeapi import ApiError, KubeApi

    rest = KubeApi(api_client)
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "?")
        try:
            rest.create(collection_path(doc, namespace), doc)
            print(f"  created {doc['kind']} {name}", file=out)
        except ApiError as err:
            if err.status != 409:
                raise
            print(f"  {doc['kind']} {name} already exists, left unchanged", file=out)


# --- the demo -----------------------------------------------------------------------------------------


def _step(message: str) -> Callable[[], None]:
    started = time.monotonic()
    print(f"==> {message} ...", flush=True)

    def done() -> None:
        print(f"    done in {time.monotonic() - started:.1f}s", flush=True)

    return done


def _wait(what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
    from devcluster.wait import wait_for

    return wait_for(what, probe, timeout_s)


def _show(title: str, value: Any) -> None:
    print(f"\n--- {title}")
    print(value if isinstance(value, str) else json.dumps(value, indent=2))


def _container_view(rest: Any, pod: Mapping[str, Any], container: str) -> dict[str, Any]:
    """What one container of the pod got: its log (the example prints its variables) and its /dev/nvidia*."""
    from devcluster import pods

    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    log = _wait(
        f"container {container}'s log", lambda: pods.container_log(rest, namespace, name, container), 30
    )
    _, devices, _ = pods.exec_in(rest, namespace, name, container, ["sh", "-c", "ls -l /dev/nvidia*"])
    return {"container": container, "log": log.splitlines(), "devices": devices.splitlines()}


def run_demo(args: argparse.Namespace) -> int:
    from devcluster import pods
    from devcluster.binaries import MissingBinariesError
    from devcluster.controlplane import ControlPlane
    from devcluster.images import use_local_image
    from devcluster.kubelet import KubeletNode
    from devcluster.procs import ComponentError
    from dracommon.kubeapi import KubeApi

    state_dir: Path = args.state_dir or Path(tempfile.mkdtemp(prefix="draplugin-demo-"))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with ExitStack() as cleanup:
        try:
            done = _step("starting the control plane (etcd, apiserver, scheduler, controller-manager)")
            cluster = ControlPlane(state_dir / "control-plane")
            cleanup.callback(cluster.stop)
            cluster.start()
            done()
            done = _step("starting containerd (runc) and a kubelet on it")
            # Unix socket paths are short: the kubelet root goes in a short temp dir.
            node = KubeletNode(cluster, Path(tempfile.mkdtemp(prefix="dra-demo-")))
            cleanup.callback(node.stop)
            node.start()
            done()
        except (MissingBinariesError, ComponentError) as err:
            print(f"demo: {err}", file=sys.stderr)
            return 1
        plugin = PluginProcess(
            kubeconfig=cluster.kubeconfig,
            node_name=node.name,
            kubelet_root_dir=node.root_dir,
            cdi_root=node.cdi_root,
            state_dir=state_dir / "plugin",
        )
        done = _step(f"starting the plugin: draplugin run --backend fake (fake GPUs from {FAKE_GPUS.name})")
        cleanup.callback(plugin.stop)
        plugin.start()
        plugin.wait_registered()
        api = cluster.api_client()
        cleanup.callback(api.close)
        rest = KubeApi(api)
        slices = wait_published(plugin, api)
        devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
        done()
        print(f"    the plugin published {len(devices)} devices: {', '.join(devices)}")

        done = _step(f"applying {SHARED_CLAIM_EXAMPLE.relative_to(REPO_ROOT)} in namespace {DEMO_NAMESPACE}")
        apply(
            api,
            [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": DEMO_NAMESPACE}}],
            "",
            sys.stdout,
        )
        _wait(
            "the namespace's default ServiceAccount",
            lambda: rest.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/serviceaccounts/default"),
            30,
        )
        apply(api, load_manifests(DEVICE_CLASSES), DEMO_NAMESPACE, sys.stdout)
        docs = [use_local_image(doc, node.workload_image) for doc in load_manifests(SHARED_CLAIM_EXAMPLE)]
        for doc in docs:
            if doc["kind"] == "Pod":
                doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
        apply(api, docs, DEMO_NAMESPACE, sys.stdout)
        pod_name = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
        try:
            pod = pods.wait_running(rest, DEMO_NAMESPACE, pod_name, 120, node.cdi_root)
        except pods.PodError as err:
            print(f"demo: {err}", file=sys.stderr)
            return 1
        done()

        claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        claim = rest.get(f"/apis/resource.k8s.io/v1/namespaces/{DEMO_NAMESPACE}/resourceclaims/{claim_name}")
        _show(f"allocation of claim {DEMO_NAMESPACE}/{claim_name}", claim["status"]["allocation"]["devices"])
        spec_path = node.cdi_root / f"gpu.draplugin.dev-claim_{claim['metadata']['uid']}.json"
        _show(f"CDI spec {spec_path}", spec_path.read_text())
        _show(
            "what the containers got (their own logs, and exec: ls -l /dev/nvidia*)",
            [_container_view(rest, pod, c["name"]) for c in pod["spec"]["containers"]],
        )
        print(
            f"""
--- try your own specs
  export KUBECONFIG={cluster.kubeconfig}
  kubectl logs -n {DEMO_NAMESPACE} {pod_name} -c {pod["spec"]["containers"][0]["name"]}
  kubectl exec -n {DEMO_NAMESPACE} {pod_name} -- ls -l /dev
  {sys.executable} -m devcluster.demo apply -n {DEMO_NAMESPACE} -f examples/09-time-slicing/time-slicing.yaml
  (`apply` swaps the examples' public image for {node.workload_image}, which the node has; no registry here)
  CDI specs land in {node.cdi_root}; kubectl is {cluster.bin_dir / "kubectl"}.
  Pending pod? `dra-controller explain CLAIM -n {DEMO_NAMESPACE}` tells why, device by device.
  Plugin log: {plugin.log_path}   cluster logs: {cluster.logs}""",
            flush=True,
        )
        if args.once:
            return 0
        print("\nThe cluster stays up; Ctrl-C stops everything.", flush=True)
        while not stop.wait(1.0):
            if not plugin.running:
                print(f"demo: the plugin exited:\n{plugin.log_tail()}", file=sys.stderr)
                return 1
    return 0


def run_apply(args: argparse.Namespace) -> int:
    from devcluster.images import use_local_image, workload_image
    from dracommon.kubeapi import load_api_client

    api = load_api_client(args.kubeconfig)
    try:
        # The demo's node has no registry to pull from: pods run its local workload image.
        image = workload_image().name
        for path in args.filename:
            print(f"{path}:")
            apply(
                api,
                [use_local_image(d, image) for d in load_manifests(Path(path))],
                args.namespace,
                sys.stdout,
            )
    except (ValueError, OSError) as err:
        print(f"apply: {err}", file=sys.stderr)
        return 1
    finally:
        api.close()  # type: ignore[no-untyped-call]
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--once", action="store_true", help="exit after showing the example (default: stay up)"
    )
    parser.add_argument("--state-dir", type=Path, help="where logs and state go (default: a new temp dir)")
    sub = parser.add_subparsers(dest="command")
    apply_parser = sub.add_parser(
        "apply",
        help="create the objects of YAML files in the demo cluster, pods on the local image (no kubectl)",
    )
    apply_parser.add_argument("-f", "--filename", action="append", required=True)
    apply_parser.add_argument("-n", "--namespace", default=DEMO_NAMESPACE)
    apply_parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG")
    args = parser.parse_args(argv)
    if args.command == "apply":
        return run_apply(args)
    return run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
