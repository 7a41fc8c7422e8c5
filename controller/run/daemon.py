"""`dra-controller run` wiring: watch caches, leader election, the reconcile loop,
metrics and health, and an orderly stop.

Threads: one per watch cache, one for the election, one reconcile loop, one
HTTP server. Every replica keeps its caches warm; only the leader reconciles,
so a fail-over starts from a full view at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from controller.objects import RESOURCE_API, TAINT_RULE_PATHS
from controller.run.api import KubeClaimApi
from controller.run.leader import KubeLeaseApi, LeaderConfig, LeaderElector
from controller.run.metrics import ControllerMetrics, MetricsServer
from controller.run.podsecurity import PodSecurityCheck
from controller.run.reconciler import Reconciler, ReconcilerSettings, Snapshot
from controller.run.watchcache import KubeListWatch, WatchCache
from dracommon.drivername import DEFAULT_DRIVER_NAME, reporting_controller
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubeversion import NEWEST_KNOWN, KubernetesVersion

log = logging.getLogger(__name__)

# A pass also runs this often without any change: event thresholds are time-based.
RESYNC_S = 5.0
# Changes arriving together (a burst of watch events) are handled in one pass.
DEBOUNCE_S = 0.05
# /healthz fails when the reconcile loop has not come round for this long (a hung thread).
STALL_S = 120.0


@dataclass(frozen=True)
class DaemonSettings:
    identity: str
    lease_name: str = "dra-controller"
    lease_namespace: str = "kube-system"
    namespace: str | None = None
    metrics_port: int = 8080
    event_after_s: float = 60.0
    event_interval_s: float = 600.0
    driver_name: str = DEFAULT_DRIVER_NAME
    leader_elect: bool = True
    leader_config: LeaderConfig = field(default_factory=LeaderConfig)
    release: KubernetesVersion = NEWEST_KNOWN  # the cluster's: allocate by its rules
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    # The kubelet plugin's namespace, whose Pod Security refusals the leader reports (podsecurity.py).
    plugin_namespace: str | None = None


def _served_taint_rules(api: KubeApi) -> str | None:
    """The newest DeviceTaintRule collection the API server serves to us, None for none: a version
    is not served before its release or with its gate off (404: the next older one is tried), and
    a chart older than this controller may not grant them (403)."""
    for path in TAINT_RULE_PATHS:
        try:
            api.get(path, {"limit": "1"})
        except ApiError as err:
            if err.status == 404:
                continue
            if err.status != 403:
                raise
            log.warning(
                "DeviceTaintRules are not readable; pre-allocation ignores them", extra={"error": str(err)}
            )
            return None
        return path
    return None


class ControllerDaemon:
    def __init__(
        self, api: KubeApi, settings: DaemonSettings, registry: CollectorRegistry | None = None
    ) -> None:
        self.settings = settings
        self.registry = registry or CollectorRegistry()
        self.metrics = ControllerMetrics(self.registry)
        self._stop = threading.Event()
        self._dirty = threading.Event()
        self._heartbeat = time.monotonic()
        scope = f"/namespaces/{settings.namespace}" if settings.namespace else ""
        self.caches = {
            "deviceclasses": self._cache("deviceclasses", KubeListWatch(
                api, f"{RESOURCE_API}/deviceclasses", "DeviceClass")),
            "resourceslices": self._cache("resourceslices", KubeListWatch(
                api, f"{RESOURCE_API}/resourceslices", "ResourceSlice")),
            "resourceclaims": self._cache("resourceclaims", KubeListWatch(
                api, f"{RESOURCE_API}/resourceclaims", "ResourceClaim")),
            # Only pending pods matter (events, "about to be reserved"); the filter keeps the cache small.
            "pods": self._cache("pods", KubeListWatch(
                api, f"/api/v1{scope}/pods", "Pod", field_selector="status.phase=Pending")),
        }  # fmt: skip
        taint_rules = _served_taint_rules(api)
        if taint_rules is not None:
            self.caches["devicetaintrules"] = self._cache("devicetaintrules", KubeListWatch(
                api, taint_rules, "DeviceTaintRule"))  # fmt: skip
        self.elector = LeaderElector(
            KubeLeaseApi(api, settings.lease_namespace, settings.lease_name),
            namespace=settings.lease_namespace,
            name=settings.lease_name,
            identity=settings.identity,
            config=settings.leader_config,
            on_change=self._leadership_changed,
        )
        self.reconciler = Reconciler(
            KubeClaimApi(api),
            self.snapshot,
            metrics=self.metrics,
            settings=ReconcilerSettings(
                identity=settings.identity,
                namespace=settings.namespace,
                event_after_s=settings.event_after_s,
                event_interval_s=settings.event_interval_s,
                driver_name=settings.driver_name,
                release=settings.release,
                feature_gates=settings.feature_gates,
            ),
            is_leader=self.elector.is_leader if settings.leader_elect else lambda: True,
        )
        self.pod_security = (
            PodSecurityCheck(
                api,
                settings.plugin_namespace,
                controller=reporting_controller(settings.driver_name),
                instance=settings.identity,
                is_leader=self.elector.is_leader if settings.leader_elect else lambda: True,
            )
            if settings.plugin_namespace
            else None
        )
        self._threads: list[threading.Thread] = []
        self._server: MetricsServer | None = None

    def _cache(self, resource: str, source: KubeListWatch) -> WatchCache:
        gauge = self.metrics.cache_objects.labels(resource)
        relists = self.metrics.cache_relists.labels(resource)
        return WatchCache(
            resource, source, on_change=self._dirty.set, on_size=gauge.set, on_relist=relists.inc
        )

    def snapshot(self) -> Snapshot:
        return Snapshot(
            device_classes=self.caches["deviceclasses"].snapshot(),
            slices=self.caches["resourceslices"].snapshot(),
            claims=self.caches["resourceclaims"].snapshot(),
            pending_pods=self.caches["pods"].snapshot(),
            taint_rules=self.caches["devicetaintrules"].snapshot()
            if "devicetaintrules" in self.caches
            else (),
        )

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        self._dirty.set()

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        if self.settings.metrics_port:
            self._server = MetricsServer(self.settings.metrics_port, self.registry, self.health_problem)
            self._server.start()
        for resource, cache in self.caches.items():
            self._spawn(f"watch-{resource}", lambda c=cache: c.run(self._stop))  # type: ignore[misc]
        if self.settings.leader_elect:
            self._spawn("leader-election", lambda: self.elector.run(self._stop))
        else:
            self.metrics.leader.set(1)
        self._spawn("reconcile", self._loop)
        if self.pod_security is not None:
            check = self.pod_security
            self._spawn("pod-security", lambda: check.run(self._stop))
        log.info(
            "controller started",
            extra={
                "identity": self.settings.identity,
                "lease": f"{self.settings.lease_namespace}/{self.settings.lease_name}",
                "namespace": self.settings.namespace or "(all)",
                "leaderElection": self.settings.leader_elect,
            },
        )

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        # Daemon threads: a watch blocked in a read must not hold up the exit.
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop reconciling, give the Lease up, stop serving. Watches end with the process."""
        self._stop.set()
        self._dirty.set()
        for thread in self._threads:
            if thread.name in ("reconcile", "leader-election"):
                thread.join(timeout=20)
        if self.settings.leader_elect:
            self.elector.release()
        self.metrics.leader.set(0)
        if self._server is not None:
            self._server.stop()
        log.info("controller stopped", extra={"identity": self.settings.identity})

    def wait(self, stop: threading.Event) -> None:
        # A timed wait keeps the main thread responsive to the signal handler that sets `stop`.
        while not stop.wait(1.0):
            pass

    def health_problem(self) -> str | None:
        for thread in self._threads:
            if not thread.is_alive() and not self._stop.is_set():
                return f"thread {thread.name} exited"
        stalled = time.monotonic() - self._heartbeat
        if stalled > STALL_S:
            return f"reconcile loop stalled for {stalled:.0f}s"
        return None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._heartbeat = time.monotonic()
            self._dirty.wait(RESYNC_S)
            if self._stop.is_set():
                return
            time.sleep(DEBOUNCE_S)
            self._dirty.clear()
            if not all(c.synced.is_set() for c in self.caches.values()):
                continue
            try:
                report = self.reconciler.reconcile()
            except Exception:  # a bad object or API hiccup must not end the loop
                log.exception("reconcile pass failed")
                continue
            if report.allocated or report.deallocated or report.conflicts:
                # Our writes change the claims: look again soon rather than after a full resync.
                self._dirty.set()
