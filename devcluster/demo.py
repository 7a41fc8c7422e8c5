"""`python -m devcluster.demo` (`make demo`): the driver installed with its Helm chart on a local cluster.

It starts the local cluster (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager) and a real kubelet on containerd with runc, builds
our image from deploy/Dockerfile (tests/cluster/build_image.sh; a no-op when
nothing changed) and imports it into the node's containerd, installs
deploy/helm/draplugin with Helm (fake GPUs: deploy/helm/values-fake-gpus.yaml),
so that the kubelet plugin runs as the chart's DaemonSet pod and the
controller as its Deployment, waits for the ResourceSlices the plugin pod
publishes, applies `examples/02-shared-claim-two-containers` (two containers
sharing one claim; their image swapped for the locally built workload image,
since no registry is reachable), and prints the allocation, the CDI spec the
plugin wrote and what each container got, from the container's own log and
from `exec` into it (`kubectl logs` / `kubectl exec`). A second claim holds
the one fake GPU that stays idle (devcluster.demo_usage), and `dra-controller
top` shows both claims' moving utilization, then the idle one flagged after the
demo's short idle threshold. Then it stays up for your own specs until Ctrl-C
(or exits with --once). On exit it removes its state but the control plane's
logs (the exit message names the folder); a watchdog does it if the demo is
killed, and the next start cleans what an earlier run could not
(devcluster.rundir).

Run from a source checkout: the binaries come from tests/cluster/build.sh and
build_helm.sh (`make demo` builds them). Anything that keeps the demo from
running (a missing binary or image, a chart that does not install, a plugin
pod the runtime gives up on) ends it at once with the command that fixes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from devcluster.manifests import EXAMPLES, apply, load_manifests
from devcluster.stopping import StopOnSignal, StopRequested

SHARED_CLAIM_EXAMPLE = EXAMPLES / "02-shared-claim-two-containers" / "shared-claim.yaml"
DEMO_NAMESPACE = "demo"


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


def _describe_daemon(pod: Mapping[str, Any]) -> str:
    """`ns/name (Owner/name) on node N, image I, containerd://ID`: where a chart pod runs, and in what."""
    from devcluster.chart import owner

    (status,) = pod["status"]["containerStatuses"]
    meta = pod["metadata"]
    return (
        f"pod {meta['namespace']}/{meta['name']} of {owner(pod)} on node {pod['spec']['nodeName']}, "
        f"image {status['image']}, container {status['containerID'][:25]}"
    )


def run_demo(args: argparse.Namespace) -> int:
    from devcluster.binaries import MissingBinariesError
    from devcluster.chart import ChartError
    from devcluster.demo_usage import DemoUsageError
    from devcluster.images import ImageError
    from devcluster.pods import PodError
    from devcluster.procs import ComponentError

    stopper = StopOnSignal("demo")
    stopper.install()
    try:
        return _demo(args, stopper)
    except StopRequested:
        return 0
    except (MissingBinariesError, ComponentError, ImageError, ChartError, PodError, DemoUsageError) as err:
        print(f"demo: {err}", file=sys.stderr)
        return 1


# What stays of the demo's state directory after it (relative paths).
KEPT_LOGS = ("control-plane/logs",)


def _demo(args: argparse.Namespace, stopper: StopOnSignal) -> int:
    """The demo in its run directories: cleaned on any exit down to the logs (devcluster.rundir)."""
    from devcluster import chart, rundir

    chart.helm_binary()  # before anything starts: a missing helm is a build command away
    for pruned in rundir.prune():
        print(f"    removed what an earlier run left in {pruned}", flush=True)
    state_dir: Path = args.state_dir or Path(tempfile.mkdtemp(prefix="draplugin-demo-"))
    # Unix socket paths are short: the kubelet root goes in a short temp dir.
    node_dir = Path(tempfile.mkdtemp(prefix="dra-demo-"))
    rundir.claim(state_dir, KEPT_LOGS)
    rundir.claim(node_dir)
    watchdog = rundir.Watchdog([state_dir, node_dir])
    try:
        with ExitStack() as cleanup:
            try:
                return _demo_steps(args, cleanup, state_dir, node_dir)
            finally:
                stopper.cleaning()  # a second Ctrl-C no longer interrupts the stop
    finally:
        for directory in (node_dir, state_dir):
            rundir.finish(directory)
        kept = [str(state_dir / k) for k in KEPT_LOGS if (state_dir / k).exists()]
        print(f"demo stopped; logs kept in {' '.join(kept) or 'nowhere (none written)'}", flush=True)
        watchdog.close()


def _demo_steps(args: argparse.Namespace, cleanup: ExitStack, state_dir: Path, node_dir: Path) -> int:
    from devcluster import chart, demo_usage, pods
    from devcluster.binaries import REPO_ROOT
    from devcluster.controlplane import ControlPlane, free_port
    from devcluster.images import OUR_IMAGE_BUILD_COMMAND, use_local_image
    from devcluster.kubelet import KubeletNode
    from dracommon.kubeapi import KubeApi

    done = _step("starting the control plane (etcd, apiserver, scheduler, controller-manager)")
    cluster = ControlPlane(state_dir / "control-plane")
    cleanup.callback(cluster.stop)
    cluster.start()
    done()
    done = _step("starting containerd (runc) and a kubelet on it")
    node = KubeletNode(cluster, node_dir)
    cleanup.callback(node.stop)
    node.start()
    done()
    api = cluster.api_client()
    cleanup.callback(api.close)
    rest = KubeApi(api)

    done = _step(f"building our image from deploy/Dockerfile ({OUR_IMAGE_BUILD_COMMAND}) and importing it")
    image = chart.import_our_image(node)
    done()
    print(f"    {image.name} is in the node's containerd")
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    release = chart.local_release(
        cluster, node, rest, image, home=state_dir / "helm", state_dir=node.state_dir / "plugin-state",
        plugin_metrics_port=metrics_port, overrides=demo_usage.demo_values(),
    )  # fmt: skip
    done = _step(
        f"helm install {release.name} {chart.CHART.relative_to(REPO_ROOT)} -n {release.namespace} "
        f"(fake GPUs from {chart.FAKE_GPU_VALUES.name})"
    )
    release.install()
    slices = release.wait_published(node.name)
    done()
    plugin_pod = release.plugin_pods()[0]
    controller_pod = release.controller_pods()[0]
    print(f"    the kubelet plugin runs as {_describe_daemon(plugin_pod)}")
    print(f"    the controller runs as {_describe_daemon(controller_pod)}")
    devices = [d["name"] for s in slices for d in s["spec"].get("devices", [])]
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
    # First the claim for the one GPU that stays idle, so the example's claim gets another.
    apply(api, demo_usage.idle_claim_objects(node.name, node.workload_image), DEMO_NAMESPACE, sys.stdout)
    pods.wait_running(rest, DEMO_NAMESPACE, demo_usage.IDLE_CLAIM, 120, node.cdi_root)
    docs = [use_local_image(doc, node.workload_image) for doc in load_manifests(SHARED_CLAIM_EXAMPLE)]
    for doc in docs:
        if doc["kind"] == "Pod":
            doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node.name}
    apply(api, docs, DEMO_NAMESPACE, sys.stdout)
    pod_name = next(d["metadata"]["name"] for d in docs if d["kind"] == "Pod")
    pod = pods.wait_running(rest, DEMO_NAMESPACE, pod_name, 120, node.cdi_root)
    done()

    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = rest.get(f"/apis/resource.k8s.io/v1/namespaces/{DEMO_NAMESPACE}/resourceclaims/{claim_name}")
    _show(f"allocation of claim {DEMO_NAMESPACE}/{claim_name}", claim["status"]["allocation"]["devices"])
    for spec_path in sorted(node.cdi_root.glob(f"*{claim['metadata']['uid']}*")):
        _show(f"CDI spec {spec_path}", spec_path.read_text())
    _show(
        "what the containers got (their own logs, and exec: ls -l /dev/nvidia*)",
        [_container_view(rest, pod, c["name"]) for c in pod["spec"]["containers"]],
    )
    _show_usage(metrics_url, claim_name)
    plugin = plugin_pod["metadata"]
    print(
        f"""
