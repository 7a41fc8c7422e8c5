"""What NVIDIA's DCGM exporter makes of a node's DRA devices: which GPU a container's claim is on.

A model of DCGM exporter's DRA mapping, written from its source (NVIDIA/dcgm-exporter at
d5e5f51, May 2026; docs/monitoring-agents.md has the facts) so tests can ask of our slices and of
the kubelet's pod-resources answer what the exporter would ask:

- `internal/pkg/transformation/dra.go`, `DRAResourceSliceManager.onAddOrUpdate`: only slices with
  `spec.driver == "gpu.nvidia.com"`; each device keyed `<spec.pool.name>/<device name>`; the string
  attribute `type` decides: `gpu` maps the key to the string attribute `uuid` (skipped when
  empty), `mig` to the string attributes `parentUUID` (required), `profile` and `uuid` (the MIG
  device's); any other type is logged and skipped. Attribute names are read without a domain.
- `kubernetes.go`, `toDeviceToPodsDRA`: for each container's `dynamic_resources[].claim_resources[]`
  with `driver_name == "gpu.nvidia.com"`, the key `<pool_name>/<device_name>` is looked up above;
  no entry, no mapping. Metrics of the GPU with that UUID (the parent's for a MIG device) get the
  pod, namespace, container, claim name and namespace, driver, pool and device name, and for MIG
  the profile and the MIG device's UUID.

The exporter reads slices as `resource.k8s.io/v1beta1` (attributes under `basic`); ours are
written and read here as `v1` (attributes on the device), which the API server converts field for
field. This is the model only: the exporter itself is not run (it needs DCGM and a GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

DCGM_DRIVER: Final = "gpu.nvidia.com"


@dataclass(frozen=True, slots=True)
class GpuOf:
    """The GPU whose metrics a device's holder gets; `mig_uuid` and `profile` for a MIG device."""

    gpu_uuid: str
    mig_uuid: str | None = None
    profile: str | None = None


def _string(attributes: Mapping[str, Any], key: str) -> str:
    value = attributes.get(key) or {}
    return str(value.get("string") or "")


def device_index(slices: Iterable[Mapping[str, Any]]) -> dict[str, GpuOf]:
    """`<pool>/<device>` → the GPU, for every device of DCGM's driver that it can map (dra.go)."""
    index: dict[str, GpuOf] = {}
    for obj in slices:
        spec = obj["spec"]
        if spec.get("driver") != DCGM_DRIVER:
            continue
        for device in spec.get("devices") or ():
            attributes = device.get("attributes")
            if not attributes:
                continue
            key = f"{spec['pool']['name']}/{device['name']}"
            kind = _string(attributes, "type")
            if kind == "gpu" and _string(attributes, "uuid"):
                index[key] = GpuOf(_string(attributes, "uuid"))
            elif kind == "mig" and _string(attributes, "parentUUID"):
                index[key] = GpuOf(
                    _string(attributes, "parentUUID"),
                    mig_uuid=_string(attributes, "uuid"),
                    profile=_string(attributes, "profile"),
                )
    return index


@dataclass(frozen=True, slots=True)
class Attribution:
    """One metric label set DCGM would add: who holds which device of which GPU."""

    pod: str
    namespace: str
    container: str
    claim: str
    claim_namespace: str
    pool: str
    device: str
    gpu: GpuOf


def attribute(pod_resources: Iterable[Mapping[str, Any]], index: Mapping[str, GpuOf]) -> list[Attribution]:
    """The attributions of pod-resources `List` answers (as proto JSON with field names kept)."""
    found: list[Attribution] = []
    for pod in pod_resources:
        for container in pod.get("containers") or ():
            for claim in container.get("dynamic_resources") or ():
                for resource in claim.get("claim_resources") or ():
                    if resource.get("driver_name") != DCGM_DRIVER:
                        continue
                    gpu = index.get(f"{resource.get('pool_name')}/{resource.get('device_name')}")
                    if gpu is None:
                        continue
                    found.append(
                        Attribution(
                            pod=str(pod["name"]),
                            namespace=str(pod["namespace"]),
                            container=str(container["name"]),
                            claim=str(claim.get("claim_name", "")),
                            claim_namespace=str(claim.get("claim_namespace", "")),
                            pool=str(resource["pool_name"]),
                            device=str(resource["device_name"]),
                            gpu=gpu,
                        )
                    )
    return found
