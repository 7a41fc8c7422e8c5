"""Run the test cluster for humans: `python -m devcluster.localcluster` (`make cluster`).

Starts the same control plane the integration tests use (and, unless
--no-kubelet, a real kubelet on containerd with runc, or with `--runtime
fakecri` on the recording fake runtime), installs the driver's Helm chart on
the containerd node (our image imported, fake GPUs; --no-chart skips it: then
install your own build with the printed helm), prints the KUBECONFIG to export,
the kubectl built for the cluster's release, the plugin's pod and the
`dra-controller top` command for its metrics, and stays up
until Ctrl-C or SIGTERM. With `--nodes N` (N > 1) it starts N kubelet nodes
instead (devcluster.nodeset: each with its own containerd, directories,
loopback address, name and fake GPU inventory) and the chart's DaemonSet runs
one plugin pod on each. On exit it removes its state directory but the
logs (`<state dir>/control-plane/logs`, the pods' under `node/pod-logs`; the
exit message names them); a watchdog does it if this process is killed, and
the next start cleans what an earlier run could not (devcluster.rundir).
`kubectl logs`, `exec` and `port-forward` work: the API server reaches the
kubelet on loopback. Pods use images the node has imported
(`imagePullPolicy: Never`; no registry is reachable), such as the workload
image printed at start.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from devcluster import chart, images, rundir
from devcluster.binaries import MissingBinariesError, helm_path
from devcluster.controlplane import ControlPlane, free_port
from devcluster.images import OUR_IMAGE_BUILD_COMMAND, ImageError
from devcluster.kubelet import DEFAULT_NODE_NAME, RUNTIMES, KubeletNode
from devcluster.nodeset import NodeSet, node_set_release, print_summary
from devcluster.nodeset import wait_published as wait_set_published
from devcluster.procs import ComponentError
from devcluster.stopping import StopOnSignal, StopRequested
from dracommon.kubeapi import KubeApi

log = logging.getLogger("localcluster")

# What stays of a run's state directory after it (relative paths): the components' and the pods' logs.
KEPT_LOGS = ("control-plane/logs", "node/pod-logs")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devcluster.localcluster", description=__doc__)
    parser.add_argument("--no-kubelet", action="store_true", help="control plane only (fake nodes)")
    parser.add_argument(
        "--state-dir", type=Path, help="where data, logs and the kubeconfig go (default: a new temp dir)"
    )
    parser.add_argument("--node-name", default=DEFAULT_NODE_NAME, help="Node name of the kubelet")
    parser.add_argument(
        "--nodes", type=int, default=1, help="kubelet nodes on containerd (more than 1: devcluster.nodeset)"
    )
    parser.add_argument(
        "--runtime", choices=RUNTIMES, default="containerd", help="the kubelet's container runtime"
    )
    parser.add_argument(
        "--no-chart", action="store_true", help="do not install the chart (deploy/helm/draplugin)"
    )
    parser.add_argument(
        "--keep-state", action="store_true", help="keep all state on exit (default: the logs only)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.nodes < 1 or (args.nodes > 1 and (args.no_kubelet or args.runtime != "containerd")):
        print("localcluster: --nodes takes 1, or more with containerd kubelets", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for pruned in rundir.prune():
        log.info("removed what an earlier run left in %s", pruned)
    state_dir: Path = args.state_dir or Path(tempfile.mkdtemp(prefix="draplugin-cluster-"))
    set_logs = tuple(f"nodes/n{i + 1}/pod-logs" for i in range(args.nodes)) if args.nodes > 1 else ()
    if not args.keep_state:  # unmarked, a kept directory is left to `make clean-clusters`
        rundir.claim(state_dir, KEPT_LOGS + set_logs)
    stopper = StopOnSignal("localcluster")
    stopper.install()
    watchdog = None if args.keep_state else rundir.Watchdog([state_dir])

    cluster = ControlPlane(state_dir / "control-plane")
    node: KubeletNode | None = None
    node_set: NodeSet | None = None
    with_chart = not (args.no_chart or args.no_kubelet or args.runtime != "containerd")
    try:
        if with_chart:
            chart.helm_binary()  # before anything starts: a missing helm is a build command away
        cluster.start()
        if args.nodes > 1:
            node_set = NodeSet(cluster, args.nodes, base_dir=state_dir / "nodes", remove_state_on_stop=False)
            node_set.start()
            print(f"# {args.nodes} nodes ready in {node_set.startup_seconds:.1f}s", flush=True)
            if with_chart:
                install_set_chart(cluster, node_set, state_dir)
        elif not args.no_kubelet:
            node = KubeletNode(
                cluster,
                state_dir / "node",
                name=args.node_name,
                remove_state_on_stop=False,
                runtime=args.runtime,
            )
            node.start()
        if node is not None and with_chart:
            install_chart(cluster, node, state_dir)
        print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
        print(f"# kubectl for this release: {cluster.bin_dir / 'kubectl'}", flush=True)
        print(f"# logs: {cluster.logs} (kept after the cluster stops)", flush=True)
        if node is not None:
            runtime = f"container record {node.record_path}" if node.containerd is None else (
                f"containerd socket {node.cri_socket}; pods run image {node.workload_image} "
                "with imagePullPolicy: Never"
            )  # fmt: skip
            print(f"# kubelet node {node.name}: root dir {node.root_dir}, CDI dir {node.cdi_root}, {runtime}",
                  flush=True)  # fmt: skip
        if node_set is not None:
            print_summary(node_set.nodes)
        print(f"# helm: {helm_path()} (HELM_*_HOME under {state_dir / 'helm'})", flush=True)
        print("# Ctrl-C stops the cluster", flush=True)
        while True:
            time.sleep(1.0)
            cluster.processes.check_alive()
            for running in [node] if node is not None else node_set.nodes if node_set is not None else []:
                running.processes.check_alive()
    except StopRequested:
        pass
    except (MissingBinariesError, ComponentError, ImageError, chart.ChartError) as err:
        print(f"localcluster: {err}", file=sys.stderr)
        return 1
    finally:
        stopper.cleaning()
        if node is not None:
            node.stop()
        if node_set is not None:
            node_set.close()
        cluster.stop()
        if not args.keep_state:
            rundir.finish(state_dir)
            kept = " and ".join(str(state_dir / k) for k in KEPT_LOGS + set_logs if (state_dir / k).exists())
            print(f"# cluster stopped; logs kept in {kept or 'nowhere (none written)'}", flush=True)
        else:
            print(f"# cluster stopped; state kept in {state_dir}", flush=True)
        if watchdog is not None:
            watchdog.close()
    return 0


def install_chart(cluster: ControlPlane, node: KubeletNode, state_dir: Path) -> None:
    """The chart's release on the node, running: the plugin as its DaemonSet pod, slices published."""
    print(f"# building and importing our image ({OUR_IMAGE_BUILD_COMMAND}) ...", flush=True)
    image = chart.import_our_image(node)
    api = cluster.api_client()
    try:
        metrics_port = free_port()
        release = chart.local_release(
            cluster, node, KubeApi(api), image, home=state_dir / "helm", state_dir=state_dir / "plugin-state",
            plugin_metrics_port=metrics_port,
        )  # fmt: skip
        print(f"# helm install {release.name} {chart.CHART} -n {release.namespace} ...", flush=True)
        release.install()
        release.wait_published(node.name)
        for pod in release.plugin_pods() + release.controller_pods():
            meta = pod["metadata"]
            print(f"# chart pod {meta['namespace']}/{meta['name']} ({chart.owner(pod)}): "
                  f"kubectl logs -n {meta['namespace']} {meta['name']}", flush=True)  # fmt: skip
        # The node's address is loopback, which the API server's pod proxy refuses: name the URL.
        print(
            f"# GPU usage: dra-controller top --endpoint http://127.0.0.1:{metrics_port}/metrics", flush=True
        )
    finally:
        api.close()  # type: ignore[no-untyped-call]


def install_set_chart(cluster: ControlPlane, nodes: NodeSet, state_dir: Path) -> None:
    """The chart's release over the node set: one plugin pod per node, each node's slices published."""
    print(f"# building and importing our image ({OUR_IMAGE_BUILD_COMMAND}) into every node ...", flush=True)
    image = images.our_image()
    nodes.import_image(image)
    api = cluster.api_client()
    try:
        release = node_set_release(cluster, nodes, KubeApi(api), image, home=state_dir / "helm")
        print(f"# helm install {release.name} {chart.CHART} -n {release.namespace} ...", flush=True)
        release.install()
        wait_set_published(release, nodes)
        for pod in release.plugin_pods() + release.controller_pods():
            meta = pod["metadata"]
            print(f"# chart pod {meta['namespace']}/{meta['name']} on {pod['spec'].get('nodeName')}: "
                  f"kubectl logs -n {meta['namespace']} {meta['name']}", flush=True)  # fmt: skip
    finally:
        api.close()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    sys.exit(main())
