"""Pure planning for prepare: ResourceClaim JSON + this node's devices → what to prepare.

Nothing here does I/O. Given the claim as the API server returned it, the
driver name, our pool and the discovered devices, `plan_claim` decides which
allocation results are ours, which opaque config applies to each (a share of
a shared GPU gets the MPS limits of what it consumed, `draplugin.prepare.shares`),
and the CDI names they get. `render_spec` turns a plan into the claim's CDI spec and
`check_sharing` says whether a plan may take devices other claims hold.
Everything that touches disk or the network lives in `driver.py`.

Size: one pure planning pass from claim JSON to spec; each step feeds the next.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from dracommon.drivername import config_api_version
from draplugin.cdi import spec as cdi
from draplugin.cdi.driverfiles import DriverEdits
from draplugin.checkpoint import ClaimRecord, DeviceRecord
from draplugin.devices.model import Device
from draplugin.devices.schema import NVIDIA_CONTROL_NODES, DeviceNodeSpec
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from draplugin.prepare.errors import PlanError as PlanError  # re-exported: its home before errors.py
from draplugin.prepare.gpuconfig import (
    ConfigError,
    GpuConfig,
    SharingStrategy,
    default_config,
)
from draplugin.prepare.memlimits import MemoryLimitHook, device_edits
from draplugin.prepare.mpspaths import MPS_CONTAINER_DIR, SHM_CONTAINER_PATH, SHM_DIR
from draplugin.prepare.shares import Share, enforced_configs, parse_consumed
from draplugin.prepare.storedconfig import read_stored_config


def base_request_name(request: str) -> str:
    """`gpu/small` → `gpu`: the kubelet matches containers on the main request name."""
    return request.partition("/")[0]


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    request_names: tuple[str, ...]
    pool: str
    device: Device
    config: GpuConfig
    cdi_name: str
    cdi_id: str
    share_id: str | None = None
    admin_access: bool = False
    # The allocation result's request as written, `gpu/small` for a subrequest (request_names hold
    # the base name): device metadata names it so (draplugin.prepare.metadata). "": not known (a
    # plan rebuilt from the checkpoint, which keeps base names only). Left out of equality: a plan
    # rebuilt from its record is the same plan.
    request: str = dataclasses.field(default="", compare=False)

    def to_record(self) -> DeviceRecord:
        return DeviceRecord(
            request_names=self.request_names,
            pool=self.pool,
            device=self.device.name,
            cdi_ids=(self.cdi_id,),
            share_id=self.share_id,
            admin_access=self.admin_access,
            config=self.config.to_json(),
        )

    def to_prepared(self) -> PreparedDevice:
        return PreparedDevice(
            request_names=self.request_names,
            pool_name=self.pool,
            device_name=self.device.name,
            cdi_device_ids=(self.cdi_id,),
            share_id=self.share_id,
        )


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    claim: ClaimRef
    devices: tuple[PlannedDevice, ...]

    def prepared_devices(self) -> list[PreparedDevice]:
        return [device.to_prepared() for device in self.devices]

    def device_records(self) -> tuple[DeviceRecord, ...]:
        return tuple(device.to_record() for device in self.devices)

    @property
    def uses_mps(self) -> bool:
        return any(d.config.sharing.strategy is SharingStrategy.MPS for d in self.devices)


# --- planning -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Config:
    requests: tuple[str, ...]
    config: GpuConfig
    path: str


def plan_claim(
    claim: ClaimRef,
    doc: Mapping[str, Any],
    *,
    driver: str,
    pool: str,
    devices: Mapping[str, Device],
    kind: str = cdi.KIND,
) -> ClaimPlan:
    """Plan the claim's preparation on this node, or raise `PlanError` saying exactly why not."""
    who = f"{claim.namespace}/{claim.name}"
    metadata = _mapping(doc.get("metadata"), "metadata", who)
    uid = metadata.get("uid")
    if uid != claim.uid:
        raise PlanError(
            "ClaimReplaced",
            f"claim {who} has UID {uid}, kubelet asked for {claim.uid}: the claim was replaced",
        )
    status = _mapping(doc.get("status", {}), "status", who)
    allocation = status.get("allocation")
    if not allocation:
        raise PlanError("ClaimNotAllocated", f"claim {who} is not allocated (status.allocation is empty)")
    allocation = _mapping(allocation, "status.allocation", who)
    allocated = _mapping(allocation.get("devices", {}), "status.allocation.devices", who)
    api_version = config_api_version(driver)
    configs = _our_configs(allocated.get("config") or [], driver, who)

    planned: list[PlannedDevice] = []
    # Results with a shareID (a share of a shared GPU): index in `planned` and what was consumed.
    shared: dict[int, dict[str, int]] = {}
    results = _sequence(allocated.get("results") or [], "status.allocation.devices.results", who)
    for i, result in enumerate(results):
        where = f"status.allocation.devices.results[{i}]"
        result = _mapping(result, where, who)
        if result.get("driver") != driver or result.get("pool") != pool:
            continue  # another driver's device, or one of ours on another node: not ours to prepare
        request = _string(result.get("request"), f"{where}.request", who)
        name = _string(result.get("device"), f"{where}.device", who)
        device = devices.get(name)
        if device is None:
            raise PlanError(
                "DeviceNotFound",
                f"claim {who} is allocated device {pool}/{name}, which this node does not have "
                "(removed since it was published?)",
            )
        share_id = result.get("shareID")
        if share_id is not None and not isinstance(share_id, str):
            raise PlanError("InvalidClaim", f"claim {who}: {where}.shareID is not a string")
        config = _config_for(request, configs, default_config(api_version))
        if share_id is not None:
            shared[len(planned)] = parse_consumed(
                result.get("consumedCapacity"), f"{where}.consumedCapacity", who
            )
        cdi_name = cdi.claim_device_name(claim.uid, device.name)
        planned.append(
            PlannedDevice(
                request_names=(base_request_name(request),),
                pool=pool,
                device=device,
                config=config,
                cdi_name=cdi_name,
                cdi_id=cdi.qualified_name(cdi_name, kind),
                share_id=share_id,
                admin_access=result.get("adminAccess") is True,
                request=request,
            )
        )
    _enforce_shares(planned, shared, api_version, who)
    plan = ClaimPlan(claim, tuple(planned))
    _check_plan(plan, configs, who)
    return plan


