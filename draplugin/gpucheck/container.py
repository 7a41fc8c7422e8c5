"""gpu-check's step 3: a runc container from a minimal root filesystem with a CDI spec's edits applied.

The root filesystem holds the loader and the C libraries `nvidia-smi` needs,
copied from the host, nothing else; the OCI config applies exactly the spec's
edits, as the CDI library applies them. The MIG and pod checks
(`draplugin.gpucheck.mig`, `draplugin.gpucheck.pod`) run their containers
through this module too.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from draplugin.cdi.driverlayout import host_arch
from draplugin.cdi.elf import read_elf
from draplugin.cdi.spec import Spec, claim_device_name
from draplugin.devices.model import Device
from draplugin.gpucheck.smi import listed_uuids
from draplugin.gpucheck.table import MISMATCH, NODE, SKIPPED, Row, compared

CONTAINER_TIMEOUT_S = 60


def container_edits(spec: Mapping[str, Any], device_name: str) -> dict[str, list[Any]]:
    """The spec's edits for one of its devices, merged as the CDI library does: the spec's own
    edits, then the device's; a later device node or mount at the same path replaces an earlier one."""
    device = next(d for d in spec["devices"] if d["name"] == device_name)
    env: list[str] = []
    nodes: dict[str, Mapping[str, Any]] = {}
    mounts: dict[str, Mapping[str, Any]] = {}
    for edits in (spec.get("containerEdits", {}), device["containerEdits"]):
        env += edits.get("env", [])
        nodes.update({n["path"]: n for n in edits.get("deviceNodes", [])})
        mounts.update({m["containerPath"]: m for m in edits.get("mounts", [])})
    return {"env": env, "deviceNodes": list(nodes.values()), "mounts": list(mounts.values())}


def oci_config(
    edits: Mapping[str, list[Any]], args: Sequence[str], stat_node: Callable[[str], os.stat_result] = os.stat
) -> dict[str, Any]:
    """An OCI runtime config with `edits` applied: the process, the standard mounts and the device
    cgroup rules a runtime would write, and nothing of the host beyond what the edits name."""
    devices: list[dict[str, Any]] = []
    allow: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    for node in edits["deviceNodes"]:
        if node.get("type") == "c" and node.get("major") is not None:
            # As the CDI library does: a node with its numbers is made from them, no host file read
            # (a MIG access node the plugin made in its own container is in no host /dev).
            major, minor = int(node["major"]), int(node["minor"])
        else:
            info = stat_node(node.get("hostPath") or node["path"])
            if not stat.S_ISCHR(info.st_mode):
                raise ValueError(f"{node.get('hostPath') or node['path']} is not a character device")
            major, minor = os.major(info.st_rdev), os.minor(info.st_rdev)
        devices.append(
            {
                "path": node["path"],
                "type": "c",
                "major": major,
                "minor": minor,
                "fileMode": 0o666,
                "uid": 0,
                "gid": 0,
            }
        )
        allow.append({"allow": True, "type": "c", "major": major, "minor": minor, "access": "rwm"})
    standard = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
    ]
    spec_mounts = [
        {"destination": m["containerPath"], "source": m["hostPath"], "options": list(m.get("options", []))}
        for m in edits["mounts"]
    ]
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": list(args),
            # The edits' own PATH (a driver tool's environment) replaces the default one.
            "env": [
                *([] if any(e.startswith("PATH=") for e in edits["env"]) else ["PATH=/usr/bin:/bin"]),
                *edits["env"],
            ],
            "cwd": "/",
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": NODE,
        "mounts": standard + spec_mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")],
            "devices": devices,
            "resources": {"devices": allow},
        },
    }


def minimal_rootfs(rootfs: Path, executable: Path) -> list[str]:
    """Copy `executable`'s loader and C libraries (DT_NEEDED, transitively) from the host into
    `rootfs` at the paths the loader searches. Returns the copied paths."""
    arch = host_arch()
    search = [
        Path(p) for p in (f"/lib/{arch.multiarch}", f"/usr/lib/{arch.multiarch}", "/lib64", "/usr/lib64")
    ]
    info = read_elf(executable)
    copied: list[str] = []
    if info.interpreter:
        copied.append(_copy_in(rootfs, Path(info.interpreter)))
    pending, done = list(info.needed), set[str]()
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        host = next((d / name for d in search if (d / name).exists()), None)
        if host is None:
            continue  # the spec provides it (libnvidia-ml is dlopen'ed, not needed) or it is optional
        for target in (Path("/usr/lib") / arch.multiarch / name, Path("/lib64") / name):
            copied.append(_copy_in(rootfs, host, target))
        pending += read_elf(host).needed
    return copied


def _copy_in(rootfs: Path, host: Path, target: Path | None = None) -> str:
    destination = rootfs / (target or host).relative_to("/")
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(host.resolve(), destination)
    destination.chmod(0o755)
    return str(target or host)


def run_bundle(runc: str, bundle: Path, config: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run the OCI bundle at `bundle` (its `rootfs` made already) with `config`, to completion;
    raises `subprocess.TimeoutExpired` after `CONTAINER_TIMEOUT_S`."""
    (bundle / "config.json").write_text(json.dumps(config))
    argv = [runc, "--root", str(bundle / "state"), "run", "--bundle", str(bundle), f"gpu-check-{os.getpid()}"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=CONTAINER_TIMEOUT_S, check=False)


def run_container(
    runc: str, spec: Spec, device: Device, nvidia_smi: Path, *, check: str = "container nvidia-smi -L"
) -> Row:
    from draplugin.cdi.preview import PREVIEW_CLAIM  # loaded by render_specs already

    subject = device.name
    expected = [device.parent_uuid, device.uuid] if device.parent_uuid else [device.uuid]
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        bundle = Path(work)
        try:
            minimal_rootfs(bundle / "rootfs", nvidia_smi)
            edits = container_edits(spec.to_json(), claim_device_name(PREVIEW_CLAIM.uid, device.name))
            config = oci_config(edits, ["/usr/bin/nvidia-smi", "-L"])
        except (OSError, ValueError) as err:
            return Row(check, subject, f"no bundle: {err}", " ".join(expected), MISMATCH)
        try:
            done = run_bundle(runc, bundle, config)
        except subprocess.TimeoutExpired:
            return Row(check, subject, "timed out", " ".join(expected), MISMATCH)
    listed = listed_uuids(done.stdout)
    ours = " ".join(listed) or f"exit {done.returncode}: {(done.stderr or done.stdout).strip()[:200]}"
    return compared(
        check,
        subject,
        ours,
        " ".join(expected),
        done.returncode == 0 and listed == expected,
    )


def container_rows(
    runc: str | None, specs: Mapping[str, Spec], devices: Sequence[Device], nvidia_smi: Path | None
) -> Iterator[Row]:
    reason = ""
    if runc is None:
        reason = "no runc on PATH"
    elif os.geteuid() != 0:
        reason = "needs root (device nodes, mounts)"
    elif nvidia_smi is None:
        reason = "the spec mounts no nvidia-smi"
    for device in devices:
        spec = specs.get(device.name)
        if spec is None:
            continue
        if reason:
            yield Row("container nvidia-smi -L", device.name, reason, "", SKIPPED)
        else:
            assert runc is not None and nvidia_smi is not None
            yield run_container(runc, spec, device, nvidia_smi)
