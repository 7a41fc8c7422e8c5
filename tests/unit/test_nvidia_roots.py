"""Driver roots made of NVIDIA's real files (tests/nvidia_roots.py), and our discovery on them.

The files are Debian trixie's NVIDIA 550.163.01-2 packages, downloaded and
cached by tests/cluster/fetch_nvidia_debs.sh (a missing cache is downloaded,
~125 MB, about 20 s; no network fails these tests). The NVML library of each
root is the C-ABI NVML double's when tests/cluster/build_nvml_double.sh exists.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from draplugin.cdi.driverlayout import DriverRoot
from draplugin.cdi.driverroot import discover, version_key
from draplugin.cdi.elf import EM_X86_64, read_elf
from draplugin.cdi.rootpath import resolve_in_root
from tests import nvidia_roots as nr

TWO_PART = "550.135"
REQUIRED_PACKAGES = {
    "nvidia-smi",
    "libcuda1",
    "libnvidia-ml1",
    "libnvidia-cfg1",
    "libnvidia-encode1",
    "libnvcuvid1",
    "libnvidia-ptxjitcompiler1",
    "libnvidia-nvvm4",
    "libnvidia-allocator1",
    "nvidia-opencl-icd",
    "nvidia-cuda-mps",
    "nvidia-alternative",
    "firmware-nvidia-gsp",
    "libcudadebugger1",
    "libnvidia-gpucomp",
    "libnvidia-eglcore",
    "libnvidia-glcore",
    "libnvidia-glvkspirv",
    "libegl-nvidia0",
    "libglx-nvidia0",
}


@pytest.fixture(scope="module")
def tree() -> Path:
    try:
        return nr.unpacked_tree()
    except nr.NvidiaFilesUnavailable as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="module")
def nvml(tree: Path) -> Path | None:
    return nr.nvml_for_roots()[0]


@pytest.fixture(scope="module")
def roots(
    tree: Path, nvml: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, nr.NvidiaRoot]:
    base = tmp_path_factory.mktemp("nvidia-roots")
    built: dict[str, nr.NvidiaRoot] = {}
    layouts: tuple[nr.Layout, ...] = ("debian", "flat")
    for layout in layouts:
        built[layout] = nr.build_root(layout, base / layout, nvml=nvml)
        built[f"{layout}-{TWO_PART}"] = nr.build_root(
            layout, base / f"{layout}-{TWO_PART}", nvml=nvml, version=TWO_PART
        )
    return built


def need_double() -> Path:
    library, reason = nr.nvml_for_roots()
    if library is None:
        if not nr.nvml_double_available():
            pytest.skip(f"the NVML double is not delivered yet: {reason}")
        pytest.fail(reason, pytrace=False)
    return library


def soname_links(directory: Path) -> dict[str, str]:
    """`<SONAME> -> <versioned file>` links of a directory, as NVIDIA's packages make them."""
    return {
        p.name: os.readlink(p)
        for p in directory.iterdir()
        if p.is_symlink() and not os.readlink(p).startswith("/") and ".so." in p.name
    }


# --- the packages ---------------------------------------------------------------------------------------


def test_packages_are_the_pinned_release_with_their_index_hashes(tree: Path) -> None:
    listed = nr.packages()
    names = {name for name, _, _ in listed}
    assert names >= REQUIRED_PACKAGES
    assert {version for _, version, _ in listed} == {nr.DEBIAN_VERSION}
    assert all(len(sha) == 64 and int(sha, 16) >= 0 for _, _, sha in listed)
    assert (tree.parent / "VERSION").read_text().strip() == nr.VERSION
    assert (tree.parent / "control/nvidia-alternative/postinst").is_file()


# --- Debian's layout -----------------------------------------------------------------------------------


