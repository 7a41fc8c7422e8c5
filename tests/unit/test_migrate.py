"""`dra-controller migrate`: the workloads of examples/device-plugin/ and bad input, offline.

The converted pods are then simulated against the examples' fake node: each claim gets a
device of the product and memory its old node selection asked for.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.nodes import Node
from controller.cel import compile_selector
from controller.cli import main
from controller.migrate.command import migrate
from controller.migrate.convert import Converter, parse_mapping
from controller.migrate.documents import read_documents, split_documents
from controller.objects import load_manifests
from controller.options import build_allocator
from controller.simulate.command import simulate

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "device-plugin"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["migrate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("kind") == kind]


def convert_file(name: str) -> tuple[list[dict[str, Any]], list[str]]:
    outcome = migrate(list(read_documents([str(EXAMPLES / name)])), {})
    objects = [o for _, objs, _ in outcome.documents for o in objs]
    return objects, outcome.report


def only_request(template: dict[str, Any]) -> dict[str, Any]:
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    exactly: dict[str, Any] = request["exactly"]
    return exactly


def test_pod_from_the_gpu_scheduling_page() -> None:
    objects, report = convert_file("pod.yaml")
    (template,) = by_kind(objects, "ResourceClaimTemplate")
    (pod,) = by_kind(objects, "Pod")
    exactly = only_request(template)
    assert exactly["deviceClassName"] == "gpu.draplugin.dev" and exactly["count"] == 1
    (selector,) = exactly["selectors"]
    assert '"NVIDIA-H100-80GB-HBM3"' in selector["cel"]["expression"]
    compile_selector(selector["cel"]["expression"], kubernetes_version=(1, 34))
    spec = pod["spec"]
    assert "nodeSelector" not in spec
    assert spec["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    (container,) = spec["containers"]
    assert container["resources"] == {"claims": [{"name": "gpu"}]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert spec["restartPolicy"] == "OnFailure" and container["image"].endswith("example-vector-add:v42")
    assert any("added toleration nvidia.com/gpu" in line for line in report)


def test_two_gpu_deployment_keeps_other_selection_and_its_toleration() -> None:
    objects, report = convert_file("deployment.yaml")
    (template,) = by_kind(objects, "ResourceClaimTemplate")
    (deployment,) = by_kind(objects, "Deployment")
    assert only_request(template)["count"] == 2
    spec = deployment["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}  # not a GFD label: kept
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    (container,) = spec["containers"]
    assert container["resources"] == {"requests": {"cpu": "4"}, "claims": [{"name": "gpu"}]}
    assert deployment["metadata"]["labels"] == {"app": "trainer"}
    assert any("kept the toleration" in line for line in report)


def test_job_selecting_by_memory_and_driver() -> None:
    objects, _ = convert_file("job.yaml")
    (template,) = by_kind(objects, "ResourceClaimTemplate")
    (job,) = by_kind(objects, "Job")
    expressions = [s["cel"]["expression"] for s in only_request(template)["selectors"]]
    assert len(expressions) == 2 and 'quantity("70001Mi")' in expressions[0]
    assert "affinity" not in job["spec"]["template"]["spec"]


def test_converted_pods_get_the_product_their_selector_asked_for() -> None:
    """Pods made from the converted workloads, simulated on the examples' fake node (one H100, two
    A100 40GB, one A100 80GB in MIG mode)."""
    objects, _ = convert_file("")  # the whole directory
    objects = [o for o in objects if o]
    templates = by_kind(objects, "ResourceClaimTemplate")
    pods = []
    for obj in objects:
        if obj["kind"] == "Pod":
            pods.append(obj)
        elif obj["kind"] in ("Deployment", "Job"):
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": obj["metadata"]["name"] + "-0"},
                    "spec": obj["spec"]["template"]["spec"],
                }
            )
    for obj in [*templates, *pods]:
        obj["metadata"].setdefault("namespace", "default")
    cluster = load_manifests([REPO / "examples" / "deviceclasses.yaml", REPO / "examples" / "resourceslices"])
    cluster.claim_templates = templates
    cluster.pods = pods
    allocator = build_allocator(cluster)
    results = {
        r.pod: r for r in simulate(cluster, allocator, [Node("gpu-node-1", {"kubernetes.io/os": "linux"})])
    }
    devices = {d["name"]: d for s in cluster.slices for d in s["spec"]["devices"]}

    def products(pod: str) -> list[str]:
        return [devices[r["device"]]["attributes"]["productName"]["string"] for r in results[pod].results]

    assert products("trainer-0") == ["NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"]
    # The Job's "> 70000 MiB" and the Pod's H100 compete for the node's only whole H100 (the A100
    # 80GB is split into MIG devices): the first pod in order gets it, the other is told why not.
    allocated = [p for p in ("big-memory-0", "example-vector-add") if results[p].allocated]
    assert len(allocated) == 1 and products(allocated[0]) == ["NVIDIA H100 80GB HBM3"]
    loser = ({"big-memory-0", "example-vector-add"} - set(allocated)).pop()
    assert "in use" in str(results[loser].reason)


def test_identical_needs_share_one_template() -> None:
    pod = yaml.safe_load((EXAMPLES / "pod.yaml").read_text())
    twin = {**pod, "metadata": {"name": "twin"}}
    converter = Converter()
    first, second = converter.convert(pod), converter.convert(twin)
    assert len(first.objects) == 2 and len(second.objects) == 1  # the template is written once
    assert first.objects[1]["spec"]["resourceClaims"] == second.objects[0]["spec"]["resourceClaims"]


def test_two_containers_each_get_their_own_claim() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/mig-1g.10gb": 2}}},
            ]
        },
    }
    result = Converter().convert(pod)
    templates = by_kind(result.objects, "ResourceClaimTemplate")
    assert [only_request(t)["deviceClassName"] for t in templates] == [
        "gpu.draplugin.dev",
        "mig.gpu.draplugin.dev",
    ]
    assert '"1g.10gb"' in only_request(templates[1])["selectors"][0]["cel"]["expression"]
    spec = by_kind(result.objects, "Pod")[0]["spec"]
    assert [c["name"] for c in spec["resourceClaims"]] == ["gpu-a", "mig-1g-10gb-b"]
    assert spec["containers"][1]["resources"] == {"claims": [{"name": "mig-1g-10gb-b"}]}
    assert {t["key"] for t in spec["tolerations"]} == {"nvidia.com/gpu", "nvidia.com/mig-1g.10gb"}


def test_map_flag_and_mig_single_strategy_product() -> None:
    mapping = parse_mapping("example.com/gpu=profile:2g.20gb")
    pod = {
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"},
            "containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1, "example.com/gpu": 1}}}
            ],
        },
    }
    result = Converter({mapping.resource: mapping}).convert(pod)
    classes = sorted(
        only_request(t)["deviceClassName"] for t in by_kind(result.objects, "ResourceClaimTemplate")
    )
    assert classes == ["mig.gpu.draplugin.dev", "mig.gpu.draplugin.dev"]  # nvidia.com/gpu meant a MIG device


def test_multi_term_affinity_becomes_one_ored_selector_or_stays() -> None:
    def pod(terms: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "kind": "Pod",
            "metadata": {"name": "p"},
            "spec": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                    }
                },
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            },
        }

    l4 = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}]}
    t4 = {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["Tesla-T4"]}]}
    zone = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
    result = Converter().convert(pod([l4, t4]))
    (template,) = by_kind(result.objects, "ResourceClaimTemplate")
    (selector,) = only_request(template)["selectors"]
    assert " || " in selector["cel"]["expression"]
    assert "affinity" not in by_kind(result.objects, "Pod")[0]["spec"]
    kept = Converter().convert(pod([l4, zone]))
    assert "affinity" in by_kind(kept.objects, "Pod")[0]["spec"]
    assert any("terms are ORed" in m for m in kept.messages)


BAD_INPUT = """\
apiVersion: v1
kind: Pod
metadata: {name: half}
spec:
  containers:
  - name: a
    resources: {limits: {nvidia.com/gpu: "0.5"}}
