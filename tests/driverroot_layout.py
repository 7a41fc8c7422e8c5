"""Fake NVIDIA driver installs for tests: directory trees laid out like real ones.

The libraries are tiny but real ELF shared objects (header, a PT_LOAD and a
PT_DYNAMIC segment, a string table) with a real DT_SONAME, so the SONAME
reader is exercised the way it runs on a node and `readelf -d` agrees.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from draplugin.cdi.driverlayout import BINARIES

EM_X86_64 = 62
EM_AARCH64 = 183
EM_386 = 3

# The compute and utility libraries of a modern driver (580 series), each with its SONAME.
MODERN_LIBRARIES = (
    "libcuda",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libcudadebugger",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-opencl",
    "libnvidia-pkcs11",
    "libnvidia-pkcs11-openssl3",
    "libnvidia-nscq",
)
# An old driver (418 series) had the fatbinary loader and the OpenCL compiler instead of nvvm/gpucomp.
OLD_LIBRARIES = (
    "libcuda",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-fatbinaryloader",
    "libnvidia-compiler",
    "libnvidia-cfg",
    "libnvidia-opencl",
)
# Libraries whose SONAME is not `<name>.so.1` on real installs.
SONAMES = {"libnvidia-opencl": "libnvidia-opencl.so.1", "libnvidia-nvvm": "libnvidia-nvvm.so.4"}


# Where the stand-in tools record every command they get (one line each), and keep their state.
COMMAND_LOG = "var/log/fake-nvidia-commands.log"
TOOL_STATE = "var/lib/fake-nvidia"

# `nvidia-smi` and `nvidia-cuda-mps-control` stand-ins that answer like the real ones for what the
# plugin uses. Alone, `nvidia-smi` prints its name (what the CUDA-files test runs in a container).
# `compute-policy -i <gpu> --set-timeslice <0-3>` records the GPU's time-slice level (0 is the
# default); `compute-policy -i <gpu> -l` prints it. `-i <gpu> -c <mode>` records the GPU's compute
# mode (the names and numbers the real one takes) and `--query-gpu=compute_mode --format=csv,noheader
# -i <gpu>` prints it as the real one does (Default when never set). Every call is appended to
# COMMAND_LOG.
NVIDIA_SMI = r"""#!/bin/sh
LOG='{root}/var/log/fake-nvidia-commands.log'
STATE='{root}/var/lib/fake-nvidia'
{ echo "nvidia-smi $*" >> "$LOG"; } 2>/dev/null
[ $# -eq 0 ] && { echo nvidia-smi; exit 0; }
if [ "$1" = -i ] && [ "$3" = -c ] && [ $# -eq 4 ]; then
  case "$4" in
    0|DEFAULT) mode=Default;; 1|EXCLUSIVE_PROCESS) mode=Exclusive_Process;; 2|PROHIBITED) mode=Prohibited;;
    *) echo "Invalid compute mode: $4" >&2; exit 2;;
  esac
  mkdir -p "$STATE" && echo "$mode" > "$STATE/computemode-$2"
  echo "Set compute mode to $4 for GPU $2." && echo "All done."
  exit 0
fi
if [ "$1" = --query-gpu=compute_mode ] && [ "$2" = --format=csv,noheader ] && [ "$3" = -i ]; then
  cat "$STATE/computemode-$4" 2>/dev/null || echo Default
  exit 0
fi
if [ "$1" = compute-policy ]; then
  shift; gpu=""; level=""; list=""
  while [ $# -gt 0 ]; do
    case "$1" in
      -i) gpu="$2"; shift 2;;
      --set-timeslice) level="$2"; shift 2;;
      --set-timeslice=*) level="${1#*=}"; shift;;
      -l|--list) list=1; shift;;
      *) echo "Invalid combination of input arguments: $1" >&2; exit 2;;
    esac
  done
  [ -n "$gpu" ] || { echo "No GPU given (-i)" >&2; exit 2; }
  mkdir -p "$STATE"
  if [ -n "$level" ]; then
    case "$level" in 0|1|2|3) ;; *) echo "Invalid timeslice value: $level" >&2; exit 2;; esac
    echo "$level" > "$STATE/timeslice-$gpu"
    echo "Successfully set the timeslice to $level for GPU $gpu."
    exit 0
  fi
  if [ -n "$list" ]; then
    echo "GPU $gpu timeslice: $(cat "$STATE/timeslice-$gpu" 2>/dev/null || echo 0)"
    exit 0
  fi
