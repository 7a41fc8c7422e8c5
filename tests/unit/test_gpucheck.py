"""`make gpu-check` without a GPU: a fake NVML and a fake `nvidia-smi -q -x` document."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from draplugin.cdi.driverlayout import DriverRoot, host_arch
from draplugin.gpucheck import check as gpucheck
from draplugin.gpucheck.container import container_edits, minimal_rootfs, oci_config
from draplugin.gpucheck.smi import listed_uuids, parse_smi_xml
from draplugin.gpucheck.table import MISMATCH, OK, SKIPPED, Row, format_table
from tests.driverroot_layout import debian_layout
from tests.unit.fakenvml import FakeNvml, a10g, h100_with_mig
from tests.unit.test_mig_nvml import write_caps

# Python fake: an A10G without MIG support (no model of the NVML double) in a fixed nvidia-smi -q -x.
SMI_XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
  <driver_version>580.65.06</driver_version>
  <attached_gpus>2</attached_gpus>
  <gpu id="00000000:18:00.0">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <mig_mode><current_mig>Enabled</current_mig><pending_mig>Enabled</pending_mig></mig_mode>
    <mig_devices>
      <mig_device>
        <index>0</index><gpu_instance_id>2</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <device_attributes><shared><multiprocessor_count>60</multiprocessor_count></shared></device_attributes>
        <fb_memory_usage><total>40448 MiB</total></fb_memory_usage>
      </mig_device>
      <mig_device>
        <index>1</index><gpu_instance_id>9</gpu_instance_id><compute_instance_id>0</compute_instance_id>
        <device_attributes><shared><multiprocessor_count>16</multiprocessor_count></shared></device_attributes>
        <fb_memory_usage><total>9984 MiB</total></fb_memory_usage>
      </mig_device>
    </mig_devices>
    <uuid>GPU-11111111-2222-3333-4444-555555555555</uuid>
    <pci><pci_bus_id>00000000:18:00.0</pci_bus_id></pci>
    <fb_memory_usage><total>81559 MiB</total></fb_memory_usage>
  </gpu>
  <gpu id="00000000:3B:00.0">
    <product_name>NVIDIA A10G</product_name>
    <mig_mode><current_mig>N/A</current_mig><pending_mig>N/A</pending_mig></mig_mode>
    <mig_devices>None</mig_devices>
    <uuid>GPU-99999999-0000-0000-0000-000000000000</uuid>
    <pci><pci_bus_id>00000000:3B:00.0</pci_bus_id></pci>
    <fb_memory_usage><total>23028 MiB</total></fb_memory_usage>
  </gpu>
</nvidia_smi_log>
"""


def native_root(tmp_path: Path) -> DriverRoot:
    arch = host_arch()
    root = debian_layout(version="580.65.06", lib_dir=f"usr/lib/{arch.multiarch}", machine=arch.machine)
    return DriverRoot.at(str(root.build(tmp_path / "driver")))


def fake_listing(nvml: FakeNvml) -> Callable[[], str]:
    """`nvidia-smi -L` of the fake NVML's GPUs and their MIG devices, as they are at each call."""

    def listing() -> str:
        lines = []
        for index, gpu in enumerate(nvml.gpus):
            lines.append(f"GPU {index}: {gpu.name} (UUID: {gpu.uuid})")
            migs = [m for m in gpu.migs if m is not None]
            lines += [f"  MIG Device {i}: (UUID: {m.uuid})" for i, m in enumerate(migs)]
        return "\n".join(lines) + "\n"

    return listing


def mig_caps_root(tmp_path: Path) -> str:
    """A /proc whose nvidia-caps access files exist for every GPU instance ID a create can get."""
    proc = tmp_path / "proc"
    for gi in range(1, 15):
        write_caps(proc, gi)
    return str(proc)


def rows_for(
    tmp_path: Path, xml: str = SMI_XML, runc: str | None = None, nvml: FakeNvml | None = None
) -> list[Row]:
    nvml = nvml or FakeNvml([h100_with_mig(), a10g()])
    return gpucheck.check(
        nvml=nvml,
        smi_xml=xml,
        driver_root=native_root(tmp_path),
        runc=runc,
        list_gpus=fake_listing(nvml),
        proc_root=mig_caps_root(tmp_path),
        mps_client=False,  # a CUDA client needs a real libcuda: tests/unit/test_gpucheck_pod.py
    )


