"""Driver files in prepare: the --driver-root settings, discovery retried and reported once, claims
that would get a broken spec fail with the reason, and every spec sets NVIDIA_VISIBLE_DEVICES=void."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from draplugin import config
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import ARCHES, DriverInstall, DriverRoot, DriverRootError
from draplugin.cdi.driverroot import discover
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore
from draplugin.devices.model import Device
from draplugin.kubelet.interface import ClaimError, ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.plan import plan_claim, render_spec
from draplugin.prepare.sharing import SharingState
from tests.driverroot_layout import debian_layout
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, claim_doc, result

LIB_DIR = "/usr/lib/x86_64-linux-gnu"


def x86_discover(root: DriverRoot, **kwargs: object) -> DriverInstall:
    return discover(root, arch=ARCHES["x86_64"], **kwargs)  # type: ignore[arg-type]


class Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, reason: str, message: str) -> None:
        self.seen.append((reason, message))


def files_at(root: Path, reports: Reports) -> DriverFiles:
    return DriverFiles(DriverRoot.at(str(root)), report=reports, discover_install=x86_discover)


# --- settings -----------------------------------------------------------------------------------------


def test_driver_root_defaults_per_backend_and_env_mirror() -> None:
    nvml = config.load({"node_name": "n"}, environ={})
    assert (nvml.driver_root, nvml.driver_root_mount) == ("/", Path("/"))
    fake = config.load({"node_name": "n", "backend": "fake"}, environ={})
    assert (fake.driver_root, fake.driver_root_mount) == (None, None)
    chart = config.load(
        {"node_name": "n"}, environ={"DRIVER_ROOT": "/run/nvidia/driver", "DRIVER_ROOT_MOUNT": "/driver-root"}
    )
    assert (chart.driver_root, chart.driver_root_mount) == ("/run/nvidia/driver", Path("/driver-root"))
    flag_wins = config.load({"node_name": "n", "driver_root": "/opt/drv"}, environ={"DRIVER_ROOT": "/x"})
    assert (flag_wins.driver_root, flag_wins.driver_root_mount) == ("/opt/drv", Path("/opt/drv"))
    fake_root = config.load({"node_name": "n", "backend": "fake", "driver_root": "/opt/drv"}, environ={})
    assert fake_root.driver_root == "/opt/drv"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"driver_root": "run/nvidia/driver"},
            r"--driver-root \(DRIVER_ROOT\): 'run/nvidia/driver' must be an absolute path",
        ),
        (
            {"backend": "fake", "driver_root_mount": "/driver-root"},
            r"--driver-root-mount .* needs --driver-root",
        ),
        ({"driver_root_mount": "relative"}, r"--driver-root-mount \(DRIVER_ROOT_MOUNT\): 'relative' must be"),
    ],
)
def test_bad_driver_root_settings(flags: dict[str, str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.load({"node_name": "n", **flags}, environ={})


# --- discovery for prepare ----------------------------------------------------------------------------


def test_failed_discovery_is_retried_and_reported_once(tmp_path: Path) -> None:
    reports = Reports()
    files = files_at(tmp_path / "driver", reports)
    for _ in range(3):
        with pytest.raises(DriverRootError, match="does not exist"):
            files.edits()
    assert [reason for reason, _ in reports.seen] == ["DriverRootMissing"]
    # The GPU Operator's driver container fills the root later: the next call finds it.
    debian_layout(dev_nodes=("nvidiactl",)).build(tmp_path / "driver")
    edits = files.edits()
    assert any(m.container_path == f"{LIB_DIR}/libcuda.so.1" for m in edits.mounts)
    assert files.edits() is edits
    files.edits()
    assert [reason for reason, _ in reports.seen] == ["DriverRootMissing", "UvmDeviceNodesMissing"]


def test_vanished_libraries_are_discovered_again(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "driver")
    files = files_at(root, Reports())
    assert files.install().version == "580.95.05"
    # A driver upgrade replaces the libraries of the old version.
    for old in (root / "usr/lib/x86_64-linux-gnu").glob("*.580.95.05"):
        old.unlink()
    debian_layout(version="580.105.08").build(root)
    assert files.install().version == "580.105.08"


def test_nvml_version_is_asked_at_every_discovery(tmp_path: Path) -> None:
    root = debian_layout(proc_version=None).build(tmp_path / "driver")
    debian_layout(version="570.172.08", proc_version=None, firmware=False).build(root)
    answers = iter(["570.172.8"])
    files = DriverFiles(
        DriverRoot.at(str(root)),
        known_version=lambda: next(answers),
        report=Reports(),
        discover_install=x86_discover,
    )
    assert files.install().version == "570.172.08"


# --- prepare ------------------------------------------------------------------------------------------


def gpu_driver(
    tmp_path: Path,
    claims: FakeClaims,
    files: DriverFiles | None,
    devices: Sequence[Device] = tuple(DEVICES.values()),
) -> GpuDriver:
    """The prepare driver of one node, with driver files from `files`."""
    driver = GpuDriver(
        driver_name=DRIVER,
        node_name=NODE,
        devices=devices,
        claims=claims,
        cdi_store=SpecStore(tmp_path / "cdi", DRIVER),
        checkpoint=CheckpointStore(tmp_path / "state" / "checkpoint.json", "boot-1"),
        sharing=SharingState(tmp_path / "state"),
        events=RecordingEvents(),
        metrics=ClaimMetrics(CollectorRegistry()),
        driver_files=files,
    )
    driver.recover()
    return driver


def spec_of(tmp_path: Path, uid: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((tmp_path / "cdi" / f"{DRIVER}-claim_{uid}.json").read_text())
    return loaded


async def test_prepare_gives_every_device_of_the_claim_the_driver_files(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "driver")
    claims = FakeClaims()
    ref = claims.add(claim_doc(uid="uid-1", results=[result("gpu", "gpu-0"), result("gpu", "gpu-1")]))
    await gpu_driver(tmp_path, claims, files_at(root, Reports())).prepare_claim(ref)
    spec = spec_of(tmp_path, "uid-1")
    shared = spec["containerEdits"]
    assert isinstance(shared, dict)
    assert shared["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "TRITON_LIBCUDA_PATH=/usr/lib/x86_64-linux-gnu"]
    by_path = {m["containerPath"]: m["hostPath"] for m in shared["mounts"]}
    assert by_path[f"{LIB_DIR}/libcuda.so.1"] == str(root / "usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05")
    assert by_path["/usr/bin/nvidia-smi"] == str(root / "usr/bin/nvidia-smi")
    # Claim-wide edits live once in the spec, not in each device.
    devices = spec["devices"]
    assert isinstance(devices, list) and len(devices) == 2
    assert all("mounts" not in d["containerEdits"] for d in devices)


async def test_prepare_fails_the_claim_saying_what_is_missing(tmp_path: Path) -> None:
    claims = FakeClaims()
    ref = claims.add(claim_doc(uid="uid-2", results=[result("gpu", "gpu-0")]))
    driver = gpu_driver(tmp_path, claims, files_at(tmp_path / "empty", Reports()))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ClaimError, match=r"cannot get the NVIDIA driver files: no NVIDIA driver libraries"):
        await driver.prepare_claim(ref)
    assert not (tmp_path / "cdi" / f"{DRIVER}-claim_uid-2.json").exists()
    events = driver.events
    assert isinstance(events, RecordingEvents)
    assert [(uid, reason) for uid, reason, _ in events.claim_events] == [("uid-2", "DriverLibrariesMissing")]
    # Once the driver is there, the kubelet's retry succeeds.
    debian_layout().build(tmp_path / "empty")
    await driver.prepare_claim(ref)
    assert spec_of(tmp_path, "uid-2")["containerEdits"]


async def test_without_a_driver_root_specs_still_keep_the_legacy_hook_out(tmp_path: Path) -> None:
    claims = FakeClaims()
    ref = claims.add(claim_doc(uid="uid-3", results=[result("gpu", "gpu-0")]))
    await gpu_driver(tmp_path, claims, None).prepare_claim(ref)
    assert spec_of(tmp_path, "uid-3")["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}


def test_render_spec_puts_driver_edits_in_the_spec_edits(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "driver")
    edits = files_at(root, Reports()).edits()
    ref_doc = claim_doc(uid="uid-4", results=[result("gpu", "gpu-0")])
    plan = plan_claim(ClaimRef("ns", "uid-4", "claim"), ref_doc, driver=DRIVER, pool=NODE, devices=DEVICES)
    spec = render_spec(plan, None, driver_edits=edits)
    assert spec.edits.mounts == edits.mounts and spec.edits.device_nodes == edits.device_nodes
    assert spec.edits.env == ("NVIDIA_VISIBLE_DEVICES=void", "TRITON_LIBCUDA_PATH=/usr/lib/x86_64-linux-gnu")