def _enforce_shares(
    planned: list[PlannedDevice], shared: Mapping[int, Mapping[str, int]], api_version: str, who: str
) -> None:
    """Give the claim's shares of shared GPUs the MPS limits of what they consumed (`shares`)."""
    if not shared:
        return
    indices = sorted(shared)
    found = [
        Share(planned[i].device, planned[i].request_names[0], planned[i].config, shared[i]) for i in indices
    ]
    for i, config in zip(indices, enforced_configs(found, api_version=api_version, who=who), strict=True):
        planned[i] = dataclasses.replace(planned[i], config=config)


def plan_from_record(
    record: ClaimRecord, devices: Mapping[str, Device], kind: str = cdi.KIND, *, driver: str
) -> ClaimPlan:
    """Rebuild a completed claim's plan from the checkpoint (start-up, no API server needed)."""
    claim = ClaimRef(record.namespace, record.uid, record.name)
    who = f"{record.namespace}/{record.name}"
    planned = []
    for entry in record.devices:
        device = devices.get(entry.device)
        if device is None:
            raise PlanError("DeviceNotFound", f"claim {who}: device {entry.device} is no longer on this node")
        if entry.config is None:
            raise PlanError("CheckpointIncomplete", f"claim {who}: the checkpoint does not hold its config")
        try:
            config = read_stored_config(
                entry.config, "checkpoint config", api_version=config_api_version(driver)
            )
        except ConfigError as err:
            raise PlanError("CheckpointIncomplete", f"claim {who}: {err}") from None
        cdi_name = cdi.claim_device_name(record.uid, device.name)
        planned.append(
            PlannedDevice(
                request_names=entry.request_names,
                pool=entry.pool,
                device=device,
                config=config,
                cdi_name=cdi_name,
                cdi_id=cdi.qualified_name(cdi_name, kind),
                share_id=entry.share_id,
                admin_access=entry.admin_access,
            )
        )
    return ClaimPlan(claim, tuple(planned))


