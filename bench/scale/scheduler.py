"""kube-scheduler's pods/s on the objects simulate ran: the real control plane, no kubelet.

How one run goes (bench.controlplane starts etcd, kube-apiserver, kube-scheduler and
kube-controller-manager from $DRA_KUBE_BIN_DIR):

1. Its kube-scheduler and kube-controller-manager are stopped: the pods must wait for the
   measured scheduler, and nothing else should take CPU from it on this machine (the pods name
   their claims directly, so the resourceclaim controller has nothing to do; ServiceAccount
   default/default exists already).
2. Created by WORKERS threads: the fleet's Nodes (Ready, with capacity, no kubelet:
   devcluster.objects.create_fake_node, the labels bench.fleet gives them), the chart's
   DeviceClasses, the fleet's ResourceSlices, the claims, then one pod per claim
   (bench.scale.fixtures). Nothing schedules them yet, so how fast they were created does not
   colour the figure.
3. A watch on the pods starts, then a fresh kube-scheduler with a KubeSchedulerConfiguration
   whose client QPS and burst are 5000, as upstream's scheduler_perf sets them
   (test/integration/scheduler_perf/util.go: its defaults, 50/100, would throttle the bindings
   and the claim status writes, two or three API writes per pod); everything else is the default
   profile (percentageOfNodesToScore adaptive, parallelism 16).
4. Each pod's first watch event with spec.nodeName is its bind time. Figures: pods / (last
   bind - scheduler start) (start-up, informer sync, every decision: what simulate's wall time
   holds too) and (pods - 1) / (last bind - first bind), the scheduling phase alone.
5. Afterwards every claim must have an allocation (the scheduler wrote it) and every pod a node;
   the scheduler's scheduler_schedule_attempts_total says how many attempts each result had
   (a pod tried more than once shows as unschedulable or error attempts).
"""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from bench.controlplane import start_control_plane
from bench.fleet import device_classes, iter_fleet_slices, node_objects
from bench.scale.fixtures import NAMESPACE, pending_workload
from bench.scale.phases import SchedulingRun
from devcluster.controlplane import ControlPlane, free_port
from devcluster.objects import create_fake_node
from dracommon.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)

JSON = dict[str, Any]
RESOURCE_API = "/apis/resource.k8s.io/v1"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"{RESOURCE_API}/namespaces/{NAMESPACE}/resourceclaims"
WORKERS = 8
CLIENT_QPS = 5000  # scheduler_perf's (util.go: cfg.QPS = 5000.0, cfg.Burst = 5000)
CLIENT_BURST = 5000
WATCH_S = 10


class SchedulerRunError(RuntimeError):
    """The cluster or the scheduler failed, or not every pod was bound in time."""


def scheduler_config(kubeconfig: Path, qps: int, burst: int) -> str:
    return yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
        "leaderElection": {"leaderElect": False},
    }, sort_keys=False)  # fmt: skip


def _in_parallel(work: Callable[[Any], object], items: Iterable[Any]) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(work, items):
            pass


class BindWatch:
    """The time each pod of the namespace is first seen with a node, on a thread of its own."""

    def __init__(self, api: KubeApi, expected: int) -> None:
        self.api, self.expected = api, expected
        self.bound_at: dict[str, float] = {}
        self.done = threading.Event()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        items, self.version = api.list(PODS)
        self._see(items)
        self.thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self.thread.start()

    def _see(self, pods: Iterable[JSON]) -> None:
        now = time.perf_counter()
        for pod in pods:
            if (pod.get("spec") or {}).get("nodeName"):
                self.bound_at.setdefault(pod["metadata"]["name"], now)
        if len(self.bound_at) >= self.expected:
            self.done.set()

    def _run(self) -> None:
        try:
            while not self.stop.is_set() and not self.done.is_set():
                try:
                    for event in self.api.watch(PODS, self.version, timeout_s=WATCH_S):
                        obj = event.get("object") or {}
                        self.version = str((obj.get("metadata") or {}).get("resourceVersion") or self.version)
                        if event.get("type") in ("ADDED", "MODIFIED"):
                            self._see([obj])
                        if self.done.is_set() or self.stop.is_set():
                            return
                except ApiError as err:  # too old a version, or a broken stream: list again
                    log.warning("pod watch restarts: %s", err)
                    items, self.version = self.api.list(PODS)
                    self._see(items)
        except BaseException as err:  # reported by measure()
            self.error = err
            self.done.set()


def _create_fleet(api: KubeApi, cluster: ControlPlane, nodes: int, gpus: int, claims: list[JSON]) -> None:
    client = cluster.api_client()
    _in_parallel(
        lambda node: create_fake_node(client, node["metadata"]["name"], node["metadata"]["labels"]),
        node_objects(nodes),
    )
    for device_class in device_classes():
        api.create(f"{RESOURCE_API}/deviceclasses", device_class)
    slices = [s for per_node in iter_fleet_slices(nodes, gpus) for s in per_node]
    _in_parallel(lambda s: api.create(f"{RESOURCE_API}/resourceslices", s), slices)
    _in_parallel(lambda c: api.create(CLAIMS, {k: v for k, v in c.items() if k != "status"}), claims)


