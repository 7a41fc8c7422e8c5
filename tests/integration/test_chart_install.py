"""The chart on day one: which nodes it runs on, Pod Security, the values NVIDIA's users set first.

Rendered with `helm template` (tests/integration/test_chart.py's render_chart), and for what the
install notes say about the cluster (their `lookup`s of nodes and the namespace), `helm install
--dry-run=server` against the real API server, whose PodSecurity admission (on by default in
kube-apiserver) also shows what a namespace enforcing `baseline` does to the plugin's pods. The
packaged chart installed for real: tests/e2e/test_chart_live.py.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.run.podsecurity import PodSecurityCheck
from devcluster.binaries import REPO_ROOT
from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from tests.integration.test_chart import container_env, only, render_chart
from tests.kube.chart import CHART, HelmError, run_helm

# The labels NVIDIA's charts select GPU nodes by (deploy/helm/draplugin/templates/_helpers.tpl says
# where each comes from), any one enough.
GPU_NODE_LABELS = [
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
    "nvidia.com/gpu.present",
]
NO_GPU_NODE = "WARNING: no node has a GPU node label"
PSA_WARNING = 'enforces the Pod Security level "baseline"'


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


def install_notes(helm_output: str) -> str:
    """The NOTES part of `helm install`'s output (the rendered manifests come before it)."""
    _, found, notes = helm_output.partition("\nNOTES:\n")
    assert found, helm_output[-2000:]
    return notes


@pytest.fixture
def kube(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


def plugin_pod(helm_home: Path, values: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    spec: dict[str, Any] = only(render_chart(helm_home, values, **kw), "DaemonSet")["spec"]["template"][
        "spec"
    ]
    return spec


# --- which nodes ------------------------------------------------------------------------------------


def test_the_plugin_runs_on_any_node_nfd_or_the_gpu_operator_marks_as_an_nvidia_gpu_node(
    helm_home: Path,
) -> None:
    """NVIDIA's terms, ORed: NFD's PCI labels alone (no GPU operator, no GFD) are enough."""
    pod = plugin_pod(helm_home)
    assert "nodeSelector" not in pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {"matchExpressions": [{"key": label, "operator": "In", "values": ["true"]}]}
        for label in GPU_NODE_LABELS
    ]


def test_the_users_node_affinity_replaces_ours_and_other_affinities_stay(helm_home: Path) -> None:
    mine = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]},
    ]}}  # fmt: skip
    pod = plugin_pod(helm_home, {"kubeletPlugin": {"affinity": {"nodeAffinity": mine}}})
    assert pod["affinity"] == {"nodeAffinity": mine}
    anti = {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "kubernetes.io/hostname"}]}
    pod = plugin_pod(helm_home, {"kubeletPlugin": {"affinity": {"podAntiAffinity": anti}}})
    assert pod["affinity"]["podAntiAffinity"] == anti
    assert "nodeAffinity" in pod["affinity"]


def test_the_no_gpu_node_warning_stays_quiet_under_a_client_dry_run(helm_home: Path) -> None:
    """--dry-run=client sees no cluster (lookup answers nothing): no warning about nodes it cannot see."""
    out = run_helm(
        ["install", "r", str(CHART), "-n", "dra", "--dry-run=client"], helm_home, helm_home / "none"
    )
    notes = install_notes(out)
    assert "is installed in namespace dra" in notes
    assert "WARNING" not in notes and "Pod Security" not in notes


@pytest.mark.cluster
def test_the_install_notes_warn_only_while_no_node_has_a_gpu_label(
    helm_home: Path,
    kube_cluster: ControlPlane,
    kube: KubeApi,
    test_namespace: str,
    fake_node: Callable[..., str],
) -> None:
    def notes() -> str:
        args = ["install", f"n-{uuid.uuid4().hex[:6]}", str(CHART), "-n", test_namespace, "--dry-run=server"]
        return install_notes(run_helm(args, helm_home, kube_cluster.kubeconfig))

    api = kube
    gpu_nodes = [
        n["metadata"]["name"]
        for n in api.get("/api/v1/nodes")["items"]
        if any((n["metadata"].get("labels") or {}).get(label) == "true" for label in GPU_NODE_LABELS)
    ]
    assert not gpu_nodes, f"another test left GPU-labelled nodes: {gpu_nodes}"
    assert NO_GPU_NODE in notes()
    fake_node(labels={"feature.node.kubernetes.io/pci-0302_10de.present": "true"})  # NFD, nothing else
    assert NO_GPU_NODE not in notes()


# --- Pod Security -------------------------------------------------------------------------------------


def plugin_daemonset(
    helm_home: Path, kube: KubeApi, namespace: str, values: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The chart's DaemonSet for `namespace`, with its ServiceAccounts created there (a pod of a
    missing ServiceAccount is refused for that, before Pod Security has its say)."""
    objects = render_chart(helm_home, values, namespace=namespace)
    for account in (o for o in objects if o["kind"] == "ServiceAccount"):
        try:
            kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)
        except ApiError as err:
            if err.status != 409:
                raise
    return dict(only(objects, "DaemonSet"))


def probe_pod(daemonset: dict[str, Any]) -> dict[str, Any]:
    """A Pod of the DaemonSet's template: what the DaemonSet controller would create."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plugin-probe"},
            "spec": daemonset["spec"]["template"]["spec"]}  # fmt: skip


