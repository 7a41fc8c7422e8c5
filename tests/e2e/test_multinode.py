"""Several real kubelet nodes, one control plane, the chart's DaemonSet on all of them.

A control plane of the module's own (node-lifecycle and taint-eviction
controllers on, as in a real cluster), one node set on it
(tests/e2e/conftest.py `node_set`: NODE_SET_SIZE kubelets, each
on its own containerd, with its own directories, loopback address, name and
fake GPU inventory: devcluster.nodeset.INVENTORIES) and one release of the
chart over it, started once for the module. What is checked:

- the DaemonSet runs one plugin pod per node, and each node's ResourceSlices
  are that node's inventory, published by the plugin pod on that node;
- the credentials a plugin pod really has (the service-account token the
  kubelet projects into it, bound to the pod and so to its node) may write its
  own node's ResourceSlice and not another node's: the chart's
  ValidatingAdmissionPolicy compares the token's node claim with the slice's
  spec.nodeName (server-side dry runs, so the plugins' slices stay as they are);
- kube-scheduler places a claim whose selector only one node's GPUs match on
  that node, and a shared claim's second pod beside its first;
- `dra-controller explain` for a pod that fits nowhere says, node by node, why;
- docs/operations.md's drain runbook, run command by command: a Deployment's
  pod on the drained node moves to another node, the node's plugin unprepares
  its claim (CDI spec and checkpoint entry gone) before the pod object goes,
  and the node's devices are tainted with a DeviceTaintRule (resource.k8s.io/v1
  on 1.37, v1alpha3 on 1.34 where the test cluster switches it on);
- node loss (kill -9 of a node's kubelet and plugin): the node goes NotReady,
  a pod tolerating that for 2 s is evicted and its Deployment's replacement
  runs on another node, the evicted pod's claim keeps its device (the pod
  might still run there: upstream's resourceclaim controller frees a claim
  only once its pod is gone or terminal) so no other claim gets it, the
  node's slices stay (owned by its Node, which exists); with the kubelet back
  the evicted pod is finished and unprepared, and a pod that tolerated the
  loss keeps its prepared claim through the plugin's restart.

Fake GPUs only (the plugin's fake backend): no NVIDIA software is involved on
this path. Run on the pinned release and on the 1.34 floor (DRA_KUBE_BIN_DIR
from `K8S_VERSION=v1.34.4 tests/cluster/build.sh`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from devcluster import pods
from devcluster.binaries import REPO_ROOT, MissingBinariesError
from devcluster.chart import ChartRelease
from devcluster.controlplane import ControlPlane
from devcluster.kubelet import KubeletNode, node_is_ready
from devcluster.nodeset import NODE_SET_LABEL, PLUGIN_STATE, NodeSet, plugin_pod_of, wait_published
from devcluster.objects import create_namespace, delete_namespace
from devcluster.procs import ComponentError
from devcluster.wait import wait_for
from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.kubeapi import ApiError, KubeApi
from draplugin.prepare.wiring import CHECKPOINT_FILE
from tests.e2e import scheduling
from tests.e2e.workloads import claim_pod
from tests.unit.test_docs import shell_commands

pytestmark = pytest.mark.kubelet

log = logging.getLogger(__name__)

DRIVER = DEFAULT_DRIVER_NAME
RESOURCE = "/apis/resource.k8s.io/v1"
POD_TIMEOUT = 120.0
# Where the kubelet mounts the token, below the container's root: /var/run is a symlink to /run in
# the image (Debian), and an absolute link read through /proc/<pid>/root would leave the container.
TOKEN = "run/secrets/kubernetes.io/serviceaccount/token"
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
DRAIN_HEADING = "### Draining a node, step by step"


def minor(cluster: ControlPlane) -> int:
    return int(cluster.kubernetes_version.removeprefix("v").split(".")[1])


@pytest.fixture(scope="module")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the module's own, with the controllers a real cluster runs on node failure
    (node-lifecycle, taint-eviction: devcluster.controlplane), which the session's cannot run beside
    its fake nodes; no other test's nodes or objects share it."""
    cluster = ControlPlane(tmp_path_factory.mktemp("kube-set"), node_lifecycle=True)
    try:
        cluster.start()
    except (MissingBinariesError, ComponentError) as err:
        pytest.fail(f"cannot start the control plane: {err}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(api: KubeApi, node_set_chart: ChartRelease) -> Iterator[str]:
    """The test's namespace; deleted afterwards (its claims' devices freed with it)."""
    name = create_namespace(api.api_client, prefix="mn-")
    try:
        yield name
    finally:
        delete_namespace(api.api_client, name)
        # Gone, its pods with it: their claims' devices are free for the next test.
        wait_for(f"namespace {name} deleted", lambda: not namespace_exists(api, name), POD_TIMEOUT)


def namespace_exists(api: KubeApi, name: str) -> bool:
    try:
        api.get(f"/api/v1/namespaces/{name}")
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True


def slices_of(api: KubeApi, node: str) -> list[dict[str, Any]]:
    query = {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
    items: list[dict[str, Any]] = api.get(f"{RESOURCE}/resourceslices", query)["items"]
    return items


def product_names(slices: list[dict[str, Any]]) -> set[str]:
    return {d["attributes"]["productName"]["string"] for s in slices for d in s["spec"].get("devices") or []}


def plugin_pid(node: KubeletNode, release: ChartRelease) -> int:
    """The process of the plugin container on `node`, as the node's containerd reports it."""
    assert node.containerd is not None
    uid = plugin_pod_of(release, node.name)["metadata"]["uid"]
    (sandbox,) = node.containerd.crictl(
        "pods", "-q", "--label", f"io.kubernetes.pod.uid={uid}"
    ).stdout.split()
    (container,) = node.containerd.crictl("ps", "-q", "--name", "plugin", "--pod", sandbox).stdout.split()
    pid: int = json.loads(node.containerd.crictl("inspect", container).stdout)["info"]["pid"]
    return pid


def plugin_token(node: KubeletNode, release: ChartRelease) -> str:
    """The service-account token the kubelet mounted into the node's plugin container, read through
    the container's root (/proc/<pid>/root): the credentials the plugin itself uses."""
    return (Path(f"/proc/{plugin_pid(node, release)}/root") / TOKEN).read_text().strip()


def put_as(cluster: ControlPlane, token: str, obj: dict[str, Any]) -> tuple[int, str]:
    """A server-side dry-run update of a ResourceSlice with `token`: the status and the message."""
    http = urllib3.PoolManager(ca_certs=str(cluster.ca_file), cert_reqs="CERT_REQUIRED")
    response = http.request(
        "PUT",
        f"{cluster.server}{RESOURCE}/resourceslices/{obj['metadata']['name']}?dryRun=All",
        body=json.dumps(obj).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=30,
    )
    body = json.loads(response.data or b"{}")
    return response.status, str(body.get("message", ""))


def gpu_template(
    api: KubeApi, namespace: str, name: str, selector: str | None = None, tolerate: str | None = None
) -> None:
    """A ResourceClaimTemplate for one whole GPU of the chart's class, with a CEL selector if given
    and a toleration of device taint key `tolerate` (any value, NoSchedule) if given."""
    exactly: dict[str, Any] = {"deviceClassName": DRIVER}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if tolerate:
        exactly["tolerations"] = [{"key": tolerate, "operator": "Exists", "effect": "NoSchedule"}]
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    })  # fmt: skip


