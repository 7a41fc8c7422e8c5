"""`make gpu-check`: our discovery and CDI specs against the NVIDIA driver's own tools, on a GPU machine.

  1. NVML discovery (the `nvml` backend, as `draplugin run` uses it) against
     `nvidia-smi -q -x`, GPU by GPU: presence, name, memory, PCI bus ID, MIG
     mode, and the MIG devices (how many, their SM counts: the XML carries no
     MIG UUIDs or profile names).
  2. The CDI spec prepare would write for a claim of each device
     (`draplugin.cdi.preview`, prepare's own code), with the driver files of
     `--driver-root`: it must mount `libcuda.so.1`, `libnvidia-ml.so.1` and
     `nvidia-smi`.
  3. With `runc` (and root): a container from a minimal root filesystem (the
     loader and the C libraries `nvidia-smi` needs, copied from the host,
     nothing else) with exactly that spec's edits applied as the CDI library
     applies them, running `nvidia-smi -L`: it must list the claimed device and
     only it.
  4. Sharing, through prepare's own modules (`draplugin.gpucheck.sharing`):
     an MPS daemon with a thread percentage and a pinned memory limit started,
     asked, and stopped; a time-slice set and reset (`nvidia-smi
     compute-policy`); a MIG device created and destroyed on a GPU in MIG mode
     (skipped, saying why, without MIG or with MIG mode off). Each undoes what
     it did, also when it fails.
  5. While that MIG device exists (`draplugin.gpucheck.mig`): its CDI
     `nvidia-caps` nodes against `/proc` and the host's `/dev/nvidia-caps`, a
     runc container on its spec listing it with `nvidia-smi -L`, and the UUID
     prepare read from the compute instance against `nvidia-smi -L`'s.
  6. Memory shares (`draplugin.gpucheck.memlimit`), per whole GPU, as root on
     cgroup v2: the driver's per-cgroup memory limit set and read back on a
     scratch cgroup, and an allocation past it refused from a process in that
     cgroup (the driver's libcuda through ctypes); cleared and removed after.
  7. As in the plugin's pod and its workloads (`draplugin.gpucheck.pod`):
     `nvidia-smi compute-policy -l` with `DriverTools.env` in a container with
     no NVIDIA library and the driver root elsewhere than `/`, against the
     admin's; an MPS client in another PID namespace served by the claim's
     daemon.

Prints one table. Exit status 0 when every check passed (or was skipped, with
its reason in the table), 1 on any mismatch, 2 when it cannot run at all
(NVML or `nvidia-smi` missing). Needs the package and nvidia-ml-py, nothing from
a package registry; CI never runs it (no GPU there); its checks without a GPU
run in `tests/unit/test_gpucheck.py` against a fake NVML and a fake document.

    python -m draplugin.gpucheck [--driver-root /] [--runc runc] [--nvidia-smi nvidia-smi]

This module is the entry point and steps 1 and 2; the rows and their table are
`draplugin.gpucheck.table`, what `nvidia-smi` prints is read by
`draplugin.gpucheck.smi`, step 3 is `draplugin.gpucheck.container`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dracommon.drivername import DEFAULT_DRIVER_NAME
from dracommon.quantity import parse_quantity
from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot, DriverRootError, host_arch
from draplugin.cdi.spec import Spec
from draplugin.devices.model import Device
from draplugin.gpucheck.container import container_rows
from draplugin.gpucheck.smi import SmiGpu, parse_smi_xml
from draplugin.gpucheck.table import MISMATCH, NODE, SKIPPED, Row, compared, format_table

MiB = 1 << 20
# NVML's total and nvidia-smi's differ by rounding (and by reserved memory on some drivers).
MEMORY_TOLERANCE = 0.01


# --- 1. discovery -----------------------------------------------------------------------------------


def nvml_mig_modes(nvml: Any) -> dict[str, bool]:
    """GPU UUID → MIG mode on, as our NVML reads it (GPUs without MIG support are left out)."""
    modes: dict[str, bool] = {}
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            continue
        uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        modes[uuid] = int(current) == nvml.NVML_DEVICE_MIG_ENABLE
    return modes


def compare_discovery(
    devices: Sequence[Device], smi: Sequence[SmiGpu], mig_modes: Mapping[str, bool] | None = None
) -> list[Row]:
    """`mig_modes`: our NVML's MIG mode per GPU UUID (`nvml_mig_modes`). A GPU in MIG mode with no
    MIG device yet (how partitionable MIG starts, and any MIG GPU before an admin creates one)
    publishes nothing under static MIG: that is the expected answer, not a missing GPU."""
    modes = mig_modes or {}
    rows: list[Row] = []
    seen: set[str] = set()
    for gpu in smi:
        full = [d for d in devices if d.uuid == gpu.uuid]
        migs = [d for d in devices if d.parent_uuid == gpu.uuid]
        seen.update(d.name for d in full + migs)
        subject = f"{gpu.uuid} ({gpu.bus_id})"
        published = ", ".join(d.name for d in full + migs) or "nothing"
        empty_mig = not (full or migs) and modes.get(gpu.uuid) is True
        if empty_mig:
            published = "nothing: MIG mode on, no MIG devices yet"
        rows.append(compared("published", subject, published, "present", bool(full or migs) or empty_mig))
        if empty_mig:
            on = "on" if gpu.mig_enabled else "off"
            rows.append(compared("MIG mode", subject, "on", on))
            rows.append(compared("MIG devices", subject, "0", str(len(gpu.migs))))
            continue
        if not (full or migs):
            continue
        sample = (full + migs)[0]
        rows.append(compared("name", subject, str(sample.attributes.get("productName")), gpu.name))
        rows.append(
            compared(
                "PCI bus ID",
                subject,
                str(sample.attributes.get("resource.kubernetes.io/pciBusID")),
                gpu.bus_id,
            )
        )
        rows.append(
            compared("MIG mode", subject, "on" if migs else "off", "on" if gpu.mig_enabled else "off")
        )
        if full and gpu.memory_mib is not None:
            ours = parse_quantity(full[0].capacity.get("memory", "0")).value() // MiB
            close = abs(ours - gpu.memory_mib) <= max(1, gpu.memory_mib * MEMORY_TOLERANCE)
            rows.append(compared("memory MiB", subject, str(ours), str(gpu.memory_mib), close))
        if gpu.mig_enabled or migs:
            rows.append(compared("MIG devices", subject, str(len(migs)), str(len(gpu.migs))))
            ours_sm = sorted(int(d.capacity.get("multiprocessors", "0")) for d in migs)
            theirs_sm = sorted(m.multiprocessors or 0 for m in gpu.migs)
            rows.append(compared("MIG SMs", subject, str(ours_sm), str(theirs_sm)))
    for device in devices:
        if device.name not in seen:
            rows.append(compared("published", device.name, device.uuid, "not in nvidia-smi", False))
    return rows


# --- 2. CDI specs -----------------------------------------------------------------------------------

# What a CUDA container needs from the spec, by container path (the library dir is the architecture's).
REQUIRED_MOUNTS = ("libcuda.so.1", "libnvidia-ml.so.1")


def render_specs(
    devices: Sequence[Device], files: driverfiles.DriverFiles | None
) -> tuple[list[Row], dict[str, Spec]]:
    try:
        # Imported here, not at the top: the discovery check needs none of prepare's planning, and a
        # module missing on a bare GPU machine (which has nvidia-ml-py only) becomes this row.
        from draplugin.cdi.preview import preview_spec
    except ImportError as err:
        return [Row("CDI spec", "all devices", f"cannot render: {err}", "a rendered spec", MISMATCH)], {}
    rows: list[Row] = []
    specs: dict[str, Spec] = {}
    by_name = {d.name: d for d in devices}
    lib_dir = f"/usr/lib/{host_arch().multiarch}"
    for device in devices:
        try:
            spec = preview_spec(
                by_name, [device.name], driver=DEFAULT_DRIVER_NAME, node=NODE, driver_files=files
            )
            spec.render()  # validates
        except (DriverRootError, ValueError) as err:
            rows.append(Row("CDI spec", device.name, str(err), "a valid spec", MISMATCH))
            continue
        specs[device.name] = spec
        mounted = {m.container_path for m in spec.edits.mounts}
        wanted = [f"{lib_dir}/{name}" for name in REQUIRED_MOUNTS] + ["/usr/bin/nvidia-smi"]
        missing = [path for path in wanted if path not in mounted]
        ours = f"{len(spec.edits.mounts)} mounts" + (f", missing {', '.join(missing)}" if missing else "")
        rows.append(compared("CDI spec", device.name, ours, "libcuda, libnvidia-ml, nvidia-smi", not missing))
    return rows, specs


# --- the whole check ----------------------------------------------------------------------------------


def check(
    *,
    nvml: Any = None,
    smi_xml: str,
    driver_root: DriverRoot | None,
    runc: str | None,
    lib_path: str | None = None,
    list_gpus: Callable[[], str] | None = None,
    proc_root: str = "/proc",
    host_smi: Callable[[Sequence[str]], subprocess.CompletedProcess[str]] | None = None,
    dev_root: str = "/dev",
    mps_client: bool = True,
) -> list[Row]:
    """Every row of the check; `nvml`, `smi_xml`, `list_gpus` (what `nvidia-smi -L` prints, default:
    the driver root's), `proc_root` (MIG caps files), `host_smi` (the admin's `nvidia-smi` with
    arguments; None skips the compute-policy row) and `dev_root` are injectable for the tests without
    a GPU; `mps_client` False leaves out the MPS client row (it needs a real libcuda)."""
    from draplugin.devices.nvml import NvmlBackend

    backend = NvmlBackend(NODE, lib_path=lib_path, nvml=nvml)
    devices = backend.discover()
    smi_gpus = parse_smi_xml(smi_xml)
    rows = compare_discovery(devices, smi_gpus, nvml_mig_modes(backend.nvml))
    files = None
    if driver_root is not None:
        files = driverfiles.for_backend(driver_root, backend, report=lambda reason, message: None)
    spec_rows, specs = render_specs(devices, files)
    rows += spec_rows
    nvidia_smi = None
    if files is not None and driver_root is not None and specs:
        # The container runs the nvidia-smi the spec mounts; its C libraries come from the host.
        smi = next((b for b in files.install().binaries if b.found.name == "nvidia-smi"), None)
        nvidia_smi = driver_root.local(smi.real) if smi is not None else None
    rows += container_rows(runc, specs, devices, nvidia_smi)
    from draplugin.gpucheck import memlimit, sharing

    for gpu in sharing.whole_gpus(devices):
        rows += memlimit.memory_limit_rows(backend.nvml, gpu)
    if files is None or driver_root is None:
        return [*rows, Row("sharing", "all GPUs", "no driver root: no MPS or nvidia-smi to run", "", SKIPPED)]
    from draplugin.gpucheck import pod
    from draplugin.gpucheck.mig import MigInspector
    from draplugin.prepare.drivertools import DriverTools

    with tempfile.TemporaryDirectory(prefix="gpu-check-driver-libs-") as views:
        # The plugin's one environment builder for every driver tool (its library links go here).
        tools = DriverTools(files, Path(views))
        for gpu in sharing.whole_gpus(devices):
            rows += sharing.mps_rows(gpu, tools)
            rows += sharing.timeslice_rows(gpu, tools)
            if mps_client:
                rows += pod.mps_client_rows(gpu, tools)
        if host_smi is None:
            rows.append(Row(pod.POLICY_CHECK, "all GPUs", "no host nvidia-smi to compare with", "", SKIPPED))
        else:
            rows.append(pod.compute_policy_row(driver_root, runc, host_smi, dev_root=dev_root))
        # The MIG placements come from the discovery a partitionable plugin runs, on a backend of its own.
        partitioner = NvmlBackend(NODE, lib_path=lib_path, nvml=nvml, partitionable=True, proc_root=proc_root)
        placements = partitioner.discover() if any(g.mig_enabled for g in smi_gpus) else []
        listing = list_gpus or sharing.driver_listing(tools)
        inspect = MigInspector(files, listing, runc, nvidia_smi, proc_root=proc_root, dev_root=dev_root)
        rows += sharing.mig_rows(smi_gpus, placements, partitioner, listing, inspect)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver-root", default="/", help="the NVIDIA driver root (default /)")
    parser.add_argument(
        "--nvml-lib-path", help="libnvidia-ml.so.1 or the driver root (default: loader search)"
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare with")
    parser.add_argument("--runc", default="runc", help="runc for the container check (skipped when missing)")
    args = parser.parse_args(argv)
    from draplugin.devices.nvml import NvmlUnavailableError

    try:
        smi_xml = subprocess.run(
            [args.nvidia_smi, "-q", "-x"], capture_output=True, text=True, timeout=120, check=True
        ).stdout
        rows = check(
            smi_xml=smi_xml,
            driver_root=DriverRoot.at(args.driver_root),
            runc=shutil.which(args.runc),
            lib_path=args.nvml_lib_path,
            list_gpus=lambda: (
                subprocess.run(
                    [args.nvidia_smi, "-L"], capture_output=True, text=True, timeout=120, check=True
                ).stdout
            ),
            # The admin's nvidia-smi in this process's environment: what the plugin's must match.
            host_smi=lambda more: subprocess.run(
                [args.nvidia_smi, *more], capture_output=True, text=True, timeout=120, check=False
            ),
        )
    except (OSError, subprocess.SubprocessError, NvmlUnavailableError, ET.ParseError) as err:
        print(f"gpu-check: cannot run: {err}", file=sys.stderr)
        return 2
    print(format_table(rows))
    failed = [row for row in rows if row.status == MISMATCH]
    print(f"\n{len(rows)} checks: {len(failed)} mismatches, {sum(r.status == SKIPPED for r in rows)} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