@pytest.mark.cluster
def test_a_namespace_enforcing_baseline_refuses_the_plugin_and_the_notes_say_how_to_fix_it(
    helm_home: Path, kube_cluster: ControlPlane, kube: KubeApi, test_namespace: str
) -> None:
    api = kube
    label = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}
    api.merge_patch(f"/api/v1/namespaces/{test_namespace}", label)
    # What the DaemonSet controller meets creating the plugin's pod there: PodSecurity refuses it
    # (hostPath volumes), in every mode; the fake-GPU values too.
    for values in (None, yaml.safe_load((REPO_ROOT / "deploy/helm/values-fake-gpus.yaml").read_text())):
        pod = probe_pod(plugin_daemonset(helm_home, api, test_namespace, values))
        with pytest.raises(ApiError) as refused:
            api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod, {"dryRun": "All"})
        assert refused.value.status == 403 and 'violates PodSecurity "baseline' in refused.value.message
        assert "hostPath volumes" in refused.value.message
    out = run_helm(
        ["install", "psa", str(CHART), "-n", test_namespace, "--dry-run=server"],
        helm_home,
        kube_cluster.kubeconfig,
    )
    out = install_notes(out)
    assert PSA_WARNING in out, out
    fix = (
        f"kubectl label namespace {test_namespace} --overwrite pod-security.kubernetes.io/enforce=privileged"
    )
    assert fix in out
    # Labelled as the notes say, the namespace admits the plugin's pod and the notes say nothing more.
    api.merge_patch(f"/api/v1/namespaces/{test_namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "privileged"}}})  # fmt: skip
    pod = probe_pod(plugin_daemonset(helm_home, api, test_namespace))
    api.create(f"/api/v1/namespaces/{test_namespace}/pods", pod, {"dryRun": "All"})
    out = run_helm(
        ["install", "psa", str(CHART), "-n", test_namespace, "--dry-run=server"],
        helm_home,
        kube_cluster.kubeconfig,
    )
    assert "Pod Security" not in install_notes(out)


@pytest.mark.cluster
def test_the_controller_reports_the_plugin_daemonset_refused_by_pod_security(
    helm_home: Path, kube: KubeApi, test_namespace: str, fake_node: Callable[..., str]
) -> None:
    """A namespace that enforces baseline (as --create-namespace's unlabelled one does under a
    cluster default of baseline): the real DaemonSet controller's pod creations are refused, and
    the controller's check (`dra-controller run --plugin-namespace`, the chart passes it) logs it and
    records PodSecurityRefused on the DaemonSet, naming the fix."""
    kube.merge_patch(f"/api/v1/namespaces/{test_namespace}", {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "baseline"}}})  # fmt: skip
    node = fake_node()
    pinned = {"kubeletPlugin": {"nodeSelector": {"kubernetes.io/hostname": node}}}
    daemonset = plugin_daemonset(helm_home, kube, test_namespace, pinned)
    # Only the fake node, affinity and all: give it the labels NVIDIA's GPU nodes have.
    kube.merge_patch(f"/api/v1/nodes/{node}", {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    created = kube.create(f"/apis/apps/v1/namespaces/{test_namespace}/daemonsets", daemonset)
    check = PodSecurityCheck(
        kube, test_namespace, controller="gpu.draplugin.dev/dra-controller", instance="t"
    )
    (refusal,) = wait_for(
        "the DaemonSet controller's FailedCreate Event", lambda: check.check_once() or None, 60
    )
    assert (refusal.uid, refusal.level) == (created["metadata"]["uid"], "baseline")
    assert "hostPath volumes" in refusal.detail and "privileged" in refusal.detail
    events = kube.get(f"/apis/events.k8s.io/v1/namespaces/{test_namespace}/events")["items"]
    (ours,) = [e for e in events if e["reason"] == "PodSecurityRefused"]
    assert ours["regarding"]["uid"] == created["metadata"]["uid"]
    assert (
        f"kubectl label namespace {test_namespace} --overwrite pod-security.kubernetes.io/enforce=privileged"
        in ours["note"]
    )


# --- values -------------------------------------------------------------------------------------------


def test_the_default_namespace_is_refused_unless_allowed(helm_home: Path) -> None:
    with pytest.raises(HelmError, match=r"refuses the default namespace.*allowDefaultNamespace=true"):
        render_chart(helm_home, namespace="default")
    assert render_chart(helm_home, {"allowDefaultNamespace": True}, namespace="default")


@pytest.mark.parametrize(
    ("values", "ours"),
    [
        ({"nvidiaDriverRoot": "/run/nvidia/driver"}, "kubeletPlugin.nvidiaDriverRoot"),
        ({"kubeletPlugin": {"gpuFeatureDiscovery": False}}, "kubeletPlugin.gpuNodeAffinity"),
    ],
    ids=["nvidia-top-level-driver-root", "renamed-gpu-feature-discovery"],
)
def test_a_key_of_nvidias_chart_or_an_old_one_names_ours(
    helm_home: Path, values: dict[str, Any], ours: str
) -> None:
    with pytest.raises(HelmError, match=ours.replace(".", r"\.")):
        render_chart(helm_home, values)


def test_log_level_and_feature_gates_reach_the_daemons(helm_home: Path) -> None:
    values = {
        "logLevel": "debug",
        "controller": {"featureGates": {"DRAPrioritizedList": False, "DRAConsumableCapacity": True},
                       "extraArgs": ["--event-after-seconds=30"]},
    }  # fmt: skip
    objects = render_chart(helm_home, values)
    (plugin,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert "--log-level=debug" in plugin["args"]
    (controller,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    args = controller["args"]
    assert "--log-level=debug" in args
    # Sorted by name (Go templates range over maps in key order), in the scheduler's syntax.
    assert "--feature-gates=DRAConsumableCapacity=true,DRAPrioritizedList=false" in args
    assert args[-1] == "--event-after-seconds=30"
    (default,) = only(render_chart(helm_home), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--log-level=info" in default["args"]
    assert not [a for a in default["args"] if a.startswith("--feature-gates")]


def test_security_contexts_merge_over_the_charts(helm_home: Path) -> None:
    selinux = {"seLinuxOptions": {"type": "spc_t"}}
    values = {
        "kubeletPlugin": {"podSecurityContext": {"fsGroup": 0}, "securityContext": selinux},
        "controller": {"podSecurityContext": {"runAsUser": 1000}, "securityContext": {"privileged": False}},
    }
    objects = render_chart(helm_home, values)
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 0}
    assert pod["containers"][0]["securityContext"] == {
        "privileged": True,
        "readOnlyRootFilesystem": True,
        **selinux,
    }
    controller = only(objects, "Deployment")["spec"]["template"]["spec"]
    assert controller["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert controller["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
        "privileged": False,
    }  # fmt: skip


def test_pod_labels_and_service_account_annotations(helm_home: Path) -> None:
    identity = {"iam.gke.io/gcp-service-account": "dra@example.iam.gserviceaccount.com"}
    values = {
        "kubeletPlugin": {"podLabels": {"team": "ml"}, "serviceAccount": {"annotations": identity}},
        "controller": {"podLabels": {"team": "platform"}, "serviceAccount": {"annotations": identity}},
    }
    objects = render_chart(helm_home, values)
    for kind, team in (("DaemonSet", "ml"), ("Deployment", "platform")):
        workload = only(objects, kind)
        assert workload["spec"]["template"]["metadata"]["labels"]["team"] == team
        assert "team" not in workload["spec"]["selector"]["matchLabels"]  # a selector is immutable
    accounts = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert len(accounts) == 2
    assert all(sa["metadata"]["annotations"] == identity for sa in accounts)
    assert all(
        "annotations" not in sa["metadata"]
        for sa in render_chart(helm_home)
        if sa["kind"] == "ServiceAccount"
    )


def test_the_controller_runs_where_and_as_nvidias_does(helm_home: Path) -> None:
    pod = only(render_chart(helm_home), "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {
        "key": "node-role.kubernetes.io/control-plane",
        "operator": "Exists",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    assert {"key": "CriticalAddonsOnly", "operator": "Exists"} in pod["tolerations"]


def test_mps_daemon_pods_get_the_charts_image_pull_secrets(helm_home: Path) -> None:
    secrets = [{"name": "regcred"}, {"name": "mirror"}]
    objects = render_chart(helm_home, {"imagePullSecrets": secrets})
    env = container_env(only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"][0])
    assert env["MPS_DAEMON_IMAGE_PULL_SECRETS"] == "regcred,mirror"
    policy = next(
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and "mps-daemon" in o["metadata"]["name"]
    )
    # The pull secrets the policy admits on a daemon Pod: the chart's only (test_faults_plugin_powers.py).
    (check,) = [v for v in policy["spec"]["validations"] if "imagePullSecrets" in v["expression"]]
    assert '["regcred","mirror"]' in check["expression"]
    assert "but the chart's (regcred, mirror)" in check["message"]
    default = container_env(
        only(render_chart(helm_home), "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    )
    assert "MPS_DAEMON_IMAGE_PULL_SECRETS" not in default


# --- one version -------------------------------------------------------------------------------------


def test_the_chart_version_app_version_and_package_version_are_one(helm_home: Path) -> None:
    """A release is one number: the chart's version and appVersion (the image's default tag) and the
    package's (tools/release.sh refuses to package them otherwise)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["version"] == chart["appVersion"] == package
    (container,) = only(render_chart(helm_home), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{package}")
