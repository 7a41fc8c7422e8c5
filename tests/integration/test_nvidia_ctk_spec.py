"""NVIDIA's own CDI spec for driver roots of NVIDIA's real files: the reference for ours.

`nvidia-ctk cdi generate` (NVIDIA Container Toolkit, built by
tests/cluster/build_nvidia_ctk.sh at the pinned release) runs on the Debian and
the flat root of tests/nvidia_roots.py. Here only its spec is generated and
checked for sanity; comparing it with ours uses `generate_nvidia_spec` and
`effective_edits` from tests/nvidia_roots.py.

"management" mode needs no NVML (it lists the root's device nodes); "nvml" mode
(one device per GPU) needs the NVML double in the root, and is skipped until
tests/cluster/build_nvml_double.sh exists.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests import nvidia_roots as nr

LAYOUTS: tuple[nr.Layout, ...] = ("debian", "flat")


@pytest.fixture(scope="module")
def ctk_dir() -> Path:
    try:
        return nr.nvidia_ctk_dir()
    except nr.NvidiaFilesUnavailable as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, nr.NvidiaRoot]:
    try:
        nr.unpacked_tree()
    except nr.NvidiaFilesUnavailable as err:
        pytest.fail(str(err), pytrace=False)
    nvml = nr.nvml_for_roots()[0]
    base = tmp_path_factory.mktemp("ctk-roots")
    return {layout: nr.build_root(layout, base / layout, nvml=nvml) for layout in LAYOUTS}


def host_paths(edits: nr.EffectiveEdits, root: nr.NvidiaRoot) -> dict[str, str]:
    """Container path → host path relative to the root, for each mount."""
    prefix = str(root.path)
    return {c: str(m["hostPath"]).removeprefix(prefix) for c, m in edits.mounts.items()}


def hook_names(edits: nr.EffectiveEdits) -> list[str]:
    """The nvidia-cdi-hook subcommands, in order ("create-symlinks", "update-ldcache" ...)."""
    return [args[1] for _, args in edits.hook_commands() if len(args) > 1]


def check_driver_files(edits: nr.EffectiveEdits, root: nr.NvidiaRoot, ctk_dir: Path) -> dict[str, str]:
    """What every spec must give a compute container, whichever the layout."""
    mounts = host_paths(edits, root)
    lib = f"/{root.lib_dir}"
    assert mounts[f"{lib}/libcuda.so.{root.version}"] == f"{lib}/libcuda.so.{root.version}"
    assert mounts[f"{lib}/libnvidia-ml.so.{root.version}"] == f"{lib}/libnvidia-ml.so.{root.version}"
    # The GSP firmware, file by file, at the path the kernel module reads it from.
    firmware = f"/lib/firmware/nvidia/{root.version}/gsp_ga10x.bin"
    assert firmware in mounts
    assert edits.device_nodes["/dev/nvidiactl"]["hostPath"] == str(root.path / "dev/nvidiactl")
    assert {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} <= set(edits.device_nodes)
    names = hook_names(edits)
    assert names[0] == "create-symlinks"
    assert {"create-symlinks", "enable-cuda-compat", "update-ldcache"} <= set(names)
    for hook in edits.hooks:
        assert hook["path"] == str(ctk_dir / "nvidia-cdi-hook")
        # apply-cuda-memory-limits (nvml mode, per GPU) runs at createRuntime, the others in the container.
        assert hook["hookName"] in ("createContainer", "createRuntime")
    symlinks = [a for _, args in edits.hook_commands() if args[1] == "create-symlinks" for a in args]
    assert f"libcuda.so.{root.version}::{lib}/libcuda.so.1" in symlinks
    ldcache = next(args for _, args in edits.hook_commands() if args[1] == "update-ldcache")
    assert ("--folder", lib) in itertools.pairwise(ldcache)
    assert edits.env.get("NVIDIA_VISIBLE_DEVICES") == "void"
    return mounts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_management_spec_mounts_the_driver_files(
    roots: dict[str, nr.NvidiaRoot], ctk_dir: Path, layout: str
) -> None:
    root = roots[layout]
    spec = nr.generate_nvidia_spec(root, mode="management", ctk_dir=ctk_dir)
    assert spec["kind"] == "nvidia.com/gpu"
    edits = nr.effective_edits(spec)
    assert list(edits) == ["nvidia.com/gpu=all"]
    all_devices = edits["nvidia.com/gpu=all"]
    mounts = check_driver_files(all_devices, root, ctk_dir)
    if root.device_nodes:
        assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(all_devices.device_nodes)
    if layout == "flat":
        assert mounts["/usr/bin/nvidia-smi"] == "/usr/bin/nvidia-smi"
        assert mounts["/usr/bin/nvidia-cuda-mps-server"] == "/usr/bin/nvidia-cuda-mps-server"
    else:
        # NVIDIA's toolkit resolves /usr/bin/nvidia-smi's absolute link (into /etc/alternatives) on
        # this machine, not in the driver root: Debian's nvidia-smi and nvidia-debugdump are left out.
        assert "/usr/bin/nvidia-smi" not in mounts
        assert mounts["/usr/sbin/nvidia-cuda-mps-server"] == "/usr/sbin/nvidia-cuda-mps-server"
        # The libraries keep Debian's directory in the container, which update-ldcache adds.
        assert "/usr/lib/x86_64-linux-gnu/libcuda.so.550.163.01" not in mounts


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nvml_spec_has_a_device_per_gpu(
    roots: dict[str, nr.NvidiaRoot], ctk_dir: Path, layout: str, tmp_path: Path
) -> None:
    library, reason = nr.nvml_for_roots()
    if library is None:
        if not nr.nvml_double_available():
            pytest.skip(f"the NVML double is not delivered yet: {reason}")
        pytest.fail(reason, pytrace=False)
    root = roots[layout]
    config = nr.write_nvml_double_config(root, tmp_path / "nvml.json")
    spec = nr.generate_nvidia_spec(root, nvml_config=config, ctk_dir=ctk_dir)
    edits = nr.effective_edits(spec)
    assert {"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"} <= set(edits)
    zero = edits["nvidia.com/gpu=0"]
    check_driver_files(zero, root, ctk_dir)
    assert "/dev/nvidia0" in zero.device_nodes
    assert "/dev/nvidia1" not in zero.device_nodes
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= set(edits["nvidia.com/gpu=all"].device_nodes)
    # Each GPU's device gets CUDA's memory-limit hook, with the GPU's UUID.
    limits = [args for _, args in zero.hook_commands() if args[1] == "apply-cuda-memory-limits"]
    assert len(limits) == 1 and "--gpu-id" in limits[0]
    # As in management mode: Debian's nvidia-smi (an /etc/alternatives link) is left out.
    assert ("/usr/bin/nvidia-smi" in zero.mounts) == (layout == "flat")
