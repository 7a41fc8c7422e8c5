"""What the kubelet plugin's own token may do to Pods, on the real API server.

With `kubeletPlugin.mpsDaemon: pod` (the default) the plugin's Role grants
pods create and delete in the release namespace, for its MPS control daemon
Pods. RBAC cannot say which Pods; the chart's ValidatingAdmissionPolicy
(`kubeletplugin-pod-policy.yaml`) must. These tests install the chart's
RBAC and policies as Helm renders them, take a token bound to a plugin pod on
node A (TokenRequest with a pod as bound object: the token carries node A as
`authentication.kubernetes.io/node-name`, as the kubelet-mounted one does),
and check with it, with server dry runs and real calls:

- a hostile Pod (privileged, host PID and network, the host's `/` mounted
  writable, on node B, as the controller's ServiceAccount) is refused, and so
  is each of those changes alone made to a good daemon Pod;
- deleting the controller's Pod, or a daemon Pod of node B, is refused;
- the exact daemon Pod `draplugin.prepare.mpspod.PodRunner.pod` builds for
  node A, with the settings the chart's DaemonSet gives the plugin and owned
  by the chart's DaemonSet (as `mpspod.daemonset_owner` reads it from a plugin
  pod), is accepted, and so is deleting it; another owner, or the DaemonSet
  as its controller, or a pull secret the chart does not name, is refused.

Run on the pinned release and on the 1.34 floor (DRA_KUBE_BIN_DIR from
tests/cluster/build_compat.sh).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.dynamic import DynamicClient

from devcluster.chart import FAKE_GPU_VALUES, deep_merge
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from draplugin.prepare.mpspod import PodRunner, PodSettings, daemonset_owner
from draplugin.prepare.wiring import LIBRARY_VIEWS
from tests.integration.test_chart import DRIVER, render_chart
from tests.integration.test_rbac import Installed, pod_bound_token, unbound_token

pytestmark = pytest.mark.cluster

TEMPLATES = (
    "templates/kubeletplugin-rbac.yaml",
    "templates/kubeletplugin-resourceslice-policy.yaml",
    "templates/kubeletplugin-pod-policy.yaml",
    "templates/controller-rbac.yaml",
    "templates/kubeletplugin-daemonset.yaml",
)
# The chart's defaults (real GPUs: a privileged plugin, the host's / as driver root) and the fake-GPU
# values `make cluster` starts from (an unprivileged plugin, a fake driver root).
VALUE_SETS: dict[str, dict[str, Any]] = {
    "nvml": {"imagePullSecrets": [{"name": "regcred"}]},
    "fake": deep_merge(
        yaml.safe_load(FAKE_GPU_VALUES.read_text()),
        {"kubeletPlugin": {"backend": "fake", "privileged": False, "fakeDriverRoot": "/opt/fake-driver"}},
    ),
}
POLICY_MESSAGE = "the kubelet plugin"


@dataclass(frozen=True)
class Chart:
    installed: Installed
    # The plugin container's environment as the chart's DaemonSet sets it (fieldRefs left out).
    env: Mapping[str, str]
    values: str
    daemonset: str  # the DaemonSet's name, the daemon Pods' owner
    daemonset_uid: str


@pytest.fixture(params=list(VALUE_SETS))
def chart(
    request: pytest.FixtureRequest, kube_cluster: ControlPlane, test_namespace: str, tmp_path: Path
) -> Iterator[Chart]:
    """The chart's RBAC and admission policies, as Helm renders them, created in the test namespace."""
    release = f"powers-{uuid.uuid4().hex[:6]}"
    objects = render_chart(
        tmp_path, VALUE_SETS[request.param], release=release, namespace=test_namespace, show_only=TEMPLATES
    )
    daemonset = next(o for o in objects if o["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}
    created: list[tuple[Any, str]] = []
    with kube_cluster.api_client() as api:
        dynamic = DynamicClient(api)  # type: ignore[no-untyped-call]
        try:
            for obj in objects:
                if obj["kind"] == "DaemonSet":
                    # No plugin runs here: a DaemonSet of the chart's name that schedules no pod, so
                    # the daemon Pods' owner exists (the garbage collector deletes a Pod whose does not).
                    obj = dict(obj, spec=stand_in_daemonset_spec())
                resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                namespace = test_namespace if resource.namespaced else None
                resource.create(body=obj, namespace=namespace)
                if namespace is None:  # namespaced objects go with the test namespace
                    created.append((resource, obj["metadata"]["name"]))
            sas = [o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"]
            installed = Installed(
                test_namespace,
                next(name for name in sas if name.endswith("-kubelet-plugin")),
                next(name for name in sas if name.endswith("-controller")),
            )
            # Daemon Pods run as the namespace's default ServiceAccount, which the controller manager adds.
            rest = KubeApi(api)
            wait_for(
                "the namespace's default ServiceAccount",
                lambda: exists(rest, f"/api/v1/namespaces/{test_namespace}/serviceaccounts/default"),
                timeout=60,
            )
            name = daemonset["metadata"]["name"]
            uid = rest.get(f"/apis/apps/v1/namespaces/{test_namespace}/daemonsets/{name}")["metadata"]["uid"]
            yield Chart(installed, env, request.param, name, uid)
        finally:
            for resource, name in reversed(created):
                resource.delete(name=name)


@pytest.fixture
def admin(kube_cluster: ControlPlane) -> Iterator[k8s.ApiClient]:
    with kube_cluster.api_client() as api:
        yield api


def daemon_pod(admin: k8s.ApiClient, chart: Chart, node: str, claim_uid: str) -> dict[str, Any]:
    """The daemon Pod the plugin on `node` builds for a claim, with the settings the chart gives it
    (as draplugin.prepare.wiring passes them on)."""
    env = chart.env
    state = Path(env["STATE_DIR"])
    settings = PodSettings(
        namespace=chart.installed.namespace,
        node_name=node,
        driver_name=env["DRIVER_NAME"],
        image=env["MPS_DAEMON_IMAGE"],
        pull_policy=env["MPS_DAEMON_IMAGE_PULL_POLICY"],
        driver_root=env["DRIVER_ROOT"],
        driver_root_mount=Path(env["DRIVER_ROOT_MOUNT"]),
        library_views=state / LIBRARY_VIEWS,
        privileged=env["BACKEND"] == "nvml",
        image_pull_secrets=tuple(filter(None, env.get("MPS_DAEMON_IMAGE_PULL_SECRETS", "").split(","))),
    )
    claim_dir = state / "mps" / claim_uid
    mount = Path(env["DRIVER_ROOT_MOUNT"])
    tool_env = {
        "PATH": f"{mount}/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": str(state / LIBRARY_VIEWS / "550.54.15-0123456789abcdef"),
        "CUDA_MPS_PIPE_DIRECTORY": str(claim_dir / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(claim_dir / "log"),
        "CUDA_VISIBLE_DEVICES": "GPU-4e5a7a0c-0000-0000-0000-000000000000",
    }
    runner = PodRunner(KubeApi(admin), settings)
    control = mount / "usr" / "bin" / "nvidia-cuda-mps-control"
    # The plugin pod as the DaemonSet controller makes it: a controller reference to the DaemonSet.
    plugin_pod = {"metadata": {"ownerReferences": [{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": chart.daemonset, "uid": chart.daemonset_uid,
        "controller": True, "blockOwnerDeletion": True,
    }]}}  # fmt: skip
    return runner.pod(claim_uid, control, tool_env, claim_dir, daemonset_owner(plugin_pod))


def stand_in_daemonset_spec() -> dict[str, Any]:
    """A DaemonSet spec whose pods fit no node: only its name and UID matter here."""
    labels = {"app.kubernetes.io/component": "powers-stand-in"}
    return {
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": {
                "nodeSelector": {"draplugin.dev/no-such-node": "true"},
                "containers": [{"name": "none", "image": "busybox:1.37"}],
            },
        },
    }


def exists(api: KubeApi, path: str) -> bool:
    try:
        api.get(path)
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True


def refusal(call: Callable[[], object]) -> str | None:
    """The API server's 403 message for `call`, or None when it is accepted."""
    try:
        call()
    except ApiError as err:
        assert err.status == 403, err
        return err.message
    return None


def pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


DRY_RUN = {"dryRun": "All"}


def hostile_pod(node: str, service_account: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"hostile-{uuid.uuid4().hex[:6]}"},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "hostPID": True,
            "hostNetwork": True,
            "containers": [
                {
                    "name": "shell",
                    "image": "busybox:1.37",
                    "command": ["sh", "-c", "sleep 1d"],
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }


@contextmanager
def plugin_client(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, chart: Chart, node: str
) -> Iterator[KubeApi]:
    """The API as the plugin pod on `node` (its pod-bound token), once the Pod policy is enforced for it."""
    client = kube_cluster.token_client(pod_bound_token(admin, chart.installed, node))
    api = KubeApi(client)
    ns = chart.installed.namespace

    def enforced() -> bool:
        probe = hostile_pod(node, chart.installed.controller_sa)
        try:
            api.create(pods(ns), probe, DRY_RUN)
        except ApiError as err:
            return err.status == 403 and POLICY_MESSAGE in err.message
        return False

    with client:
        wait_for("the MPS daemon pod admission policy to be enforced", enforced, timeout=60)
        yield api


# Each one change to the good daemon Pod, and what the refusal says (a word of its message).
def _set(path: str, value: Any) -> Callable[[dict[str, Any], Chart, str], None]:
    def change(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
        *parents, last = path.split(".")
        target = pod
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target.setdefault(key, {})
        target[last] = value(chart, other_node) if callable(value) else value

    return change


def _mount_host(path: str, read_only: bool) -> Callable[[dict[str, Any], Chart, str], None]:
    def change(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
        pod["spec"]["volumes"].append({"name": "host", "hostPath": {"path": path}})
        mount = {"name": "host", "mountPath": "/host", "readOnly": read_only}
        pod["spec"]["containers"][0]["volumeMounts"].append(mount)

    return change


def _writable_driver_root(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
    for mount in pod["spec"]["containers"][0]["volumeMounts"]:
        if mount["name"] == "driver-root":
            mount["readOnly"] = False


def _secret_env(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
    ref = {"secretKeyRef": {"name": "sh.helm.release.v1.draplugin.v1", "key": "release"}}
    pod["spec"]["containers"][0]["env"].append({"name": "STOLEN", "valueFrom": ref})


def _owner(**changes: Any) -> Callable[[dict[str, Any], Chart, str], None]:
    def change(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
        (ref,) = pod["metadata"]["ownerReferences"]
        ref.update(changes)

    return change


def _second_container(pod: dict[str, Any], chart: Chart, other_node: str) -> None:
    pod["spec"]["containers"].append(dict(pod["spec"]["containers"][0], name="extra"))


CHANGES: dict[str, tuple[Callable[[dict[str, Any], Chart, str], None], str]] = {
    "other node": (
        _set("spec.nodeName", lambda chart, other: other),
        "may only create or delete MPS daemon pods with spec.nodeName",
    ),
    "controller's ServiceAccount": (
        _set("spec.serviceAccountName", lambda chart, other: chart.installed.controller_sa),
        "default ServiceAccount",
    ),
    "token mounted": (_set("spec.automountServiceAccountToken", True), "automountServiceAccountToken"),
    "host network": (_set("spec.hostNetwork", True), "no host network"),
    "host PID": (_set("spec.hostPID", True), "no host network, PID"),
    "host IPC": (_set("spec.hostIPC", True), "no host network, PID or IPC"),
    "seccomp unconfined": (_set("spec.securityContext.seccompProfile", {"type": "Unconfined"}), "seccomp"),
    "other image": (_set("spec.containers.0.image", "busybox:1.37"), "this release's image"),
    "a shell": (_set("spec.containers.0.command", ["sh", "-c", "sleep 1d"]), "nvidia-cuda-mps-control -f"),
    "a binary of the claim's directory": (
        _set("spec.containers.0.command", ["/driver-root/../var/lib/nvidia-cuda-mps-control", "-f"]),
        "nvidia-cuda-mps-control -f",
    ),
    "a second container": (_second_container, "one container"),
    "a Secret in its environment": (_secret_env, "no environment from Secrets"),
    "the host's /etc": (_mount_host("/etc", read_only=True), "mounts only host paths"),
    "the driver root writable": (_writable_driver_root, "read only"),
    "another pod's name": (_set("metadata.name", "controller"), "may only create MPS control daemon pods"),
    "a Service's label": (_set("metadata.labels.app", "web"), "only its own labels"),
    "owned by its Node": (
        _owner(apiVersion="v1", kind="Node", name="n"),
        "no owner but this release's DaemonSet",
    ),
    "owned by another DaemonSet": (
        _owner(name="other-kubelet-plugin"),
        "no owner but this release's DaemonSet",
    ),
    "the DaemonSet as its controller": (_owner(controller=True), "not as its controller"),
    "blocking the DaemonSet's deletion": (_owner(blockOwnerDeletion=True), "not blocking its deletion"),
    "a pull secret the chart does not name": (
        _set("spec.imagePullSecrets", [{"name": "sh.helm.release.v1.draplugin.v1"}]),
        "no image pull secrets but the chart's",
    ),
}
PRIVILEGED_CHANGE = (_set("spec.containers.0.securityContext", {"privileged": True}), "runs unprivileged")


def test_plugin_token_cannot_start_a_hostile_pod_or_delete_the_controller(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, chart: Chart, fake_node: Callable[..., str]
) -> None:
    node_a, node_b = fake_node(), fake_node()
    ns = chart.installed.namespace
    rest = KubeApi(admin)
    # The controller's Pod (created by the admin, as its Deployment would) and a daemon Pod of node B.
    controller: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller", "labels": {"app.kubernetes.io/component": "controller"}},
        "spec": {
            "nodeName": node_b,
            "serviceAccountName": chart.installed.controller_sa,
            "containers": [{"name": "controller", "image": "busybox:1.37"}],
        },
    }
    rest.create(pods(ns), controller)
    other = daemon_pod(admin, chart, node_b, str(uuid.uuid4()))
    rest.create(pods(ns), other)

    with plugin_client(kube_cluster, admin, chart, node_a) as plugin:
        hostile = hostile_pod(node_b, chart.installed.controller_sa)
        message = refusal(lambda: plugin.create(pods(ns), hostile, DRY_RUN))
        assert message is not None, "the plugin's token may create a privileged host pod on another node"
        assert "may only create MPS control daemon pods" in message, message
        # The same on its own node, named and labelled as a daemon Pod: still refused (its shape).
        disguised = copy.deepcopy(hostile)
        uid = str(uuid.uuid4())
        disguised["metadata"] = {
            "name": f"mps-{uid}",
            "labels": {"app.kubernetes.io/component": "mps-control-daemon", f"{DRIVER}/claim-uid": uid},
        }
        disguised["spec"]["nodeName"] = node_a
        message = refusal(lambda: plugin.create(pods(ns), disguised, DRY_RUN))
        assert message is not None, (
            "the plugin's token may create a privileged host pod named as a daemon pod"
        )

        message = refusal(lambda: plugin.delete(f"{pods(ns)}/controller", query=DRY_RUN))
        assert message is not None, "the plugin's token may delete the controller's pod"
        assert "may only change or delete MPS control daemon pods" in message, message
        assert refusal(lambda: plugin.delete(f"{pods(ns)}/controller")) is not None
        assert "deletionTimestamp" not in rest.get(f"{pods(ns)}/controller")["metadata"]

        message = refusal(lambda: plugin.delete(f"{pods(ns)}/{other['metadata']['name']}"))
        assert message is not None, "node A's plugin may delete node B's MPS daemon pod"
        assert f"with spec.nodeName {node_a}" in message, message


def test_plugin_token_creates_and_deletes_exactly_its_daemon_pod(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, chart: Chart, fake_node: Callable[..., str]
) -> None:
    node_a, node_b = fake_node(), fake_node()
    ns = chart.installed.namespace
    uid = str(uuid.uuid4())
    good = daemon_pod(admin, chart, node_a, uid)
    changes = dict(CHANGES)
    if chart.values == "fake":  # an unprivileged plugin: no privileged daemon either
        changes["privileged"] = PRIVILEGED_CHANGE
    with plugin_client(kube_cluster, admin, chart, node_a) as plugin:

        def dry_run(pod: dict[str, Any]) -> str | None:
            return refusal(lambda: plugin.create(pods(ns), pod, DRY_RUN))

        assert dry_run(good) is None
        accepted = []
        for what, (change, expected) in changes.items():
            pod = copy.deepcopy(good)
            change(pod, chart, node_b)
            message = dry_run(pod)
            if message is None:
                accepted.append(what)
            else:
                assert expected in message, f"{what}: {message}"
        assert not accepted, f"the plugin's token may create a daemon pod with: {accepted}"

        # For real: created, then deleted, by the plugin's token (as prepare and unprepare do).
        created = plugin.create(pods(ns), good)
        assert created["metadata"]["name"] == f"mps-{uid}"
        plugin.delete(f"{pods(ns)}/mps-{uid}", {"gracePeriodSeconds": 0})
    rest = KubeApi(admin)
    wait_for("the daemon pod to be deleted", lambda: not exists(rest, f"{pods(ns)}/mps-{uid}"), timeout=30)


def test_token_without_node_binding_cannot_create_daemon_pods(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, chart: Chart, fake_node: Callable[..., str]
) -> None:
    node_a = fake_node()
    ns = chart.installed.namespace
    with plugin_client(kube_cluster, admin, chart, node_a):
        pass  # the policy is enforced
    with kube_cluster.token_client(
        unbound_token(admin, chart.installed, chart.installed.plugin_sa)
    ) as client:
        pod = daemon_pod(admin, chart, node_a, str(uuid.uuid4()))
        message = refusal(lambda: KubeApi(client).create(pods(ns), pod, DRY_RUN))
    assert message is not None and "not bound to a node" in message, message


def test_deleting_the_daemonset_as_helm_uninstall_does_takes_its_daemon_pods_along(
    kube_cluster: ControlPlane, admin: k8s.ApiClient, chart: Chart, fake_node: Callable[..., str]
) -> None:
    """The daemon Pods' owner is the plugin's DaemonSet: `helm uninstall` deletes it (background
    propagation, Helm's default cascade) and the garbage collector deletes the daemon Pods, which a
    plugin pod's restart (the DaemonSet stays) never does (tests/e2e/test_chart_mps.py)."""
    node_a = fake_node()
    ns = chart.installed.namespace
    uid = str(uuid.uuid4())
    with plugin_client(kube_cluster, admin, chart, node_a) as plugin:
        plugin.create(pods(ns), daemon_pod(admin, chart, node_a, uid))
    rest = KubeApi(admin)
    assert exists(rest, f"{pods(ns)}/mps-{uid}")
    rest.delete(
        f"/apis/apps/v1/namespaces/{ns}/daemonsets/{chart.daemonset}", {"propagationPolicy": "Background"}
    )
    # Deleted by the collector: gone, or terminating (a fake node has no kubelet to confirm the end).
    path = f"{pods(ns)}/mps-{uid}"

    def collected() -> bool:
        try:
            return "deletionTimestamp" in rest.get(path)["metadata"]
        except ApiError as err:
            return err.status == 404

    wait_for("the garbage collector to delete the daemon pod", collected, 60)
    if exists(rest, path):  # the end no kubelet confirms here
        rest.delete(path, {"gracePeriodSeconds": 0})
