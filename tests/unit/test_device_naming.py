"""The NVIDIA-compatible naming mode: NVIDIA's device names, and every field DCGM exporter reads.

NVIDIA's names are checked against the forms its kubelet plugin writes (k8s-dra-driver-gpu v0.4.0,
cmd/gpu-kubelet-plugin: `gpu-%d` of the minor; `gpu-%d-mig-%s-%d-%d` of parent minor, profile,
profile ID, placement start, matched by its own `^gpu-(\\d+)-mig-(.+)-(\\d+)-(\\d+)$`). The fields
DCGM exporter reads are those tests/dcgm_view.py lists from its source; each has a test here on
the slices as the publisher renders them. The GPUs have a minor number that is not their index,
as on machines where the two differ, so a name from the wrong one shows.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from draplugin import config
from draplugin.devices import load_backend
from draplugin.devices.naming import NVIDIA_DRIVER_NAME, DeviceNaming, mig_name, nvidia_profile_label
from draplugin.devices.schema import GpuInfo, MigInstance, MigProfile, SystemInfo, build_devices
from draplugin.prepare.mig import placement_of
from draplugin.slices.render import NodeRef, render_pool
from tests import dcgm_view

NODE = "node-a"
# NVIDIA's own parse of its MIG names (cmd/gpu-kubelet-plugin/mig.go canonicalMigNameRegex).
NVIDIA_MIG_NAME = re.compile(r"^gpu-(\d+)-mig-(.+)-(\d+)-(\d+)$")

PROFILE = MigProfile("1g.10gb", 1, 9728 << 20, 14, 1, 0, 0, 0, 0, (0, 1, 2), profile_id=19)
ME_PROFILE = MigProfile("1g.24gb+me", 1, 23552 << 20, 16, 1, 1, 0, 1, 1, (0,), profile_id=21)


def gpu(index: int, minor: int, *, mig: bool = False, profiles: tuple[MigProfile, ...] = ()) -> GpuInfo:
    uuid = f"GPU-0000000{index}-1111-2222-3333-444444444444"
    instances = (
        (MigInstance(PROFILE, 1, f"MIG-0000000{index}-aaaa-bbbb-cccc-dddddddddddd", 1, 0),) if mig else ()
    )
    return GpuInfo(
        index=index,
        minor=minor,
        uuid=uuid,
        product_name="NVIDIA A100-SXM4-80GB",
        brand="Nvidia",
        architecture="Ampere",
        cuda_compute_capability=(8, 0),
        memory_bytes=80 << 30,
        pci_bus_id=f"0000:0{index}:00.0",
        pcie_root="pci0000:00",
        device_nodes=(f"/dev/nvidia{minor}",),
        mig_enabled=mig,
        mig_profiles=profiles or ((PROFILE,) if mig else ()),
        mig_instances=instances,
        multiprocessors=98,
    )


SYSTEM = SystemInfo("550.163.01", "12.4")
# GPU 0 is /dev/nvidia3, GPU 1 (static MIG) /dev/nvidia1.
GPUS = (gpu(0, 3), gpu(1, 1, mig=True))


def slices(naming: DeviceNaming, *, partitionable: bool = False) -> list[dict[str, Any]]:
    devices, counter_sets = build_devices(
        SYSTEM, [gpu(0, 3, profiles=(PROFILE,))] if partitionable else list(GPUS),
        partitionable=partitionable, naming=naming,
    )  # fmt: skip
    driver = NVIDIA_DRIVER_NAME if naming is DeviceNaming.NVIDIA else "gpu.draplugin.dev"
    return render_pool(devices, counter_sets, node=NodeRef(NODE, "node-uid"), driver=driver)


def devices_of(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for obj in objs for d in obj["spec"].get("devices", ())}


# --- names --------------------------------------------------------------------------------------------


def test_nvidia_names_a_whole_gpu_by_its_minor_ours_by_its_index() -> None:
    assert sorted(devices_of(slices(DeviceNaming.NVIDIA))) == ["gpu-1-mig-1g10gb-19-1", "gpu-3"]
    assert sorted(devices_of(slices(DeviceNaming.DRAPLUGIN))) == ["gpu-0", "gpu-1-mig-1g10gb-19-1"]


def test_nvidia_mig_names_parse_with_nvidias_own_pattern_into_minor_profile_id_and_start() -> None:
    (name,) = [n for n in devices_of(slices(DeviceNaming.NVIDIA)) if "-mig-" in n]
    match = NVIDIA_MIG_NAME.match(name)
    assert match is not None and match.groups() == ("1", "1g10gb", "19", "1"), name


@pytest.mark.parametrize(
    ("profile", "label"),
    [
        ("1g.10gb", "1g10gb"),
        ("7g.80gb", "7g80gb"),
        ("1g.24gb+me", "1g24gb-me"),  # NVML's Blackwell profiles: the profile ID keeps them apart
        ("1g.24gb-me", "1g24gb-me"),
        ("1c.3g.40gb", "1c3g40gb"),
        ("2g.20gb+gfx+me", "2g20gb-gfx-me"),
    ],
)
def test_nvidia_profile_label_drops_dots_and_replaces_what_rfc1123_forbids(profile: str, label: str) -> None:
    assert nvidia_profile_label(profile) == label


def test_nvidia_label_replaces_characters_one_for_one_where_ours_collapses_them() -> None:
    """toRFC1123Compliant replaces each character, so two in a row give two dashes; ours one."""
    nvidia = mig_name(DeviceNaming.NVIDIA, gpu_index=0, gpu_minor=0, profile="1g.5gb++x", placement_start=0)
    ours = mig_name(DeviceNaming.DRAPLUGIN, gpu_index=0, gpu_minor=0, profile="1g.5gb++x", placement_start=0)
    assert (nvidia, ours) == ("gpu-0-mig-1g5gb--x-0", "gpu-0-mig-1g5gb-x-0")


def test_prepare_finds_the_placement_a_partitionable_nvidia_name_gives() -> None:
    """Prepare creates the MIG device a name stands for: NVIDIA's names parse as ours do."""
    devices, _ = build_devices(
        SYSTEM, [gpu(0, 3, profiles=(PROFILE, ME_PROFILE))], partitionable=True, naming=DeviceNaming.NVIDIA
    )
    by_name = {d.name: d for d in devices}
    assert "gpu-3-mig-1g24gb-me-21-0" in by_name, sorted(by_name)
    placement = placement_of(by_name["gpu-3-mig-1g10gb-19-2"])
    assert (placement.parent_minor, placement.profile, placement.profile_id, placement.start) == (
        3, "1g.10gb", 19, 2,
    )  # fmt: skip
    me = placement_of(by_name["gpu-3-mig-1g24gb-me-21-0"])
    assert (me.profile, me.profile_id, me.start) == ("1g.24gb+me", 21, 0)