--- try your own specs
  export KUBECONFIG={cluster.kubeconfig}
  kubectl logs -n {DEMO_NAMESPACE} {pod_name} -c {pod["spec"]["containers"][0]["name"]}
  kubectl exec -n {DEMO_NAMESPACE} {pod_name} -- ls -l /dev
  kubectl logs -n {plugin["namespace"]} {plugin["name"]}     (the plugin)
  {sys.executable} -m devcluster.demo apply -n {DEMO_NAMESPACE} -f examples/01-single-gpu/single-gpu.yaml
  (MPS and time-slicing, examples 09 and 10, need a driver root with nvidia-smi and the MPS tools:
  the demo's fake GPUs have none, so those claims fail with an Event that says so)
  (`apply` swaps the examples' public image for {node.workload_image}, which the node has; no registry here)
  CDI specs land in {node.cdi_root}; kubectl is {cluster.bin_dir / "kubectl"}.
  helm: {chart.helm_binary()} -n {release.namespace} status {release.name}
  Pending pod? `dra-controller explain CLAIM -n {DEMO_NAMESPACE}` tells why, device by device.
  How busy is each claimed GPU? {" ".join(demo_usage.top_command(metrics_url))}
  (the plugin's metrics: {metrics_url}; in a real cluster `dra-controller top` finds the plugin pods itself)
  Cluster logs: {cluster.logs}""",
        flush=True,
    )
    if args.once:
        return 0
    print("\nThe cluster stays up; Ctrl-C stops everything.", flush=True)
    while True:
        time.sleep(1.0)
        cluster.processes.check_alive()
        node.processes.check_alive()
    return 0


def _show_usage(metrics_url: str, busy_claim: str) -> None:
    """`dra-controller top` as the pods start, and again once the idle claim is past the threshold."""
    from devcluster import demo_usage

    claims = (busy_claim, demo_usage.IDLE_CLAIM)
    done = _step("waiting for the plugin's usage samples of both claims (dra-controller top)")
    ready = demo_usage.claims_with_pods(DEMO_NAMESPACE, claims)
    what = f"claims {', '.join(claims)} with their pods"
    table = demo_usage.wait_for_top(metrics_url, what, ready, demo_usage.TOP_TIMEOUT_S * 2)
    done()
    _show("dra-controller top (the pods just started)", table)
    idle = f"{DEMO_NAMESPACE}/{demo_usage.IDLE_CLAIM}"
    usage = demo_usage.DEMO_USAGE
    done = _step(
        f"waiting for {idle} to be flagged idle (under {usage['idleThresholdPercent']}% SM for "
        f"{usage['idleAfter']}: the demo's short usage settings)"
    )
    table = demo_usage.wait_for_top(
        metrics_url, f"{idle} flagged idle", demo_usage.idle_flagged(DEMO_NAMESPACE, demo_usage.IDLE_CLAIM),
        demo_usage.IDLE_AFTER_S + 60,
    )  # fmt: skip
    done()
    _show(f"dra-controller top ({idle} idle past the threshold, most waste first)", table)


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
        api.close()
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
