"""Build the prepare driver from `draplugin run` settings: API client, devices, stores, events.

Environment variables read here (beyond the settings):
  DRAPLUGIN_FAKE_GPUS / DRAPLUGIN_FAKE_CONFIG  fake backend: GPU count, or a YAML description
  DRAPLUGIN_BOOT_ID_FILE                       where to read the boot ID (tests simulate reboots)
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry

from dracommon.kubeapi import ApiError, AsyncKubeApi, KubeApi, load_api_client
from dracommon.kubeversion import VersionError, server_version
from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot, DriverRootError
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import DEFAULT_BOOT_ID_PATH, CheckpointStore, read_boot_id
from draplugin.config import Settings
from draplugin.devices import DeviceBackend, load_backend
from draplugin.devices.fakemig import STATE_FILE as FAKE_MIG_FILE
from draplugin.devices.fakemig import FakeMigHardware
from draplugin.devices.mig import MigPartitioner
from draplugin.devices.nvml import NvmlBackend
from draplugin.events import KubeEvents
from draplugin.kubelet.dra import DEFAULT_MAX_CONCURRENT_CLAIMS
from draplugin.kubelet.serialize import held_now, lock_path
from draplugin.kubelet.sockets import PLUGINS_DIR_NAME
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.api import REQUEST_TIMEOUT_S, KubeClaimReader
from draplugin.prepare.claimstatus import ClaimStatusWriter, enabled_for
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.memlimits import MemoryLimitHook
from draplugin.prepare.metadatastore import MetadataStore
from draplugin.prepare.mps import DaemonRunner, MpsDaemons
from draplugin.prepare.mpspod import PodRunner, PodSettings
from draplugin.prepare.sharing import SharingState
from draplugin.prepare.timeslice import TimeSlicer

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
# Under the state dir: links to the driver's libraries, the LD_LIBRARY_PATH of its tools.
LIBRARY_VIEWS = "driver-libs"
# Status writes are few and never urgent: a handful of workers keeps up, and leaves the API server
# (and our CPU) to the prepares' GETs.
STATUS_WORKERS = 4
FAKE_GPUS_ENV = "DRAPLUGIN_FAKE_GPUS"
FAKE_CONFIG_ENV = "DRAPLUGIN_FAKE_CONFIG"
BOOT_ID_FILE_ENV = "DRAPLUGIN_BOOT_ID_FILE"


class WiringError(RuntimeError):
    """The driver cannot be built from these settings (bad option, no credentials, no devices)."""


def backend_options(backend: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    if backend != "fake":
        return options
    if env.get(FAKE_CONFIG_ENV):
        options["config_file"] = env[FAKE_CONFIG_ENV]
    elif env.get(FAKE_GPUS_ENV):
        try:
            options["gpus"] = int(env[FAKE_GPUS_ENV])
        except ValueError:
            raise WiringError(f"{FAKE_GPUS_ENV}={env[FAKE_GPUS_ENV]!r} is not a number") from None
    return options


def _driver_files(
    settings: Settings, backend: DeviceBackend, events: KubeEvents
) -> driverfiles.DriverFiles | None:
    """The driver files source, looked at once now so a problem is in the log and on the Node
    from the start; the plugin serves either way and prepare retries the discovery."""
    if settings.driver_root is None:
        return None

    def report(reason: str, message: str) -> None:
        driverfiles.log_report(reason, message)
        events.node_event(reason, message)

    mount = str(settings.driver_root_mount) if settings.driver_root_mount else None
    files = driverfiles.for_backend(
        DriverRoot.at(settings.driver_root, mount), backend, report, settings.driver_capabilities
    )
    # Reported by `report`; each prepare tries again and fails its claim with the same message.
    with contextlib.suppress(DriverRootError):
        files.install()
    return files


def _mig_partitioner(settings: Settings, backend: DeviceBackend) -> MigPartitioner | None:
    """Who creates MIG devices at prepare: NVML itself, or the fake GPUs' MIG state file."""
    if isinstance(backend, NvmlBackend):
        return backend
    if backend.name == "fake":
        device_dir = settings.backend_options().get("device_dir")
        return FakeMigHardware(
            settings.state_dir / FAKE_MIG_FILE, Path(str(device_dir)) if device_dir else None
        )
    return None


def _mps_runner(settings: Settings, api: KubeApi, tools: DriverTools) -> DaemonRunner | None:
    """`--mps-daemon=pod`: a Pod per claim (the chart); else None, processes of this plugin."""
    if settings.mps_daemon != "pod":
        return None
    assert settings.mps_daemon_image is not None and settings.pod_namespace is not None  # config checks
    pods = PodSettings(
        namespace=settings.pod_namespace,
        node_name=settings.node_name,
        driver_name=settings.driver_name,
        image=settings.mps_daemon_image,
        pull_policy=settings.mps_daemon_image_pull_policy,
        driver_root=settings.driver_root,
        driver_root_mount=settings.driver_root_mount,
        library_views=tools.views,
        privileged=settings.backend == "nvml",  # real GPUs: the daemon opens their device nodes
        image_pull_secrets=settings.mps_daemon_image_pull_secrets,
        plugin_pod_uid=settings.pod_uid,  # its DaemonSet owns the daemon Pods
    )
    return PodRunner(api, pods)


def _sharing(
    settings: Settings, backend: DeviceBackend, files: driverfiles.DriverFiles | None, api: KubeApi
) -> SharingState:
    """MIG from the backend; MPS daemons and time-slices through the driver root's own tools, each
    run with the one environment `DriverTools.env` builds (its library views in the state dir)."""
    tools = DriverTools(files, settings.state_dir / LIBRARY_VIEWS) if files is not None else None
    return SharingState(
        settings.state_dir,
        mig_partitioner=_mig_partitioner(settings, backend),
        mps_daemons=(
            MpsDaemons(tools, runner=_mps_runner(settings, api, tools), shm_bytes=settings.mps_shm_size)
            if tools is not None
            else None
        ),
        time_slicer=TimeSlicer(tools) if tools is not None else None,
    )


