"""lint judges the pod templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, Jobs and
CronJobs as unbound pods of the workload's namespace, naming the workload in its findings."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.allocation.builders import claim, device, device_class, exactly, resource_slice
from controller.lint.linter import Finding, lint
from controller.lint.workloads import pod_template, template_pod
from controller.objects import ClusterObjects, load_from_cluster, load_manifests
from controller.options import build_allocator

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_CLASS = device_class("gpu", ['device.attributes["gpu.draplugin.dev"].type == "gpu"'])
SLICES = [resource_slice("gpu-node-0", [device("gpu-0", {"type": "gpu"})], node="gpu-node")]
NODES = [
    {"kind": "Node", "metadata": {"name": "gpu-node"}, "spec": {"taints": [GPU_TAINT]}},
    {"kind": "Node", "metadata": {"name": "cpu-node"}, "spec": {}},
]
GPU_CLAIM_TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "one-gpu", "namespace": "ml"},
    "spec": {"spec": {"devices": {"requests": [exactly("gpu")]}}},
}


def pod_spec(
    *, claim_name: str | None = None, template: str | None = None, tolerate: bool = False
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "gpu"}
    if claim_name:
        entry["resourceClaimName"] = claim_name
    if template:
        entry["resourceClaimTemplateName"] = template
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "app", "resources": {"claims": [{"name": "gpu"}]}}],
        "resourceClaims": [entry],
    }
    if tolerate:
        spec["tolerations"] = [GPU_TOLERATION]
    return spec


def deployment(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def cron_job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "schedule": "0 * * * *",
            "jobTemplate": {"spec": {"template": {"spec": {**spec, "restartPolicy": "Never"}}}},
        },
    }


def bare_pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"}, "spec": spec}


def objects_with(
    *, workloads: Sequence[dict[str, Any]] = (), pods: Sequence[dict[str, Any]] = ()
) -> ClusterObjects:
    return ClusterObjects(
        device_classes=[GPU_CLASS],
        slices=SLICES,
        claims=[claim("c", [exactly("gpu")], namespace="ml")],
        claim_templates=[GPU_CLAIM_TEMPLATE],
        nodes=NODES,
        pods=list(pods),
        workloads=list(workloads),
    )


def taint_findings(objects: ClusterObjects) -> list[Finding]:
    return [f for f in lint(objects, build_allocator(objects)).findings if f.code == "untolerated-node-taint"]


@pytest.mark.parametrize(
    ("make", "subject"),
    [(deployment, "Deployment/ml/trainer"), (cron_job, "CronJob/ml/trainer")],
)
def test_a_workload_without_the_toleration_is_warned_naming_the_workload(make: Any, subject: str) -> None:
    [finding] = taint_findings(objects_with(workloads=[make("trainer", pod_spec(claim_name="c"))]))
    assert (finding.severity, finding.object, finding.where) == (
        "warning",
        "DeviceClass/gpu",
        f"{subject}, claim c",
    )
    kind = subject.split("/")[0]
    assert f"taints the {kind}'s pod template does not tolerate: gpu-node" in finding.message
    assert "pod ml/trainer" not in finding.where


@pytest.mark.parametrize("make", [deployment, cron_job])
def test_a_workload_whose_template_tolerates_the_taint_is_not_warned(make: Any) -> None:
    assert (
        taint_findings(objects_with(workloads=[make("trainer", pod_spec(claim_name="c", tolerate=True))]))
        == []
    )


def test_a_pod_of_the_same_spec_is_still_warned_as_a_pod() -> None:
    [finding] = taint_findings(objects_with(pods=[bare_pod("trainer", pod_spec(claim_name="c"))]))
    assert finding.where == "pod ml/trainer, claim c"
    assert "taints the pod does not tolerate" in finding.message
    assert (
        taint_findings(objects_with(pods=[bare_pod("trainer", pod_spec(claim_name="c", tolerate=True))]))
        == []
    )


def test_a_pod_and_a_workload_of_the_same_name_are_both_warned() -> None:
    spec = pod_spec(claim_name="c")
    found = taint_findings(objects_with(pods=[bare_pod("web", spec)], workloads=[deployment("web", spec)]))
    assert sorted(f.where for f in found) == ["Deployment/ml/web, claim c", "pod ml/web, claim c"]


def test_a_template_referencing_a_resource_claim_template_is_resolved() -> None:
    objects = objects_with(workloads=[deployment("trainer", pod_spec(template="one-gpu"))])
    [finding] = taint_findings(objects)
    # The claim made from the template, named as kube-controller-manager's generateName (offline).
    assert finding.where == "Deployment/ml/trainer, claim trainer-gpu"
    # A template the namespace does not have makes no claim, so nothing to judge.
    missing = objects_with(workloads=[deployment("trainer", pod_spec(template="absent"))])
    assert taint_findings(missing) == []


def test_a_bound_pod_is_skipped_but_a_template_pod_has_no_status() -> None:
    bound = bare_pod("trainer", {**pod_spec(claim_name="c"), "nodeName": "gpu-node"})
    assert taint_findings(objects_with(pods=[bound])) == []
    made = template_pod(deployment("trainer", pod_spec(claim_name="c")))
    assert made is not None
    assert "status" not in made
    assert made["metadata"] == {"name": "trainer", "namespace": "ml", "labels": {"app": "trainer"}}


def test_every_workload_kind_has_its_template_read() -> None:
    spec = pod_spec(claim_name="c")
    template = {"spec": spec}
    for kind, api in (
        ("Deployment", "apps/v1"),
        ("StatefulSet", "apps/v1"),
        ("DaemonSet", "apps/v1"),
        ("ReplicaSet", "apps/v1"),
        ("Job", "batch/v1"),
    ):
        workload = {
            "apiVersion": api,
            "kind": kind,
            "metadata": {"name": "w"},
            "spec": {"template": template},
        }
        assert pod_template(workload) == template
        [finding] = taint_findings(
            objects_with(workloads=[{**workload, "metadata": {"name": "w", "namespace": "ml"}}])
        )
        assert finding.where == f"{kind}/ml/w, claim c"
    assert pod_template({"kind": "Service", "spec": {"template": template}}) is None
    assert pod_template({"kind": "Deployment", "spec": {}}) is None


def test_lint_does_not_change_the_objects_it_is_given() -> None:
    objects = objects_with(workloads=[deployment("trainer", pod_spec(claim_name="c"))])
    before = copy.deepcopy(objects)
    taint_findings(objects)
    assert objects == before


def test_manifests_keep_workloads_in_the_default_namespace_and_ignore_other_kinds(tmp_path: Path) -> None:
    workload = deployment("trainer", pod_spec(claim_name="c"))
    del workload["metadata"]["namespace"]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}
    (tmp_path / "app.yaml").write_text(yaml.safe_dump_all([workload, service]), encoding="utf-8")
    objects = load_manifests([tmp_path])
    [loaded] = objects.workloads
    assert loaded["metadata"]["namespace"] == "default"
    assert objects.pods == [] and objects.claims == []


class ListingApi:
    """Serves each collection path from a dict, recording what was listed."""

    def __init__(self, items: dict[str, list[dict[str, Any]]]) -> None:
        self.items = items
        self.listed: list[str] = []

    def list(self, path: str, *, kind: str | None = None) -> tuple[list[dict[str, Any]], str]:
        self.listed.append(path)
        return [{**i, "kind": kind} for i in self.items.get(path, [])], "1"


def test_from_a_cluster_workloads_are_listed_only_when_asked() -> None:
    workload = deployment("trainer", pod_spec(claim_name="c"))
    api = ListingApi({"/apis/apps/v1/deployments": [workload]})
    plain = load_from_cluster(api, include_taint_rules=False)  # type: ignore[arg-type]
    assert plain.workloads == [] and not any(p.startswith(("/apis/apps", "/apis/batch")) for p in api.listed)
    with_workloads = load_from_cluster(api, include_taint_rules=False, include_workloads=True)  # type: ignore[arg-type]
    assert with_workloads.workloads == [workload]
    assert "/apis/batch/v1/cronjobs" in api.listed


class _Client:
    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize(
    ("command", "lists_workloads"), [("lint", True), ("simulate", False), ("explain", False)]
)
def test_only_lint_lists_workloads_from_a_cluster(
    command: str, lists_workloads: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import controller.options as common
    import dracommon.kubeapi as kubeapi
    from controller.cli import main

    asked: list[bool] = []

    def fake_load(api: object, *, include_workloads: bool = False) -> ClusterObjects:
        asked.append(include_workloads)
        workloads = [deployment("trainer", pod_spec(claim_name="c"))] if include_workloads else []
        return objects_with(workloads=workloads)

    monkeypatch.setattr(kubeapi, "load_api_client", lambda *a: _Client())
    monkeypatch.setattr(common, "load_from_cluster", fake_load)
    argv = {"lint": ["lint"], "simulate": ["simulate"], "explain": ["explain", "pod/x"]}[command]
    main(argv)
    assert asked == [lists_workloads]
    if command == "lint":
        assert "Deployment/ml/trainer, claim c: [untolerated-node-taint]" in capsys.readouterr().out
