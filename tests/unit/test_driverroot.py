"""Driver root discovery against trees laid out like real driver installs, and its bad inputs."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from draplugin.cdi.driverfiles import container_edits
from draplugin.cdi.driverlayout import (
    ARCHES,
    AmbiguousDriverVersion,
    DriverInstall,
    DriverRoot,
    DriverRootMissing,
    DriverVersionMismatch,
    LinkOutsideRoot,
    MissingDriverLibrary,
    NoDriverLibraries,
    SymlinkLoop,
    UnsupportedArchitecture,
    host_arch,
)
from draplugin.cdi.driverroot import discover, parse_version_file
from tests.driverroot_layout import (
    EM_386,
    EM_AARCH64,
    MODERN_LIBRARIES,
    OLD_LIBRARIES,
    DriverLayout,
    debian_layout,
    elf_shared_object,
    lib64_layout,
    relative_symlink,
)

X86 = ARCHES["x86_64"]
DEB_LIBS = "usr/lib/x86_64-linux-gnu"


def found(root: Path, **kwargs: object) -> DriverInstall:
    return discover(DriverRoot.at(str(root)), arch=X86, **kwargs)  # type: ignore[arg-type]


def mounts(install: DriverInstall) -> dict[str, str]:
    """containerPath → hostPath of the install's container edits."""
    return {m.container_path: m.host_path for m in container_edits(install).mounts}


def test_debian_multiarch_install_gives_every_library_at_versioned_name_and_soname(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    install = found(root)
    assert install.version == "580.95.05"
    assert install.version_source == str(root / "proc/driver/nvidia/version")
    assert install.findings == ()
    # The brief's list and the Container Toolkit's compute/utility ones: all present in this layout.
    assert {lib.name for lib in install.libraries} == set(MODERN_LIBRARIES)
    paths = mounts(install)
    real = str(root / DEB_LIBS / "libcuda.so.580.95.05")
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"] == real
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == real
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so"] == real
    ml = str(root / DEB_LIBS / "libnvidia-ml.so.580.95.05")
    assert paths["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] == ml
    # The SONAME comes from the file, not the convention: nvvm's is .so.4.
    assert paths["/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4"].endswith("libnvidia-nvvm.so.580.95.05")
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.1" not in paths
    assert paths["/usr/bin/nvidia-smi"] == str(root / "usr/bin/nvidia-smi")
    for binary in (
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ):
        assert paths[f"/usr/bin/{binary}"] == str(root / "usr/bin" / binary)
    assert paths["/lib/firmware/nvidia/580.95.05"] == str(root / "lib/firmware/nvidia/580.95.05")
    for mount in container_edits(install).mounts:
        assert mount.options[:3] == ("ro", "nosuid", "nodev")


def test_lib64_install_of_another_version_mounts_into_the_container_library_dir(tmp_path: Path) -> None:
    root = lib64_layout(proc_version=None).build(tmp_path / "root")
    install = found(root)
    assert (install.version, install.version_source) == ("570.172.08", "library file names")
    paths = mounts(install)
    real = str(root / "usr/lib64/libcuda.so.570.172.08")
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == real
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so.570.172.08"] == real
    assert paths["/lib/firmware/nvidia/570.172.08"] == str(root / "lib/firmware/nvidia/570.172.08")
    assert not any("580" in path for path in paths)


def test_old_driver_libraries_are_found_by_their_own_names(tmp_path: Path) -> None:
    root = debian_layout(version="418.226.00", libraries=OLD_LIBRARIES, firmware=False).build(tmp_path / "r")
    install = found(root)
    assert {lib.name for lib in install.libraries} == set(OLD_LIBRARIES)
    assert install.firmware_dir is None
    assert "/usr/lib/x86_64-linux-gnu/libnvidia-fatbinaryloader.so.418.226.00" in mounts(install)


def test_host_path_prefix_differs_from_where_the_root_is_read(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "driver-root")
    install = discover(DriverRoot.at("/run/nvidia/driver", str(root)), arch=X86)
    paths = mounts(install)
    assert paths["/usr/lib/x86_64-linux-gnu/libcuda.so.1"] == (
        "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"
    )
    nodes = {n.path: n.host_path for n in container_edits(install).device_nodes}
    assert nodes["/dev/nvidia-uvm"] == "/run/nvidia/driver/dev/nvidia-uvm"


# --- the version --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 17:43:19 UTC 2025",
            "580.95.05",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build  "
            "(dvs-builder@U22-I3-AE18-23-3)  Tue Jul  8 18:18:21 UTC 2025",
            "570.172.08",
        ),
        (
            "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.261.03  Wed Jul 16 20:26:04 UTC 2025",
            "535.261.03",
        ),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build", "580.65.06"),
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022", "390.157"),
        ("NVRM version: something else entirely", None),
        ("GCC version:  gcc version 13.3.0", None),
        ("", None),
    ],
)
def test_version_file_lines(line: str, version: str | None) -> None:
    assert parse_version_file(line + "\nGCC version:  gcc version 12.3.0\n") == version


