"""Driver roots made of NVIDIA's real files, and NVIDIA's own CDI generator as the reference.

`tests/cluster/fetch_nvidia_debs.sh` downloads Debian trixie's non-free NVIDIA
user space (550.163.01-2) and unpacks it into one cached tree; this module
builds driver roots from that tree in a directory the test gives:

- `build_debian_root`: what the packages unpack to (the versioned files under
  `usr/lib/x86_64-linux-gnu/nvidia/current/` and `usr/lib/nvidia/current/`),
  plus the links `nvidia-alternative`'s postinst has `update-alternatives` make
  (read from that package's own postinst: `usr/lib/x86_64-linux-gnu/libcuda.so.1
  -> /etc/alternatives/libcuda.so.1 -> /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1`,
  `usr/bin/nvidia-smi -> /etc/alternatives/nvidia-smi` ...), merged /usr
  (`bin`, `sbin`, `lib`, `lib64` link into `usr`) and an `etc/ld.so.cache`;
- `build_flat_root`: the layout of NVIDIA's `.run` installer, Ubuntu's packages
  and the GPU Operator's driver container: every `lib*.so.<version>` directly in
  `usr/lib/x86_64-linux-gnu/` with its SONAME (and dev) links next to it, the
  binaries in `usr/bin`, the firmware in `lib/firmware/nvidia/<version>/`.

In both, every file is NVIDIA's except the NVML library: a real
`libnvidia-ml.so.550.163.01` only initialises against the kernel module, so the
root gets the C-ABI NVML double's `libnvidia-ml.so.1` (built by
`tests/cluster/build_nvml_double.sh`, configured by `NVML_DOUBLE_CONFIG`) under
the real file name. Files are hard links into the cache (a root builds in well
under a second); `detach` gives a test its own copy of a file it modifies.

Also here: the env a driver binary needs (`driver_env`, for tests only: the
product has its own), `generate_nvidia_spec` (`nvidia-ctk cdi generate`, built
by `tests/cluster/build_nvidia_ctk.sh`) and `effective_edits`, the container
edits each device of a CDI spec gives a container once the spec-level edits
are merged in, as the CDI library merges them.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
FETCH_SCRIPT = REPO / "tests/cluster/fetch_nvidia_debs.sh"
CTK_SCRIPT = REPO / "tests/cluster/build_nvidia_ctk.sh"
NVML_DOUBLE_SCRIPT = REPO / "tests/cluster/build_nvml_double.sh"

VERSION = "550.163.01"  # the driver the packages carry
DEBIAN_VERSION = "550.163.01-2"
MULTIARCH = "x86_64-linux-gnu"
LIB_DIR = PurePosixPath("usr/lib", MULTIARCH)  # the flat layout's library directory
DEBIAN_LIB_DIR = LIB_DIR / "nvidia/current"  # where Debian's packages put the versioned libraries
DEBIAN_BIN_DIR = PurePosixPath("usr/lib/nvidia/current")  # ... and nvidia-smi, nvidia-debugdump
ALTERNATIVES_DIR = PurePosixPath("etc/alternatives")
ALTERNATIVES_ADMIN_DIR = PurePosixPath("var/lib/dpkg/alternatives")

# NVIDIA's character devices. 195 is the major Linux's devices.txt reserves for "Nvidia graphics
# devices" (nvidia.ko registers it statically): /dev/nvidia<N> is minor N, nvidia-modeset 254,
# nvidiactl 255. nvidia-uvm and nvidia-caps get dynamic majors (alloc_chrdev_region), read from
# /proc/devices where those modules are loaded, else these typical values; nvidia-uvm is minor 0
# and nvidia-uvm-tools 1, /dev/nvidia-caps/nvidia-cap1 and -cap2 (MIG config, monitor) minors 1, 2.
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MODESET_MINOR = 254
DEFAULT_UVM_MAJOR = 510
DEFAULT_CAPS_MAJOR = 511

Layout = Literal["debian", "flat"]


class NvidiaFilesUnavailable(RuntimeError):
    """NVIDIA's packages, nvidia-ctk or the NVML double could not be built; the message says why."""


# --- the cached inputs -------------------------------------------------------------------------------


