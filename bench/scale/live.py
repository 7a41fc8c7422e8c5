"""The live part: `dra-controller run` at fleet size, one `draplugin` at idle, and explain and
simulate of one pending pod against the API server (docs/scale.md, "Live cluster").

One run, on a control plane of its own (bench.controlplane):

1. kube-scheduler and kube-controller-manager are stopped, so the pods stay pending and nothing
   but the measured component talks to the API server besides the server itself.
2. The fleet, claims and pods of the scheduler part (bench.scale.scheduler's creation), and two
   namespaces of one pod each: `scale-explain` (the claim that fits nowhere, as offline explain
   has) and `scale-simulate` (one whole-GPU claim, as offline simulate of one claim has).
3. The server alone for `window_s`: kube-apiserver's `apiserver_request_total` before and after,
   by verb and resource (non-resource paths such as the harness's /metrics scrapes left out).
   What the server does by itself (its own leases, endpoints) is this baseline.
4. `dra-controller run` (leader election on, as deployed): time and CPU until its first
   successful reconcile pass (its watch caches synced), then `window_s` idle: its CPU, the passes
   and their seconds from its `dra_controller_reconcile_duration_seconds` histogram, its RSS at
   the end, and the server's request counters' growth less the baseline. Then it is stopped.
5. explain and simulate of the one pod each, against the API server (the fastest of three runs,
   bench.scale.runs: wall, CPU, peak RSS), nothing of ours running beside them.
6. One `draplugin run --backend fake` for a node of its own (devcluster.plugin, as the end-to-end
   tests start it, no kubelet), after its start-up recovery and once its slices are published:
   `window_s` idle, the server's counters' growth less the baseline.
"""

from __future__ import annotations

import shutil
import ssl
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.controlplane import start_control_plane
from bench.fleet import unfittable_claim, whole_gpu_claims
from bench.scale.fixtures import pending_workload, pod_for
from bench.scale.offline import CLI, UNFIT_CLAIM, allocation_problems, compile_bytecode
from bench.scale.runs import Measured, RunError, run_timed
from bench.scale.scheduler import CLAIMS, PODS, RESOURCE_API, _create_fleet, _in_parallel, process_cpu_seconds
from bench.scale.traffic import RequestCounts, open_watches, pass_stats, process_rss_mib, request_counts
from devcluster.controlplane import ControlPlane, free_port
from devcluster.objects import create_fake_node
from devcluster.plugin import PluginProcess, node_slices
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import KubeApi
from dracommon.subcommands import EXIT_FAILURE, EXIT_OK

EXPLAIN_NS = "scale-explain"
SIMULATE_NS = "scale-simulate"
PLUGIN_NODE = "scale-plugin-node"
TRIES = 3
SYNC_TIMEOUT_S = 900.0
COMMAND_TIMEOUT_S = 600.0


class LiveRunError(RuntimeError):
    """The cluster or a measured component failed."""


@dataclass(frozen=True)
class Idle:
    """Requests the server counted over one window, less what it counted alone over another."""

    window_s: float
    requests: RequestCounts
    # Watches open at the window's end beyond the server's own: each is counted in the requests
    # only when it ends (the controller's after 300 to 450 s), so a window shows their reopening
    # only by chance.
    watches: int = 0

    @property
    def per_s(self) -> float:
        return self.requests.total() / self.window_s

    def busiest(self, n: int = 4) -> str:
        return ", ".join(
            f"{verb} {resource} {count}" for (verb, resource), count in self.requests.most_common(n)
        )


@dataclass(frozen=True)
class ControllerRun:
    sync_s: float  # start to the first successful pass
    sync_cpu_s: float
    idle_cpu_s: float  # over the window
    passes: int  # over the window
    passes_s: float  # their seconds in all
    rss_mib: float  # at the window's end
    idle: Idle

    @property
    def pass_ms(self) -> float:
        return 1000 * self.passes_s / self.passes if self.passes else 0.0


@dataclass(frozen=True)
class LiveRun:
    nodes: int
    gpus: int
    claims: int
    version: str
    server_alone: Idle
    controller: ControllerRun
    plugin: Idle
    explain: Measured
    simulate: Measured


def _get(url: str, token: str, ca_file: Path | None) -> str:
    context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), context=context, timeout=30
    ) as r:
        return str(r.read().decode())


def _server_metrics(cluster: ControlPlane) -> str:
    return _get(f"{cluster.server}/metrics", cluster.token, cluster.ca_file)


def _window(cluster: ControlPlane, window_s: float) -> tuple[RequestCounts, int]:
    """The requests the server counted over `window_s`, and the watches open at its end."""
    before = request_counts(_server_metrics(cluster))
    time.sleep(window_s)
    after = _server_metrics(cluster)
    return request_counts(after) - before, open_watches(after).total()


def _namespace_with_pod(api: KubeApi, namespace: str, claim: dict[str, object]) -> None:
    api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    # kube-controller-manager, which would make it, is stopped; pods need it to be admitted.
    api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
               {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})  # fmt: skip
    api.create(f"{RESOURCE_API}/namespaces/{namespace}/resourceclaims", claim)
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod_for(claim))


def _fastest(command: list[str], ok: int, check: Callable[[str], list[str]]) -> Measured:
    """The fastest of TRIES runs, each exiting `ok` with an answer `check` finds nothing wrong in."""
    runs = []
    for _ in range(TRIES):
        run = run_timed(command, COMMAND_TIMEOUT_S)
        problems = check(run.stdout) if run.returncode == ok else [f"exit {run.returncode}, expected {ok}"]
        if problems:
            raise RunError(f"{' '.join(command[:3])}: {problems[:3]}: {(run.stderr or run.stdout)[-1500:]}")
        runs.append(run)
    return min(runs, key=lambda r: r.wall_s)