---
this: is: not: yaml
---
apiVersion: example.com/v1
kind: TrainingJob
metadata: {name: custom}
spec: {worker: {resources: {limits: {nvidia.com/gpu: 1}}}}
---
apiVersion: v1
kind: Pod
metadata: {name: odd-family}
spec:
  nodeSelector: {nvidia.com/gpu.family: warp-drive, nvidia.com/gpu.count: "8"}
  containers:
  - name: a
    resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: v1
kind: Pod
metadata: {name: has-claims}
spec:
  resourceClaims: [{name: nic, resourceClaimName: my-nic}]
  containers:
  - name: a
    resources: {limits: {nvidia.com/gpu: 1}, claims: [{name: nic}]}
---
- a list, not an object
---
apiVersion: v1
kind: ConfigMap
metadata: {name: untouched}  # a comment that survives
data: {a: b}
"""


def test_bad_input_gets_a_line_each_and_the_rest_is_converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_INPUT)
    code, out, err = run_cli(capsys, "-f", str(path), "-f", str(tmp_path / "missing.yaml"))
    assert code == 2  # unreadable input: a document that is not YAML, a list, a missing file
    assert (
        f"{path}#1: Pod half: container a: kept nvidia.com/gpu: the count '0.5' is not a whole number" in err
    )
    assert f"{path}#2: not YAML" in err
    assert (
        "TrainingJob custom: kind TrainingJob is not a workload migrate knows, yet it mentions nvidia.com/gpu"
        in err
    )
    assert (
        "kept nodeSelector nvidia.com/gpu.family=warp-drive as node selection: GPU family 'warp-drive'" in err
    )
    assert (
        "kept nodeSelector nvidia.com/gpu.count=8 as node selection: nvidia.com/gpu.count has no device"
        in err
    )
    assert "Pod has-claims: already uses resource claims (nic)" in err
    assert f"{path}#6: not a Kubernetes object but a list: left out" in err
    assert f"{tmp_path / 'missing.yaml'}: no such file or directory: left out" in err
    objects = {o["metadata"]["name"]: o for o in yaml.safe_load_all(out)}
    assert objects["half"]["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "0.5"}}
    assert objects["odd-family"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.family": "warp-drive",
        "nvidia.com/gpu.count": "8",
    }
    assert [c["name"] for c in objects["has-claims"]["spec"]["resourceClaims"]] == ["nic", "gpu"]
    assert "# a comment that survives" in out  # unchanged objects are written back as read


def test_stdin_json_output_and_diff(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((EXAMPLES / "pod.yaml").read_text()))
    code, out, _ = run_cli(capsys, "-f", "-", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["kind"] == "List" and [i["kind"] for i in data["items"]] == ["ResourceClaimTemplate", "Pod"]
    code, out, _ = run_cli(capsys, "-f", str(EXAMPLES / "pod.yaml"), "--diff")
    assert code == 0
    assert "-        nvidia.com/gpu: 1" in out and "+  resourceClaims:" in out


def test_bad_map_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "-f", str(EXAMPLES), "--map", "nvidia.com/gpu")
    assert code == 2 and "expected RESOURCE=DEVICECLASS" in err


def test_documents_split_at_separators_keep_their_text() -> None:
    docs = list(split_documents("x", "a: 1  # one\n---\n\n---\nb: 2\n"))
    assert [(d.index, d.text, d.data) for d in docs] == [
        (1, "a: 1  # one\n", {"a": 1}),
        (2, "b: 2\n", {"b": 2}),
    ]
