"""What the CDI spec gives a container from a driver root, on NVIDIA's real files (Debian's
550.163.01 packages in Debian's alternatives layout and the flat one, `tests/nvidia_roots.py`)
and on the small fake roots: NVML and the libraries found through `/etc/alternatives`, the
root's ld.so.cache and ld.so.conf, both image families' library directories and Triton's
variable, the video/OptiX/NVVM files and the opt-in graphics ones, control nodes once at spec
level and per-GPU and MIG access nodes with the right host path or numbers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from dracommon.drivername import DEFAULT_DRIVER_NAME, config_api_version
from draplugin import config
from draplugin.cdi import ldcache
from draplugin.cdi.driverfiles import container_edits
from draplugin.cdi.driverlayout import (
    ARCHES,
    DEFAULT_CAPABILITIES,
    GRAPHICS,
    DriverInstall,
    DriverRoot,
)
from draplugin.cdi.driverroot import discover
from draplugin.devices.model import Device
from draplugin.devices.nvml import find_library
from draplugin.devices.schema import NVIDIA_CONTROL_NODES, DeviceNodeSpec, GpuInfo, SystemInfo, build_devices
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare.gpuconfig import default_config
from draplugin.prepare.plan import ClaimPlan, PlannedDevice, render_spec
from tests import nvidia_roots as nr
from tests import nvmldouble
from tests.driverroot_layout import debian_layout, elf_shared_object, relative_symlink
from tests.nvmldouble import GI_PROFILE_3_SLICE, Gpu, MigDevice

X86 = ARCHES["x86_64"]
VERSION = nr.VERSION
DEB = "/usr/lib/x86_64-linux-gnu"
LDCONFIG = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)


@pytest.fixture(scope="module")
def real_roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, nr.NvidiaRoot]:
    try:
        nr.unpacked_tree()
    except nr.NvidiaFilesUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    base = tmp_path_factory.mktemp("real-roots")
    built = {layout: nr.build_root(layout, base / layout) for layout in ("debian", "flat")}
    # A fabric manager's socket, as an NVSwitch system has (an empty file stands in).
    for root in built.values():
        socket = root.path / "run/nvidia-fabricmanager/socket"
        socket.parent.mkdir(parents=True, exist_ok=True)
        socket.write_bytes(b"")
    return built


def install_of(root: nr.NvidiaRoot, **kwargs: Any) -> DriverInstall:
    return discover(DriverRoot.at(str(root.path)), known_version=root.version, arch=X86, **kwargs)


def mounts_of(install: DriverInstall) -> dict[str, str]:
    return {m.container_path: m.host_path for m in container_edits(install).mounts}


# --- 3: Debian's packaged driver -------------------------------------------------------------------


def test_nvml_is_found_through_debians_absolute_alternatives_links_inside_the_root(
    real_roots: dict[str, nr.NvidiaRoot],
) -> None:
    root = real_roots["debian"]
    # usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 -> /etc/alternatives/... : the root's, not ours.
    assert os.readlink(root.path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1").startswith("/etc/")
    assert find_library(str(root.path)) == str(root.path / root.nvml_library)
    flat = real_roots["flat"]
    assert find_library(str(flat.path)) == str(flat.path / flat.nvml_library)


def test_nvml_in_a_directory_only_the_roots_ld_so_cache_or_conf_names(tmp_path: Path) -> None:
    root = tmp_path / "root"
    lib = root / "opt/nvidia/lib64/libnvidia-ml.so.580.95.05"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(elf_shared_object("libnvidia-ml.so.1"))
    relative_symlink(lib.with_name("libnvidia-ml.so.1"), lib.name)
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d/nvidia.conf").write_text("# the driver\n/opt/nvidia/lib64\n")
    assert find_library(str(root)) == str(lib)


def test_discovery_uses_the_roots_ld_so_cache_for_a_directory_nothing_else_names(tmp_path: Path) -> None:
    if LDCONFIG is None or os.geteuid() != 0:
        pytest.skip("needs ldconfig -r (root)")
    root = debian_layout(lib_dir="opt/vendor/nvidia").build(tmp_path / "root")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/ld.so.conf").write_text("/opt/vendor/nvidia\n")
    subprocess.run([LDCONFIG, "-X", "-r", str(root)], check=True, capture_output=True)
    (root / "etc/ld.so.conf").unlink()  # the cache alone must say where
    install = discover(DriverRoot.at(str(root)), arch=X86)
    assert str(install.library("libcuda").file.real) == "opt/vendor/nvidia/libcuda.so.580.95.05"  # type: ignore[union-attr]


def test_ld_so_cache_parser_agrees_with_ldconfig_on_the_real_debian_root(
    real_roots: dict[str, nr.NvidiaRoot],
) -> None:
    root = real_roots["debian"]
    if not root.ld_cache or LDCONFIG is None:
        pytest.skip("no ld.so.cache was built for the root (needs ldconfig as root)")
    cache = root.path / "etc/ld.so.cache"
    printed = subprocess.run([LDCONFIG, "-p", "-C", str(cache)], capture_output=True, text=True, check=True)
    expected = [
        (line.split(" (")[0].strip(), line.rsplit("=> ", 1)[1].strip())
        for line in printed.stdout.splitlines()[1:]
        if "=>" in line
    ]
    entries = ldcache.parse(cache.read_bytes())
    assert [(e.name, e.path) for e in entries] == expected
    libcuda = next(e for e in entries if e.name == "libcuda.so.1")
    # Merged /usr: ldconfig lists it under /lib or /usr/lib, both the multiarch directory.
    assert libcuda.path.endswith("lib/x86_64-linux-gnu/libcuda.so.1") and libcuda.is_arch("x86_64")
    assert not libcuda.is_arch("aarch64")


def test_ld_so_cache_old_format_prefix_is_skipped() -> None:
    new = b"glibc-ld.so.cache1.1" + (1).to_bytes(4, "little") + (0).to_bytes(4, "little") + bytes(20)
    strings = b"libx.so.1\0/l/libx.so.1\0"
    entry = (0x0303).to_bytes(4, "little") + (72).to_bytes(4, "little") + (82).to_bytes(4, "little")
    body = new + entry + bytes(12) + strings
    old = b"ld.so-1.7.0\0" + (1).to_bytes(4, "little") + bytes(12)  # one old entry, 28 bytes
    padded = old + bytes(-len(old) % 8)
    assert [(e.name, e.path) for e in ldcache.parse(padded + body)] == [("libx.so.1", "/l/libx.so.1")]
    with pytest.raises(ldcache.LdCacheError):
        ldcache.parse(b"not a cache at all, not at all, not at all......")


def test_debian_binaries_behind_alternatives_come_from_nvidia_current(
    real_roots: dict[str, nr.NvidiaRoot], tmp_path: Path
) -> None:
    install = install_of(real_roots["debian"])
    paths = mounts_of(install)
    root = real_roots["debian"].path
    assert paths["/usr/bin/nvidia-smi"] == str(root / "usr/lib/nvidia/current/nvidia-smi")
    assert paths["/usr/bin/nvidia-debugdump"] == str(root / "usr/lib/nvidia/current/nvidia-debugdump")
    assert paths[f"{DEB}/libcuda.so.1"] == str(
        root / f"usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{VERSION}"
    )
    # A root whose alternatives links are gone still has the binaries where the packages put them.
    bare = nr.build_debian_root(tmp_path / "bare", ld_cache=False)
    os.unlink(bare.path / "usr/bin/nvidia-smi")
    assert mounts_of(install_of(bare))["/usr/bin/nvidia-smi"] == str(
        bare.path / "usr/lib/nvidia/current/nvidia-smi"
    )


# --- 12: libcuda for ldconfig-less loaders and RHEL-family images ------------------------------------


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_libraries_are_in_both_families_library_directories_and_triton_is_told(
    real_roots: dict[str, nr.NvidiaRoot], layout: str
) -> None:
    install = install_of(real_roots[layout])
    edits = container_edits(install)
    paths = mounts_of(install)
    real = str(real_roots[layout].path / real_roots[layout].library("libcuda"))
    for lib_dir in (DEB, "/usr/lib64"):
        for name in (f"libcuda.so.{VERSION}", "libcuda.so.1", "libcuda.so"):
            assert paths[f"{lib_dir}/{name}"] == real
        assert paths[f"{lib_dir}/libnvidia-ml.so.1"].endswith(f"libnvidia-ml.so.{VERSION}")
    # Triton's libcuda_dirs() returns TRITON_LIBCUDA_PATH before it runs `ldconfig -p`; it links -lcuda there.
    assert "TRITON_LIBCUDA_PATH=/usr/lib/x86_64-linux-gnu" in edits.env
    assert f"{DEB}/libcuda.so" in paths
    # Nothing else in the environment: LD_LIBRARY_PATH stays the image's.
    assert [e.split("=")[0] for e in edits.env] == ["TRITON_LIBCUDA_PATH"]


# --- 13: video, OptiX, legacy NVVM, OpenCL ICD, fabric manager; graphics opt-in -------------------------


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_default_capabilities_give_video_opencl_icd_and_fabric_manager(
    real_roots: dict[str, nr.NvidiaRoot], layout: str
) -> None:
    root = real_roots[layout]
    install = install_of(root)
    assert install.capabilities == DEFAULT_CAPABILITIES
    paths = mounts_of(install)
    for soname in ("libnvcuvid.so.1", "libnvidia-encode.so.1", "libnvidia-opticalflow.so.1"):
        assert f"{DEB}/{soname}" in paths and f"/usr/lib64/{soname}" in paths
    # libvdpau opens its drivers from the vdpau subdirectory.
    assert f"{DEB}/vdpau/libvdpau_nvidia.so.1" in paths and "/usr/lib64/vdpau/libvdpau_nvidia.so.1" in paths
    assert f"{DEB}/libnvidia-rtcore.so.{VERSION}" in paths  # OptiX's ray tracing core
    assert paths["/etc/OpenCL/vendors/nvidia.icd"] == str(root.path / "etc/OpenCL/vendors/nvidia.icd")
    socket = next(
        m for m in container_edits(install).mounts if m.container_path.endswith("fabricmanager/socket")
    )
    assert (
        socket.host_path == str(root.path / "run/nvidia-fabricmanager/socket") and "noexec" in socket.options
    )
    # Graphics is opt-in.
    assert not any("GLX" in p or "EGL" in p or "vulkan" in p or "glcore" in p for p in paths)


@pytest.mark.parametrize("layout", ["debian", "flat"])
def test_graphics_capability_adds_egl_glx_vulkan(real_roots: dict[str, nr.NvidiaRoot], layout: str) -> None:
    root = real_roots[layout]
    paths = mounts_of(install_of(root, capabilities=DEFAULT_CAPABILITIES | {GRAPHICS}))
    for name in (
        "libGLX_nvidia.so.0",
        "libEGL_nvidia.so.0",
        f"libnvidia-glcore.so.{VERSION}",
        f"libnvidia-eglcore.so.{VERSION}",
        f"libnvidia-glsi.so.{VERSION}",
        f"libnvidia-tls.so.{VERSION}",
        f"libnvidia-glvkspirv.so.{VERSION}",
    ):
        assert f"{DEB}/{name}" in paths, name
    assert paths["/usr/share/vulkan/icd.d/nvidia_icd.json"] == str(
        root.path / "usr/share/vulkan/icd.d/nvidia_icd.json"
    )
    assert "/usr/share/glvnd/egl_vendor.d/10_nvidia.json" in paths


def test_legacy_nvvm70_is_mounted_under_its_own_name(tmp_path: Path) -> None:
    root = debian_layout(
        extra_files={
            "usr/lib/x86_64-linux-gnu/libnvidia-nvvm70.so.4": elf_shared_object("libnvidia-nvvm70.so.4")
        }
    ).build(tmp_path / "root")
    paths = mounts_of(discover(DriverRoot.at(str(root)), arch=X86))
    assert paths[f"{DEB}/libnvidia-nvvm70.so.4"] == str(
        root / "usr/lib/x86_64-linux-gnu/libnvidia-nvvm70.so.4"
    )


def test_driver_capabilities_setting_and_its_env_mirror() -> None:
    assert config.load({"node_name": "n"}, environ={}).driver_capabilities == DEFAULT_CAPABILITIES
    chosen = config.load({"node_name": "n"}, environ={"DRIVER_CAPABILITIES": "compute,utility,graphics"})
    assert chosen.driver_capabilities == {"compute", "utility", "graphics"}
    assert config.load({"node_name": "n", "driver_capabilities": "all"}, environ={}).driver_capabilities == {
        "compute",
        "utility",
        "video",
        "graphics",
    }
    with pytest.raises(config.ConfigError, match=r"DRIVER_CAPABILITIES.*'display' not known"):
        config.load({"node_name": "n"}, environ={"DRIVER_CAPABILITIES": "compute,display"})


# --- 5 and 6: device nodes -----------------------------------------------------------------------------


def gpu_devices(nodes: tuple[str, ...]) -> list[Device]:
    """One GPU as the NVML backend describes it: its own node and the control nodes."""
    gpu = GpuInfo(
        index=0,
        minor=0,
        uuid="GPU-0",
        product_name="NVIDIA H100",
        brand="Nvidia",
        architecture="Hopper",
        cuda_compute_capability=(9, 0),
        memory_bytes=80 << 30,
        pci_bus_id="0000:18:00.0",
        pcie_root=None,
        device_nodes=nodes,
    )
    return build_devices(SystemInfo(VERSION, "12.4"), [gpu])[0]


def plan_of(devices: list[Device]) -> ClaimPlan:
    config_ = default_config(config_api_version(DEFAULT_DRIVER_NAME))
    planned = tuple(
        PlannedDevice(("gpu",), "node", d, config_, f"uid-{d.name}", f"k8s.gpu.example.com/gpu=uid-{d.name}")
        for d in devices
    )
    return ClaimPlan(ClaimRef("ns", "uid", "claim"), planned)


def node_entries(spec: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Spec-level and device-level device nodes."""
    spec_level = spec.get("containerEdits", {}).get("deviceNodes", [])
    device_level = [n for d in spec["devices"] for n in d["containerEdits"].get("deviceNodes", [])]
    return spec_level, device_level