# --- what DCGM exporter reads, field by field -----------------------------------------------------------


def test_slices_carry_the_driver_name_dcgm_filters_on() -> None:
    assert {obj["spec"]["driver"] for obj in slices(DeviceNaming.NVIDIA)} == {dcgm_view.DCGM_DRIVER}


def test_slices_carry_the_pool_name_the_kubelet_reports_the_node_name() -> None:
    """DCGM keys devices by `<pool>/<device>`; the kubelet reports the allocation's pool, ours the node's."""
    assert {obj["spec"]["pool"]["name"] for obj in slices(DeviceNaming.NVIDIA)} == {NODE}


def test_a_whole_gpu_carries_type_gpu_and_its_uuid_as_strings() -> None:
    attributes = devices_of(slices(DeviceNaming.NVIDIA))["gpu-3"]["attributes"]
    assert attributes["type"] == {"string": "gpu"}
    assert attributes["uuid"] == {"string": GPUS[0].uuid}


def test_a_mig_device_carries_type_mig_parent_uuid_profile_and_its_uuid_as_strings() -> None:
    attributes = devices_of(slices(DeviceNaming.NVIDIA))["gpu-1-mig-1g10gb-19-1"]["attributes"]
    assert attributes["type"] == {"string": "mig"}
    assert attributes["parentUUID"] == {"string": GPUS[1].uuid}
    assert attributes["profile"] == {"string": "1g.10gb"}
    assert attributes["uuid"] == {"string": GPUS[1].mig_instances[0].uuid}


