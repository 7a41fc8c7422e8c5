"""NVIDIA's own CDI spec for driver roots of NVIDIA's real files: the reference for ours.

`nvidia-ctk cdi generate` (NVIDIA Container Toolkit, built by
tests/cluster/build_nvidia_ctk.sh at the pinned release) runs on the Debian and
the flat root of tests/nvidia_roots.py. First its spec is checked for sanity;
then ours (the plugin's own NVML discovery on the NVML double, driver files and
`render_spec`) is compared with it GPU by GPU, on the effective container edits
(`effective_edits`): whatever NVIDIA's spec lets a compute container open must
be openable in ours too, or be listed in docs/cdi.md's "Left out" table, whose
rows must all still apply; every hook NVIDIA emits must have a row in its hook
table.

"management" mode needs no NVML (it lists the root's device nodes); "nvml" mode
(one device per GPU) needs the NVML double in the root.
"""

from __future__ import annotations

import fnmatch
import itertools
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


# --- ours against NVIDIA's: what a compute container can open -------------------------------------------

DOC = nr.REPO / "docs/cdi.md"
LEFT_OUT_HEADING = "## Left out"
HOOKS_HEADING = "## NVIDIA's hooks"
# The loader's own directories in a Debian-family image (its glibc searches the multiarch
# directories without a cache entry); our spec mounts the libraries there.
LOADER_DIRS = (f"/usr/lib/{nr.MULTIARCH}", f"/lib/{nr.MULTIARCH}")
OUR_KIND = "gpu.draplugin.dev/gpu"
OUR_CLAIM = "00000000-0000-0000-0000-000000000000"  # the made-up claim of `draplugin cdi-spec`
GPUS = 2
MAX_LINKS = 40  # as Linux (ELOOP)


@dataclass
class ContainerView:
    """What a container of one CDI device can open, from its effective edits: the mounts, the
    links `create-symlinks` makes (in the container, relative to the link), and the directories
    `update-ldcache` adds to the container's ld.so.cache."""

    mounts: dict[str, str]
    links: dict[str, str]
    ld_folders: tuple[str, ...]

    @classmethod
    def of(cls, edits: nr.EffectiveEdits) -> ContainerView:
        links: dict[str, str] = {}
        folders: list[str] = []
        for _, args in edits.hook_commands():
            pairs = list(itertools.pairwise(args))
            if args[1:2] == ("create-symlinks",):
                for flag, value in pairs:
                    if flag == "--link":
                        target, _, link = value.partition("::")
                        links[link] = target
            elif args[1:2] == ("update-ldcache",):
                folders += [value for flag, value in pairs if flag == "--folder"]
        mounts = {path: str(m["hostPath"]) for path, m in edits.mounts.items()}
        return cls(mounts, links, tuple(folders))

    def paths(self) -> set[str]:
        return set(self.mounts) | set(self.links)

    def host_file(self, path: str) -> str | None:
        """The host file a container opens at `path` (links followed, then the longest mount), or None."""
        for _ in range(MAX_LINKS):
            target = self.links.get(path)
            if target is None:
                break
            path = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        for mounted in sorted(self.mounts, key=len, reverse=True):
            if path == mounted or path.startswith(mounted + "/"):
                host = self.mounts[mounted] + path[len(mounted) :]
                return host if os.path.lexists(host) else None
        return None

    def loader_finds(self, name: str) -> str | None:
        """The host file `dlopen(name)` loads: the image's loader directories, then the cache's."""
        for directory in (*LOADER_DIRS, *self.ld_folders):
            found = self.host_file(f"{directory}/{name}")
            if found is not None:
                return found
        return None


def same_file(a: str | None, b: str | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def is_library(path: str) -> bool:
    name = posixpath.basename(path)
    return name.startswith("lib") and ".so" in name


def device_number(node: Mapping[str, Any]) -> tuple[int, int] | None:
    """The device a node entry gives: its numbers when the spec writes them, else its host node's."""
    if node.get("type") and node.get("major"):
        return int(node["major"]), int(node.get("minor") or 0)
    try:
        rdev = os.stat(str(node.get("hostPath") or node["path"])).st_rdev
    except OSError:
        return None
    return os.major(rdev), os.minor(rdev)


def gaps(nvidia: nr.EffectiveEdits, ours: nr.EffectiveEdits) -> dict[str, str]:
    """Each container path NVIDIA's device gives that ours does not, with what NVIDIA has there.

    A path counts as given when ours opens the same host file there; a library in a directory
    NVIDIA's update-ldcache adds (Debian's `.../nvidia/current`) also counts when the loader
    finds the same file under that name in ours (in the image's own library directory)."""
    theirs, mine = ContainerView.of(nvidia), ContainerView.of(ours)
    missing: dict[str, str] = {}
    for path in sorted(theirs.paths()):
        host = theirs.host_file(path)
        if host is None:
            continue  # a link to nothing: nothing to open there
        if same_file(mine.host_file(path), host):
            continue
        by_loader = posixpath.dirname(path) in theirs.ld_folders and is_library(path)
        if by_loader and same_file(mine.loader_finds(posixpath.basename(path)), host):
            continue
        missing[path] = host
    for path, node in nvidia.device_nodes.items():
        ours_node = ours.device_nodes.get(path)
        if ours_node is None or device_number(ours_node) != device_number(node):
            missing[path] = str(node.get("hostPath") or path)
    return missing


def doc_table(heading: str) -> list[tuple[list[str], str]]:
    """The rows of the first table under `heading` in docs/cdi.md: (the first cell's `code`
    spans, the rest of the row)."""
    text = DOC.read_text()
    start = text.index(heading)
    rows: list[tuple[list[str], str]] = []
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if set(cells[0]) <= {"-", " ", ":"}:
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), " | ".join(cells[1:])))
    return rows[1:]  # the header