def _run_build_script(script: Path, what: str, timeout: float) -> Path:
    try:
        result = subprocess.run(
            [str(script)], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise NvidiaFilesUnavailable(f"{script.relative_to(REPO)} ({what}) did not run: {err}") from None
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        tail = "\n".join(result.stderr.strip().splitlines()[-15:])
        raise NvidiaFilesUnavailable(
            f"{script.relative_to(REPO)} ({what}) failed with exit status {result.returncode}:\n{tail}"
        )
    return Path(lines[-1])


@cache
def debs_dir() -> Path:
    """The cache of NVIDIA's Debian packages (`fetch_nvidia_debs.sh`): tree/, control/, packages.txt."""
    return _run_build_script(FETCH_SCRIPT, f"NVIDIA's Debian packages {DEBIAN_VERSION}", 900)


def unpacked_tree() -> Path:
    """Every package unpacked into one tree, as `dpkg-deb -x` leaves it."""
    return debs_dir() / "tree"


def packages() -> list[tuple[str, str, str]]:
    """(package, version, sha256) of every package the tree holds, as checked against apt's index."""
    rows = (line.split() for line in (debs_dir() / "packages.txt").read_text().splitlines())
    return [(row[0], row[1], row[4]) for row in rows if len(row) == 5]


@cache
def nvidia_ctk_dir() -> Path:
    """The directory holding NVIDIA's `nvidia-ctk` and `nvidia-cdi-hook` (`build_nvidia_ctk.sh`)."""
    return _run_build_script(CTK_SCRIPT, "nvidia-ctk", 1200)


def nvml_double_available() -> bool:
    """Whether the NVML double's build script exists (it is delivered separately)."""
    return NVML_DOUBLE_SCRIPT.is_file()


def nvml_double_library() -> Path:
    """The C-ABI NVML double's `libnvidia-ml.so.1`, from `tests/nvmldouble.py` (which builds it)."""
    from tests import nvmldouble

    if not nvml_double_available():
        raise NvidiaFilesUnavailable(f"{NVML_DOUBLE_SCRIPT.relative_to(REPO)} does not exist yet")
    try:
        return nvmldouble.lib_path()
    except nvmldouble.NvmlDoubleUnavailable as err:
        raise NvidiaFilesUnavailable(str(err)) from None


def nvml_for_roots() -> tuple[Path | None, str]:
    """The double's library for the roots' NVML file, or None and why not (roots then keep
    NVIDIA's file: layout tests still work, nothing that initialises NVML does)."""
    try:
        return nvml_double_library(), "the NVML double"
    except NvidiaFilesUnavailable as err:
        return None, str(err)


# --- the roots -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvidiaRoot:
    """A driver root built here; paths are relative to `path` unless they say otherwise."""

    path: Path
    layout: Layout
    version: str  # as the file names spell it (the content is always VERSION's)
    lib_dir: PurePosixPath  # where the versioned libraries really are
    bin_dir: PurePosixPath  # where nvidia-smi really is
    firmware_dir: PurePosixPath  # the GSP firmware directory, as the layout names it
    nvml_double: bool  # the NVML library file is the double (else NVIDIA's, which will not initialise)
    device_nodes: tuple[PurePosixPath, ...] = ()  # the character devices made under dev/ (as root only)
    ld_cache: bool = False  # etc/ld.so.cache was generated for the root
    alternatives: Mapping[str, tuple[PurePosixPath, PurePosixPath]] = field(default_factory=dict)

    def library(self, name: str) -> PurePosixPath:
        """The versioned file of a library: `library("libcuda")` → `.../libcuda.so.<version>`."""
        return self.lib_dir / f"{name}.so.{self.version}"

    @property
    def nvml_library(self) -> PurePosixPath:
        return self.library("libnvidia-ml")

    @property
    def nvidia_smi(self) -> Path:
        return self.path / self.bin_dir / "nvidia-smi"


Rename = Callable[[str], str]
Move = Callable[[PurePosixPath], PurePosixPath | None]


def _renamer(version: str) -> Rename:
    def rename(text: str) -> str:
        return text.replace(VERSION, version) if version != VERSION else text

    return rename


def _place(source: Path, target: Path) -> None:
    """A hard link to the cache's file, or a copy (reflinked where the filesystem can) across devices."""
    try:
        os.link(source, target)
    except OSError as err:
        if err.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EACCES):
            raise
        shutil.copy2(source, target)