def test_a_partitionable_mig_device_carries_the_parent_uuid_dcgm_needs_before_it_exists() -> None:
    """Created at prepare, it has no UUID to publish; DCGM maps it by `parentUUID` alone."""
    mig = devices_of(slices(DeviceNaming.NVIDIA, partitionable=True))["gpu-3-mig-1g10gb-19-0"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["parentUUID"] == {"string": GPUS[0].uuid}
    assert "uuid" not in mig["attributes"]


def test_dcgm_maps_every_published_device_to_its_gpu() -> None:
    index = dcgm_view.device_index(slices(DeviceNaming.NVIDIA))
    assert index == {
        f"{NODE}/gpu-3": dcgm_view.GpuOf(GPUS[0].uuid),
        f"{NODE}/gpu-1-mig-1g10gb-19-1": dcgm_view.GpuOf(
            GPUS[1].uuid, mig_uuid=GPUS[1].mig_instances[0].uuid, profile="1g.10gb"
        ),
    }


def test_dcgm_maps_nothing_of_our_own_driver_name() -> None:
    assert dcgm_view.device_index(slices(DeviceNaming.DRAPLUGIN)) == {}


def test_load_backend_hands_the_naming_to_the_fake_backends_device_builder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fake GPUs have minor = index and no NVML profile IDs, so both schemes name them alike: what
    is checked is that the setting reaches `build_devices`, and that a bad one is refused."""
    import draplugin.devices.fake as fake

    seen: list[object] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("naming"))
        return build_devices(*args, **kwargs)

    monkeypatch.setattr(fake, "build_devices", recording)
    load_backend("fake", NODE, gpus=2, model="A100-SXM4-80GB", naming=DeviceNaming.NVIDIA)
    load_backend("fake", NODE, gpus=2, model="A100-SXM4-80GB")
    assert seen == [DeviceNaming.NVIDIA, DeviceNaming.DRAPLUGIN]
    with pytest.raises(ValueError, match="nvidia-ish"):
        load_backend("fake", NODE, gpus=1, naming="nvidia-ish")


# --- the setting ----------------------------------------------------------------------------------------


def settings(**values: str) -> config.Settings:
    return config.validate(config.resolve({"node_name": NODE, "backend": "fake", **values}, {}))


def test_nvidia_naming_goes_with_nvidias_driver_name_and_reaches_the_backend() -> None:
    chosen = settings(device_naming="nvidia", driver_name=NVIDIA_DRIVER_NAME)
    assert chosen.device_naming is DeviceNaming.NVIDIA
    assert chosen.backend_options()["naming"] is DeviceNaming.NVIDIA
    assert "naming" not in settings().backend_options()


@pytest.mark.parametrize(
    "values",
    [{"device_naming": "nvidia"}, {"driver_name": NVIDIA_DRIVER_NAME}, {"device_naming": "nvidia-ish"}],
)
def test_nvidia_naming_and_nvidias_driver_name_are_refused_apart(values: dict[str, str]) -> None:
    with pytest.raises(config.ConfigError, match="--device-naming"):
        settings(**values)


def test_the_devices_preview_renders_nvidias_names_under_nvidias_driver_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`draplugin devices --device-naming nvidia`: what `draplugin run` in that mode would publish."""
    from draplugin.cli import main

    argv = ["devices", "--node-name", NODE, "--backend", "fake", "--fake-gpus", "1", "-o", "json"]
    assert main([*argv, "--device-naming", "nvidia"]) == 0
    (obj,) = json.loads(capsys.readouterr().out)["items"]
    assert obj["spec"]["driver"] == NVIDIA_DRIVER_NAME
    assert main(argv) == 0
    (obj,) = json.loads(capsys.readouterr().out)["items"]
    assert obj["spec"]["driver"] == "gpu.draplugin.dev"
