"""A real Kubernetes control plane on loopback: etcd, kube-apiserver,
kube-scheduler and kube-controller-manager, built by tests/cluster/build.sh.

One cluster serves both fake nodes (Node objects without a kubelet) and real
kubelet nodes. To keep fake nodes schedulable forever, the apiserver runs
without the TaintNodesByCondition admission plugin and the controller manager
without the node-lifecycle controller. The price: nodes never become NotReady
or get tainted when their kubelet stops, so tests must not rely on node-failure
handling (taint-based eviction). A control plane of its own with
`node_lifecycle=True` runs those controllers (node-lifecycle and
taint-eviction), as a real cluster does, for clusters with real kubelets only.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from devcluster import pki
from devcluster.binaries import CONTROL_PLANE_BINARIES, bin_dir, built_version, require_binaries
from devcluster.procs import ComponentError, ProcessGroup
from dracommon.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)

ADMIN_USER = "draplugin-admin"
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
DRA_API_VERSION = "resource.k8s.io/v1"

# The controllers a DRA test cluster needs; node-lifecycle is left out on
# purpose (module docstring).
CONTROLLERS = (
    "resourceclaim-controller",
    "device-taint-eviction-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "replicaset-controller",
    "deployment-controller",
    "daemonset-controller",
    "job-controller",
    "pod-garbage-collector-controller",
)
# What a real cluster adds: NotReady and unreachable taints on a silent node, and eviction after the
# pods' tolerations.
NODE_FAILURE_CONTROLLERS = ("node-lifecycle-controller", "taint-eviction-controller")


@dataclass(frozen=True)
class DRASettings:
    """Feature gates and API versions that switch on the DRA features we use."""

    feature_gates: str
    runtime_config: str


def dra_settings(kubernetes_version: str) -> DRASettings:
    """Per-release DRA switches; $DRA_FEATURE_GATES / $DRA_RUNTIME_CONFIG override."""
    minor = int(kubernetes_version.split(".")[1])
    if minor <= 34:
        # 1.34: taints, partitionable devices, consumable capacity, binding
        # conditions and extended resources are alpha; DeviceTaintRule is v1alpha3.
        # ResourceHealthStatus (alpha until 1.36) makes the kubelet open our
        # device health stream, as 1.37's does by default.
        defaults = DRASettings(
            "DRADeviceTaints=true,DRAPartitionableDevices=true,DRAConsumableCapacity=true,"
            "DRADeviceBindingConditions=true,DRAExtendedResource=true,ResourceHealthStatus=true",
            "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true",
        )
    else:
        # 1.37 serves everything we use from resource.k8s.io/v1 with defaults.
        defaults = DRASettings("", "")
    return DRASettings(
        os.environ.get("DRA_FEATURE_GATES", defaults.feature_gates),
        os.environ.get("DRA_RUNTIME_CONFIG", defaults.runtime_config),
    )


def free_port() -> int:
    """An ephemeral loopback port (the kernel may hand it out again later,
    a race we accept in a single-user test machine)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_ok(url: str, token: str | None = None, ca_file: Path | None = None) -> bool:
    """True when GET url answers 200. Without ca_file TLS is not verified:
    used only for components' own self-signed health endpoints on loopback."""
    if ca_file is not None:
        context = ssl.create_default_context(cafile=str(ca_file))
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=context, timeout=3) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ssl.SSLError):
        return False


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: dict[str, str], name: str) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    path.chmod(0o600)
    return path


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager.

    `start()` blocks until every component is ready (or raises ComponentError
    with the failing component's log tail); `stop()` stops them all.
    """

    def __init__(
        self,
        state_dir: Path,
        binaries: Path | None = None,
        startup_timeout: float = 180.0,
        node_lifecycle: bool = False,
    ) -> None:
        self.state_dir = state_dir
        self.controllers = CONTROLLERS + (NODE_FAILURE_CONTROLLERS if node_lifecycle else ())
        self.bin_dir = binaries or bin_dir()
        self.logs = state_dir / "logs"
        self.pki_dir = state_dir / "pki"
        self.token = secrets.token_urlsafe(32)
        self.kubeconfig = state_dir / "kubeconfig"
        self.startup_timeout = startup_timeout
        self.kubernetes_version = built_version(self.bin_dir)
        self.dra = dra_settings(self.kubernetes_version)
        self.processes = ProcessGroup(self.logs)
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.etcd_url = ""
        self.startup_seconds = 0.0
        self._client_ca: pki.CertKey | None = None

    # ----------------------------------------------------------- public API

    @property
    def ca_file(self) -> Path:
        """The apiserver's self-signed serving certificate bundle (cert, then its CA)."""
        return self.pki_dir / "apiserver.crt"

    @property
    def client_ca(self) -> pki.CertKey:
        """The CA the apiserver trusts for client certificates (node identities)."""
        if self._client_ca is None:
            raise RuntimeError("control plane not started")
        return self._client_ca

    def start(self) -> None:
        started = time.monotonic()
        require_binaries(self.bin_dir, CONTROL_PLANE_BINARIES)
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_scheduler_and_controllers()
            self._wait_for_cluster_objects()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        log.info("control plane ready server=%s seconds=%.1f", self.server, self.startup_seconds)

    def stop(self) -> None:
        self.processes.stop_all()

    def api_client(self) -> k8s.ApiClient:
        """A client with the admin identity (group system:masters): the kubeconfig's settings."""
        return self.token_client(self.token)

    def token_client(self, token: str) -> k8s.ApiClient:
        configuration = k8s.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        return k8s.ApiClient(configuration)

    def service_account_token(self, namespace: str, name: str, expiration_seconds: int = 3600) -> str:
        """A bound token for the ServiceAccount (created if missing), via TokenRequest."""
        base = f"/api/v1/namespaces/{namespace}/serviceaccounts"
        with self.api_client() as admin:
            rest = KubeApi(admin)
            try:
                rest.create(base, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
            except ApiError as err:
                if err.status != 409:
                    raise
            response = rest.create(f"{base}/{name}/token", {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": [SERVICE_ACCOUNT_ISSUER], "expirationSeconds": expiration_seconds},
            })  # fmt: skip
            token: str = response["status"]["token"]
            return token

    def service_account_client(self, namespace: str, name: str) -> k8s.ApiClient:
        """A client that acts as system:serviceaccount:<namespace>:<name> (RBAC applies)."""
        return self.token_client(self.service_account_token(namespace, name))

    def get_json(self, path: str) -> dict[str, Any]:
        """GET an API path with the admin identity; for discovery documents."""
        with self.api_client() as api:
            return KubeApi(api, timeout_s=10).get(path)

    # ------------------------------------------------------------ start-up

    def _gate_flags(self) -> list[str]:
        return [f"--feature-gates={self.dra.feature_gates}"] if self.dra.feature_gates else []

    def _start_etcd(self) -> None:
        client_port, peer_port = free_port(), free_port()
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        self.etcd_url = client_url
        etcd = self.processes.start("etcd", [
            str(self.bin_dir / "etcd"),
            "--name=draplugin-test",
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=draplugin-test={peer_url}",
            # Throw-away data: durability only costs time.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])  # fmt: skip
        self.processes.wait_until("etcd /health", lambda: http_ok(f"{client_url}/health"), 60, blame=etcd)

    def _start_apiserver(self) -> None:
        service_account_key = pki.rsa_key(self.pki_dir / "service-account.key")
        self._client_ca = pki.self_signed_ca(self.pki_dir, "draplugin-test-client-ca")
        # The identity the apiserver shows kubelets (logs, exec, port-forward);
        # what it may do there is RBAC's answer (_allow_kubelet_api).
        kubelet_client = pki.client_cert(
            self._client_ca, self.pki_dir, "apiserver-kubelet-client", KUBELET_CLIENT_USER, ()
        )
        tokens = self.state_dir / "tokens.csv"
        tokens.write_text(f'{self.token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        tokens.chmod(0o600)
        runtime_config = [f"--runtime-config={self.dra.runtime_config}"] if self.dra.runtime_config else []
        apiserver = self.processes.start("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={self.pki_dir}",
            f"--token-auth-file={tokens}",
            f"--client-ca-file={self._client_ca.cert}",
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={self._client_ca.cert}",
            # Kubelets serve on loopback and their nodes say so (devcluster/kubelet.py).
            "--kubelet-preferred-address-types=InternalIP",
            # Node authorizer + NodeRestriction: a kubelet sees only what its
            # node may see, as in a real cluster.
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={service_account_key}",
            f"--service-account-signing-key-file={service_account_key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # Loopback addresses are not valid Endpoints for the `kubernetes` Service.
            "--endpoint-reconciler-type=none",
            # Two cores: no request fairness bookkeeping.
            "--enable-priority-and-fairness=false",
            "--v=2",
            *runtime_config,
            *self._gate_flags(),
        ])  # fmt: skip
        self.processes.wait_until(
            "kube-apiserver /readyz",
            lambda: self.ca_file.exists() and http_ok(f"{self.server}/readyz", self.token, self.ca_file),
            self.startup_timeout,
            blame=apiserver,
        )
        write_kubeconfig(self.kubeconfig, self.server, self.ca_file, {"token": self.token}, "draplugin-test")
        self._allow_kubelet_api()

    def _allow_kubelet_api(self) -> None:
        """Let the apiserver's kubelet client identity use the kubelet API, as kubeadm does."""
        with self.api_client() as admin:
            try:
                KubeApi(admin).create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": "draplugin-apiserver-kubelet-client"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": "system:kubelet-api-admin"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": KUBELET_CLIENT_USER}],
                })  # fmt: skip
            except ApiError as err:
                if err.status != 409:  # a restarted control plane on kept state has it
                    raise

    def _start_scheduler_and_controllers(self) -> None:
        common = [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--v=2",
            *self._gate_flags(),
        ]
        scheduler_port, controller_port = free_port(), free_port()
        scheduler = self.processes.start("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"),
            f"--secure-port={scheduler_port}",
            f"--cert-dir={self.state_dir / 'scheduler-pki'}",
            *common,
        ])  # fmt: skip
        controllers = self.processes.start("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"),
            f"--secure-port={controller_port}",
            f"--cert-dir={self.state_dir / 'controller-manager-pki'}",
            f"--service-account-private-key-file={self.pki_dir / 'service-account.key'}",
            f"--root-ca-file={self.ca_file}",
            # Controllers act with the admin identity: fewer tokens to mint at
            # start-up; their RBAC is upstream's business, not ours.
            "--use-service-account-credentials=false",
            f"--controllers={','.join(self.controllers)}",
            *common,
        ])  # fmt: skip
        self.processes.wait_until(
            "kube-scheduler /healthz",
            lambda: http_ok(f"https://127.0.0.1:{scheduler_port}/healthz"),
            self.startup_timeout,
            blame=scheduler,
        )
        self.processes.wait_until(
            "kube-controller-manager /healthz",
            lambda: http_ok(f"https://127.0.0.1:{controller_port}/healthz"),
            self.startup_timeout,
            blame=controllers,
        )

    def _wait_for_cluster_objects(self) -> None:
        def serves_dra_v1() -> bool:
            try:
                group = self.get_json("/apis/resource.k8s.io")
            except ApiError:  # not served yet (404), or the server is still starting
                return False
            return DRA_API_VERSION in {v["groupVersion"] for v in group.get("versions", [])}

        self.processes.wait_until(f"{DRA_API_VERSION} to be served", serves_dra_v1, 60)
        controllers = next(c for c in self.processes.components if c.name == "kube-controller-manager")
        self.processes.wait_until(
            "ServiceAccount default/default",
            lambda: http_ok(f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
                            self.token, self.ca_file),
            self.startup_timeout,
            blame=controllers,
        )  # fmt: skip


__all__ = ["ComponentError", "ControlPlane", "DRASettings", "dra_settings", "write_kubeconfig"]