fi
echo "Invalid combination of input arguments." >&2
exit 2
"""

# The MPS control daemon: `-d` starts a background server on named pipes in
# $CUDA_MPS_PIPE_DIRECTORY (writing nvidia-cuda-mps-control.pid there, like the real one), `-f` is
# the same server in the foreground (what a daemon Pod runs: the container lives as long as it); without
# arguments it is the client: each stdin line goes to the daemon and its answer is printed, and with
# no daemon it fails like the real one. The daemon keeps the default active thread percentage and
# pinned memory limits, answers the get_* commands, and `quit` stops it and removes its pipes.
MPS_CONTROL = r"""#!/bin/sh
LOG='{root}/var/log/fake-nvidia-commands.log'
PIPE="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
log() { { echo "$*" >> "$LOG"; } 2>/dev/null; }
if [ "$1" = "-d" ]; then
  log "nvidia-cuda-mps-control -d pipe=$PIPE log=${CUDA_MPS_LOG_DIRECTORY:-}" \
    "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
  running=$(cat "$PIPE/nvidia-cuda-mps-control.pid" 2>/dev/null)
  if [ -p "$PIPE/control" ] && kill -0 "$running" 2>/dev/null; then
    echo "An instance of this daemon is already running" >&2; exit 1
  fi
  mkdir -p "$PIPE" && rm -f "$PIPE/control" "$PIPE/reply" && mkfifo "$PIPE/control" "$PIPE/reply" || exit 1
  "$0" --serve </dev/null >/dev/null 2>&1 &
  echo $! > "$PIPE/nvidia-cuda-mps-control.pid"
  exit 0
fi
if [ "$1" = "-f" ]; then
  log "nvidia-cuda-mps-control -f pipe=$PIPE log=${CUDA_MPS_LOG_DIRECTORY:-}" \
    "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"
  mkdir -p "$PIPE" && rm -f "$PIPE/control" "$PIPE/reply" && mkfifo "$PIPE/control" "$PIPE/reply" || exit 1
  echo $$ > "$PIPE/nvidia-cuda-mps-control.pid"
  exec "$0" --serve </dev/null
fi
if [ "$1" = "--serve" ]; then
  trap '' HUP
  trap 'rm -f "$PIPE/control" "$PIPE/reply" "$PIPE/nvidia-cuda-mps-control.pid"; exit 143' TERM
  atp=100.0
  while :; do
    read -r cmd a b < "$PIPE/control" || continue
    log "mps-daemon $$: $cmd $a $b"
    out=""
    case "$cmd" in
      get_default_active_thread_percentage) out="$atp";;
      set_default_active_thread_percentage) atp="$a.0";;
      set_default_device_pinned_mem_limit) echo "$a $b" >> "$PIPE/.limits";;
      get_default_device_pinned_mem_limit)
        out=$(grep "^$a " "$PIPE/.limits" 2>/dev/null | tail -n 1 | cut -d' ' -f2);;
      quit)
        echo "" > "$PIPE/reply"
        rm -f "$PIPE/control" "$PIPE/reply" "$PIPE/.limits" "$PIPE/nvidia-cuda-mps-control.pid"
        log "mps-daemon $$: exit"
        exit 0;;
      *) out="Unknown command: $cmd";;
    esac
    echo "$out" > "$PIPE/reply"
  done