def _claim_status(
    settings: Settings, api: KubeApi, async_api: AsyncKubeApi, registry: CollectorRegistry = REGISTRY
) -> ClaimStatusWriter | None:
    """The status.devices writer, if `--device-status` (auto: the server's release) turns it on."""
    version = settings.kubernetes_version
    if settings.device_status == "auto" and version is None:
        try:
            version = server_version(api)
        except (ApiError, VersionError) as err:
            # Off rather than guessed: a write the server may not narrow is worse than no status.
            log.warning(
                "cannot read the server's release: status.devices stays off", extra={"error": str(err)}
            )
            return None
    if not enabled_for(settings.device_status, version):
        log.info("status.devices is off", extra={"device_status": settings.device_status})
        return None
    return ClaimStatusWriter(
        async_api, driver_name=settings.driver_name, node_name=settings.node_name, registry=registry
    )


def memory_limit_hook(settings: Settings) -> MemoryLimitHook | None:
    """NVIDIA's hook for shares' memory limits, where discovery can mark GPUs for it (nvml backend)."""
    if settings.nvidia_cdi_hook_path is None or settings.backend != "nvml":
        return None
    return MemoryLimitHook(settings.nvidia_cdi_hook_path, settings.driver_root or "/")


def metadata_store(settings: Settings) -> MetadataStore:
    """Device metadata below the plugin's own kubelet directory, as upstream's helper keeps it
    (its plugin data directory); the chart mounts that directory at the same path, so the host
    path the CDI spec names is this one. Always made: with --device-metadata=off it only removes."""
    plugin_dir = settings.kubelet_root_dir / PLUGINS_DIR_NAME / settings.driver_name
    return MetadataStore(
        plugin_dir, settings.cdi_root, settings.driver_name, enabled=settings.device_metadata != "off"
    )


def claim_reader(api: KubeApi) -> KubeClaimReader:
    """The prepare path's claim reader: a GET worker and a pooled connection for every claim the
    kubelet runner lets in at once. With fewer (16 for 64 claims) admitted claims queued for a
    thread in rounds of a server round trip each, where the Go plugins send every GET at once
    over HTTP/2. retries=0: the reader retries itself, within the prepare's deadline; urllib3's
    own retries would outlast it."""
    return KubeClaimReader(AsyncKubeApi(api, DEFAULT_MAX_CONCURRENT_CLAIMS, retries=0))


def driver_from_settings(settings: Settings, backend: DeviceBackend | None = None) -> GpuDriver:
    """Everything the driver needs, then start-up recovery (checkpoint, CDI specs) before serving.

    `backend`: the node daemon passes the backend it publishes from, so the
    driver prepares exactly the devices the ResourceSlices offer.
    """
    try:
        if backend is None:
            backend = load_backend(settings.backend, settings.node_name, **backend_options(settings.backend))
        devices = backend.discover()
        api_client = load_api_client(str(settings.kubeconfig) if settings.kubeconfig else None)
    except (ValueError, RuntimeError) as err:
        raise WiringError(str(err)) from err
    api = KubeApi(api_client, timeout_s=REQUEST_TIMEOUT_S)
    boot_id = read_boot_id(Path(os.environ.get(BOOT_ID_FILE_ENV) or DEFAULT_BOOT_ID_PATH))
    events = KubeEvents(api, settings.driver_name, settings.node_name)
    # Discovery problems an admin must fix (an NVML GPU in MIG mode without MIG devices) go to
    # the Node as Events; a backend without such problems has nothing to attach.
    attach_events = getattr(backend, "attach_events", None)
    if callable(attach_events):
        attach_events(events)
    files = _driver_files(settings, backend, events)
    claims = claim_reader(api)
    # The status writer's own workers and connection pool (same server and credentials): a
    # prepare's claim GET must never queue behind a background status write. retries=0: the writer
    # retries itself, within its own limits.
    status_api = AsyncKubeApi(
        KubeApi(type(api_client)(configuration=api_client.configuration), timeout_s=REQUEST_TIMEOUT_S),
        STATUS_WORKERS,
        retries=0,
    )
    driver = GpuDriver(
        driver_name=settings.driver_name,
        node_name=settings.node_name,
        devices=devices,
        claims=claims,
        cdi_store=SpecStore(settings.cdi_root, settings.driver_name),
        checkpoint=CheckpointStore(settings.state_dir / CHECKPOINT_FILE, boot_id),
        sharing=_sharing(settings, backend, files, api),
        events=events,
        metrics=ClaimMetrics(),
        driver_files=files,
        api_deadline_s=settings.prepare_api_deadline_s,
        status=_claim_status(settings, api, status_api),
        metadata=metadata_store(settings),
        memory_limit_hook=memory_limit_hook(settings),
    )
    # Beside another plugin pod (rolling update: a pod UID is set) recover under the lock its
    # calls hold, or it could remove a spec that pod is writing for a claim it is preparing.
    serialized = (
        held_now(lock_path(settings.kubelet_root_dir, settings.driver_name))
        if settings.pod_uid is not None
        else contextlib.nullcontext()
    )
    with serialized:
        driver.recover()
    log.info(
        "prepare driver ready",
        extra={
            "backend": settings.backend,
            "devices": len(devices),
            "cdi_root": str(settings.cdi_root),
            "state_dir": str(settings.state_dir),
        },
    )
    return driver
