"""`make gpu-check`, a dynamic MIG device while it exists: its CDI nodes, a container on it, its UUID.

`draplugin.gpucheck.sharing.mig_rows` creates a MIG device through prepare's own code
(`draplugin.prepare.mig.create_device` over `NvmlBackend.mig_create`) and,
before destroying it, hands it to `MigInspector`, which checks:

- `MIG caps node`: each `nvidia-caps` node of the CDI spec prepare writes for
  the device (`type`, `major`, `minor`) against the numbers the kernel driver
  gives, read here on their own: the `nvidia-caps` major of `/proc/devices` and
  the `DeviceFileMinor` of the GPU instance's and compute instance's `access`
  files, and against the host's `/dev/nvidia-caps/nvidia-capN` that NVIDIA's
  own tools made (NVML runs `nvidia-modprobe` for them when a process of the
  host opens the MIG device). The plugin creates the device from inside its
  container, where such a node lands in the container's `/dev` only: the spec
  carries the numbers so the runtime makes the node, and this row shows the
  numbers are the host kernel's. A node the spec has beyond those two (another
  instance's, `mig/config`, `mig/monitor`) is a mismatch.
- `MIG container nvidia-smi -L`: a runc container with exactly that spec's
  edits (the container row of `draplugin.gpucheck.container`) lists the parent GPU and
  the MIG device, with NVIDIA's own `nvidia-smi`.
- `MIG UUID`: the UUID prepare reports (`nvmlComputeInstanceGetInfo(ci).device`
  -> `nvmlDeviceGetUUID`) is the MIG UUID that appeared in the driver root's
  `nvidia-smi -L` with the create.

Needs what the container row needs (runc, root, the spec's `nvidia-smi`); a
row that cannot run is skipped with the reason.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dracommon.drivername import DEFAULT_DRIVER_NAME
from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRootError
from draplugin.cdi.spec import claim_device_name
from draplugin.devices.model import Device
from draplugin.gpucheck.container import container_edits, run_container
from draplugin.gpucheck.smi import listed_uuids
from draplugin.gpucheck.table import MISMATCH, NODE, OK, SKIPPED, Row
from draplugin.prepare.errors import PlanError

CAPS_DIR = "/dev/nvidia-caps"
CAPS_DRIVER = "nvidia-caps"  # its name in /proc/devices


@dataclass(frozen=True, slots=True)
class CreatedDevice:
    """A MIG device gpu-check created: as prepare returned it, with its instance IDs (the ledger's)."""

    device: Device  # its MIG UUID and device nodes, as prepare's `create_device` realized it
    parent_minor: int
    gpu_instance: int
    compute_instance: int
    listed_before: str  # `nvidia-smi -L` before the create


def caps_major(proc_root: str | Path) -> int | None:
    """The character major `nvidia-caps` registered (`<proc>/devices`), or None."""
    try:
        text = (Path(proc_root) / "devices").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    character = False
    for line in text.splitlines():
        if line.endswith(":"):
            character = line.startswith("Character")
            continue
        number, _, name = line.strip().partition(" ")
        if character and name.strip() == CAPS_DRIVER and number.isdigit():
            return int(number)
    return None


def access_minor(path: Path) -> int | None:
    """`DeviceFileMinor` of a capability's `access` file, or None."""
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value)
    return None


def expected_caps(proc_root: str | Path, minor: int, gi: int, ci: int) -> dict[str, tuple[int | None, int]]:
    """The caps nodes that grant one MIG device, by container path: (major, minor) from /proc.
    An access file that is missing gives no entry (the rows then miss a node and say so)."""
    base = Path(proc_root) / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    major = caps_major(proc_root)
    nodes: dict[str, tuple[int | None, int]] = {}
    for access in (base / "access", base / f"ci{ci}" / "access"):
        found = access_minor(access)
        if found is not None:
            nodes[f"{CAPS_DIR}/nvidia-cap{found}"] = (major, found)
    return nodes


def _numbers(node: Mapping[str, Any]) -> str:
    if node.get("major") is None:
        stated = node.get("hostPath") or node["path"]
        return f"{node.get('type') or '?'} (no numbers: a runtime stats {stated})"
    return f"{node.get('type') or '?'} {node['major']}:{node['minor']}"


def host_node(path: str, dev_root: str | Path = "/dev") -> tuple[int, int] | None:
    """(major, minor) of the host's character device at the container path `path`, or None."""
    local = Path(dev_root) / Path(path).relative_to("/dev")
    try:
        info = os.stat(local)
    except OSError:
        return None
    return (os.major(info.st_rdev), os.minor(info.st_rdev)) if stat.S_ISCHR(info.st_mode) else None