def test_two_installed_versions_need_something_to_choose(tmp_path: Path) -> None:
    root = debian_layout(proc_version=None).build(tmp_path / "root")
    debian_layout(version="570.172.08", proc_version=None, firmware=False).build(root)
    with pytest.raises(
        AmbiguousDriverVersion, match=r"several driver versions: 570\.172\.08 .*580\.95\.05"
    ) as err:
        found(root)
    assert "no NVML answer and no readable" in str(err.value)
    # NVML's published form drops leading zeros ("580.95.5"): it still picks the right files.
    install = found(root, known_version="580.95.5")
    assert install.version == "580.95.05" and install.version_source == "NVML"
    assert all(lib.file_name.endswith(".580.95.05") for lib in install.libraries)
    older = found(root, known_version="570.172.08")
    assert mounts(older)["/usr/lib/x86_64-linux-gnu/libcuda.so.1"].endswith("libcuda.so.570.172.08")


def test_version_file_picks_between_two_versions(tmp_path: Path) -> None:
    root = debian_layout(version="570.172.08").build(tmp_path / "root")
    debian_layout(proc_version=None).build(root)  # 580 libraries next to the loaded 570 module
    install = found(root)
    assert install.version == "570.172.08"
    assert mounts(install)["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"].endswith(
        "libnvidia-ml.so.570.172.08"
    )


