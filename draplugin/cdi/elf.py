"""Read an ELF object's identity: class, machine, DT_SONAME, DT_NEEDED and its loader.

Ours, not pyelftools: `make gpu-check` and the node image must run with only
the package and nvidia-ml-py importable, and this needs ~80 lines of `struct`.

The SONAME is read the way the dynamic loader finds it: the PT_DYNAMIC
segment's DT_STRTAB (a virtual address, mapped to a file offset through the
PT_LOAD segment that holds it) plus DT_SONAME's offset. Section headers are
not used: stripped libraries may not have them, and the loader ignores them.
Only the headers, the dynamic segment and one string are read, so a 100 MB
libcuda costs a few small reads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

EM_386 = 3
EM_ARM = 40
EM_X86_64 = 62
EM_AARCH64 = 183

_PT_LOAD = 1
_PT_DYNAMIC = 2
_PT_INTERP = 3
_DT_NULL = 0
_DT_NEEDED = 1
_DT_STRTAB = 5
_DT_SONAME = 14
# A SONAME is a short file name; refuse to read megabytes looking for a NUL.
_MAX_NAME = 4096
_MAX_PROGRAM_HEADERS = 4096


class ElfError(ValueError):
    """The file is not an ELF object we can read; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class ElfInfo:
    bits: int  # 32 or 64
    machine: int  # e_machine: EM_X86_64, EM_AARCH64, ...
    soname: str | None  # None: the object has no DT_SONAME
    needed: tuple[str, ...] = ()  # DT_NEEDED: the libraries the loader maps with it
    interpreter: str | None = None  # PT_INTERP: the loader of an executable


def read_elf(path: Path) -> ElfInfo:
    """The ELF class, machine and SONAME of `path`, or `ElfError` naming the problem."""
    try:
        with path.open("rb") as file:
            return _read(file, path)
    except struct.error as err:
        raise ElfError(f"{path}: truncated ELF file ({err})") from None


def _read(file: BinaryIO, path: Path) -> ElfInfo:
    ident = file.read(16)
    if len(ident) < 16 or ident[:4] != b"\x7fELF":
        raise ElfError(f"{path}: not an ELF file")
    if ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ElfError(f"{path}: unknown ELF class {ident[4]} or byte order {ident[5]}")
    bits = 32 if ident[4] == 1 else 64
    order = "<" if ident[5] == 1 else ">"
    header = file.read(48 if bits == 64 else 36)
    (machine,) = struct.unpack_from(order + "H", header, 2)
    if bits == 64:
        (phoff,) = struct.unpack_from(order + "Q", header, 16)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 38)
        ph_format, dyn_format = order + "IIQQQQQQ", order + "qQ"
    else:
        (phoff,) = struct.unpack_from(order + "I", header, 12)
        phentsize, phnum = struct.unpack_from(order + "HH", header, 26)
        ph_format, dyn_format = order + "IIIIIIII", order + "iI"
    if phnum > _MAX_PROGRAM_HEADERS or (phnum and phentsize < struct.calcsize(ph_format)):
        raise ElfError(f"{path}: implausible program header table ({phnum} entries of {phentsize} bytes)")
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None  # (offset, filesz)
    interp: tuple[int, int] | None = None
    for i in range(phnum):
        file.seek(phoff + i * phentsize)
        fields = struct.unpack(ph_format, file.read(struct.calcsize(ph_format)))
        if bits == 64:
            p_type, _, offset, vaddr, _, filesz, _, _ = fields
        else:
            p_type, offset, vaddr, _, filesz, _, _, _ = fields
        if p_type == _PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif p_type == _PT_DYNAMIC:
            dynamic = (offset, filesz)
        elif p_type == _PT_INTERP:
            interp = (offset, min(filesz, _MAX_NAME))
    interpreter = None
    if interp is not None:
        file.seek(interp[0])
        interpreter = file.read(interp[1]).partition(b"\0")[0].decode("ascii", "replace") or None
    if dynamic is None:
        return ElfInfo(bits, machine, None, (), interpreter)
    file.seek(dynamic[0])
    table = file.read(dynamic[1])
    entry_size = struct.calcsize(dyn_format)
    strtab: int | None = None
    soname: int | None = None
    needed: list[int] = []
    for start in range(0, len(table) - entry_size + 1, entry_size):
        tag, value = struct.unpack_from(dyn_format, table, start)
        if tag == _DT_NULL:
            break
        if tag == _DT_STRTAB:
            strtab = value
        elif tag == _DT_SONAME:
            soname = value
        elif tag == _DT_NEEDED:
            needed.append(value)
    if soname is None and not needed:
        return ElfInfo(bits, machine, None, (), interpreter)
    if strtab is None:
        raise ElfError(f"{path}: DT_SONAME or DT_NEEDED without DT_STRTAB")
    base = next((off + strtab - va for va, off, size in loads if va <= strtab < va + size), None)
    if base is None:
        raise ElfError(f"{path}: DT_STRTAB {strtab:#x} lies in no loadable segment")
    return ElfInfo(
        bits,
        machine,
        _string(file, path, base + soname, "DT_SONAME") if soname is not None else None,
        tuple(_string(file, path, base + offset, "DT_NEEDED") for offset in needed),
        interpreter,
    )


def _string(file: BinaryIO, path: Path, offset: int, what: str) -> str:
    file.seek(offset)
    name, nul, _ = file.read(_MAX_NAME).partition(b"\0")
    if not nul or not name:
        raise ElfError(f"{path}: {what} does not point at a name")
    try:
        return name.decode("ascii")
    except UnicodeDecodeError:
        raise ElfError(f"{path}: {what} is not ASCII") from None