def _our_configs(entries: Any, driver: str, who: str) -> list[_Config]:
    """Our driver's configs, DeviceClass ones first, then the claim's: later entries win."""
    entries = _sequence(entries, "status.allocation.devices.config", who)
    from_class: list[_Config] = []
    from_claim: list[_Config] = []
    claim_index = 0
    for i, entry in enumerate(entries):
        where = f"status.allocation.devices.config[{i}]"
        entry = _mapping(entry, where, who)
        source = entry.get("source")
        # The scheduler copies the claim's spec.devices.config in order after the class
        # configs, so the n-th FromClaim entry is spec.devices.config[n]: name that for the user.
        user_path = where
        if source == "FromClaim":
            user_path = f"spec.devices.config[{claim_index}]"
            claim_index += 1
        opaque = entry.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != driver:
            continue
        requests = tuple(_sequence(entry.get("requests") or [], f"{where}.requests", who))
        # Imported here, not at the top: only a claim with an opaque config of ours needs the
        # validator, and it brings pydantic, which a plugin whose claims carry none never loads.
        from draplugin.prepare.claimconfig import validate_opaque_config

        try:
            config = validate_opaque_config(
                opaque.get("parameters"),
                f"{user_path}.opaque.parameters",
                api_version=config_api_version(driver),
            )
        except ConfigError as err:
            origin = "DeviceClass" if source == "FromClass" else "claim"
            raise PlanError("InvalidConfig", f"claim {who}: invalid {origin} config: {err}") from None
        target = from_class if source == "FromClass" else from_claim
        target.append(_Config(tuple(str(r) for r in requests), config, f"{user_path}.opaque.parameters"))
    return from_class + from_claim


def _config_for(request: str, configs: Sequence[_Config], default: GpuConfig) -> GpuConfig:
    chosen = default
    base = base_request_name(request)
    for entry in configs:
        if not entry.requests or request in entry.requests or base in entry.requests:
            chosen = entry.config
    return chosen


def _check_plan(plan: ClaimPlan, configs: Sequence[_Config], who: str) -> None:
    by_name: dict[str, PlannedDevice] = {}
    for planned in plan.devices:
        if planned.config.sharing.strategy is SharingStrategy.TIME_SLICING and planned.device.kind == "mig":
            raise PlanError(
                "UnsupportedSharing",
                f"claim {who}: time-slicing cannot be applied to MIG device {planned.device.name} "
                "(MIG slices are already isolated); use Exclusive or MPS",
            )
        earlier = by_name.get(planned.device.name)
        if earlier is not None:
            # Only consumable capacity (distinct share IDs) hands one device to a claim twice.
            if earlier.share_id is None or planned.share_id is None or earlier.share_id == planned.share_id:
                raise PlanError(
                    "InvalidClaim",
                    f"claim {who} is allocated device {planned.device.name} twice without share IDs",
                )
            if earlier.config != planned.config:
                raise PlanError(
                    "InvalidConfig",
                    f"claim {who}: requests {earlier.request_names[0]} and {planned.request_names[0]} share "
                    f"device {planned.device.name} but have different configs",
                )
        by_name[planned.device.name] = planned
    mps = {d.config for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS}
    if len(mps) > 1:
        raise PlanError(
            "InvalidConfig",
            f"claim {who}: its devices use different MPS settings; a claim runs one MPS server, "
            "so all its MPS devices must share one mpsConfig",
        )
    # A per-device memory limit for a device the config does not cover is a typo, not a no-op.
    for entry in configs:
        mps_config = entry.config.sharing.mps
        if mps_config is None:
            continue
        covered = {d.device.name for d in plan.devices if d.config is entry.config}
        for name in mps_config.per_device_pinned_memory_limit:
            if covered and name not in covered:
                raise PlanError(
                    "InvalidConfig",
                    f"claim {who}: {entry.path}.sharing.mpsConfig.perDevicePinnedMemoryLimit[{name}]: "
                    f"device {name} is not allocated to the requests this config applies to "
                    f"(those are: {', '.join(sorted(covered))})",
                )


# --- sharing between claims ---------------------------------------------------------------------------


def check_sharing(plan: ClaimPlan, holders: Iterable[ClaimRecord]) -> None:
    """Refuse a plan that takes a device another claim holds, unless both sides allow sharing.

    The scheduler should never do this; this is the last line of defence
    against a double allocation (for example after a lost status update).
    """
    mine = {(d.pool, d.device.name): d for d in plan.devices}
    for record in holders:
        if record.uid == plan.claim.uid:
            continue
        for held in record.devices:
            planned = mine.get((held.pool, held.device))
            if planned is None:
                continue
            problem = _sharing_conflict(planned, held)
            if problem:
                raise PlanError(
                    "DeviceInUse",
                    f"claim {plan.claim.namespace}/{plan.claim.name}: device {held.pool}/{held.device} "
                    f"is already prepared for claim {record.namespace}/{record.name} "
                    f"(uid {record.uid}); {problem}",
                )