def by_check(rows: list[Row], check: str) -> list[Row]:
    return [row for row in rows if row.check == check]


def mismatches(rows: list[Row]) -> list[Row]:
    """The mismatches but the MIG caps node rows: the fake /proc has no `devices`, this machine no
    such nodes (those rows have their tests in tests/unit/test_gpucheck_mig.py)."""
    return [r for r in rows if r.status == MISMATCH and r.check != "MIG caps node"]


def test_parse_nvidia_smi_document() -> None:
    h100, a10 = parse_smi_xml(SMI_XML)
    assert (h100.uuid, h100.bus_id, h100.memory_mib, h100.mig_enabled) == (
        "GPU-11111111-2222-3333-4444-555555555555",
        "0000:18:00.0",
        81559,
        True,
    )
    assert [(m.gpu_instance, m.multiprocessors, m.memory_mib) for m in h100.migs] == [
        (2, 60, 40448),
        (9, 16, 9984),
    ]
    assert (a10.bus_id, a10.mig_enabled, a10.migs) == ("0000:3b:00.0", False, ())


def test_matching_discovery_passes_and_container_is_skipped_without_runc(tmp_path: Path) -> None:
    rows = rows_for(tmp_path)
    assert mismatches(rows) == []
    assert {r.theirs.rpartition(", ")[2] for r in by_check(rows, "MIG caps node")} == {"host has none"}
    checks = {r.check for r in rows}
    assert {
        "published",
        "name",
        "PCI bus ID",
        "MIG mode",
        "memory MiB",
        "MIG devices",
        "MIG SMs",
        "CDI spec",
    } <= checks
    # One spec per published device (two MIG devices of the H100, the A10G), each with the driver files.
    specs = by_check(rows, "CDI spec")
    assert [r.subject for r in specs] == ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-6", "gpu-1"]
    assert all(r.status == OK for r in specs)
    containers = by_check(rows, "container nvidia-smi -L")
    assert [(r.status, r.ours) for r in containers] == [(SKIPPED, "no runc on PATH")] * 3
    table = format_table(rows)
    assert table.splitlines()[0].split() == ["check", "subject", "ours", "driver's", "tools", "status"]
    assert len(table.splitlines()) == len(rows) + 1


def test_every_difference_is_a_mismatch(tmp_path: Path) -> None:
    xml = SMI_XML.replace("<total>23028 MiB</total>", "<total>24576 MiB</total>")
    xml = xml.replace(
        "<multiprocessor_count>16</multiprocessor_count>", "<multiprocessor_count>14</multiprocessor_count>"
    )
    xml = xml.replace("NVIDIA A10G", "NVIDIA A10")
    xml = xml.replace("GPU-99999999-0000-0000-0000-000000000000", "GPU-77777777-0000-0000-0000-000000000000")
    bad = {(r.check, r.subject) for r in rows_for(tmp_path, xml) if r.status == MISMATCH}
    h100 = "GPU-11111111-2222-3333-4444-555555555555 (0000:18:00.0)"
    assert ("MIG SMs", h100) in bad
    # The A10G's UUID is unknown to nvidia-smi: it is missing there, and nvidia-smi's GPU is missing here.
    assert ("published", "gpu-1") in bad
    assert ("published", "GPU-77777777-0000-0000-0000-000000000000 (0000:3b:00.0)") in bad
    memory = SMI_XML.replace("<total>23028 MiB</total>", "<total>24576 MiB</total>")
    memory_rows = by_check(rows_for(tmp_path / "m", memory), "memory MiB")
    assert [(r.ours, r.theirs, r.status) for r in memory_rows] == [("23028", "24576", MISMATCH)]


def test_spec_without_driver_files_is_a_mismatch(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    rows = gpucheck.check(
        nvml=FakeNvml([a10g()]),
        smi_xml=SMI_XML,
        driver_root=DriverRoot.at(str(tmp_path / "empty")),
        runc=None,
    )
    (spec,) = by_check(rows, "CDI spec")
    assert spec.status == MISMATCH and "no NVIDIA driver libraries" in spec.ours


def spec_json() -> dict[str, Any]:
    return {
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "mounts": [
                {
                    "hostPath": "/d/libcuda.so.580",
                    "containerPath": "/usr/lib/x/libcuda.so.1",
                    "options": ["ro"],
                }
            ],
        },
        "devices": [
            {"name": "other", "containerEdits": {"env": ["B=1"]}},
            {
                "name": "uid-gpu-0",
                "containerEdits": {
                    "env": ["A=1"],
                    "deviceNodes": [
                        {"path": "/dev/nvidia0", "hostPath": "/fake/nvidia0"},
                        {"path": "/dev/nvidiactl"},
                    ],
                },
            },
        ],
    }