def test_control_nodes_once_at_spec_level_and_gpu_nodes_at_the_driver_roots_dev(
    real_roots: dict[str, nr.NvidiaRoot],
) -> None:
    root = real_roots["flat"]
    if not root.device_nodes:
        pytest.skip("the root's dev/ nodes need CAP_MKNOD")
    host = "/run/nvidia/driver"
    install = discover(DriverRoot.at(host, str(root.path)), known_version=root.version, arch=X86)
    devices = gpu_devices(("/dev/nvidia0", *NVIDIA_CONTROL_NODES))
    spec = render_spec(plan_of(devices), driver_edits=container_edits(install)).to_json()
    spec_level, device_level = node_entries(spec)
    assert [n["path"] for n in device_level] == ["/dev/nvidia0"]
    assert device_level[0]["hostPath"] == f"{host}/dev/nvidia0"
    assert {n["path"]: n.get("hostPath") for n in spec_level} == {
        p: f"{host}{p}" for p in NVIDIA_CONTROL_NODES
    }


def test_control_nodes_of_a_host_root_and_of_a_backend_without_driver_root(tmp_path: Path) -> None:
    root = debian_layout().build(tmp_path / "root")
    devices = gpu_devices(("/dev/nvidia0", *NVIDIA_CONTROL_NODES))
    install = discover(DriverRoot.at("/", str(root)), arch=X86)
    spec_level, device_level = node_entries(
        render_spec(plan_of(devices), driver_edits=container_edits(install)).to_json()
    )
    assert device_level == [{"path": "/dev/nvidia0"}]  # the host's /dev: the same path
    assert sorted(n["path"] for n in spec_level) == sorted(NVIDIA_CONTROL_NODES)
    # No driver root (a fake backend): the devices' own control nodes, still once, at spec level.
    two = gpu_devices(("/dev/nvidia0", *NVIDIA_CONTROL_NODES)) + [
        d.__class__(**{**{f: getattr(d, f) for f in d.__dataclass_fields__}, "name": "gpu-1"})
        for d in gpu_devices(("/dev/nvidia1", *NVIDIA_CONTROL_NODES))
    ]
    spec_level, device_level = node_entries(render_spec(plan_of(two)).to_json())
    assert [n["path"] for n in spec_level] == list(NVIDIA_CONTROL_NODES)
    assert [n["path"] for n in device_level] == ["/dev/nvidia0", "/dev/nvidia1"]