def _sharing_conflict(planned: PlannedDevice, held: DeviceRecord) -> str:
    """'' when the two may share the device, else why not."""
    if planned.admin_access or held.admin_access:
        return ""  # admin access is monitoring next to the real user, by design
    if planned.share_id is not None and held.share_id is not None:
        if not planned.device.allow_multiple_allocations:
            # Share IDs from an allocation this node no longer publishes as shared (--shared-gpus).
            return "the device is not published as a shared GPU on this node (--shared-gpus is off)"
        return "" if planned.share_id != held.share_id else "both use the same share ID"
    api_version = planned.config.api_version
    held_config = default_config(api_version)
    if held.config is not None:
        # An unreadable record counts as exclusive use.
        with contextlib.suppress(ConfigError):
            held_config = read_stored_config(held.config, "checkpoint", api_version=api_version)
    mine, theirs = planned.config.sharing, held_config.sharing
    if mine.strategy is SharingStrategy.EXCLUSIVE or theirs.strategy is SharingStrategy.EXCLUSIVE:
        return "one of the claims uses it exclusively"
    if mine.strategy is SharingStrategy.MPS or theirs.strategy is SharingStrategy.MPS:
        return "a GPU runs one MPS server, owned by one claim"
    if mine != theirs:
        return "the claims ask for different time-slice intervals"
    return ""


# --- CDI ----------------------------------------------------------------------------------------------


def env_key(device_name: str) -> str:
    """`gpu-0` → `GPU_0`, for per-device environment variable names."""
    return re.sub(r"[^A-Z0-9]", "_", device_name.upper())


# In every spec: the legacy NVIDIA runtime hook (nvidia-container-runtime) reads this variable,
# which CUDA images set to "all"; "void" makes it add nothing, so a container gets the GPUs
# of its claims and no others.
NVIDIA_VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES=void"


def render_spec(
    plan: ClaimPlan,
    mps_host_dir: PurePosixPath | None = None,
    kind: str = cdi.KIND,
    driver_edits: cdi.ContainerEdits | None = None,
    memory_limit_hook: MemoryLimitHook | None = None,
) -> cdi.Spec:
    """The claim's CDI spec: one CDI device per node device, each with only its own edits.

    A share whose GPU takes the driver's per-cgroup memory limit gets NVIDIA's hook that sets it
    and the limit in its env (`memory_limit_hook`, `draplugin.prepare.memlimits`).

    `driver_edits` (the driver's libraries, binaries and node-wide device nodes,
    `draplugin.cdi.driverfiles`) are the spec's own edits, which CDI applies
    once for any of its devices: every device of a claim needs the same files.
    Each device carries only its own nodes (`/dev/nvidiaN`, its MIG access
    nodes), at the driver root's `dev` on the host when it has one.

    Environment keys are per device (`DRAPLUGIN_DEVICE_GPU_0_UUID`): the
    kubelet gives a container the union of several CDI devices, and CDI
    resolves equal keys last-writer-wins, so shared keys would lose devices.
    MPS settings are the exception: one claim has one MPS configuration
    (enforced by planning), so every MPS device carries identical values.
    """
    mps_env = _mps_env(plan)
    seen: set[str] = set()
    devices: list[cdi.CdiDevice] = []
    control: list[cdi.DeviceNode] = []
    dev_dir = driver_edits.host_dev_dir if isinstance(driver_edits, DriverEdits) else "/dev"
    for planned in plan.devices:
        if planned.cdi_name in seen:
            continue  # the same device under two share IDs: one CDI device serves both
        seen.add(planned.cdi_name)
        device = planned.device
        key = env_key(device.name)
        sharing = planned.config.sharing
        env = [
            f"DRAPLUGIN_DEVICE_{key}_NAME={device.name}",
            f"DRAPLUGIN_DEVICE_{key}_UUID={device.uuid}",
            f"DRAPLUGIN_DEVICE_{key}_KIND={device.kind}",
            f"DRAPLUGIN_DEVICE_{key}_INDEX={device.index}",
            f"DRAPLUGIN_DEVICE_{key}_SHARING={sharing.strategy.value}",
        ]
        model = _model(device)
        if model:
            env.append(f"DRAPLUGIN_DEVICE_{key}_MODEL={model}")
        if device.parent_uuid:
            env.append(f"DRAPLUGIN_DEVICE_{key}_PARENT_UUID={device.parent_uuid}")
        if sharing.time_slicing is not None:
            env.append(f"DRAPLUGIN_DEVICE_{key}_TIMESLICE_INTERVAL={sharing.time_slicing.interval.value}")
        mounts: tuple[cdi.Mount, ...] = ()
        if sharing.strategy is SharingStrategy.MPS:
            env.extend(mps_env)
            if mps_host_dir is not None:
                mounts = (
                    cdi.Mount(
                        host_path=str(mps_host_dir),
                        container_path=MPS_CONTAINER_DIR,
                        options=("rbind", "rw", "nosuid", "nodev"),
                    ),
                    # MPS clients and the server exchange memory segments through /dev/shm, so the
                    # container's must be the daemon's: the claim's own directory, not the pod's tmpfs.
                    cdi.Mount(
                        host_path=str(PurePosixPath(str(mps_host_dir)) / SHM_DIR),
                        container_path=SHM_CONTAINER_PATH,
                        options=("rbind", "rw", "nosuid", "nodev"),
                    ),
                )
        nodes = tuple(
            _device_node(node, _host_path(device, node, dev_dir))
            for node in device.device_nodes
            if node not in NVIDIA_CONTROL_NODES
        )
        control += [
            _device_node(node, _host_path(device, node, dev_dir))
            for node in device.device_nodes
            if node in NVIDIA_CONTROL_NODES
        ]
        limit_env, hooks = device_edits(planned, memory_limit_hook)
        env.extend(limit_env)
        devices.append(cdi.CdiDevice(planned.cdi_name, cdi.ContainerEdits(tuple(env), nodes, mounts, hooks)))
    shared = driver_edits or cdi.ContainerEdits()
    # The control nodes are node-wide: written once, at spec level. A device-level copy would be
    # applied after the spec's (and win) with the wrong host path. The driver root's, when it is
    # known, are the ones that exist; else (a fake backend without one) the devices' own.
    spec_nodes = shared.device_nodes if driver_edits is not None else tuple(dict.fromkeys(control))
    edits = cdi.ContainerEdits((NVIDIA_VISIBLE_DEVICES_ENV, *shared.env), spec_nodes, shared.mounts)
    return cdi.Spec(kind=kind, devices=tuple(devices), edits=edits)