def _mirror(
    tree: Path, dest: Path, mapping: Move, rename: Rename, skip: Iterable[str] = ()
) -> dict[PurePosixPath, PurePosixPath]:
    """Recreate the tree's files and links under `dest`; `mapping` moves a relative path (or drops
    it, returning None). Returns where each tree path went."""
    placed: dict[PurePosixPath, PurePosixPath] = {}
    skipped = tuple(skip)
    for directory, dirs, files in os.walk(tree):
        dirs.sort()
        here = PurePosixPath(Path(directory).relative_to(tree).as_posix())
        for name in sorted(files) + sorted(d for d in dirs if (Path(directory) / d).is_symlink()):
            relative = here / name
            if any(str(relative).startswith(s) for s in skipped):
                continue
            moved = mapping(relative)
            if moved is None:
                continue
            target = dest / rename(str(moved))
            target.parent.mkdir(parents=True, exist_ok=True)
            source = Path(directory) / name
            if source.is_symlink():
                target.symlink_to(rename(os.readlink(source)))
            else:
                _place(source, target)
            placed[relative] = PurePosixPath(rename(str(moved)))
        for name in dirs:
            source_dir = Path(directory) / name
            if not source_dir.is_symlink():
                moved = mapping(here / name)
                if moved is not None:
                    (dest / rename(str(moved))).mkdir(parents=True, exist_ok=True)
    return placed


def _install_nvml(root: Path, relative: PurePosixPath, nvml: Path | None) -> bool:
    if nvml is None:
        return False
    target = root / relative
    target.unlink()
    shutil.copyfile(nvml, target)
    target.chmod(0o644)
    return True


def detach(root: NvidiaRoot | Path, relative: str | PurePosixPath) -> Path:
    """Give the root its own copy of a file (hard-linked from the cache) a test is about to modify."""
    base = root.path if isinstance(root, NvidiaRoot) else root
    path = base / relative
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path} is not a regular file")
    if os.stat(path).st_nlink > 1:
        private = path.with_name(path.name + ".detach")
        shutil.copy2(path, private)
        os.replace(private, path)
    return path


def proc_version_line(version: str, open_module: bool = False) -> str:
    """The NVRM line of /proc/driver/nvidia/version, as each kernel module flavour prints it."""
    if open_module:
        return (
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
            "(dvs-builder@U16-I3-D03-1-3)  Tue Apr  8 11:36:17 UTC 2025"
        )
    return f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Tue Apr  8 11:27:32 UTC 2025"


def _write_proc(root: Path, version: str, open_module: bool) -> None:
    proc = root / "proc/driver/nvidia"
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "version").write_text(
        proc_version_line(version, open_module) + "\nGCC version:  gcc version 14.2.0 (Debian 14.2.0-19) \n"
    )


def _dynamic_major(name: str, default: int) -> int:
    try:
        for line in Path("/proc/devices").read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
                return int(parts[0])
    except OSError:
        pass
    return default