def test_mig_access_nodes_carry_type_major_minor_and_mode(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # A 3g.40gb MIG device on the NVML double, whose procRoot has the kernel driver's files.
    double = nvmldouble.nvml_double_factory(tmp_path)(
        "dgxh100",
        gpus=1,
        overrides=[Gpu(index=0, mig_mode=1, mig_devices=(MigDevice(GI_PROFILE_3_SLICE, 0),))],
    )
    with double.pynvml():
        pass  # the first nvmlInit writes the driver's /proc
    assert double.proc_root is not None
    (access,) = double.proc_root.glob("driver/nvidia/capabilities/gpu0/mig/gi*/access")
    (ci_access,) = access.parent.glob("ci*/access")
    gi_minor, ci_minor = (int(f.read_text().split()[1]) for f in (access, ci_access))
    major = next(
        int(line.split()[0]) for line in (double.proc_root / "devices").read_text().splitlines()
        if line.endswith(" nvidia-caps")
    )  # fmt: skip
    # A copy of that /proc, with a block device of the same name after the character devices:
    # only the character device's major is the caps nodes' (the double writes no block devices).
    proc = tmp_path / "proc-copy"
    shutil.copytree(double.proc_root, proc)
    with (proc / "devices").open("a") as devices:
        devices.write(f"\nBlock devices:\n{major + 2} nvidia-caps\n")
    empty_sys = tmp_path / "sys"
    empty_sys.mkdir()
    backend = nvmldouble.plugin_backend(double, request, proc_root=str(proc), sysfs_root=str(empty_sys))
    (mig,) = backend.discover()
    caps = [n for n in mig.device_nodes if "nvidia-caps" in n]
    assert caps == [f"/dev/nvidia-caps/nvidia-cap{gi_minor}", f"/dev/nvidia-caps/nvidia-cap{ci_minor}"]
    assert all(isinstance(n, DeviceNodeSpec) for n in caps)
    _, device_level = node_entries(render_spec(plan_of([mig])).to_json())
    by_path = {n["path"]: n for n in device_level}
    assert by_path[f"/dev/nvidia-caps/nvidia-cap{gi_minor}"] == {
        "path": f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
        "type": "c",
        "major": major,
        "minor": gi_minor,
        "fileMode": 0o444,
    }
    assert by_path[f"/dev/nvidia-caps/nvidia-cap{ci_minor}"]["minor"] == ci_minor
    # Without the nvidia-caps major the node is a plain path, as before (the runtime stats the host's).
    (proc / "devices").write_text("Character devices:\n195 nvidia\n")
    (plain,) = nvmldouble.plugin_backend(
        double, request, proc_root=str(proc), sysfs_root=str(empty_sys)
    ).discover()
    assert not any(isinstance(n, DeviceNodeSpec) for n in plain.device_nodes)


def test_device_node_numbers_validate() -> None:
    from draplugin.cdi.spec import CdiError, ContainerEdits, DeviceNode

    ContainerEdits(
        device_nodes=(DeviceNode("/dev/x", type="c", major=1, minor=3, file_mode=0o666),)
    ).validate("t")
    for bad in (
        DeviceNode("/dev/x", major=1, minor=3),  # numbers without a type
        DeviceNode("/dev/x", type="c", major=1),  # half the numbers
        DeviceNode("/dev/x", type="x"),
    ):
        with pytest.raises(CdiError):
            ContainerEdits(device_nodes=(bad,)).validate("t")


def test_device_node_spec_is_its_path() -> None:
    node = DeviceNodeSpec("/dev/nvidia-caps/nvidia-cap3", 237, 3, 0o444)
    assert node == "/dev/nvidia-caps/nvidia-cap3" and {node} == {"/dev/nvidia-caps/nvidia-cap3"}
    assert PurePosixPath(node).name == "nvidia-cap3"
    import pickle

    again = pickle.loads(pickle.dumps(node))
    assert isinstance(again, DeviceNodeSpec) and (again.major, again.minor, again.file_mode) == (
        237,
        3,
        0o444,
    )