def _host_path(device: Device, node: str, dev_dir: str) -> str | None:
    """Where the runtime finds the node on the host, when not at the container path: the backend's
    own nodes (fake GPUs), else the driver root's `dev` (NVIDIA's `--dev-root`) for NVIDIA's nodes,
    else the same path. A node that is not NVIDIA's (fake GPUs without a device directory use
    `/dev/null`) is the host's own: the driver root does not have it."""
    if device.host_dev_dir is None and not node.startswith("/dev/nvidia"):
        return None
    host_dir = (device.host_dev_dir or dev_dir).rstrip("/")
    host = f"{host_dir}/{node.removeprefix('/dev/')}"
    return None if host == node else host


def _device_node(node: str, host_path: str | None) -> cdi.DeviceNode:
    if isinstance(node, DeviceNodeSpec):
        # Made by the runtime from its numbers: it may exist in no host /dev (a MIG device made
        # inside the plugin's container), so nothing may need to stat the host path.
        return cdi.DeviceNode(
            path=str(node),
            host_path=host_path,
            type="c",
            major=node.major,
            minor=node.minor,
            file_mode=node.file_mode,
        )
    return cdi.DeviceNode(path=node, host_path=host_path)


def _model(device: Device) -> str:
    for key in ("productName", "model", "resource.kubernetes.io/productName"):
        value = device.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _mps_env(plan: ClaimPlan) -> list[str]:
    mps_devices = [d for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS]
    if not mps_devices:
        return []
    mps = mps_devices[0].config.sharing.mps
    env = [
        f"CUDA_MPS_PIPE_DIRECTORY={MPS_CONTAINER_DIR}/pipe",
        f"CUDA_MPS_LOG_DIRECTORY={MPS_CONTAINER_DIR}/log",
    ]
    if mps is None:
        return env
    if mps.default_active_thread_percentage is not None:
        env.append(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={mps.default_active_thread_percentage}")
    limits = []
    for planned in sorted({d.device.name: d for d in mps_devices}.values(), key=lambda d: d.device.name):
        default = mps.default_pinned_device_memory_limit
        limit = mps.per_device_pinned_memory_limit.get(planned.device.name, default)
        if limit is not None:
            # CUDA takes the limit per device UUID in whole MiB; round up so a limit never shrinks.
            limits.append(f"{planned.device.uuid}={-(-limit // (1 << 20))}M")
    if limits:
        env.append(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={','.join(limits)}")
    return env


# --- tolerant access to claim JSON --------------------------------------------------------------------


def _mapping(value: Any, where: str, who: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise PlanError("InvalidClaim", f"claim {who}: {where} is not an object")
    return value


def _sequence(value: Any, where: str, who: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise PlanError("InvalidClaim", f"claim {who}: {where} is not a list")
    return value


def _string(value: Any, where: str, who: str) -> str:
    if not isinstance(value, str) or not value:
        raise PlanError("InvalidClaim", f"claim {who}: {where} is missing")
    return value