def _make_devices(root: Path, gpus: int, mig_caps: bool) -> tuple[PurePosixPath, ...]:
    """NVIDIA's character devices under `dev/`, with their real numbers (needs CAP_MKNOD)."""
    uvm = _dynamic_major("nvidia-uvm", DEFAULT_UVM_MAJOR)
    caps = _dynamic_major("nvidia-caps", DEFAULT_CAPS_MAJOR)
    # With the modes nvidia-modprobe gives them: the caps' access is what MIG isolation rests on.
    nodes: list[tuple[str, int, int, int]] = [
        ("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666),
        ("nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR, 0o666),
        ("nvidia-uvm", uvm, 0, 0o666),
        ("nvidia-uvm-tools", uvm, 1, 0o666),
        *((f"nvidia{i}", NVIDIA_MAJOR, i, 0o666) for i in range(gpus)),
    ]
    if mig_caps:
        nodes += [("nvidia-caps/nvidia-cap1", caps, 1, 0o400), ("nvidia-caps/nvidia-cap2", caps, 2, 0o444)]
    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    made: list[PurePosixPath] = []
    for name, major, minor, mode in nodes:
        path = dev / name
        if not path.exists():
            os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
            path.chmod(mode)  # past the umask
        made.append(PurePosixPath("dev", name))
    return tuple(made)


def _ld_cache(root: Path) -> bool:
    """`ldconfig -r <root> -X`: the cache of the root's default library directories, links untouched.

    ldconfig chroots into the root, so absolute links (into /etc/alternatives) resolve inside it;
    that needs CAP_SYS_CHROOT, so an unprivileged run builds no cache.
    """
    ldconfig = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if ldconfig is None or os.geteuid() != 0:
        return False
    (root / "etc").mkdir(exist_ok=True)
    (root / "var/cache/ldconfig").mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [ldconfig, "-X", "-r", str(root)], capture_output=True, text=True, timeout=60, check=False
    )
    return result.returncode == 0 and (root / "etc/ld.so.cache").is_file()


def _finish(
    root: Path,
    layout: Layout,
    version: str,
    *,
    lib_dir: PurePosixPath,
    bin_dir: PurePosixPath,
    firmware_dir: PurePosixPath,
    nvml: Path | None,
    gpus: int,
    devices: bool | None,
    mig_caps: bool,
    open_module: bool,
    ld_cache: bool,
    alternatives: Mapping[str, tuple[PurePosixPath, PurePosixPath]] | None = None,
) -> NvidiaRoot:
    """What every layout ends with once its files are in: the NVML file, /proc, dev/, the loader cache."""
    double = _install_nvml(root, lib_dir / f"libnvidia-ml.so.{version}", nvml)
    _write_proc(root, version, open_module)
    made: tuple[PurePosixPath, ...] = ()
    if devices is None:
        devices = os.geteuid() == 0
    if devices:
        made = _make_devices(root, gpus, mig_caps)
    else:
        (root / "dev").mkdir(exist_ok=True)
    return NvidiaRoot(
        path=root,
        layout=layout,
        version=version,
        lib_dir=lib_dir,
        bin_dir=bin_dir,
        firmware_dir=firmware_dir,
        nvml_double=double,
        device_nodes=made,
        ld_cache=_ld_cache(root) if ld_cache else False,
        alternatives=alternatives or {},
    )


# The alternatives nvidia-alternative's postinst installs, read from the postinst itself.
_ADD_SLAVE = re.compile(r"\$\(add_slave\s+(\S+)\s+(\S+)\s+(\S+)\)")
_ADD_MULTIARCH = re.compile(r'\$\(add_multiarch_slave\s+(\S+)\s+("[^"]*"|\S+)\s+(\S+)\s+(\S+)\s+(\S+)\)')
_BLOCK = re.compile(r'^\s*(\w+)="', re.M)
_INSTALL = re.compile(r"update-alternatives --install (\S+) (\S+) (\S+) (\d+)")


@dataclass(frozen=True, slots=True)
class Slave:
    link: PurePosixPath  # absolute, as on the installed system
    name: str
    path: PurePosixPath


@dataclass(frozen=True, slots=True)
class Alternative:
    link: PurePosixPath
    name: str
    path: PurePosixPath
    priority: int
    slaves: tuple[Slave, ...]


def _postinst_slaves(text: str) -> dict[str, list[Slave]]:
    """Every `add_slave`/`add_multiarch_slave` call of the postinst, by the variable it fills."""
    groups: dict[str, list[Slave]] = {}
    listed = re.search(r'^TRIPLETS="([^"]*)"', text, re.M)
    if listed is None:
        raise ValueError("nvidia-alternative's postinst sets no TRIPLETS")
    triplets = listed[1].split()
    starts = [(m.start(), m.group(1)) for m in _BLOCK.finditer(text)]
    for index, (start, name) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(text)
        block = text[start:end]
        slaves: list[Slave] = []
        for call in re.finditer(r"\$\(add_(?:multiarch_)?slave[^)]*\)", block):
            single = _ADD_SLAVE.fullmatch(call.group(0))
            if single:
                slaves.append(
                    Slave(PurePosixPath(single[1]), "nvidia--" + single[2], PurePosixPath(single[3]))
                )
                continue
            multi = _ADD_MULTIARCH.fullmatch(call.group(0))
            if multi is None:
                raise ValueError(f"cannot read {call.group(0)!r} in nvidia-alternative's postinst")
            target_dir, target_sub, file, source_dir, source_sub = (g.strip('"') for g in multi.groups())
            for triplet in triplets:
                suffix = triplet.rstrip("/")
                suffix = f"-{suffix.lstrip('/')}" if suffix else ""
                slaves.append(
                    Slave(
                        PurePosixPath(f"{target_dir}{triplet}{target_sub}{file}"),
                        f"nvidia--{file}{suffix}",
                        PurePosixPath(f"{source_dir}{triplet}{source_sub}{file}"),
                    )
                )
        if slaves:
            groups.setdefault(name, []).extend(slaves)
    return groups


def nvidia_alternative(root: Path, postinst: str) -> Alternative:
    """The `nvidia` alternative the postinst's trigger installs in `root`, with the slaves it keeps.

    As the postinst decides: a slave counts when its file is a regular file and its link's
    directory exists (here: inside the root); the kernel-module config slaves of the proprietary
    module are there (nvidia-kernel-support), the open module's are not, so the normal alternative
    (`/usr/lib/nvidia/current`, priority 550) is installed; `libnvidia-ml.so` only when nvml.h is.
    """
    groups = _postinst_slaves(postinst)

    def present(slave: Slave) -> bool:
        source = root / str(slave.path).lstrip("/")
        return source.is_file() and (root / str(slave.link.parent).lstrip("/")).is_dir()

    chosen = [s for group in ("slaves", "conf_slaves", "kmod_slaves") for s in groups.get(group, [])]
    if (root / "usr/include/nvml.h").is_file():
        chosen += groups.get("libnvidia_ml_so_slave", [])
    install = _INSTALL.search(postinst)
    if install is None:
        raise ValueError("nvidia-alternative's postinst runs no update-alternatives --install")
    return Alternative(
        PurePosixPath(install[1]),
        install[2],
        PurePosixPath(install[3]),
        int(install[4]),
        tuple(s for s in chosen if present(s)),
    )


def _install_alternative(
    root: Path, alternative: Alternative
) -> dict[str, tuple[PurePosixPath, PurePosixPath]]:
    """The links `update-alternatives --install` makes, and its admin file (auto mode)."""
    links: dict[str, tuple[PurePosixPath, PurePosixPath]] = {}
    alt_dir = root / ALTERNATIVES_DIR
    alt_dir.mkdir(parents=True, exist_ok=True)
    for link, name, path in [(alternative.link, alternative.name, alternative.path)] + [
        (s.link, s.name, s.path) for s in alternative.slaves
    ]:
        local = root / str(link).lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        if local.is_symlink() or local.exists():
            local.unlink()
        local.symlink_to(f"/{ALTERNATIVES_DIR}/{name}")
        (alt_dir / name).symlink_to(str(path))
        links[name] = (link, path)
    admin = root / ALTERNATIVES_ADMIN_DIR
    admin.mkdir(parents=True, exist_ok=True)
    ordered = sorted(alternative.slaves, key=lambda s: s.name)  # update-alternatives keeps them sorted
    lines = ["auto", str(alternative.link)]
    for slave in ordered:
        lines += [slave.name, str(slave.link)]
    lines += ["", str(alternative.path), str(alternative.priority)]
    lines += [str(s.path) for s in ordered]
    (admin / alternative.name).write_text("\n".join(lines) + "\n\n")
    return links


def build_debian_root(
    dest: Path,
    *,
    version: str = VERSION,
    nvml: Path | None = None,
    gpus: int = 2,
    devices: bool | None = None,
    mig_caps: bool = True,
    open_module: bool = False,
    ld_cache: bool = True,
    tree: Path | None = None,
) -> NvidiaRoot:
    """Debian's layout in `dest` (created): the packages' files, the alternatives, merged /usr.

    `nvml`: the file to put in as `libnvidia-ml.so.<version>` (the double's `libnvidia-ml.so.1`;
    None keeps NVIDIA's, which only initialises against the kernel module). `version`: another
    version string for every file, directory and link name that carries 550.163.01 (a two-part
    "550.135" tests two-part driver versions); the files' content, and so the SONAMEs that carry
    the version (libnvidia-eglcore.so.550.163.01 ...) and what the double reports, stay
    550.163.01's. `devices`: make dev/ character devices (default: when running as root).
    """
    tree = tree or unpacked_tree()
    control = tree.parent / "control"  # each package's control files, next to the tree
    rename = _renamer(version)
    dest.mkdir(parents=True, exist_ok=True)
    _mirror(tree, dest, lambda p: p, rename)
    for top in ("bin", "sbin", "lib", "lib64"):
        (dest / "usr" / top).mkdir(parents=True, exist_ok=True)
        (dest / top).symlink_to(f"usr/{top}")
    postinst = rename((control / "nvidia-alternative/postinst").read_text())
    links = _install_alternative(dest, nvidia_alternative(dest, postinst))
    lib_dir = PurePosixPath(rename(str(DEBIAN_LIB_DIR)))
    return _finish(
        dest,
        "debian",
        version,
        lib_dir=lib_dir,
        bin_dir=DEBIAN_BIN_DIR,
        firmware_dir=PurePosixPath("usr/lib/firmware/nvidia", version),
        nvml=nvml,
        gpus=gpus,
        devices=devices,
        mig_caps=mig_caps,
        open_module=open_module,
        ld_cache=ld_cache,
        alternatives=links,
    )


def _flat_path(relative: PurePosixPath) -> PurePosixPath | None:
    """Where the flat layout keeps a file of Debian's tree (None: Debian-only, left out)."""
    text = str(relative)
    current = f"{DEBIAN_LIB_DIR}/"
    if text.startswith(current):
        rest = text[len(current) :]
        if rest.startswith("libvdpau_nvidia."):
            return LIB_DIR / "vdpau" / rest
        if rest == "nvidia-drm_gbm.so":
            return None  # a link to the allocator, made in gbm/ below
        return LIB_DIR / rest
    if text.startswith(f"{DEBIAN_BIN_DIR}/"):
        name = relative.name
        if name.endswith(".1.gz"):
            return PurePosixPath("usr/share/man/man1", name)
        return PurePosixPath("usr/bin", name)
    if text.startswith("usr/sbin/"):
        return PurePosixPath("usr/bin", relative.name)  # nvidia-cuda-mps-server: usr/bin with the .run
    if text.startswith("usr/lib/firmware/"):
        return PurePosixPath(text[len("usr/") :])
    if text.startswith(("etc/nvidia/", "etc/modprobe.d/", "usr/lib/nvidia/")):
        return None  # Debian's kernel-module configs and its alternatives' directories
    return relative


def build_flat_root(
    dest: Path,
    *,
    version: str = VERSION,
    nvml: Path | None = None,
    gpus: int = 2,
    devices: bool | None = None,
    mig_caps: bool = True,
    open_module: bool = False,
    ld_cache: bool = True,
    tree: Path | None = None,
) -> NvidiaRoot:
    """The `.run` installer's (and the GPU Operator's) flat layout in `dest`; options as in
    `build_debian_root`. `lib`, `bin` are real directories here (no merged /usr)."""
    tree = tree or unpacked_tree()
    rename = _renamer(version)
    dest.mkdir(parents=True, exist_ok=True)
    _mirror(tree, dest, _flat_path, rename)
    gbm = dest / LIB_DIR / "gbm"
    gbm.mkdir(parents=True, exist_ok=True)
    if not (gbm / "nvidia-drm_gbm.so").is_symlink():
        (gbm / "nvidia-drm_gbm.so").symlink_to(f"../libnvidia-allocator.so.{version}")
    for directory in ("usr/bin", "usr/lib64", "lib64"):
        (dest / directory).mkdir(parents=True, exist_ok=True)
    return _finish(
        dest,
        "flat",
        version,
        lib_dir=LIB_DIR,
        bin_dir=PurePosixPath("usr/bin"),
        firmware_dir=PurePosixPath("lib/firmware/nvidia", version),
        nvml=nvml,
        gpus=gpus,
        devices=devices,
        mig_caps=mig_caps,
        open_module=open_module,
        ld_cache=ld_cache,
    )


def build_root(layout: Layout, dest: Path, **options: Any) -> NvidiaRoot:
    builder = build_debian_root if layout == "debian" else build_flat_root
    return builder(dest, **options)


# Exit statuses of the real nvidia-smi: NVML not found (a tool environment that misses the driver's
# libraries); `-i <UUID>` that NVML does not list ("No devices were found"); `compute-policy` on the
# double, which reaches NVML's undocumented export table only and fails with "Uninitialized"
# (tests/cluster/nvmldouble/README.md).
SMI_NO_NVML = 12
SMI_NOT_FOUND = 6
SMI_POLICY_ON_DOUBLE = 255


def tool_root(dest: Path, layout: Layout = "debian", **options: Any) -> NvidiaRoot:
    """A root of `layout` with the double as its NVML, for tests that run NVIDIA's binaries
    (`nvidia-smi`, the MPS control daemon and server, `libcuda`); `options` as in `build_root`.

    A test that calls it fails, naming the build script to run, when the files cannot be had:
    a missing cache or double is never a silent skip."""
    import pytest

    try:
        return build_root(layout, dest, nvml=nvml_double_library(), **options)
    except NvidiaFilesUnavailable as err:
        scripts = f"{FETCH_SCRIPT.relative_to(REPO)}, {NVML_DOUBLE_SCRIPT.relative_to(REPO)}"
        pytest.fail(f"NVIDIA's files for a driver root are missing (run {scripts}): {err}", pytrace=False)


def write_nvml_double_config(root: NvidiaRoot, path: Path, *, gpus: int = 2, **fields: Any) -> Path:
    """A config for the double (the file NVML_DOUBLE_CONFIG names) that matches the root: its
    driver version (nvidia-ctk looks for `libcuda.so.<NVML's version>`), `gpus` H100s (as many
    as the root has /dev/nvidiaN), and its state file next to the config; `fields` add to it."""
    config: dict[str, Any] = {
        "machine": "dgxh100",
        "gpuCount": gpus,
        "driverVersion": root.version,
        "stateFile": str(path.with_name(path.name + ".state")),
        **fields,
    }
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


# --- running NVIDIA's binaries -------------------------------------------------------------------------


def driver_env(
    root: NvidiaRoot, nvml_config: Path | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The env a driver binary of the root (nvidia-smi ...) needs to load the root's libraries.

    For tests only: the product has its own. The library directory is the one holding the real
    files: in Debian's layout the multiarch directory's links point into /etc/alternatives, which
    the loader would resolve on this machine, not in the root.
    """
    env = dict(os.environ if base is None else base)
    env["LD_LIBRARY_PATH"] = str(root.path / root.lib_dir)
    if nvml_config is not None:
        env["NVML_DOUBLE_CONFIG"] = str(nvml_config)
    return env


def generate_nvidia_spec(
    root: NvidiaRoot,
    *,
    nvml_config: Path | None = None,
    mode: str = "nvml",
    extra_args: Sequence[str] = (),
    ctk_dir: Path | None = None,
    timeout: float = 120,
) -> dict[str, Any]:
    """NVIDIA's CDI spec for the root: `nvidia-ctk cdi generate --driver-root R --dev-root R`.

    nvidia-ctk finds `libnvidia-ml.so.1` under the driver root itself (its library locator: the
    root's ld.so.cache, then the usual directories) and dlopens that file, so with the double in
    the root nothing else is needed but the double's config; LD_LIBRARY_PATH is set anyway, as
    for the driver's own binaries. The hook path is the nvidia-cdi-hook built next to nvidia-ctk.
    Raises NvidiaFilesUnavailable with nvidia-ctk's output when it fails.
    """
    directory = ctk_dir or nvidia_ctk_dir()
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "spec.json"
        argv = [
            str(directory / "nvidia-ctk"),
            "cdi",
            "generate",
            "--driver-root",
            str(root.path),
            "--dev-root",
            str(root.path),
            "--mode",
            mode,
            "--format",
            "json",
            "--nvidia-cdi-hook-path",
            str(directory / "nvidia-cdi-hook"),
            "--output",
            str(output),
            *extra_args,
        ]
        env = driver_env(root, nvml_config)
        env.pop("NVIDIA_CTK_CONFIG", None)
        started = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, env=env)
        if result.returncode != 0 or not output.is_file():
            raise NvidiaFilesUnavailable(
                f"nvidia-ctk cdi generate failed (exit {result.returncode}, "
                f"{time.monotonic() - started:.1f}s):\n{result.stderr[-4000:]}"
            )
        spec: dict[str, Any] = json.loads(output.read_text())
        spec["x-nvidia-ctk-log"] = result.stderr
        return spec


# --- CDI's merge of spec and device edits --------------------------------------------------------------


@dataclass
class EffectiveEdits:
    """What one CDI device gives a container: the spec's edits, then the device's, merged.

    As the CDI library applies them: an env variable, device node or mount of the device
    replaces the spec's of the same name or container path; hooks accumulate in order.
    """

    env: dict[str, str] = field(default_factory=dict)
    device_nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # by container path
    mounts: dict[str, dict[str, Any]] = field(default_factory=dict)  # by container path
    hooks: list[dict[str, Any]] = field(default_factory=list)
    additional_gids: list[int] = field(default_factory=list)

    def apply(self, edits: Mapping[str, Any]) -> None:
        for entry in edits.get("env") or ():
            name, _, value = str(entry).partition("=")
            self.env[name] = value
        for node in edits.get("deviceNodes") or ():
            self.device_nodes[str(node["path"])] = dict(node)
        for mount in edits.get("mounts") or ():
            self.mounts[str(mount["containerPath"])] = dict(mount)
        self.hooks += [dict(hook) for hook in edits.get("hooks") or ()]
        self.additional_gids += [int(g) for g in edits.get("additionalGids") or ()]

    def hook_commands(self) -> list[tuple[str, tuple[str, ...]]]:
        """(hookName, args) of each hook, in order."""
        return [(str(h.get("hookName")), tuple(h.get("args") or ())) for h in self.hooks]


def effective_edits(spec: Mapping[str, Any]) -> dict[str, EffectiveEdits]:
    """The effective container edits of each device of the spec, by qualified name (kind=name)."""
    kind = str(spec["kind"])
    result: dict[str, EffectiveEdits] = {}
    for device in spec.get("devices") or ():
        edits = EffectiveEdits()
        edits.apply(spec.get("containerEdits") or {})
        edits.apply(device.get("containerEdits") or {})
        result[f"{kind}={device['name']}"] = edits
    return result


# --- the plugin's own spec for a root --------------------------------------------------------------------

# Renders with the product's code only: NVML discovery (the double, loaded from the root), the
# driver files of the root, and prepare's planning and rendering (as `draplugin cdi-spec`, which
# has no --proc-root: MIG access nodes are read from the double's procRoot here).
_PLUGIN_SPEC_SCRIPT = """
import sys
from dracommon.drivername import DEFAULT_DRIVER_NAME
from draplugin.cdi import driverfiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.cdi.preview import preview_spec
from draplugin.devices.nvml import NvmlBackend

root, proc, node, *names = sys.argv[1:]
backend = NvmlBackend(node, lib_path=root, proc_root=proc)
devices = {device.name: device for device in backend.discover()}
files = driverfiles.for_backend(DriverRoot.at(root), backend, report=lambda reason, message: None)
names = names or list(devices)
spec = preview_spec(devices, names, driver=DEFAULT_DRIVER_NAME, node=node, driver_files=files)
sys.stdout.write(spec.render().decode())
"""


def plugin_spec(
    root: NvidiaRoot,
    nvml_config: Path,
    *,
    proc_root: Path | None = None,
    devices: Sequence[str] = (),
    node: str = "node-1",
    timeout: float = 120,
) -> dict[str, Any]:
    """Our CDI spec for a claim holding `devices` (default: every device NVML shows) on the root.

    A process of its own: the double (a Go library) reads NVML_DOUBLE_CONFIG from the
    environment the process started with. NVML is the root's file (the double), as
    `--nvml-lib-path <root>` loads it; `proc_root` is where MIG access files are read.
    """
    argv = [sys.executable, "-c", _PLUGIN_SPEC_SCRIPT, str(root.path), str(proc_root or "/proc"), node]
    env = {**os.environ, "NVML_DOUBLE_CONFIG": str(nvml_config), "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [*argv, *devices], capture_output=True, text=True, timeout=timeout, check=False, cwd=REPO, env=env
    )
    if result.returncode != 0:
        raise AssertionError(
            f"rendering our spec failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
        )
    spec: dict[str, Any] = json.loads(result.stdout)
    return spec


def add_ipc_files(root: NvidiaRoot) -> tuple[PurePosixPath, ...]:
    """The sockets of a node running persistenced and the fabric manager, where NVIDIA's generator
    looks for them (`internal/discover/ipc.go`: `run`, `var/run`); empty files stand in, as
    nothing connects to them here."""
    made = (
        PurePosixPath("run/nvidia-persistenced/socket"),
        PurePosixPath("run/nvidia-fabricmanager/socket"),
    )
    for relative in made:
        path = root.path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")
    return made
