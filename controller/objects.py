"""The API objects the cluster-side tools work on: from manifests offline, or from a cluster.

Objects stay plain JSON dicts (what the API server serves): typed client
models drop fields they do not know, and the allocator reads API field names.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from dracommon.yamlload import load_all as load_yaml_documents
from dracommon.yamlload import yaml_error

if TYPE_CHECKING:  # the API client is imported where objects are listed: offline tools skip it
    from dracommon.kubeapi import KubeApi

JSON = dict[str, Any]

RESOURCE_API = "/apis/resource.k8s.io/v1"
# DeviceTaintRules, newest version first: resource.k8s.io/v1 from 1.37, v1beta2 from 1.36 and
# v1alpha3 from 1.33 (to 1.38), each only where the API server serves it (1.34: behind the
# DRADeviceTaints gate and runtime-config); a 404 where it does not. The allocator reads the
# fields of all three (v1alpha3 of 1.34 also selects by class and CEL: allocation.taintrules).
TAINT_RULE_VERSIONS = ("v1", "v1beta2", "v1alpha3")
TAINT_RULE_PATHS = tuple(
    f"/apis/resource.k8s.io/{version}/devicetaintrules" for version in TAINT_RULE_VERSIONS
)
TAINT_RULES = TAINT_RULE_PATHS[0]
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
# Workload kinds whose pod template lint judges as a pod (`controller.lint.workloads`).
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob")
# Namespaced kinds we keep; a manifest without a namespace lands in "default", as with kubectl.
NAMESPACED_KINDS = ("ResourceClaim", "ResourceClaimTemplate", "Pod", *WORKLOAD_KINDS)


class ManifestError(ValueError):
    """A manifest file that cannot be read as Kubernetes objects."""


@dataclass
class ClusterObjects:
    """Everything allocation depends on, in the order it was read."""

    device_classes: list[JSON] = field(default_factory=list)
    slices: list[JSON] = field(default_factory=list)
    claims: list[JSON] = field(default_factory=list)
    claim_templates: list[JSON] = field(default_factory=list)
    taint_rules: list[JSON] = field(default_factory=list)
    nodes: list[JSON] = field(default_factory=list)
    pods: list[JSON] = field(default_factory=list)
    # Deployments, Jobs, ...: only lint reads them (their pod templates); simulate and explain
    # are about pods that exist.
    workloads: list[JSON] = field(default_factory=list)

    _BY_KIND: ClassVar[dict[str, str]] = {
        "DeviceClass": "device_classes",
        "ResourceSlice": "slices",
        "ResourceClaim": "claims",
        "ResourceClaimTemplate": "claim_templates",
        "DeviceTaintRule": "taint_rules",
        "Node": "nodes",
        "Pod": "pods",
        **{kind: "workloads" for kind in WORKLOAD_KINDS},
    }

    def add(self, obj: Mapping[str, Any]) -> bool:
        """Keep an object of a kind we use; False for other kinds (ignored)."""
        attribute = self._BY_KIND.get(str(obj.get("kind", "")))
        if attribute is None:
            return False
        getattr(self, attribute).append(dict(obj))
        return True

    def find_claim(self, name: str, namespace: str) -> JSON | None:
        for claim in self.claims:
            meta = claim.get("metadata") or {}
            if meta.get("name") == name and (meta.get("namespace") or "default") == namespace:
                return claim
        return None


def _documents(path: Path) -> Iterator[Any]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            yield json.loads(text)
        except json.JSONDecodeError as err:
            raise ManifestError(f"{path}: invalid JSON: {err}") from err
        return
    try:
        # PyYAML's safe_load_all results and errors, parsed fast (dracommon.yamlload).
        yield from load_yaml_documents(text)
    except yaml_error() as err:  # PyYAML's error class, imported only once something is raised
        raise ManifestError(f"{path}: invalid YAML: {err}") from err


def flatten_document(document: Any, path: Path) -> Iterator[Mapping[str, Any]]:
    """The objects of one parsed YAML/JSON document: itself, or the items of a `kind: *List`
    (nested lists too); empty documents hold none. ManifestError for anything not an object."""
    if document is None:
        return
    if not isinstance(document, Mapping):
        raise ManifestError(f"{path}: expected a Kubernetes object, got {type(document).__name__}")
    if str(document.get("kind", "")).endswith("List") and isinstance(document.get("items"), list):
        for item in document["items"]:
            yield from flatten_document(item, path)
        return
    yield document


def manifest_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files named directly, plus *.yaml/*.yml/*.json below named directories (sorted)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in MANIFEST_SUFFIXES))
        elif path.is_file():
            files.append(path)
        else:
            raise ManifestError(f"{path}: no such file or directory")
    return files


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while API objects are parsed: they are trees of dicts and
    lists without cycles, and its passes over the growing heap took a third of the time to load
    1,000 nodes' ResourceSlices. Nothing is left uncollected: it runs again afterwards.

    What was made meanwhile goes to the oldest generation: left in the youngest, the first pass
    after re-enabling would traverse every new object (about 20 ms at 1,000 nodes) to find them
    all alive. Objects someone else froze stay frozen: then the collector is only re-enabled."""
    enabled = gc.isenabled()
    untouched = gc.get_freeze_count() == 0
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if untouched and gc.get_freeze_count() == 0:
                gc.freeze()  # the permanent generation, then with unfreeze the oldest: no traversal
                gc.enable()
                gc.unfreeze()
            else:
                gc.enable()


