"""`make gpu-check`'s rows on a created MIG device, on the C-ABI NVML double and the real `nvidia-smi -L`.

The double creates the MIG device through prepare's code (`NvmlBackend.mig_create`)
and writes the capability `access` files and `/proc/devices` under its
`procRoot`, as the kernel driver does; NVIDIA's `nvidia-smi -L` (550.163.01,
from `tests/nvidia_roots.py`) lists what the double holds. The host's
`/dev/nvidia-caps` is a directory of the test's, filled (as root) with the
nodes nvidia-modprobe would make.
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from draplugin.devices.nvml import NvmlBackend
from draplugin.gpucheck import sharing as gpucheck_sharing
from draplugin.gpucheck.mig import CreatedDevice, MigInspector, caps_rows, expected_caps, uuid_row
from draplugin.gpucheck.smi import SmiGpu
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row
from tests import nvidia_roots as nr
from tests.nvmldouble import Gpu, NvmlDouble, NvmlDoubleUnavailable, library_dir


@pytest.fixture
def double(tmp_path: Path) -> Iterator[tuple[NvmlDouble, ModuleType]]:
    try:
        library_dir()
    except NvmlDoubleUnavailable as err:
        pytest.fail(f"the NVML double is missing (run {nr.NVML_DOUBLE_SCRIPT.relative_to(nr.REPO)}): {err}")
    made = NvmlDouble.create(tmp_path / "nvml", "dgxh100", gpus=1, overrides=[Gpu(index=0, mig_mode=1)])
    with made.pynvml() as nvml:
        yield made, nvml


def real_listing(tmp_path: Path, made: NvmlDouble) -> Callable[[], str]:
    root = nr.tool_root(tmp_path / "driver", "flat")

    def listing() -> str:
        env = nr.driver_env(root, made.config_path)
        done = subprocess.run(
            [str(root.nvidia_smi), "-L"], env=env, capture_output=True, text=True, timeout=60, check=True
        )
        return done.stdout

    return listing


def make_nodes(dev: Path, nodes: dict[str, tuple[int | None, int]]) -> None:
    for path, (major, minor) in nodes.items():
        target = dev / Path(path).relative_to("/dev")
        target.parent.mkdir(parents=True, exist_ok=True)
        assert major is not None
        os.mknod(target, 0o444 | stat.S_IFCHR, os.makedev(major, minor))


def run_mig_rows(
    tmp_path: Path, made: NvmlDouble, nvml: ModuleType, *, dev_nodes: bool
) -> tuple[list[Row], list[str]]:
    backend = NvmlBackend("n", nvml=nvml, partitionable=True, proc_root=str(made.proc_root))
    parent = next(d for d in backend.discover() if d.kind == "gpu")
    smi = SmiGpu(parent.uuid, "H100", "0000:00:00.0", None, True, mig_capable=True)
    listing = real_listing(tmp_path, made)
    inspector = MigInspector(None, listing, proc_root=str(made.proc_root), dev_root=str(tmp_path / "dev"))
    seen: list[str] = []

    def inspect(created: CreatedDevice) -> list[Row]:
        seen.append(created.device.uuid)
        if dev_nodes:  # what nvidia-modprobe makes on the host when a host process opens the device
            wanted = expected_caps(made.proc_root or "", 0, created.gpu_instance, created.compute_instance)
            make_nodes(tmp_path / "dev", wanted)
        return inspector(created)

    rows = gpucheck_sharing.mig_rows([smi], backend.discover(), backend, listing, inspect)
    return rows, seen


def test_a_created_mig_devices_nodes_and_uuid_match_the_drivers(
    tmp_path: Path, double: tuple[NvmlDouble, ModuleType]
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the host's caps nodes are made with mknod (root)")
    made, nvml = double
    rows, seen = run_mig_rows(tmp_path, made, nvml, dev_nodes=True)
    caps = [r for r in rows if r.check == "MIG caps node"]
    assert len(caps) == 2 and all(r.status == OK for r in caps), caps
    assert all(r.ours.startswith("c 235:") for r in caps), caps  # the double's nvidia-caps major
    (uuid,) = [r for r in rows if r.check == "MIG UUID"]
    assert uuid.status == OK and uuid.ours == uuid.theirs == seen[0] and seen[0].startswith("MIG-")
    assert [r.status for r in rows if r.check == "MIG container nvidia-smi -L"] == [SKIPPED]
    assert [(r.status, r.ours) for r in rows if r.check == "MIG destroy"] == [(OK, "gone")]


def test_caps_nodes_the_host_lacks_are_a_mismatch(
    tmp_path: Path, double: tuple[NvmlDouble, ModuleType]
) -> None:
    made, nvml = double
    rows, _ = run_mig_rows(tmp_path, made, nvml, dev_nodes=False)
    caps = [r for r in rows if r.check == "MIG caps node"]
    assert len(caps) == 2 and {r.status for r in caps} == {MISMATCH}
    assert all(r.theirs.endswith("host has none") for r in caps)
    assert [r.status for r in rows if r.check == "MIG destroy"] == [OK]  # destroyed all the same


def made_device(uuid: str = "MIG-1") -> CreatedDevice:
    from draplugin.devices.model import Device

    device = Device(
        name="gpu-0-mig-1g10gb-19-0", kind="mig", index=0, minor=0, uuid=uuid, parent_uuid="GPU-0"
    )
    return CreatedDevice(device, 0, 7, 0, "GPU 0: H100 (UUID: GPU-0)\n")


def test_a_spec_with_other_numbers_or_other_caps_is_a_mismatch(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    base = proc / "driver/nvidia/capabilities/gpu0/mig/gi7"
    (base / "ci0").mkdir(parents=True)
    (base / "access").write_text("DeviceFileMinor: 66\nDeviceFileMode: 292\n")
    (base / "ci0/access").write_text("DeviceFileMinor: 67\n")
    (proc / "devices").write_text(
        "Character devices:\n195 nvidia\n235 nvidia-caps\n\nBlock devices:\n235 sd\n"
    )
    assert expected_caps(proc, 0, 7, 0) == {
        "/dev/nvidia-caps/nvidia-cap66": (235, 66),
        "/dev/nvidia-caps/nvidia-cap67": (235, 67),
    }
    node = {"path": "/dev/nvidia-caps/nvidia-cap66", "type": "c", "major": 235, "minor": 99}
    stray = {"path": "/dev/nvidia-caps/nvidia-cap1", "type": "c", "major": 235, "minor": 1}
    spec = {"devices": [{"name": "d", "containerEdits": {"deviceNodes": [node, stray]}}]}
    rows = caps_rows(spec, "d", made_device(), proc_root=proc, dev_root=tmp_path / "dev")
    assert [(r.subject.rpartition(" ")[2], r.status) for r in rows] == [
        ("/dev/nvidia-caps/nvidia-cap66", MISMATCH),  # minor 99, and no host node
        ("/dev/nvidia-caps/nvidia-cap67", MISMATCH),  # not in the spec
        ("/dev/nvidia-caps/nvidia-cap1", MISMATCH),  # mig/config: never a claim's
    ]
    assert rows[1].ours == "not in the spec" and rows[2].theirs == "not this device's"


def test_a_uuid_nvidia_smi_does_not_list_is_a_mismatch() -> None:
    after = "GPU 0: H100 (UUID: GPU-0)\n  MIG 1g.10gb Device 0: (UUID: MIG-2)\n"
    row = uuid_row(made_device("MIG-1"), after)
    assert (row.status, row.ours, row.theirs) == (MISMATCH, "MIG-1", "MIG-2")
    assert uuid_row(made_device("MIG-2"), after).status == OK