def set_pod(nodes: NodeSet, namespace: str, name: str, source: dict[str, str], api: KubeApi) -> None:
    """A sleeping workload pod with one claim, kept to the set's nodes (other tests' nodes may share
    the control plane)."""
    image = nodes.nodes[0].workload_image
    pod = claim_pod(
        name, image, source, command=["sleep", "3600"],
        nodeSelector={NODE_SET_LABEL: nodes.name},
        automountServiceAccountToken=False, terminationGracePeriodSeconds=1,
    )  # fmt: skip
    api.create(f"/api/v1/namespaces/{namespace}/pods", pod)


def running_on(api: KubeApi, namespace: str, name: str) -> str:
    pod = pods.wait_running(api, namespace, name, POD_TIMEOUT)
    node: str = pod["spec"]["nodeName"]
    return node


def allocated_pool(api: KubeApi, namespace: str, pod_name: str) -> str:
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{pod_name}")
    claim = scheduling.claim(api, namespace, scheduling.pod_claim_names(pod)["gpu"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    pool: str = result["pool"]
    return pool


def test_every_node_runs_one_plugin_pod_publishing_its_own_inventory(
    node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi
) -> None:
    log.info("node set of %d started in %.1fs", len(node_set.nodes), node_set.startup_seconds)
    plugin_nodes = sorted(p["spec"]["nodeName"] for p in node_set_chart.plugin_pods())
    assert plugin_nodes == sorted(n.name for n in node_set.nodes)
    seen: list[set[str]] = []
    for node in node_set.nodes:
        slices = slices_of(api, node.name)
        assert {s["spec"]["pool"]["name"] for s in slices} == {node.name}
        models = {g["model"] for g in node_set.inventory(node)["gpus"]}
        names = product_names(slices)
        assert len(names) == len(models), (node.name, names, models)
        seen.append(names)
    # Each node has models of its own: no two nodes publish the same product.
    assert all(a.isdisjoint(b) for i, a in enumerate(seen) for b in seen[i + 1 :]), seen


def test_a_plugin_token_writes_its_own_nodes_slice_and_not_another_nodes(
    kube_cluster: ControlPlane, node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi
) -> None:
    node_a, node_b = node_set.nodes[0], node_set.nodes[1]
    token = plugin_token(node_a, node_set_chart)
    own, other = slices_of(api, node_a.name)[0], slices_of(api, node_b.name)[0]
    status, message = put_as(kube_cluster, token, own)
    assert status == 200, message
    status, message = put_as(kube_cluster, token, other)
    assert status == 403, message
    assert (
        f"the kubelet plugin on node {node_a.name} may only write ResourceSlices with spec.nodeName"
        in message
    )
    # Moving node B's slice onto node A is no way round it: the old object's node is B's.
    status, message = put_as(
        kube_cluster, token, {**other, "spec": {**other["spec"], "nodeName": node_a.name}}
    )
    assert status in (403, 422), message


def test_a_claim_only_one_nodes_gpus_match_lands_there_and_a_shared_claims_pods_share_a_node(
    node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi, namespace: str
) -> None:
    target = node_set.nodes[-1]
    (model, *_) = sorted(product_names(slices_of(api, target.name)))
    gpu_template(api, namespace, "one-model", f'device.attributes["{DRIVER}"].productName == "{model}"')
    set_pod(node_set, namespace, "picky", {"resourceClaimTemplateName": "one-model"}, api)
    assert running_on(api, namespace, "picky") == target.name
    assert allocated_pool(api, namespace, "picky") == target.name

    shared = f"shared-{uuid.uuid4().hex[:6]}"
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": shared},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    })  # fmt: skip
    set_pod(node_set, namespace, "first", {"resourceClaimName": shared}, api)
    first = running_on(api, namespace, "first")
    set_pod(node_set, namespace, "second", {"resourceClaimName": shared}, api)
    assert running_on(api, namespace, "second") == first
    reserved = scheduling.claim(api, namespace, shared)["status"]["reservedFor"]
    assert sorted(r["name"] for r in reserved) == ["first", "second"]


def test_explain_says_per_node_why_a_pod_fits_nowhere(
    kube_cluster: ControlPlane, node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi, namespace: str
) -> None:
    gpu_template(api, namespace, "huge", f'device.capacity["{DRIVER}"].memory.compareTo(quantity("1Ti")) > 0')
    set_pod(node_set, namespace, "huge", {"resourceClaimTemplateName": "huge"}, api)
    scheduling.wait_unschedulable(api, namespace, "huge", POD_TIMEOUT)
    explained = scheduling.explain(kube_cluster, namespace, "pod/huge")
    (claim,) = explained["claims"]
    assert claim["allocated"] is False
    reports = {n["node"]: n for n in claim["nodes"]}
    for node in node_set.nodes:
        report = reports[node.name]
        assert report["allocatable"] is False, report
        (request,) = report["requests"]
        assert request["usable"] == 0, request
        assert report["verdict"], report


def removed_for(report: Any, reason: str) -> int:
    """How many devices `explain`'s per-node report sets aside for `reason`, over all its pools."""
    if isinstance(report, dict):
        own = report.get("removed")
        count = int(own.get(reason, 0)) if isinstance(own, dict) else 0
        return count + sum(removed_for(v, reason) for k, v in report.items() if k != "removed")
    if isinstance(report, list):
        return sum(removed_for(v, reason) for v in report)
    return 0


def test_a_noschedule_device_taint_keeps_new_claims_off_the_node_unless_they_tolerate_it(
    kube_cluster: ControlPlane, node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi, namespace: str
) -> None:
    """A DeviceTaintRule on node A's pool: kube-scheduler's allocator skips tainted devices a claim
    does not tolerate (the claim's pod stays pending, and `explain` says why), allocates them to a
    claim that tolerates the taint, and once the rule is gone the pending pod schedules."""
    node = node_set.nodes[0]
    (model, *_) = sorted(product_names(slices_of(api, node.name)))
    only_a = f'device.attributes["{DRIVER}"].productName == "{model}"'
    version = "v1" if minor(kube_cluster) >= 37 else "v1alpha3"
    rule_name = f"test-taint-{namespace}"
    rules = f"/apis/resource.k8s.io/{version}/devicetaintrules"
    key = "draplugin.dev/test-maintenance"
    api.create(rules, {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {"name": rule_name},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": node.name},
            "taint": {"key": key, "value": "test", "effect": "NoSchedule"},
        },
    })  # fmt: skip
    try:
        gpu_template(api, namespace, "untolerating", only_a)
        gpu_template(api, namespace, "tolerating", only_a, tolerate=key)
        set_pod(node_set, namespace, "blocked", {"resourceClaimTemplateName": "untolerating"}, api)
        scheduling.wait_unschedulable(api, namespace, "blocked", POD_TIMEOUT)
        # explain reads the rules of the version served (1.34: v1alpha3) and applies them as
        # kube-scheduler does.
        explained = scheduling.explain(kube_cluster, namespace, "pod/blocked")
        (claim,) = explained["claims"]
        report = {n["node"]: n for n in claim["nodes"]}[node.name]
        assert report["allocatable"] is False, report
        # The one device the selector picks on node A is set aside for its taint.
        assert removed_for(report, "taint") == 1, report

        set_pod(node_set, namespace, "tolerant", {"resourceClaimTemplateName": "tolerating"}, api)
        assert running_on(api, namespace, "tolerant") == node.name
        assert allocated_pool(api, namespace, "tolerant") == node.name
        # The selector matches one device on node A: the tolerant pod gives it back for the next step.
        api.delete(f"/api/v1/namespaces/{namespace}/pods/tolerant")
    finally:
        api.delete(f"{rules}/{rule_name}")
    assert running_on(api, namespace, "blocked") == node.name
    assert allocated_pool(api, namespace, "blocked") == node.name


# --- drain, node loss -----------------------------------------------------------------------------


def gpu_deployment(nodes: NodeSet, namespace: str, name: str, prefer: str, api: KubeApi) -> None:
    """One replica holding one whole GPU (a claim per pod), preferring node `prefer`, tolerating an
    unreachable or not-ready node for 2 s only (taint-based eviction comes quickly)."""
    gpu_template(api, namespace, name)
    template = claim_pod(
        name, nodes.nodes[0].workload_image, {"resourceClaimTemplateName": name}, command=["sleep", "3600"],
        nodeSelector={NODE_SET_LABEL: nodes.name},
        automountServiceAccountToken=False, terminationGracePeriodSeconds=1,
        tolerations=[
            {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
            for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
        ],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "preference": {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [prefer]}]},
        }]}},
    )  # fmt: skip
    template["metadata"] = {"labels": {"app": name}}
    api.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": template},
    })  # fmt: skip