def load_manifests(paths: Iterable[str | Path]) -> ClusterObjects:
    """Read YAML (multi-document) and JSON manifests, including `kind: List`."""
    return load_files(manifest_files(paths))


def load_files(files: Iterable[Path]) -> ClusterObjects:
    """`load_manifests` of files already found (`controller.manifests.collect`): each is read as
    it is, with no second look at what the path is."""
    objects = ClusterObjects()
    with gc_paused():
        for path in files:
            for document in _documents(path):
                for obj in flatten_document(document, path):
                    if obj.get("kind") in NAMESPACED_KINDS:
                        meta = dict(obj.get("metadata") or {})
                        meta.setdefault("namespace", "default")
                        obj = {**obj, "metadata": meta}
                    objects.add(obj)
    return objects


COLLECTIONS: Sequence[tuple[str, str, str]] = (
    ("device_classes", f"{RESOURCE_API}/deviceclasses", "DeviceClass"),
    ("slices", f"{RESOURCE_API}/resourceslices", "ResourceSlice"),
    ("claims", f"{RESOURCE_API}/resourceclaims", "ResourceClaim"),
    ("claim_templates", f"{RESOURCE_API}/resourceclaimtemplates", "ResourceClaimTemplate"),
    ("nodes", "/api/v1/nodes", "Node"),
    ("pods", "/api/v1/pods", "Pod"),
)
WORKLOAD_COLLECTIONS: Sequence[tuple[str, str]] = (
    ("/apis/apps/v1/deployments", "Deployment"),
    ("/apis/apps/v1/statefulsets", "StatefulSet"),
    ("/apis/apps/v1/daemonsets", "DaemonSet"),
    ("/apis/apps/v1/replicasets", "ReplicaSet"),
    ("/apis/batch/v1/jobs", "Job"),
    ("/apis/batch/v1/cronjobs", "CronJob"),
)


def load_from_cluster(
    api: KubeApi, *, include_taint_rules: bool = True, include_workloads: bool = False
) -> ClusterObjects:
    """List the objects allocation depends on from a live cluster; with `include_workloads`,
    the workload objects too (lint judges their pod templates)."""
    objects = ClusterObjects()
    with gc_paused():  # the same trees, decoded from the API server's pages
        _list_into(api, objects, include_taint_rules, include_workloads)
    return objects


def _list_into(
    api: KubeApi, objects: ClusterObjects, include_taint_rules: bool, include_workloads: bool
) -> None:
    from dracommon.kubeapi import ApiError

    for attribute, path, kind in COLLECTIONS:
        items, _ = api.list(path, kind=kind)
        setattr(objects, attribute, items)
    if include_workloads:
        for path, kind in WORKLOAD_COLLECTIONS:
            items, _ = api.list(path, kind=kind)
            objects.workloads.extend(items)
    if include_taint_rules:
        for path in TAINT_RULE_PATHS:
            try:
                objects.taint_rules, _ = api.list(path, kind="DeviceTaintRule")
            except ApiError as err:
                if err.status != 404:  # this version is not served: the next older one may be
                    raise
                continue
            break