def test_container_edits_are_merged_like_the_cdi_library() -> None:
    edits = container_edits(spec_json(), "uid-gpu-0")
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void", "A=1"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia0"]
    assert [m["containerPath"] for m in edits["mounts"]] == ["/usr/lib/x/libcuda.so.1"]


def test_oci_config_allows_exactly_the_spec_devices() -> None:
    def fake_stat(path: str) -> os.stat_result:
        minor = {"/fake/nvidia0": 0, "/dev/nvidiactl": 255}[path]
        return os.stat_result(
            (stat.S_IFCHR | 0o666, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(195, minor)}
        )

    config = oci_config(container_edits(spec_json(), "uid-gpu-0"), ["/usr/bin/nvidia-smi", "-L"], fake_stat)
    assert config["process"]["args"] == ["/usr/bin/nvidia-smi", "-L"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in config["process"]["env"]
    assert config["root"] == {"path": "rootfs", "readonly": True}
    assert [(d["path"], d["major"], d["minor"]) for d in config["linux"]["devices"]] == [
        ("/dev/nvidiactl", 195, 255),
        ("/dev/nvidia0", 195, 0),
    ]
    rules = config["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    assert [(r["major"], r["minor"]) for r in rules[1:]] == [(195, 255), (195, 0)]
    bind = [m for m in config["mounts"] if m["destination"] == "/usr/lib/x/libcuda.so.1"]
    assert bind == [
        {"destination": "/usr/lib/x/libcuda.so.1", "source": "/d/libcuda.so.580", "options": ["ro"]}
    ]


def test_oci_config_refuses_a_node_that_is_not_a_device(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    edits = {
        "env": [],
        "mounts": [],
        "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": str(tmp_path / "plain")}],
    }
    with pytest.raises(ValueError, match="is not a character device"):
        oci_config(edits, ["true"])


def test_listed_uuids_of_nvidia_smi_l() -> None:
    output = (
        "GPU 0: NVIDIA H200 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
        "  MIG 1g.18gb     Device  0: (UUID: MIG-aaaaaaaa-0000-0000-0000-000000000001)\n"
    )
    assert listed_uuids(output) == [
        "GPU-11111111-2222-3333-4444-555555555555",
        "MIG-aaaaaaaa-0000-0000-0000-000000000001",
    ]


def test_minimal_rootfs_holds_the_loader_and_c_library(tmp_path: Path) -> None:
    copied = minimal_rootfs(tmp_path / "rootfs", Path("/usr/bin/ls"))
    assert any(path.endswith("libc.so.6") for path in copied)
    interpreter = next(p for p in copied if "ld-linux" in p)
    assert (tmp_path / "rootfs" / interpreter.lstrip("/")).is_file()


def test_cannot_run_without_nvidia_smi(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert gpucheck.main(["--nvidia-smi", str(tmp_path / "no-nvidia-smi")]) == 2
    assert "gpu-check: cannot run" in capsys.readouterr().err


def no_mig_devices_yet() -> tuple[str, FakeNvml]:
    """The H100 with MIG mode on and no MIG device: how partitionable MIG starts."""
    h100 = h100_with_mig()
    h100.migs = []
    start = SMI_XML.index("<mig_devices>")
    end = SMI_XML.index("</mig_devices>") + len("</mig_devices>")
    return SMI_XML[:start] + "<mig_devices>None</mig_devices>" + SMI_XML[end:], FakeNvml([h100, a10g()])


def test_mig_mode_on_without_mig_devices_is_no_mismatch(tmp_path: Path) -> None:
    xml, nvml = no_mig_devices_yet()
    rows = rows_for(tmp_path, xml, nvml=nvml)
    h100 = "GPU-11111111-2222-3333-4444-555555555555 (0000:18:00.0)"
    mine = {r.check: r for r in rows if r.subject == h100}
    assert mismatches(rows) == []
    assert mine["published"].status == OK and "no MIG devices yet" in mine["published"].ours
    assert (mine["MIG mode"].ours, mine["MIG mode"].theirs) == ("on", "on")
    assert (mine["MIG devices"].ours, mine["MIG devices"].theirs) == ("0", "0")