def test_debian_root_is_what_the_packages_unpack_plus_the_alternatives(
    roots: dict[str, nr.NvidiaRoot],
) -> None:
    root = roots["debian"]
    path = root.path
    current = path / "usr/lib/x86_64-linux-gnu/nvidia/current"
    assert (current / "libcuda.so.550.163.01").is_file()
    assert os.readlink(current / "libcuda.so.1") == "libcuda.so.550.163.01"
    assert (path / "usr/lib/nvidia/current/nvidia-smi").is_file()
    # The postinst's update-alternatives: absolute links through /etc/alternatives.
    libcuda = path / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert os.readlink(libcuda) == "/etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu"
    assert (
        os.readlink(path / "etc/alternatives/nvidia--libcuda.so.1-x86_64-linux-gnu")
        == "/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"
    )
    assert os.readlink(path / "usr/bin/nvidia-smi") == "/etc/alternatives/nvidia--nvidia-smi"
    assert os.readlink(path / "etc/alternatives/nvidia--nvidia-smi") == "/usr/lib/nvidia/current/nvidia-smi"
    # libnvidia-cfg's slave goes to the multiarch directory's nvidia/ subdirectory, not next to libcuda.
    assert (path / "usr/lib/x86_64-linux-gnu/nvidia/libnvidia-cfg.so.1").is_symlink()
    assert not (path / "usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1").exists()
    assert os.readlink(path / "usr/lib/nvidia/nvidia") == "/etc/alternatives/nvidia"
    # Merged /usr, the firmware under usr/lib, the NVRM line.
    assert {top: os.readlink(path / top) for top in ("bin", "sbin", "lib", "lib64")} == {
        "bin": "usr/bin",
        "sbin": "usr/sbin",
        "lib": "usr/lib",
        "lib64": "usr/lib64",
    }
    assert (path / "usr/lib/firmware/nvidia/550.163.01/gsp_ga10x.bin").is_file()
    assert (path / "usr/sbin/nvidia-cuda-mps-server").is_file()
    assert (
        (path / "proc/driver/nvidia/version")
        .read_text()
        .startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.163.01  ")
    )
    # Debian ships no ld.so.conf.d for the driver: the alternatives put the links on the default path.
    assert not (path / "etc/ld.so.conf.d").exists()
    assert root.lib_dir == PurePosixPath("usr/lib/x86_64-linux-gnu/nvidia/current")


def test_debian_root_alternatives_are_what_update_alternatives_makes(
    roots: dict[str, nr.NvidiaRoot], tree: Path, tmp_path: Path
) -> None:
    """The real update-alternatives, run with --root on the same files, makes the same links."""
    tool = shutil.which("update-alternatives")
    if tool is None:
        pytest.skip("no update-alternatives on this machine")
    ours = roots["debian"].path
    alternative = nr.nvidia_alternative(
        ours, (tree.parent / "control/nvidia-alternative/postinst").read_text()
    )
    theirs = tmp_path / "root"
    nr.build_debian_root(theirs, devices=False, ld_cache=False)
    for made in (theirs / "etc/alternatives").iterdir():  # start again from the packages' files alone
        made.unlink()
    for slave in alternative.slaves:
        (theirs / str(slave.link).lstrip("/")).unlink()
    (theirs / str(alternative.link).lstrip("/")).unlink()
    (theirs / "var/lib/dpkg/alternatives/nvidia").unlink()
    argv = [tool, "--root", str(theirs), "--install", str(alternative.link), alternative.name]
    argv += [str(alternative.path), str(alternative.priority)]
    for slave in alternative.slaves:
        argv += ["--slave", str(slave.link), slave.name, str(slave.path)]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)

    def links(root: Path) -> dict[str, str]:
        found = {}
        for directory, dirs, files in os.walk(root):
            for name in dirs + files:
                path = Path(directory, name)
                if path.is_symlink():
                    found[str(path.relative_to(root))] = os.readlink(path)
        return found

    assert links(theirs) == links(ours)
    assert (theirs / "var/lib/dpkg/alternatives/nvidia").read_text() == (
        ours / "var/lib/dpkg/alternatives/nvidia"
    ).read_text()
    assert len(alternative.slaves) >= 30