def _start_scheduler(cluster: ControlPlane, qps: int, burst: int) -> tuple[float, Callable[[], bool], int]:
    config = cluster.state_dir / "scale-scheduler.yaml"
    config.write_text(scheduler_config(cluster.kubeconfig, qps, burst))
    port = free_port()
    gates = [f"--feature-gates={cluster.dra.feature_gates}"] if cluster.dra.feature_gates else []
    started = time.perf_counter()
    component = cluster.processes.start("kube-scheduler-measured", [
        str(cluster.bin_dir / "kube-scheduler"),
        f"--config={config}",
        f"--secure-port={port}",
        f"--cert-dir={cluster.state_dir / 'scale-scheduler-pki'}",
        f"--authentication-kubeconfig={cluster.kubeconfig}",
        f"--authorization-kubeconfig={cluster.kubeconfig}",
        "--bind-address=127.0.0.1",
        # Level 2 logs a line per binding; 1 keeps the log off the two cores.
        "--v=1",
        *gates,
    ])  # fmt: skip
    return started, component.alive, port


def process_cpu_seconds(stat: str) -> float:
    """utime + stime of a /proc/<pid>/stat line, in seconds (fields 14 and 15, after the command)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(cluster: ControlPlane) -> dict[str, float]:
    """CPU each running component has used so far: kube-scheduler's, and the API server's and
    etcd's, which serve its lists, watches and writes on the same two cores."""
    used = {}
    for component in cluster.processes.components:
        try:
            used[component.name] = process_cpu_seconds(
                Path(f"/proc/{component.process.pid}/stat").read_text()
            )
        except OSError:
            continue
    return used


def schedule_attempts(metrics: str) -> dict[str, int]:
    """scheduler_schedule_attempts_total by result (scheduled, unschedulable, error), from /metrics."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("scheduler_schedule_attempts_total{"):
            labels, value = line.rsplit(" ", 1)
            result = labels.split('result="', 1)[1].split('"', 1)[0]
            counts[result] = counts.get(result, 0) + int(float(value))
    return counts


def _scrape(port: int, token: str) -> str:
    """The measured scheduler's /metrics (its own self-signed certificate, on loopback)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return str(response.read().decode())


def measure(
    nodes: int, gpus: int, claims_n: int, *, qps: int = CLIENT_QPS, burst: int = CLIENT_BURST,
    timeout_s: float = 900.0, keep: bool = False,
) -> tuple[SchedulingRun, str, dict[str, float]]:  # fmt: skip
    """One run: kube-scheduler's figures, its release, and how the set-up went (seconds, rates)."""
    cluster = start_control_plane("scale-scheduler-")
    if cluster is None:
        raise SchedulerRunError("the control plane did not start (above)")
    setup: dict[str, float] = {}
    try:
        measured_alone = ("kube-scheduler", "kube-controller-manager")
        for component in [c for c in cluster.processes.components if c.name in measured_alone]:
            cluster.processes.stop(component)
        with cluster.api_client() as client:
            api = KubeApi(client, timeout_s=120)
            claims, pods = pending_workload(claims_n)
            began = time.perf_counter()
            _create_fleet(api, cluster, nodes, gpus, claims)
            setup["fleet_created_s"] = time.perf_counter() - began
            began = time.perf_counter()
            _in_parallel(lambda p: api.create(PODS, p), pods)
            setup["pods_created_s"] = time.perf_counter() - began
            setup["pods_created_per_s"] = len(pods) / setup["pods_created_s"]
            watch = BindWatch(KubeApi(cluster.api_client(), timeout_s=120), len(pods))
            before = cpu_seconds(cluster)
            started, alive, port = _start_scheduler(cluster, qps, burst)
            deadline = started + timeout_s
            while not watch.done.wait(1.0):
                if not alive():
                    raise SchedulerRunError("kube-scheduler exited; see its log in " + str(cluster.logs))
                if time.perf_counter() > deadline:
                    break
            watch.stop.set()
            after = cpu_seconds(cluster)
            setup.update({f"cpu_{name}": used - before.get(name, 0.0) for name, used in after.items()})
            if watch.error is not None:
                raise SchedulerRunError(f"the pod watch failed: {watch.error}")
            run = SchedulingRun.from_events(nodes, len(pods), started, dict(watch.bound_at))
            if not run.complete:
                raise SchedulerRunError(
                    f"{len(run.bound)} of {len(pods)} pods bound within {timeout_s:.0f}s "
                    f"(logs in {cluster.logs})"
                )
            try:
                attempts = schedule_attempts(_scrape(port, cluster.token))
                setup.update({f"attempts_{result}": float(n) for result, n in attempts.items()})
            except OSError as err:
                print(f"kube-scheduler's /metrics could not be read: {err}", file=sys.stderr)
            allocated = sum(bool((c.get("status") or {}).get("allocation")) for c in api.list(CLAIMS)[0])
            if allocated != claims_n:
                raise SchedulerRunError(
                    f"{allocated} of {claims_n} claims allocated after every pod was bound"
                )
    except BaseException:
        cluster.stop()
        print(f"kept for a look: {cluster.state_dir} (logs/ has every component's log)", file=sys.stderr)
        raise
    cluster.stop()
    if keep:
        print(f"kept: {cluster.state_dir}", file=sys.stderr)
    else:
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    return run, cluster.kubernetes_version, setup
