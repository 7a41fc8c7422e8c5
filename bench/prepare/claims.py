"""Fresh ResourceClaims allocated to one plugin's devices, written as the scheduler would write them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dracommon.kubeapi import KubeApi
from draplugin.kubelet.interface import ClaimRef

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
# Creating a few hundred claims is API round trips only: a few in flight hide the latency.
CREATE_WORKERS = 8


def create_node(rest: KubeApi, name: str) -> None:
    """The Node object a plugin's ResourceSlices are owned by (the peer looks it up to publish)."""
    rest.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})


def allocated_claim(
    rest: KubeApi, namespace: str, name: str, driver: str, pool: str, device: str
) -> ClaimRef:
    """One claim of one device, with `status.allocation` naming `driver`/`pool`/`device`."""
    base = CLAIMS.format(namespace=namespace)
    created: dict[str, Any] = rest.create(base, {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
    })  # fmt: skip
    rest.patch_status(f"{base}/{name}", {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": driver, "pool": pool, "device": device},
    ]}}}})  # fmt: skip
    return ClaimRef(namespace, created["metadata"]["uid"], name)


def claim_batches(
    rest: KubeApi, namespace: str, prefix: str, driver: str, pool: str, *, batches: int, devices: int
) -> list[list[ClaimRef]]:
    """`batches` lists of `devices` fresh claims, claim i of each on device gpu-i (one claim per device)."""
    jobs = [(b, i) for b in range(batches) for i in range(devices)]
    with ThreadPoolExecutor(CREATE_WORKERS) as pool_:
        refs = list(
            pool_.map(
                lambda job: allocated_claim(
                    rest, namespace, f"{prefix}-{job[0]}-{job[1]}", driver, pool, f"gpu-{job[1]}"
                ),
                jobs,
            )
        )
    return [refs[b * devices : (b + 1) * devices] for b in range(batches)]