@dataclass
class Compared:
    root: nr.NvidiaRoot
    nvidia: dict[str, nr.EffectiveEdits]  # by GPU index
    ours: dict[str, nr.EffectiveEdits]
    gaps: dict[str, str]  # over every GPU


@pytest.fixture(scope="module")
def compared(ctk_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Compared]:
    library, reason = nr.nvml_for_roots()
    if library is None:
        pytest.fail(reason, pytrace=False)
    base = tmp_path_factory.mktemp("compare")
    out: dict[str, Compared] = {}
    for layout in LAYOUTS:
        root = nr.build_root(layout, base / layout, nvml=library, gpus=GPUS)
        nr.add_ipc_files(root)
        config = nr.write_nvml_double_config(root, base / f"{layout}-nvml.json", gpus=GPUS)
        theirs = nr.effective_edits(nr.generate_nvidia_spec(root, nvml_config=config, ctk_dir=ctk_dir))
        mine = nr.effective_edits(nr.plugin_spec(root, config))
        nvidia = {str(i): theirs[f"nvidia.com/gpu={i}"] for i in range(GPUS)}
        ours = {str(i): mine[f"{OUR_KIND}={OUR_CLAIM}-gpu-{i}"] for i in range(GPUS)}
        found: dict[str, str] = {}
        for index in nvidia:
            found.update(gaps(nvidia[index], ours[index]))
        out[layout] = Compared(root, nvidia, ours, found)
    return out


def listed(path: str, rows: list[tuple[list[str], str]]) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for patterns, _ in rows for pattern in patterns)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_everything_nvidia_gives_a_compute_container_is_ours_or_listed(
    compared: dict[str, Compared], layout: str
) -> None:
    rows = doc_table(LEFT_OUT_HEADING)
    prefix = str(compared[layout].root.path)
    unlisted = {
        path: host.removeprefix(prefix)
        for path, host in compared[layout].gaps.items()
        if not listed(path, rows)
    }
    assert not unlisted, f"NVIDIA's spec gives these, ours does not, docs/cdi.md does not say why: {unlisted}"


def test_every_left_out_row_still_applies(compared: dict[str, Compared]) -> None:
    every_gap = {path for c in compared.values() for path in c.gaps}
    stale = [
        pattern
        for patterns, _ in doc_table(LEFT_OUT_HEADING)
        for pattern in patterns
        if not any(fnmatch.fnmatchcase(path, pattern) for path in every_gap)
    ]
    assert not stale, f"docs/cdi.md lists as left out what ours now gives (or NVIDIA no longer does): {stale}"


def test_every_hook_nvidia_emits_has_a_row(compared: dict[str, Compared]) -> None:
    emitted = {
        args[1]
        for c in compared.values()
        for edits in c.nvidia.values()
        for _, args in edits.hook_commands()
        if len(args) > 1
    }
    assert {"create-symlinks", "update-ldcache", "apply-cuda-memory-limits"} <= emitted
    documented = {name for names, _ in doc_table(HOOKS_HEADING) for name in names[:1]}
    assert emitted <= documented, f"hooks without a row in docs/cdi.md: {sorted(emitted - documented)}"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_comparison_sees_libraries_by_path_and_by_loader(
    compared: dict[str, Compared], layout: str
) -> None:
    """The comparison itself: libcuda is given in both layouts (in Debian's only by the loader),
    and something NVIDIA gives that ours really does not is found."""
    nvidia = ContainerView.of(compared[layout].nvidia["0"])
    ours = ContainerView.of(compared[layout].ours["0"])
    debian = layout == "debian"
    lib = f"/{nr.DEBIAN_LIB_DIR}" if debian else f"/{nr.LIB_DIR}"
    assert f"{lib}/libcuda.so.1" in nvidia.links
    assert same_file(ours.loader_finds("libcuda.so.1"), nvidia.host_file(f"{lib}/libcuda.so.1"))
    assert (f"{lib}/libcuda.so.1" in ours.paths()) == (not debian)
    assert f"{lib}/libcuda.so.1" not in compared[layout].gaps
    assert "/dev/nvidia-modeset" in compared[layout].gaps