def _explained(nodes: int) -> Callable[[str], list[str]]:
    def check(output: str) -> list[str]:
        # Not allocatable, and the text output counts every node it looked at.
        return (
            []
            if UNFIT_CLAIM in output and f"on {nodes} node(s)" in output
            else [f"no account of {nodes} nodes"]
        )

    return check


def _controller(cluster: ControlPlane, window_s: float, alone: Idle) -> ControllerRun:
    port = free_port()
    started = time.monotonic()
    component = cluster.processes.start("dra-controller", [
        CLI, "run", "--kubeconfig", str(cluster.kubeconfig), "--metrics-port", str(port),
        "--lease-namespace", "kube-system", "--identity", "scale-controller",
    ])  # fmt: skip
    stat = Path(f"/proc/{component.process.pid}/stat")

    def metrics() -> str:
        try:
            return _get(f"http://127.0.0.1:{port}/metrics", "", None)
        except OSError:
            return ""

    try:
        cluster.processes.wait_until(
            "dra-controller's first reconcile pass", lambda: pass_stats(metrics())[0] >= 1,
            timeout=SYNC_TIMEOUT_S, interval=0.1, blame=component,
        )  # fmt: skip
        sync_s = time.monotonic() - started
        sync_cpu = process_cpu_seconds(stat.read_text())
        passes_before = pass_stats(metrics())
        grown, watches = _window(cluster, window_s)
        passes_after = pass_stats(metrics())
        cpu = process_cpu_seconds(stat.read_text()) - sync_cpu
        rss = process_rss_mib(Path(f"/proc/{component.process.pid}/status").read_text())
        if not component.alive():
            raise LiveRunError(f"dra-controller exited: {component.log_tail()}")
    finally:
        cluster.processes.stop(component)
    return ControllerRun(
        sync_s, sync_cpu, cpu, passes_after[0] - passes_before[0], passes_after[1] - passes_before[1],
        rss, Idle(window_s, grown - alone.requests, watches - alone.watches),
    )  # fmt: skip


def _plugin(cluster: ControlPlane, root: Path, window_s: float, alone: Idle) -> Idle:
    create_fake_node(cluster.api_client(), PLUGIN_NODE)
    plugin = PluginProcess(
        kubeconfig=cluster.kubeconfig, node_name=PLUGIN_NODE, kubelet_root_dir=root / "kubelet",
        cdi_root=root / "cdi", state_dir=root / "plugin",
    )  # fmt: skip
    plugin.start(timeout_s=120)
    try:
        client = cluster.api_client()
        cluster.processes.wait_until(
            "the plugin's slices", lambda: bool(node_slices(client, PLUGIN_NODE, DEFAULT_DRIVER_NAME)),
            timeout=120,
        )  # fmt: skip
        time.sleep(2)  # its publishing writes settle before the window opens
        grown, watches = _window(cluster, window_s)
        if not plugin.running:
            raise LiveRunError(f"draplugin exited: {plugin.log_tail()}")
    finally:
        plugin.stop()
    return Idle(window_s, grown - alone.requests, watches - alone.watches)


def measure_live(nodes: int, gpus: int, claims_n: int, window_s: float, *, keep: bool = False) -> LiveRun:
    cluster = start_control_plane("scale-live-")
    if cluster is None:
        raise LiveRunError("the control plane did not start (above)")
    root = Path(tempfile.mkdtemp(prefix="scale-live-plugin-"))
    try:
        for component in [c for c in cluster.processes.components
                          if c.name in ("kube-scheduler", "kube-controller-manager")]:  # fmt: skip
            cluster.processes.stop(component)
        with cluster.api_client() as client:
            api = KubeApi(client, timeout_s=120)
            claims, pods = pending_workload(claims_n)
            _create_fleet(api, cluster, nodes, gpus, claims)
            _in_parallel(lambda p: api.create(PODS, p), pods)
            _namespace_with_pod(api, EXPLAIN_NS, unfittable_claim(UNFIT_CLAIM, EXPLAIN_NS))
            _namespace_with_pod(api, SIMULATE_NS, whole_gpu_claims(1, namespace=SIMULATE_NS)[0])
            if len(api.list(CLAIMS)[0]) != claims_n:
                raise LiveRunError("not every claim was created")
        alone = Idle(window_s, *_window(cluster, window_s))
        controller = _controller(cluster, window_s, alone)
        kubeconfig = str(cluster.kubeconfig)
        compile_bytecode()  # as the offline part does: an installed copy has its bytecode
        explain = _fastest(
            [CLI, "explain", f"pod/pod-{UNFIT_CLAIM}", "-n", EXPLAIN_NS, "--kubeconfig", kubeconfig],
            EXIT_FAILURE,  # not allocatable: the expected answer
            _explained(nodes),
        )
        simulate = _fastest(
            [CLI, "simulate", "-n", SIMULATE_NS, "-o", "json", "--kubeconfig", kubeconfig],
            EXIT_OK,
            lambda output: allocation_problems(output, 1),
        )
        plugin = _plugin(cluster, root, window_s, alone)
    except BaseException:
        cluster.stop()
        print(f"kept for a look: {cluster.state_dir} (logs/ has every component's log)")
        raise
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)
    if not keep:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    return LiveRun(nodes, gpus, claims_n, cluster.kubernetes_version, alone, controller,
                   plugin, explain, simulate)  # fmt: skip