fi
[ -p "$PIPE/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
while read -r line; do
  log "nvidia-cuda-mps-control: $line"
  echo "$line" > "$PIPE/control" && cat "$PIPE/reply" || exit 1
done
"""

STAND_INS = {"nvidia-smi": NVIDIA_SMI, "nvidia-cuda-mps-control": MPS_CONTROL}


def command_log(root: Path) -> list[str]:
    """The commands the stand-in tools of a driver root were given, in order."""
    path = root / COMMAND_LOG
    return path.read_text().splitlines() if path.exists() else []


def elf_shared_object(soname: str | None, machine: int = EM_X86_64, bits: int = 64) -> bytes:
    """A minimal little-endian ELF shared object whose dynamic section names `soname`."""
    strings = b"\0" + (soname.encode() + b"\0" if soname is not None else b"")
    if bits == 64:
        ehsize, phentsize, ph_format, dyn_format = 64, 56, "<IIQQQQQQ", "<qQ"
    else:
        ehsize, phentsize, ph_format, dyn_format = 52, 32, "<IIIIIIII", "<iI"
    strtab = ehsize + 2 * phentsize
    dynamic = (strtab + len(strings) + 7) & ~7
    entries = [(5, strtab), (10, len(strings))] + ([(14, 1)] if soname is not None else []) + [(0, 0)]
    dyn = b"".join(struct.pack(dyn_format, tag, value) for tag, value in entries)
    total = dynamic + len(dyn)
    if bits == 64:
        load = struct.pack(ph_format, 1, 5, 0, 0, 0, total, total, 0x1000)
        dyn_ph = struct.pack(ph_format, 2, 6, dynamic, dynamic, dynamic, len(dyn), len(dyn), 8)
        header = struct.pack(
            "<16sHHIQQQIHHHHHH",
            b"\x7fELF\x02\x01\x01" + b"\0" * 9,
            3,  # ET_DYN
            machine,
            1,
            0,
            ehsize,  # e_phoff
            0,
            0,
            ehsize,
            phentsize,
            2,
            64,
            0,
            0,
        )
    else:
        load = struct.pack(ph_format, 1, 0, 0, 0, total, total, 5, 0x1000)
        dyn_ph = struct.pack(ph_format, 2, dynamic, dynamic, dynamic, len(dyn), len(dyn), 6, 4)
        header = struct.pack(
            "<16sHHIIIIIHHHHHH",
            b"\x7fELF\x01\x01\x01" + b"\0" * 9,
            3,
            machine,
            1,
            0,
            ehsize,
            0,
            0,
            ehsize,
            phentsize,
            2,
            40,
            0,
            0,
        )
    body = header + load + dyn_ph + strings
    return body + b"\0" * (dynamic - len(body)) + dyn


@dataclass
class DriverLayout:
    """What to put in a fake driver root; `build` writes it under a directory."""

    version: str = "580.95.05"
    lib_dir: str = "usr/lib/x86_64-linux-gnu"
    libraries: Iterable[str] = MODERN_LIBRARIES
    machine: int = EM_X86_64
    bin_dir: str = "usr/bin"
    binaries: Iterable[str] = BINARIES
    # The NVRM line of /proc/driver/nvidia/version; None: no version file.
    proc_version: str | None = "default"
    firmware: bool = True
    persistenced_socket: bool = False
    hook: bool = False
    # Made as character devices with /dev/null's number (harmless to open; needs CAP_MKNOD, as the
    # fake backend's own device nodes do), so the reference CDI library accepts them.
    dev_nodes: Iterable[str] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
    soname_links: bool = True
    extra_files: dict[str, bytes] = field(default_factory=dict)

    def build(self, root: Path) -> Path:
        lib_dir = root / self.lib_dir
        lib_dir.mkdir(parents=True, exist_ok=True)
        for name in self.libraries:
            real = lib_dir / f"{name}.so.{self.version}"
            soname = SONAMES.get(name, f"{name}.so.1")
            real.write_bytes(elf_shared_object(soname, self.machine))
            if self.soname_links:
                # What the driver installer and ldconfig leave: SONAME → real file, dev name → SONAME.
                # A second version installed later takes the links over, as ldconfig would.
                relative_symlink(lib_dir / soname, real.name)
                if name in ("libcuda", "libnvidia-ml"):
                    relative_symlink(lib_dir / f"{name}.so", soname)
        bin_dir = root / self.bin_dir
        bin_dir.mkdir(parents=True, exist_ok=True)
        (root / COMMAND_LOG).parent.mkdir(parents=True, exist_ok=True)
        for binary in self.binaries:
            path = bin_dir / binary
            script = STAND_INS.get(binary, "#!/bin/sh\necho {name}\n")
            path.write_text(script.replace("{name}", binary).replace("{root}", str(root)))
            path.chmod(0o755)
        if self.proc_version is not None:
            line = self.proc_version
            if line == "default":
                line = (
                    f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.version}  "
                    "Tue Sep 23 17:43:19 UTC 2025"
                )
            proc = root / "proc/driver/nvidia/version"
            proc.parent.mkdir(parents=True, exist_ok=True)
            proc.write_text(line + "\nGCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n")
        if self.firmware:
            firmware = root / "lib/firmware/nvidia" / self.version
            firmware.mkdir(parents=True, exist_ok=True)
            (firmware / "gsp_ga10x.bin").write_bytes(b"\0" * 16)
            (firmware / "gsp_tu10x.bin").write_bytes(b"\0" * 16)
        if self.persistenced_socket:
            socket_dir = root / "run/nvidia-persistenced"
            socket_dir.mkdir(parents=True, exist_ok=True)
            (socket_dir / "socket").write_bytes(b"")
        if self.hook:
            hook = root / "usr/bin/nvidia-cdi-hook"
            hook.parent.mkdir(parents=True, exist_ok=True)
            hook.write_bytes(b"#!/bin/sh\n")
            hook.chmod(0o755)
        dev = root / "dev"
        dev.mkdir(exist_ok=True)
        for node in self.dev_nodes:
            (dev / node).parent.mkdir(parents=True, exist_ok=True)
            if not (dev / node).exists():
                os.mknod(dev / node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        for relative, content in self.extra_files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        return root


def debian_layout(**overrides: object) -> DriverLayout:
    """Ubuntu/Debian packages (and the .run installer on them): the multiarch directory."""
    return DriverLayout(**overrides)  # type: ignore[arg-type]


def lib64_layout(**overrides: object) -> DriverLayout:
    """RHEL/Fedora/SUSE packages and the GPU operator's RHCOS driver container: `usr/lib64`."""
    values: dict[str, object] = {"lib_dir": "usr/lib64", "version": "570.172.08"}
    values.update(overrides)
    return DriverLayout(**values)  # type: ignore[arg-type]


def relative_symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        os.unlink(link)
    link.symlink_to(target)
