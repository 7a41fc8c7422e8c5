"""The fake backend: determinism per node, the model table, file parsing and MIG layouts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from draplugin.devices import load_backend
from draplugin.devices.fake import (
    MODELS,
    FakeBackend,
    FakeConfigError,
    config_from_flags,
    load_config,
    parse_config,
)
from draplugin.devices.model import Version, validate_devices


def test_same_node_same_devices_other_node_other_uuids() -> None:
    a1 = FakeBackend("node-a", config_from_flags(4, "H100-80GB-HBM3")).discover()
    a2 = FakeBackend("node-a", config_from_flags(4, "H100-80GB-HBM3")).discover()
    b = FakeBackend("node-b", config_from_flags(4, "H100-80GB-HBM3")).discover()
    assert [d.to_api() for d in a1] == [d.to_api() for d in a2]
    assert {d.uuid for d in a1}.isdisjoint({d.uuid for d in b})
    assert len({d.uuid for d in a1}) == 4
    assert [d.name for d in a1] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


def test_model_table_has_eight_models_that_all_validate() -> None:
    assert set(MODELS) == {
        "A100-SXM4-40GB",
        "A100-SXM4-80GB",
        "H100-80GB-HBM3",
        "H200",
        "L4",
        "L40S",
        "T4",
        "A10G",
    }
    for name in MODELS:
        backend = FakeBackend("n", config_from_flags(2, name))
        validate_devices(backend.discover())


def test_attributes_follow_the_nvml_schema() -> None:
    gpu = FakeBackend("n", config_from_flags(1, "A100-SXM4-40GB")).discover()[0]
    assert gpu.attributes["type"] == "gpu"
    assert gpu.attributes["productName"] == "NVIDIA A100-SXM4-40GB"
    assert gpu.attributes["cudaComputeCapability"] == Version("8.0.0")
    assert gpu.attributes["driverVersion"] == Version("580.65.6")
    assert gpu.capacity == {"memory": "40Gi"}
    assert set(gpu.attributes) == {
        "type",
        "uuid",
        "productName",
        "brand",
        "architecture",
        "cudaComputeCapability",
        "driverVersion",
        "cudaDriverVersion",
        "index",
        "minor",
        "resource.kubernetes.io/pciBusID",
        "resource.kubernetes.io/pcieRoot",
    }
    assert gpu.device_nodes == ("/dev/null",)


def test_dev_root_gives_nvidia_shaped_nodes() -> None:
    gpu = load_backend("fake", "n", gpus=2, model="L4", dev_root="/run/fake-dev").discover()[1]
    assert gpu.device_nodes == (
        "/run/fake-dev/nvidia1",
        "/run/fake-dev/nvidiactl",
        "/run/fake-dev/nvidia-uvm",
        "/run/fake-dev/nvidia-uvm-tools",
    )


def test_device_dir_gets_real_nodes_that_the_cdi_spec_injects_at_nvidia_paths(tmp_path: Path) -> None:
    device_dir = tmp_path / "fake-dev"
    gpu = load_backend("fake", "n", gpus=2, model="L4", device_dir=str(device_dir)).discover()[1]
    assert gpu.device_nodes == ("/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    assert gpu.host_dev_dir == str(device_dir)
    names = sorted(p.name for p in device_dir.iterdir())
    assert names == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidiactl"]
    for node in device_dir.iterdir():
        info = node.lstat()
        assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(1, 3), node
        assert stat.S_IMODE(info.st_mode) == 0o666
    (device_dir / "nvidia0").unlink()
    (device_dir / "nvidia0").write_text("not a device")  # replaced on the next start
    load_backend("fake", "n", gpus=2, model="L4", device_dir=str(device_dir))
    assert stat.S_ISCHR((device_dir / "nvidia0").lstat().st_mode)


def test_device_dir_that_cannot_hold_nodes_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(FakeConfigError, match=f"cannot create device nodes in {blocker}"):
        load_backend("fake", "n", gpus=1, device_dir=str(blocker))


def test_yaml_file_with_static_mig(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(
        "driverVersion: '570.124.06'\n"
        "gpus:\n"
        "  - model: A100-SXM4-40GB\n    mig: [3g.20gb, {profile: 1g.5gb, start: 6}, 2g.10gb]\n"
        "  - model: L4\n    count: 2\n    memory: 24Gi\n"
    )
    devices = load_backend("fake", "n", config_file=str(path)).discover()
    assert [d.name for d in devices] == [
        "gpu-0-mig-3g20gb-0",
        "gpu-0-mig-2g10gb-4",
        "gpu-0-mig-1g5gb-6",
        "gpu-1",
        "gpu-2",
    ]
    mig = devices[0]
    assert mig.kind == "mig" and mig.parent_uuid and mig.uuid.startswith("MIG-")
    assert mig.attributes["profile"] == "3g.20gb" and mig.attributes["parentUUID"] == mig.parent_uuid
    assert set(mig.capacity) == {
        "multiprocessors",
        "copyEngines",
        "decoders",
        "encoders",
        "jpegEngines",
        "ofaEngines",
        "memory",
    }
    assert devices[3].capacity == {"memory": "24Gi"}
    assert devices[3].attributes["driverVersion"] == Version("570.124.6")


def test_partitionable_publishes_every_placement_with_counters() -> None:
    backend = FakeBackend("n", parse_config({"gpus": [{"model": "A100-SXM4-40GB"}], "partitionable": True}))
    devices = backend.discover()
    sets = backend.shared_counters()
    validate_devices(devices, sets)
    assert devices[0].name == "gpu-0" and len(devices) == 1 + 7 + 3 + 2 + 1 + 1
    slice_7 = next(d for d in devices if d.name == "gpu-0-mig-1g5gb-6")
    assert slice_7.consumes_counters[0].counters["memory-slice-6"] == "1"
    assert sets[0].counters["memory"] == "40Gi"


PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"


def test_every_gpu_has_its_own_pcie_root_by_default() -> None:
    gpus = FakeBackend("n", config_from_flags(3, "L4")).discover()
    assert [(g.attributes[PCI_BUS_ID], g.attributes[PCIE_ROOT]) for g in gpus] == [
        ("0000:18:00.0", "pci0000:17"),
        ("0000:28:00.0", "pci0000:27"),
        ("0000:38:00.0", "pci0000:37"),
    ]


def test_gpus_per_pcie_root_groups_gpus_in_file_order_across_entries() -> None:
    config = parse_config({
        "gpusPerPcieRoot": 2,
        "gpus": [{"model": "H100-80GB-HBM3"}, {"model": "A100-SXM4-40GB", "count": 2}, {"model": "L4"}],
    })  # fmt: skip
    gpus = FakeBackend("n", config).discover()
    assert [(g.name, g.attributes[PCIE_ROOT]) for g in gpus] == [
        ("gpu-0", "pci0000:17"),
        ("gpu-1", "pci0000:17"),
        ("gpu-2", "pci0000:37"),
        ("gpu-3", "pci0000:37"),
    ]
    # Bus IDs do not depend on the grouping.
    assert [g.attributes[PCI_BUS_ID] for g in gpus] == [f"0000:{b}:00.0" for b in ("18", "28", "38", "48")]


def test_mig_devices_share_their_parents_pcie_root() -> None:
    config = parse_config({
        "gpusPerPcieRoot": 2,
        "gpus": [{"model": "L4"}, {"model": "A100-SXM4-80GB", "mig": ["1g.10gb", "2g.20gb"]}],
    })  # fmt: skip
    devices = FakeBackend("n", config).discover()
    assert {d.name: d.attributes[PCIE_ROOT] for d in devices} == {
        "gpu-0": "pci0000:17",
        "gpu-1-mig-1g10gb-0": "pci0000:17",
        "gpu-1-mig-2g20gb-2": "pci0000:17",
    }


def test_pcie_roots_past_the_first_pci_domain() -> None:
    config = parse_config({"gpusPerPcieRoot": 4, "gpus": [{"model": "T4", "count": 17}]})
    roots = [g.attributes[PCIE_ROOT] for g in FakeBackend("n", config).discover()]
    assert roots[:4] == ["pci0000:17"] * 4
    assert roots[12:16] == ["pci0000:d7"] * 4  # gpu-15 (domain 0001) stays under its group's root
    assert roots[16] == "pci0001:17"
    assert len(set(roots)) == 5


NUMA_NODE = "resource.kubernetes.io/numaNode"


def test_numa_node_comes_from_each_entry_and_is_absent_without_one() -> None:
    config = parse_config({
        "gpus": [
            {"model": "H100-80GB-HBM3", "count": 2, "numaNode": 0},
            {"model": "A100-SXM4-80GB", "mig": ["1g.10gb"], "numaNode": 1},
            {"model": "L4"},
        ],
    })  # fmt: skip
    devices = FakeBackend("n", config).discover()
    assert {d.name: d.attributes.get(NUMA_NODE) for d in devices} == {
        "gpu-0": 0,
        "gpu-1": 0,
        # A MIG device is on its parent's NUMA node.
        "gpu-2-mig-1g10gb-0": 1,
        # No numaNode: no affinity, so no attribute (a shared -1 would pair every such GPU).
        "gpu-3": None,
    }
    assert NUMA_NODE not in devices[3].attributes
    validate_devices(devices, [])


def test_flags_only_fake_gpus_publish_no_numa_node() -> None:
    gpus = FakeBackend("n", config_from_flags(2, "L4")).discover()
    assert all(NUMA_NODE not in g.attributes for g in gpus)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": [{"numaNode": -1}]}, "gpus[0].numaNode: must be an integer from 0 to 1023, got -1"),
        ({"gpus": [{"numaNode": 1024}]}, "gpus[0].numaNode: must be an integer from 0 to 1023, got 1024"),
        ({"gpus": [{"numaNode": "0"}]}, "gpus[0].numaNode: must be an integer from 0 to 1023, got '0'"),
        ({"gpus": [{"numaNode": True}]}, "gpus[0].numaNode: must be an integer from 0 to 1023, got True"),
        ({"gpus": [{"model": "Z9000"}]}, "gpus[0].model: unknown model 'Z9000'"),
        ({"gpus": [{"model": "L4", "mig": ["1g.5gb"]}]}, "gpus[0]: model L4 does not support MIG"),
        ({"gpus": [{"mig": ["9g.99gb"]}]}, "unknown MIG profile '9g.99gb'"),
        ({"gpus": [{"mig": ["7g.40gb", "1g.5gb"]}]}, "no free placement for MIG profile 1g.5gb"),
        ({"gpus": [{"mig": [{"profile": "3g.20gb", "start": 2}]}]}, "cannot start at 2"),
        ({"gpus": [{"count": -1}]}, "gpus[0].count"),
        ({"gpus": [{"memory": "lots"}]}, "gpus[0].memory"),
        ({"gpus": [], "colour": "green"}, "unknown keys: colour"),
        ({"gpus": [], "driverVersion": "new"}, "'driverVersion'"),
        ({"gpus": [], "gpusPerPcieRoot": 0}, "'gpusPerPcieRoot' must be an integer ≥1, got 0"),
        ({"gpus": [], "gpusPerPcieRoot": "2"}, "'gpusPerPcieRoot' must be an integer ≥1, got '2'"),
        ({"gpus": [], "gpusPerPcieRoot": True}, "'gpusPerPcieRoot' must be an integer ≥1, got True"),
        ([1, 2], "top level must be a mapping"),
    ],
)
def test_bad_input_names_the_entry(data: object, message: str) -> None:
    with pytest.raises(FakeConfigError, match=None) as info:
        parse_config(data)
    assert message in str(info.value)


def test_unreadable_and_invalid_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FakeConfigError, match="cannot read fake GPU file"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(FakeConfigError, match=f"{bad}: not valid YAML"):
        load_config(bad)


def test_flags_validate_model_and_count() -> None:
    with pytest.raises(FakeConfigError, match="--fake-model: unknown model"):
        config_from_flags(1, "GTX-480")
    with pytest.raises(FakeConfigError, match="--fake-gpus must be"):
        config_from_flags(-2)
    with pytest.raises(ValueError, match="unknown options: colour"):
        load_backend("fake", "n", gpus=1, colour="red")
    with pytest.raises(ValueError, match="unknown device backend 'rocm'"):
        load_backend("rocm", "n")