def test_debian_root_has_an_ld_cache_of_its_own(roots: dict[str, nr.NvidiaRoot]) -> None:
    root = roots["debian"]
    if not root.ld_cache:
        pytest.skip("ldconfig -r needs root (chroot)")
    listed = subprocess.run(
        ["ldconfig", "-p", "-C", str(root.path / "etc/ld.so.cache")],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    assert "libcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1" in listed
    assert "libnvidia-ml.so.1 (libc6,x86-64)" in listed


# --- the flat layout -----------------------------------------------------------------------------------


def test_flat_root_has_every_library_in_the_multiarch_directory(
    roots: dict[str, nr.NvidiaRoot], tree: Path
) -> None:
    root = roots["flat"]
    lib = root.path / "usr/lib/x86_64-linux-gnu"
    debian_files = {
        p.name for p in (tree / "usr/lib/x86_64-linux-gnu/nvidia/current").glob("lib*.so.550.163.01")
    }
    debian_files |= {p.name for p in (tree / "usr/lib/x86_64-linux-gnu").glob("lib*.so.550.163.01")}
    debian_files.discard("libvdpau_nvidia.so.550.163.01")
    assert {p.name for p in lib.glob("lib*.so.550.163.01")} == debian_files
    assert (lib / "vdpau/libvdpau_nvidia.so.550.163.01").is_file()
    assert soname_links(lib)["libcuda.so.1"] == "libcuda.so.550.163.01"
    assert soname_links(lib)["libnvidia-nvvm.so.4"] == "libnvidia-nvvm.so.550.163.01"
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "gbm/nvidia-drm_gbm.so") == "../libnvidia-allocator.so.550.163.01"
    for binary in ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        assert stat.S_ISREG(os.lstat(root.path / "usr/bin" / binary).st_mode), binary
    assert not (root.path / "lib").is_symlink()
    assert (root.path / "lib/firmware/nvidia/550.163.01/gsp_tu10x.bin").is_file()
    assert not (root.path / "etc/alternatives").exists()
    assert root.lib_dir == PurePosixPath("usr/lib/x86_64-linux-gnu")


def test_roots_are_hard_links_into_the_cache_and_detach_copies(
    roots: dict[str, nr.NvidiaRoot], tree: Path
) -> None:
    root = roots["flat"]
    libcuda = root.path / root.library("libcuda")
    cached = tree / "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.550.163.01"
    assert os.stat(libcuda).st_ino == os.stat(cached).st_ino or libcuda.read_bytes() == cached.read_bytes()
    copy = nr.detach(root, root.library("libcuda"))
    assert os.stat(copy).st_nlink == 1
    with copy.open("r+b") as file:
        file.seek(0x100)
        file.write(b"x")
    assert copy.read_bytes() != cached.read_bytes()


def test_nvml_file_is_the_double_or_nvidias(
    roots: dict[str, nr.NvidiaRoot], tree: Path, nvml: Path | None
) -> None:
    real = (tree / "usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.550.163.01").read_bytes()
    for name in ("debian", "flat"):
        root = roots[name]
        content = (root.path / root.nvml_library).read_bytes()
        assert root.nvml_double == (nvml is not None)
        assert content == (nvml.read_bytes() if nvml is not None else real)
        assert read_elf(root.path / root.nvml_library).soname == "libnvidia-ml.so.1"


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_sonames_are_what_the_elf_reader_reads(roots: dict[str, nr.NvidiaRoot], layout: str) -> None:
    """Every real library's DT_SONAME, as draplugin.cdi.elf reads it, names its package's link
    (or the file itself, for the libraries NVIDIA loads by their versioned name), and agrees
    with readelf where binutils is installed."""
    root = roots[layout]
    lib_dir = root.path / root.lib_dir
    links = {target: name for name, target in soname_links(lib_dir).items()}  # file -> its SONAME link
    files = sorted(lib_dir.glob(f"lib*.so.{root.version}"))
    assert len(files) >= (20 if layout == "flat" else 15)
    readelf = shutil.which("readelf")
    for file in files:
        info = read_elf(file)
        assert (info.bits, info.machine) == (64, EM_X86_64), file.name
        expected = links.get(file.name, file.name)
        assert info.soname == expected, file.name
        if readelf is not None:
            dynamic = subprocess.run(
                [readelf, "-d", str(file)], capture_output=True, text=True, check=True
            ).stdout
            assert f"Library soname: [{info.soname}]" in dynamic, file.name