def test_kernel_module_and_libraries_of_different_versions(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    with pytest.raises(DriverVersionMismatch, match=r"version is 590\.1\.2 \(from NVML\).*580\.95\.05"):
        found(root, known_version="590.1.2")


def test_unparsable_version_file_falls_back_to_file_names_and_says_so(tmp_path: Path) -> None:
    root = debian_layout(proc_version="NVRM: garbled").build(tmp_path / "root")
    install = found(root)
    assert install.version_source == "library file names"
    assert [f.reason for f in install.findings] == ["DriverVersionUnreadable"]
    assert (
        "does not parse" in install.findings[0].message and "'NVRM: garbled'" in install.findings[0].message
    )
    debian_layout(version="570.172.08", proc_version="NVRM: garbled", firmware=False).build(root)
    with pytest.raises(AmbiguousDriverVersion, match="does not parse"):
        found(root)


# --- bad roots ----------------------------------------------------------------------------------------


def test_missing_root_and_a_file_as_root(tmp_path: Path) -> None:
    with pytest.raises(DriverRootMissing, match=r"does not exist: set --driver-root"):
        found(tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(DriverRootMissing, match="is not a directory"):
        found(tmp_path / "file")


def test_root_without_libraries_names_where_it_looked(tmp_path: Path) -> None:
    root = DriverLayout(libraries=()).build(tmp_path / "root")
    with pytest.raises(
        NoDriverLibraries, match=r"no NVIDIA driver libraries .*looked in usr/lib/x86_64-linux-gnu, usr/lib64"
    ):
        found(root)


def test_missing_required_library_of_the_version(tmp_path: Path) -> None:
    root = DriverLayout(libraries=("libcuda", "libnvidia-cfg")).build(tmp_path / "root")
    with pytest.raises(MissingDriverLibrary, match=r"libnvidia-ml\.so\.580\.95\.05 \(x86_64\) not found"):
        found(root)


def test_symlink_loop_on_a_required_library(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    lib = root / DEB_LIBS / "libcuda.so.580.95.05"
    relative_symlink(lib, "libcuda.loop")
    relative_symlink(root / DEB_LIBS / "libcuda.loop", "libcuda.so.580.95.05")
    with pytest.raises(SymlinkLoop, match="link loop"):
        found(root)


def test_symlink_loop_on_an_optional_library_skips_it(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    relative_symlink(root / DEB_LIBS / "libnvidia-cfg.so.580.95.05", "libnvidia-cfg.so.580.95.05")
    install = found(root)
    assert install.library("libnvidia-cfg") is None
    assert [f.reason for f in install.findings] == ["DriverFileSymlinkLoop"]
    assert not any("libnvidia-cfg" in path for path in mounts(install))


def test_link_climbing_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "libcuda.so.580.95.05").write_bytes(elf_shared_object("libcuda.so.1"))
    relative_symlink(root / DEB_LIBS / "libcuda.so.580.95.05", "../../../../outside/libcuda.so.580.95.05")
    with pytest.raises(LinkOutsideRoot, match="above the driver root"):
        found(root)


def test_absolute_links_stay_inside_the_root(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    # An absolute target names a path of the driver's tree: a file at that host path is not used.
    outside = tmp_path / "host-only"
    outside.mkdir()
    (outside / "libnvidia-cfg.so.580.95.05").write_bytes(elf_shared_object("libnvidia-cfg.so.1"))
    relative_symlink(
        root / DEB_LIBS / "libnvidia-cfg.so.580.95.05", str(outside / "libnvidia-cfg.so.580.95.05")
    )
    # An absolute target that exists inside the root is followed there.
    inside = root / "opt/nvidia/libnvidia-allocator.so.580.95.05"
    inside.parent.mkdir(parents=True)
    (root / DEB_LIBS / "libnvidia-allocator.so.580.95.05").rename(inside)
    relative_symlink(
        root / DEB_LIBS / "libnvidia-allocator.so.580.95.05", "/opt/nvidia/libnvidia-allocator.so.580.95.05"
    )
    install = found(root)
    assert install.library("libnvidia-cfg") is None
    paths = mounts(install)
    assert paths["/usr/lib/x86_64-linux-gnu/libnvidia-allocator.so.1"] == str(inside)
    for host in paths.values():
        assert Path(host).is_relative_to(root), host


def test_merged_usr_lib_link_is_searched_once(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    (root / "lib").rename(root / "usr/lib/firmware-parent")
    (root / "usr/lib/firmware-parent/firmware").rename(root / "usr/lib/firmware")
    (root / "usr/lib/firmware-parent").rmdir()
    relative_symlink(root / "lib", "usr/lib")
    install = found(root)
    # Found under the name containers know it by, mounted from the real directory.
    firmware = str(root / "usr/lib/firmware/nvidia/580.95.05")
    assert mounts(install)["/lib/firmware/nvidia/580.95.05"] == firmware
    assert install.library("libcuda") is not None
    assert install.library("libcuda").file.found == PurePosixPath(DEB_LIBS, "libcuda.so.580.95.05")  # type: ignore[union-attr]


# --- ELF identity -------------------------------------------------------------------------------------


def test_library_without_soname_goes_by_the_convention(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    (root / DEB_LIBS / "libnvidia-allocator.so.580.95.05").write_bytes(elf_shared_object(None))
    install = found(root)
    assert install.library("libnvidia-allocator").soname == "libnvidia-allocator.so.1"  # type: ignore[union-attr]


def test_32_bit_copy_in_usr_lib_is_not_mounted(tmp_path: Path) -> None:
    # RHEL: usr/lib64 holds the 64-bit libraries and usr/lib the 32-bit ones, searched after.
    root = lib64_layout().build(tmp_path / "root")
    DriverLayout(version="570.172.08", lib_dir="usr/lib", machine=EM_386, binaries=(), firmware=False).build(
        root
    )
    (root / "usr/lib64/libcuda.so.570.172.08").unlink()
    install_error = pytest.raises(
        MissingDriverLibrary, match=r"libcuda\.so\.570\.172\.08 \(x86_64\) not found"
    )
    with install_error:
        found(root)


def test_architecture_picks_its_own_libraries(tmp_path: Path) -> None:
    root = DriverLayout(lib_dir="usr/lib/aarch64-linux-gnu", machine=EM_AARCH64).build(tmp_path / "root")
    with pytest.raises(NoDriverLibraries):
        found(root)  # x86_64 does not look in the aarch64 directory
    shared = lib64_layout(machine=EM_AARCH64).build(tmp_path / "lib64")
    with pytest.raises(MissingDriverLibrary, match=r"\(x86_64\) not found"):
        found(shared)  # the files are there, but for another architecture
    assert discover(DriverRoot.at(str(shared)), arch=ARCHES["aarch64"]).library("libcuda") is not None
    install = discover(DriverRoot.at(str(root)), arch=ARCHES["aarch64"])
    assert mounts(install)["/usr/lib/aarch64-linux-gnu/libcuda.so.1"] == str(
        root / "usr/lib/aarch64-linux-gnu/libcuda.so.580.95.05"
    )
    assert host_arch("arm64") == ARCHES["aarch64"] and host_arch("AMD64") == X86
    with pytest.raises(UnsupportedArchitecture, match="ppc64le"):
        host_arch("ppc64le")


def test_unreadable_optional_library_is_a_finding(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    (root / DEB_LIBS / "libnvidia-nscq.so.580.95.05").write_bytes(b"\x7fELF\x02\x01")
    install = found(root)
    assert install.library("libnvidia-nscq") is None
    assert [f.reason for f in install.findings] == ["DriverLibraryUnreadable"]
    assert "truncated" in install.findings[0].message or "not an ELF" in install.findings[0].message


# --- device nodes, socket, hook -----------------------------------------------------------------------


def test_uvm_nodes_only_when_they_exist(tmp_path: Path) -> None:
    with_uvm = found(debian_layout().build(tmp_path / "a"))
    nodes = [n.path for n in container_edits(with_uvm).device_nodes]
    assert nodes == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    without = found(debian_layout(dev_nodes=("nvidiactl",)).build(tmp_path / "b"))
    assert [n.path for n in container_edits(without).device_nodes] == ["/dev/nvidiactl"]
    assert [f.reason for f in without.findings] == ["UvmDeviceNodesMissing"]
    assert "/dev/nvidia-uvm and /dev/nvidia-uvm-tools missing" in without.findings[0].message
    assert "nvidia-modprobe" in without.findings[0].message
    # Libraries are still given: a missing node is reported, not a reason to break the spec.
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in mounts(without)
    # A plain file where the node should be would make the runtime refuse the spec: not a node.
    plain = debian_layout(dev_nodes=("nvidiactl", "nvidia-uvm-tools")).build(tmp_path / "c")
    (plain / "dev/nvidia-uvm").write_bytes(b"")
    install = found(plain)
    assert [n.path for n in container_edits(install).device_nodes] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm-tools",
    ]
    assert install.findings[0].message.startswith("/dev/nvidia-uvm missing (or not character devices)")


def test_persistenced_socket_is_mounted_when_present(tmp_path: Path) -> None:
    root = debian_layout(persistenced_socket=True).build(tmp_path / "root")
    edits = container_edits(found(root))
    socket = [m for m in edits.mounts if m.container_path == "/run/nvidia-persistenced/socket"]
    assert len(socket) == 1 and socket[0].host_path == str(root / "run/nvidia-persistenced/socket")
    assert "noexec" in socket[0].options
    assert not any(
        m.container_path.endswith("socket")
        for m in container_edits(found(debian_layout().build(tmp_path / "b"))).mounts
    )


def test_spec_does_not_depend_on_the_hook_binary(tmp_path: Path) -> None:
    plain = found(debian_layout().build(tmp_path / "plain"))
    hooked = found(debian_layout(hook=True).build(tmp_path / "hooked"))
    assert plain.hook is None and hooked.hook == PurePosixPath("usr/bin/nvidia-cdi-hook")

    def relative(install: DriverInstall) -> list[tuple[str, str]]:
        prefix = str(install.root.host)
        return [(m.container_path, m.host_path.removeprefix(prefix)) for m in container_edits(install).mounts]

    assert relative(plain) == relative(hooked)
    # No hook, so nothing else either: the only variable is Triton's libcuda directory.
    assert (
        container_edits(hooked).env
        == container_edits(plain).env
        == ("TRITON_LIBCUDA_PATH=/usr/lib/x86_64-linux-gnu",)
    )


def test_nothing_outside_the_root_in_any_layout(tmp_path: Path) -> None:
    for i, layout in enumerate((debian_layout(persistenced_socket=True), lib64_layout(hook=True))):
        root = layout.build(tmp_path / str(i))
        for mount in container_edits(found(root)).mounts:
            assert os.path.realpath(mount.host_path).startswith(str(root) + "/"), mount