def live_pods(api: KubeApi, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = api.get(
        f"/api/v1/namespaces/{namespace}/pods", {"labelSelector": f"app={app}"}
    )["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def running_replica(api: KubeApi, namespace: str, app: str, other_than: str = "") -> dict[str, Any]:
    """The Deployment's one Running pod that is not being deleted (nor named `other_than`)."""

    def running() -> dict[str, Any] | None:
        found = [
            p for p in live_pods(api, namespace, app)
            if p["status"].get("phase") == "Running" and p["metadata"]["name"] != other_than
        ]  # fmt: skip
        return found[0] if len(found) == 1 else None

    pod: dict[str, Any] = wait_for(f"one running pod of {app}", running, POD_TIMEOUT)
    return pod


def claim_specs(node: KubeletNode) -> list[str]:
    """The names of the per-claim CDI specs the plugin keeps on `node`."""
    return sorted(p.name for p in node.cdi_root.glob("*-claim_*.json"))


def checkpointed_claims(node: KubeletNode) -> set[str]:
    """The claim UIDs the node's plugin checkpoint holds."""
    path = node.state_dir / PLUGIN_STATE / CHECKPOINT_FILE
    if not path.exists():
        return set()
    return {claim["uid"] for claim in json.loads(path.read_text()).get("claims") or []}


def allocation_of(api: KubeApi, namespace: str, pod: dict[str, Any]) -> tuple[str, str, str]:
    """(claim UID, pool, device) of the pod's one claim."""
    claim = scheduling.claim(api, namespace, scheduling.pod_claim_names(pod)["gpu"])
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return claim["metadata"]["uid"], result["pool"], result["device"]


def drain_section() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(DRAIN_HEADING)
    end = text.index("\n#", start + len(DRAIN_HEADING))
    return text[start:end]


def run_doc_command(kube_cluster: ControlPlane, node: str, command: str) -> str:
    env = {
        **os.environ,
        "KUBECONFIG": str(kube_cluster.kubeconfig),
        "NODE": node,
        "PATH": f"{kube_cluster.bin_dir}:{os.environ.get('PATH', '')}",
    }
    done = subprocess.run(
        ["bash", "-c", command],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
        check=False,
    )
    assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_drain_runbook_moves_the_pods_unprepares_everything_and_taints_the_devices(
    kube_cluster: ControlPlane, node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi, namespace: str
) -> None:
    """docs/operations.md's drain section, run: every command in page order (the DeviceTaintRule file
    of the other release left out), with the plugin's part checked after each step."""
    node = node_set.nodes[0]
    gpu_deployment(node_set, namespace, "trainer", node.name, api)
    before = running_replica(api, namespace, "trainer")
    assert before["spec"]["nodeName"] == node.name
    claim_uid, _, _ = allocation_of(api, namespace, before)
    assert claim_uid in checkpointed_claims(node)
    assert any(claim_uid in name for name in claim_specs(node))

    served = "maintenance-taint.yaml" if minor(kube_cluster) >= 37 else "maintenance-taint-v1alpha3.yaml"
    commands = list(shell_commands(drain_section()))
    assert len(commands) == 7, commands
    try:
        for command in commands:
            if "maintenance-taint" in command and f"/{served} " not in command:
                continue  # the other release's DeviceTaintRule
            output = run_doc_command(kube_cluster, node.name, command)
            if command.startswith("kubectl drain"):
                after = running_replica(api, namespace, "trainer")
                assert after["spec"]["nodeName"] != node.name
                assert allocation_of(api, namespace, after)[1] != node.name
                # The kubelet unprepared the old pod's claim before letting the pod go.
                assert claim_specs(node) == [] and checkpointed_claims(node) == set()
                assert plugin_pod_of(node_set_chart, node.name)  # the DaemonSet's pod stays
            elif command.startswith("kubectl get resourceclaims"):
                assert node.name not in output, output
            elif "maintenance-taint" in command:
                version = "v1" if served == "maintenance-taint.yaml" else "v1alpha3"
                rule = api.get(f"/apis/resource.k8s.io/{version}/devicetaintrules/maintenance-{node.name}")
                assert rule["spec"]["deviceSelector"]["pool"] == node.name
            elif command.startswith("kubectl get resourceslices"):
                assert node.name in output
    finally:
        subprocess.run(
            [str(kube_cluster.bin_dir / "kubectl"), "--kubeconfig", str(kube_cluster.kubeconfig),
             "uncordon", node.name],
            capture_output=True, check=False, timeout=60,
        )  # fmt: skip
    assert not api.get(f"/api/v1/nodes/{node.name}")["spec"].get("unschedulable")


def test_node_loss_evicts_after_the_toleration_and_hands_out_nothing_twice_and_the_node_recovers(
    node_set: NodeSet, node_set_chart: ChartRelease, api: KubeApi, namespace: str
) -> None:
    """kill -9 of one node's kubelet and plugin; then what upstream does, with the driver's part."""
    node = node_set.nodes[1]
    gpu_deployment(node_set, namespace, "server", node.name, api)
    lost_pod = running_replica(api, namespace, "server")
    assert lost_pod["spec"]["nodeName"] == node.name
    lost_claim, _, lost_device = allocation_of(api, namespace, lost_pod)
    # A pod that tolerates the node's loss for ever keeps its claim: it must survive the recovery.
    api.create(f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates", {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "mig"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": f"mig.{DRIVER}"}},
        ]}}},
    })  # fmt: skip
    api.create(f"/api/v1/namespaces/{namespace}/pods", claim_pod(
        "stays", node.workload_image, {"resourceClaimTemplateName": "mig"}, command=["sleep", "3600"],
        nodeSelector={"kubernetes.io/hostname": node.name}, automountServiceAccountToken=False,
        terminationGracePeriodSeconds=1,
        tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}],
    ))  # fmt: skip
    stays = pods.wait_running(api, namespace, "stays", POD_TIMEOUT)
    stays_claim, _, _ = allocation_of(api, namespace, stays)
    (stays_spec,) = [node.cdi_root / n for n in claim_specs(node) if stays_claim in n]
    spec_stamp = stays_spec.stat().st_mtime_ns

    os.kill(plugin_pid(node, node_set_chart), signal.SIGKILL)
    node.kill_kubelet()
    try:
        lost_node_checks(api, namespace, node, lost_pod, lost_claim, lost_device)
    finally:
        node.restart_kubelet()
    # The kubelet finishes the evicted pod (its claim unprepared, then gone) and restarts the plugin,
    # which recovers from its checkpoint: the surviving pod's claim stays prepared, spec untouched.
    wait_for(
        "the evicted pod gone",
        lambda: lost_pod["metadata"]["name"] not in {p["metadata"]["name"] for p in api.get(
            f"/api/v1/namespaces/{namespace}/pods")["items"]},
        POD_TIMEOUT,
    )  # fmt: skip
    wait_published(node_set_chart, node_set)
    assert lost_claim not in checkpointed_claims(node)
    assert stays_claim in checkpointed_claims(node)
    assert stays_spec.stat().st_mtime_ns == spec_stamp
    again = api.get(f"/api/v1/namespaces/{namespace}/pods/stays")
    assert again["status"]["phase"] == "Running" and not again["metadata"].get("deletionTimestamp")