def test_two_part_version_renames_names_not_content(roots: dict[str, nr.NvidiaRoot], tree: Path) -> None:
    for layout in ("debian", "flat"):
        root = roots[f"{layout}-{TWO_PART}"]
        assert (root.path / root.library("libcuda")).is_file()
        assert not list((root.path / root.lib_dir).glob("*550.163.01*"))
        assert (root.path / root.firmware_dir).name == TWO_PART
        assert f"Kernel Module  {TWO_PART}  " in (root.path / "proc/driver/nvidia/version").read_text()
        # The content is 550.163.01's: the SONAMEs that carry a version still say so.
        gpucomp = root.path / f"usr/lib/x86_64-linux-gnu/libnvidia-gpucomp.so.{TWO_PART}"  # in both layouts
        assert read_elf(gpucomp).soname == "libnvidia-gpucomp.so.550.163.01"
    debian = roots[f"debian-{TWO_PART}"].path
    assert os.readlink(debian / f"usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.{TWO_PART}").endswith(
        f"libnvidia-nvvm.so.{TWO_PART}-x86_64-linux-gnu"
    )
    assert (debian / f"etc/nvidia/nvidia-{TWO_PART}").is_symlink()


def test_device_nodes_have_nvidias_numbers(roots: dict[str, nr.NvidiaRoot]) -> None:
    root = roots["flat"]
    if os.geteuid() != 0:
        assert root.device_nodes == ()
        pytest.skip("device nodes need CAP_MKNOD")
    numbers = {}
    for node in root.device_nodes:
        info = os.stat(root.path / node)
        assert stat.S_ISCHR(info.st_mode), node
        numbers[str(node)] = (os.major(info.st_rdev), os.minor(info.st_rdev))
    assert numbers["dev/nvidiactl"] == (195, 255)
    assert numbers["dev/nvidia0"] == (195, 0)
    assert numbers["dev/nvidia1"] == (195, 1)
    assert numbers["dev/nvidia-modeset"] == (195, 254)
    assert numbers["dev/nvidia-uvm"][1] == 0
    assert numbers["dev/nvidia-uvm-tools"] == (numbers["dev/nvidia-uvm"][0], 1)
    assert numbers["dev/nvidia-caps/nvidia-cap1"][1] == 1
    assert stat.S_IMODE(os.stat(root.path / "dev/nvidiactl").st_mode) == 0o666


