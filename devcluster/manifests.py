"""The examples' manifests, applied to the local cluster through the API server (no kubectl needed).

The demo and the end-to-end tests create the objects of `examples/*.yaml`
with the kubernetes client; this table maps each kind the examples use to its
collection, and anything else is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from devcluster.binaries import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
DEVICE_CLASSES = EXAMPLES / "deviceclasses.yaml"

_COLLECTIONS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "Pod"): "/api/v1/namespaces/{ns}/pods",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("apps/v1", "Deployment"): "/apis/apps/v1/namespaces/{ns}/deployments",
    ("batch/v1", "Job"): "/apis/batch/v1/namespaces/{ns}/jobs",
    ("resource.k8s.io/v1", "DeviceClass"): "/apis/resource.k8s.io/v1/deviceclasses",
    ("resource.k8s.io/v1", "ResourceClaim"): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
    (
        "resource.k8s.io/v1",
        "ResourceClaimTemplate",
    ): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
}


def load_manifests(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def collection_path(doc: Mapping[str, Any], namespace: str) -> str:
    key = (str(doc.get("apiVersion")), str(doc.get("kind")))
    template = _COLLECTIONS.get(key)
    if template is None:
        known = ", ".join(f"{kind} ({version})" for version, kind in _COLLECTIONS)
        raise ValueError(f"cannot apply {key[1]} {key[0]}: this tool knows {known}")
    return template.format(ns=doc.get("metadata", {}).get("namespace") or namespace)


def apply(api_client: Any, docs: Sequence[Mapping[str, Any]], namespace: str, out: IO[str]) -> None:
    """Create each object; an existing one is reported and left as it is."""
    from dracommon.kubeapi import ApiError, KubeApi

    rest = KubeApi(api_client)
    for doc in docs:
        name = doc.get("metadata", {}).get("name", "?")
        try:
            rest.create(collection_path(doc, namespace), doc)
            print(f"  created {doc['kind']} {name}", file=out)
        except ApiError as err:
            if err.status != 409:
                raise
            print(f"  {doc['kind']} {name} already exists, left unchanged", file=out)