def lost_node_checks(
    api: KubeApi,
    namespace: str,
    node: KubeletNode,
    lost_pod: dict[str, Any],
    lost_claim: str,
    lost_device: str,
) -> None:
    """What upstream does while the node is silent, and that none of its devices is handed out twice."""
    wait_for(
        f"Node {node.name} NotReady", lambda: not node_is_ready(api.get(f"/api/v1/nodes/{node.name}")), 180
    )

    replacement = running_replica(api, namespace, "server", other_than=lost_pod["metadata"]["name"])
    assert replacement["spec"]["nodeName"] != node.name
    evicted = api.get(f"/api/v1/namespaces/{namespace}/pods/{lost_pod['metadata']['name']}")
    assert evicted["metadata"].get("deletionTimestamp"), "the lost node's pod was not evicted"
    # Its claim stays allocated (the pod might still run on the lost node), so its device is not
    # handed out again: no other claim in the cluster holds that device of that node.
    claims = api.get(f"{RESOURCE}/resourceclaims")["items"]
    holders = [
        c["metadata"]["uid"] for c in claims
        for r in ((c.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        if (r["pool"], r["device"]) == (node.name, lost_device)
    ]  # fmt: skip
    assert holders == [lost_claim], holders
    # The lost node's slices stay (owned by its Node, which exists); nothing is scheduled onto them.
    slices = slices_of(api, node.name)
    node_uid = api.get(f"/api/v1/nodes/{node.name}")["metadata"]["uid"]
    assert slices and all(s["metadata"]["ownerReferences"][0]["uid"] == node_uid for s in slices)