# --- NVIDIA's binaries from the roots -------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_real_nvidia_smi_runs_from_the_root(roots: dict[str, nr.NvidiaRoot], layout: str) -> None:
    """nvidia-smi runs from the root with `driver_env`; without the double the root's NVML is
    NVIDIA's, which finds no kernel driver (exit 9)."""
    root = roots[layout]
    result = subprocess.run(
        [str(root.nvidia_smi), "-L"],
        env=nr.driver_env(root),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if root.nvml_double:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "GPU 0: " in result.stdout
        assert "(UUID: GPU-" in result.stdout
    else:
        assert result.returncode == 9, result.stdout + result.stderr
        assert "couldn't communicate with the NVIDIA driver" in result.stdout


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_real_nvidia_smi_lists_the_doubles_gpus(
    roots: dict[str, nr.NvidiaRoot], layout: str, tmp_path: Path
) -> None:
    need_double()
    root = roots[layout]
    assert root.nvml_double
    config = nr.write_nvml_double_config(root, tmp_path / "nvml.json")
    result = subprocess.run(
        [str(root.nvidia_smi), "-L"],
        env=nr.driver_env(root, config),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("GPU 0: "), result.stdout
    assert "GPU 1: " in result.stdout and "GPU 2: " not in result.stdout, result.stdout


# --- our discovery on the real layouts ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["flat", f"flat-{TWO_PART}"])
def test_discovery_finds_the_flat_install(roots: dict[str, nr.NvidiaRoot], name: str) -> None:
    root = roots[name]
    for known in (None, root.version):
        install = discover(DriverRoot.at(str(root.path)), known_version=known)
        assert install.version == root.version
        found = {lib.name: (str(lib.file.real), lib.soname) for lib in install.libraries}
        lib = "usr/lib/x86_64-linux-gnu"
        assert found["libcuda"] == (f"{lib}/libcuda.so.{root.version}", "libcuda.so.1")
        assert found["libnvidia-ml"] == (f"{lib}/libnvidia-ml.so.{root.version}", "libnvidia-ml.so.1")
        assert found["libnvidia-nvvm"][1] == "libnvidia-nvvm.so.4"
        # At least the compute and utility libraries (a later discovery may add video ones).
        assert set(found) >= {
            "libcuda",
            "libnvidia-ml",
            "libnvidia-cfg",
            "libcudadebugger",
            "libnvidia-opencl",
            "libnvidia-gpucomp",
            "libnvidia-ptxjitcompiler",
            "libnvidia-allocator",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-nvvm",
        }
        assert [str(b.real) for b in install.binaries] == [
            "usr/bin/nvidia-smi",
            "usr/bin/nvidia-debugdump",
            "usr/bin/nvidia-cuda-mps-control",
            "usr/bin/nvidia-cuda-mps-server",
        ]
        assert install.firmware_dir is not None
        assert str(install.firmware_dir.real) == f"lib/firmware/nvidia/{root.version}"
        assert version_key(install.version) == version_key(root.version)
        if root.device_nodes:
            assert [c for c, _ in install.device_nodes] == [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
            ]
            assert install.findings == ()


def test_rootpath_follows_debians_alternatives_inside_the_root(roots: dict[str, nr.NvidiaRoot]) -> None:
    """What a fix can build on: the absolute /etc/alternatives links are re-rooted, never read on `/`."""
    root = roots["debian"].path
    assert resolve_in_root(root, "usr/lib/x86_64-linux-gnu/libcuda.so.1") == PurePosixPath(
        "usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.550.163.01"
    )
    assert resolve_in_root(root, "usr/bin/nvidia-smi") == PurePosixPath("usr/lib/nvidia/current/nvidia-smi")
    assert resolve_in_root(root, "lib/firmware/nvidia/550.163.01") == PurePosixPath(
        "usr/lib/firmware/nvidia/550.163.01"
    )


@pytest.mark.parametrize("name", ["debian", f"debian-{TWO_PART}"])
def test_discovery_finds_the_debian_install(roots: dict[str, nr.NvidiaRoot], name: str) -> None:
    root = roots[name]
    install = discover(DriverRoot.at(str(root.path)), known_version=root.version)
    found = {lib.name: (str(lib.file.real), lib.soname) for lib in install.libraries}
    current = "usr/lib/x86_64-linux-gnu/nvidia/current"
    assert found["libcuda"] == (f"{current}/libcuda.so.{root.version}", "libcuda.so.1")
    assert found["libnvidia-ml"] == (f"{current}/libnvidia-ml.so.{root.version}", "libnvidia-ml.so.1")
    assert found["libnvidia-cfg"][0] == f"{current}/libnvidia-cfg.so.{root.version}"
    assert {str(b.real) for b in install.binaries} >= {"usr/lib/nvidia/current/nvidia-smi"}
    assert install.firmware_dir is not None
    assert str(install.firmware_dir.real) == f"usr/lib/firmware/nvidia/{root.version}"


# --- CDI's merge ----------------------------------------------------------------------------------------


def test_effective_edits_merge_spec_and_device_edits_as_cdi_does() -> None:
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "containerEdits": {
            "env": ["A=spec", "B=spec"],
            "deviceNodes": [{"path": "/dev/nvidiactl"}],
            "mounts": [{"hostPath": "/h/libcuda.so.1", "containerPath": "/c/libcuda.so.1"}],
            "hooks": [{"hookName": "createContainer", "path": "/hook", "args": ["hook", "update-ldcache"]}],
        },
        "devices": [
            {
                "name": "0",
                "containerEdits": {
                    "env": ["B=device"],
                    "deviceNodes": [{"path": "/dev/nvidia0"}],
                    "mounts": [{"hostPath": "/other", "containerPath": "/c/libcuda.so.1"}],
                    "hooks": [{"hookName": "createContainer", "path": "/hook", "args": ["hook", "chmod"]}],
                },
            },
            {"name": "all", "containerEdits": {}},
        ],
    }
    edits = nr.effective_edits(spec)
    assert set(edits) == {"nvidia.com/gpu=0", "nvidia.com/gpu=all"}
    zero = edits["nvidia.com/gpu=0"]
    assert zero.env == {"A": "spec", "B": "device"}
    assert set(zero.device_nodes) == {"/dev/nvidiactl", "/dev/nvidia0"}
    assert zero.mounts["/c/libcuda.so.1"]["hostPath"] == "/other"
    assert zero.hook_commands() == [
        ("createContainer", ("hook", "update-ldcache")),
        ("createContainer", ("hook", "chmod")),
    ]
    assert edits["nvidia.com/gpu=all"].mounts["/c/libcuda.so.1"]["hostPath"] == "/h/libcuda.so.1"
