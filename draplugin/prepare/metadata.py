"""Device metadata (KEP-5304): the document of each prepared request, and what it looks like.

Pure: what a prepared claim's metadata documents say, where they and their CDI
specs live, and their bytes. The files themselves are written by
`draplugin.prepare.metadatastore`.

The contract is upstream's kubelet plugin helper's, `k8s.io/dynamic-resource-allocation`
v0.37.2 (`kubeletplugin/metadata.go`, types in `api/metadata`; docs/device-metadata.md):

- per claim and request, `{plugin data dir}/dra-device-metadata/{namespace}_{claim}/{request}/metadata.json`
  (mode 0644, directories 0755): a JSON stream of one `DeviceMetadata` object per API version,
  newest first (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1` for readers built on 1.36);
- per claim and request, a CDI spec `{cdi root}/{driver}_metadata_{claim uid}_{request}.json` of kind
  `{driver}/metadata` whose one device, `{claim uid}_{request}`, bind-mounts that file read-only at
  `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/{claim}/{request}/{driver}-metadata.json`,
  or, for a claim made from a template (annotation `resource.kubernetes.io/pod-claim-name`),
  `.../resourceclaimtemplates/{pod claim name}/{request}/{driver}-metadata.json`;
- the request is the base request (`gpu` for `gpu/small`) in every path; the document names the
  request as allocated (`gpu/small`).

Every device carries its attributes as its ResourceSlice publishes them (`Device.to_api`), and
what the claim's opaque config made of it: `sharingStrategy`, with `timeSliceInterval`,
`mpsActiveThreadPercentage`, `mpsPinnedMemoryBytes` and `shareID` where they apply.

Names are checked before they become paths: the API server's own rules (namespace a DNS label,
claim a DNS subdomain, request and pod claim name DNS labels) and the file-name length limit, so
no name can reach outside the metadata directory or fail half-way through a write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

from dracommon.kubenames import dns_label_problem, dns_subdomain_problem, uid_problem
from draplugin.cdi import spec as cdi
from draplugin.kubelet.interface import PreparedDevice
from draplugin.prepare.errors import PlanError
from draplugin.prepare.gpuconfig import SharingStrategy
from draplugin.prepare.plan import ClaimPlan, PlannedDevice, base_request_name

# Host side, below the plugin's data directory (upstream's metadataSubDir).
METADATA_DIR_NAME: Final = "dra-device-metadata"
FILE_NAME: Final = "metadata.json"
FILE_MODE: Final = 0o644
DIR_MODE: Final = 0o755
# Container side (api/metadata/types.go).
CONTAINER_DIR: Final = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR: Final = "resourceclaims"
TEMPLATES_SUBDIR: Final = "resourceclaimtemplates"
CONTAINER_FILE_SUFFIX: Final = "-metadata.json"
# Set by the resource claim controller on claims made from a template (PodResourceClaimAnnotation).
POD_CLAIM_NAME_ANNOTATION: Final = "resource.kubernetes.io/pod-claim-name"
GROUP: Final = "metadata.resource.k8s.io"
# Newest first, as upstream's readers expect: v1beta1 is the latest (1.37), v1alpha1 what a reader
# built on 1.36 knows. Upstream's helper writes what the driver lists; these are the two it accepts.
VERSIONS: Final = ("v1beta1", "v1alpha1")
KIND: Final = "DeviceMetadata"
CDI_CLASS: Final = "metadata"
# The validation of both versions: at most 32 attributes per device (+k8s:maxProperties=32).
MAX_ATTRIBUTES: Final = 32
# Linux NAME_MAX: the longest file-name component.
NAME_MAX: Final = 255


@dataclass(frozen=True, slots=True)
class MetadataDevice:
    pool: str
    name: str
    # Rendered as the API renders them: {"string": ...}, {"int": ...}, {"bool": ...}, {"version": ...}.
    attributes: Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class RequestMetadata:
    request: str  # as allocated: `gpu` or `gpu/small`
    devices: tuple[MetadataDevice, ...]

    @property
    def base(self) -> str:
        return base_request_name(self.request)


@dataclass(frozen=True, slots=True)
class ClaimMetadata:
    namespace: str
    name: str
    uid: str
    pod_claim_name: str | None
    requests: tuple[RequestMetadata, ...]


def claim_metadata(plan: ClaimPlan, doc: Mapping[str, Any]) -> ClaimMetadata:
    """What the claim's metadata documents say, from its realized plan and its API object; raises
    `PlanError` for a name that cannot become a path, before anything is written."""
    claim = plan.claim
    who = f"claim {claim.namespace}/{claim.name}"
    meta = doc.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    pod_claim_name = None
    if isinstance(annotations, Mapping) and isinstance(annotations.get(POD_CLAIM_NAME_ANNOTATION), str):
        pod_claim_name = str(annotations[POD_CLAIM_NAME_ANNOTATION])
    by_request: dict[str, list[MetadataDevice]] = {}
    for planned in plan.devices:
        request = planned.request or planned.request_names[0]
        by_request.setdefault(request, []).append(_device(planned, who))
    metadata = ClaimMetadata(
        namespace=claim.namespace,
        name=claim.name,
        uid=claim.uid,
        pod_claim_name=pod_claim_name,
        requests=tuple(RequestMetadata(r, tuple(devices)) for r, devices in by_request.items()),
    )
    check_names(metadata)
    return metadata


def _device(planned: PlannedDevice, who: str) -> MetadataDevice:
    published = planned.device.to_api().get("attributes", {})
    extra = config_attributes(planned)
    clash = sorted(set(published) & set(extra))
    if clash:
        raise PlanError(
            "DeviceMetadataInvalid",
            f"{who}: device {planned.device.name} publishes attribute(s) {', '.join(clash)}, which its "
            "device metadata uses for the claim's config",
        )
    attributes = {**published, **extra}
    if len(attributes) > MAX_ATTRIBUTES:
        raise PlanError(
            "DeviceMetadataInvalid",
            f"{who}: device {planned.device.name} would carry {len(attributes)} attributes in its device "
            f"metadata, more than the {MAX_ATTRIBUTES} the metadata API allows",
        )
    return MetadataDevice(pool=planned.pool, name=planned.device.name, attributes=attributes)


def config_attributes(planned: PlannedDevice) -> dict[str, dict[str, Any]]:
    """What the claim's opaque config made of the device, as attributes in the driver's domain."""
    sharing = planned.config.sharing
    out: dict[str, dict[str, Any]] = {"sharingStrategy": {"string": sharing.strategy.value}}
    if sharing.time_slicing is not None:
        out["timeSliceInterval"] = {"string": sharing.time_slicing.interval.value}
    mps = sharing.mps
    if sharing.strategy is SharingStrategy.MPS and mps is not None:
        if mps.default_active_thread_percentage is not None:
            out["mpsActiveThreadPercentage"] = {"int": mps.default_active_thread_percentage}
        limit = mps.per_device_pinned_memory_limit.get(
            planned.device.name, mps.default_pinned_device_memory_limit
        )
        if limit is not None:
            out["mpsPinnedMemoryBytes"] = {"int": int(limit)}
    if planned.share_id is not None:
        out["shareID"] = {"string": planned.share_id}
    return out


def check_names(metadata: ClaimMetadata) -> None:
    """Refuse names that the API server would never store, or that cannot be one file name."""
    who = f"claim {metadata.namespace}/{metadata.name}"
    problems = [
        ("namespace", metadata.namespace, dns_label_problem(metadata.namespace)),
        ("name", metadata.name, dns_subdomain_problem(metadata.name)),
        ("uid", metadata.uid, uid_problem(metadata.uid)),
    ]
    if metadata.pod_claim_name:
        problems.append(
            (
                f"annotation {POD_CLAIM_NAME_ANNOTATION}",
                metadata.pod_claim_name,
                dns_label_problem(metadata.pod_claim_name),
            )
        )
    for request in metadata.requests:
        problems.append(("request", request.base, dns_label_problem(request.base)))
    for what, value, problem in problems:
        if problem is not None:
            raise PlanError(
                "DeviceMetadataInvalid",
                f"{who}: its {what} {value!r} cannot name a device metadata file: it {problem}",
            )
    too_long = [
        n for n in (claim_dir_name(metadata.namespace, metadata.name),) if len(os.fsencode(n)) > NAME_MAX
    ]
    if too_long:
        raise PlanError(
            "DeviceMetadataInvalid",
            f"{who}: its device metadata directory name {too_long[0]!r} is longer than the "
            f"{NAME_MAX} bytes a file name may have (namespace and claim name together)",
        )


# --- paths ------------------------------------------------------------------------------------------


def claim_dir_name(namespace: str, name: str) -> str:
    """`{namespace}_{claim}`: neither a DNS label nor a DNS subdomain holds '_', so it splits back."""
    return f"{namespace}_{name}"


def container_path(driver: str, metadata: ClaimMetadata, request: str) -> str:
    """Where the container finds the request's file (upstream's containerFilePath)."""
    file_name = f"{driver}{CONTAINER_FILE_SUFFIX}"
    if metadata.pod_claim_name:
        return str(
            PurePosixPath(CONTAINER_DIR, TEMPLATES_SUBDIR, metadata.pod_claim_name, request, file_name)
        )
    return str(PurePosixPath(CONTAINER_DIR, CLAIMS_SUBDIR, metadata.name, request, file_name))


def cdi_kind(driver: str) -> str:
    return f"{driver}/{CDI_CLASS}"


def cdi_device_name(uid: str, request: str) -> str:
    return f"{uid}_{request}"


def cdi_spec_prefix(driver: str) -> str:
    """Every metadata CDI spec of the driver is named `{prefix}{claim uid}_{request}.json`."""
    return f"{driver}_metadata_"


def cdi_spec_name(driver: str, uid: str, request: str) -> str:
    return f"{cdi_spec_prefix(driver)}{uid}_{request}.json"


# --- rendering --------------------------------------------------------------------------------------


def render_document(driver: str, metadata: ClaimMetadata, request: RequestMetadata) -> bytes:
    """The request's metadata.json: the object once per version, each as Go's json.MarshalIndent
    writes it (the helper's PrettySerializer) and a newline, so the bytes equal upstream's."""
    return b"".join(_go_json(_document(driver, metadata, request, version)) + b"\n" for version in VERSIONS)


def _document(driver: str, metadata: ClaimMetadata, request: RequestMetadata, version: str) -> dict[str, Any]:
    # Keys in the order of upstream's Go structs (TypeMeta, ObjectMeta, then the fields); attribute
    # maps sorted, as Go's encoder sorts map keys.
    out: dict[str, Any] = {
        "kind": KIND,
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {
            "name": metadata.name,
            "namespace": metadata.namespace,
            "uid": metadata.uid,
            "generation": 1,
        },
    }
    if metadata.pod_claim_name is not None:
        out["podClaimName"] = metadata.pod_claim_name
    devices = []
    for device in request.devices:
        entry: dict[str, Any] = {"driver": driver, "pool": device.pool, "name": device.name}
        if device.attributes:
            entry["attributes"] = {key: dict(device.attributes[key]) for key in sorted(device.attributes)}
        devices.append(entry)
    req: dict[str, Any] = {"name": request.request}
    if devices:
        req["devices"] = devices
    out["requests"] = [req]
    return out


def _go_json(value: Any) -> bytes:
    """json.MarshalIndent(value, "", "  ") as Go writes it: UTF-8 kept, and '<', '>', '&', U+2028,
    U+2029 escaped (Go's HTML-safe default)."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text.encode()


def render_cdi_spec(
    driver: str, metadata: ClaimMetadata, request: RequestMetadata, host_file: Path
) -> cdi.Spec:
    """The CDI spec that bind-mounts the request's file read-only (upstream's writeCDISpec)."""
    mount = cdi.Mount(
        host_path=str(host_file),
        container_path=container_path(driver, metadata, request.base),
        options=("ro", "bind"),
    )
    device = cdi.CdiDevice(cdi_device_name(metadata.uid, request.base), cdi.ContainerEdits(mounts=(mount,)))
    return cdi.Spec(kind=cdi_kind(driver), devices=(device,))


def cdi_device_id(driver: str, uid: str, request: str) -> str:
    return cdi.qualified_name(cdi_device_name(uid, request), cdi_kind(driver))


def with_metadata_devices(prepared: Sequence[PreparedDevice], ids: Mapping[str, str]) -> list[PreparedDevice]:
    """Each request's metadata CDI device added to the first device of that request, as upstream's
    helper does: the runtime then mounts the file into every container that uses the request."""
    done: set[str] = set()
    out = []
    for device in prepared:
        extra = []
        for request in device.request_names:
            if request in ids and request not in done:
                extra.append(ids[request])
                done.add(request)
        if extra:
            device = PreparedDevice(
                request_names=device.request_names,
                pool_name=device.pool_name,
                device_name=device.device_name,
                cdi_device_ids=(*device.cdi_device_ids, *extra),
                share_id=device.share_id,
            )
        out.append(device)
    return out