def caps_rows(
    spec_json: Mapping[str, Any],
    cdi_name: str,
    made: CreatedDevice,
    *,
    proc_root: str | Path = "/proc",
    dev_root: str | Path = "/dev",
) -> list[Row]:
    """One row per caps node the MIG device needs, plus one for any the spec has beyond those."""
    subject = made.device.name
    nodes = {
        n["path"]: n
        for n in container_edits(spec_json, cdi_name)["deviceNodes"]
        if n["path"].startswith(CAPS_DIR)
    }
    wanted = expected_caps(proc_root, made.parent_minor, made.gpu_instance, made.compute_instance)
    if not wanted:
        where = f"{proc_root}/driver/nvidia/capabilities/gpu{made.parent_minor}/mig/gi{made.gpu_instance}"
        return [
            Row(
                "MIG caps node",
                subject,
                f"{len(nodes)} in the spec",
                f"no access files under {where}",
                MISMATCH,
            )
        ]
    rows: list[Row] = []
    for path, (major, minor) in sorted(wanted.items()):
        node = nodes.get(path)
        on_host = host_node(path, dev_root)
        theirs = f"c {major}:{minor} (/proc), host " + (
            f"c {on_host[0]}:{on_host[1]}" if on_host else "has none"
        )
        ours = _numbers(node) if node is not None else "not in the spec"
        same = (
            node is not None
            and node.get("type") == "c"
            and (node.get("major"), node.get("minor")) == (major, minor) == on_host
        )
        rows.append(Row("MIG caps node", f"{subject} {path}", ours, theirs, OK if same else MISMATCH))
    for path in sorted(set(nodes) - set(wanted)):
        rows.append(
            Row("MIG caps node", f"{subject} {path}", _numbers(nodes[path]), "not this device's", MISMATCH)
        )
    return rows


def uuid_row(made: CreatedDevice, listed_after: str) -> Row:
    """Prepare's MIG UUID (from the compute instance's info) against the one `nvidia-smi -L` added."""
    before = set(listed_uuids(made.listed_before))
    new = [u for u in listed_uuids(listed_after) if u.startswith("MIG-") and u not in before]
    theirs = " ".join(new) or "no new MIG device listed"
    ours = made.device.uuid or "no UUID"
    return Row("MIG UUID", made.device.name, ours, theirs, OK if new == [made.device.uuid] else MISMATCH)


@dataclass
class MigInspector:
    """The checks on a MIG device gpu-check created, run while it exists (`sharing.mig_rows`)."""

    files: driverfiles.DriverFiles | None
    list_gpus: Callable[[], str]
    runc: str | None = None
    nvidia_smi: Path | None = None
    proc_root: str = "/proc"
    dev_root: str = "/dev"
    is_root: Callable[[], bool] = field(default=lambda: os.geteuid() == 0)

    def __call__(self, made: CreatedDevice) -> list[Row]:
        rows: list[Row] = []
        try:
            rows.append(uuid_row(made, self.list_gpus()))
        except (PlanError, OSError) as err:
            rows.append(
                Row("MIG UUID", made.device.name, made.device.uuid, f"no nvidia-smi -L: {err}", MISMATCH)
            )
        try:
            # Imported here, as in `render_specs`: only the spec rows need prepare's planning.
            from draplugin.cdi.preview import PREVIEW_CLAIM, preview_spec

            spec = preview_spec(
                {made.device.name: made.device},
                [made.device.name],
                driver=DEFAULT_DRIVER_NAME,
                node=NODE,
                driver_files=self.files,
            )
        except (ImportError, DriverRootError, ValueError) as err:
            return [
                *rows,
                Row("MIG caps node", made.device.name, f"no spec: {err}", "a rendered spec", MISMATCH),
            ]
        cdi_name = claim_device_name(PREVIEW_CLAIM.uid, made.device.name)
        rows += caps_rows(spec.to_json(), cdi_name, made, proc_root=self.proc_root, dev_root=self.dev_root)
        rows.append(self._container(spec, made.device))
        return rows

    def _container(self, spec: Any, device: Device) -> Row:
        check = "MIG container nvidia-smi -L"
        reason = _container_skip(self.runc, self.nvidia_smi, self.is_root)
        if reason:
            return Row(check, device.name, reason, "", SKIPPED)
        assert self.runc is not None and self.nvidia_smi is not None
        return run_container(self.runc, spec, device, self.nvidia_smi, check=check)


def _container_skip(runc: str | None, nvidia_smi: Path | None, is_root: Callable[[], bool]) -> str:
    if runc is None:
        return "no runc on PATH"
    if not is_root():
        return "needs root (device nodes, mounts)"
    if nvidia_smi is None:
        return "the spec mounts no nvidia-smi"
    return ""
