"""The dynamic loader's cache (`/etc/ld.so.cache`) and configuration of a driver root, read as data.

Hand-written because nothing else reads another tree's cache: `ldconfig -p`
and `ctypes.util.find_library` answer for this process's own `/`, and no
Python package parses the file. The format is glibc's (`elf/cache.c`,
`sysdeps/generic/dl-cache.h`), as libnvidia-container and the NVIDIA
Container Toolkit (`internal/ldcache`) read it:

  new format ("glibc-ld.so.cache" "1.1", what glibc 2.32+ writes): a 48-byte
  header (magic, version, nlibs u32, len_strings u32, flags u8, 3 pad bytes,
  extension_offset u32, 3 unused u32), then `nlibs` 24-byte entries (flags
  i32, key u32, value u32, osversion u32, hwcap u64); key and value are
  offsets of NUL-terminated strings from the start of the new header;
  old format first ("ld.so-1.7.0", up to glibc 2.31's default "compat"
  files): a 16-byte header (magic with NUL, nlibs u32) and 12-byte entries,
  then the new format, 8-byte aligned.

Entries are the library name the loader looks up (the SONAME, `libcuda.so.1`)
and the path it maps to (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`, often a
link). Paths are the root's own: the caller resolves them inside the root.
"""

from __future__ import annotations

import glob
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

CACHE_FILE = PurePosixPath("etc/ld.so.cache")
CONF_FILE = PurePosixPath("etc/ld.so.conf")

_OLD_MAGIC = b"ld.so-1.7.0"
_NEW_MAGIC = b"glibc-ld.so.cache1.1"
_NEW_HEADER = struct.Struct("<20sII")  # magic + version, nlibs, len_strings (the rest is unused here)
_NEW_HEADER_SIZE = 48
_NEW_ENTRY = struct.Struct("<iIIIQ")
_OLD_ENTRY_SIZE = 12

FLAG_ELF = 0x0001  # any ELF entry (FLAG_ELF_LIBC6 is 0x0003)
FLAG_TYPE_MASK = 0x00FF
FLAG_ARCH_MASK = 0xFF00
# The architecture bits of 64-bit libraries we can give containers (FLAG_X8664_LIB64, FLAG_AARCH64_LIB64).
ARCH_FLAGS = {"x86_64": 0x0300, "aarch64": 0x0A00}
# No conf file includes more than this (a loop of includes is a broken install, not a reason to hang).
_MAX_INCLUDE_DEPTH = 8


class LdCacheError(ValueError):
    """The file is not an ld.so.cache this module understands."""


@dataclass(frozen=True, slots=True)
class CacheEntry:
    name: str  # "libcuda.so.1"
    path: str  # "/usr/lib/x86_64-linux-gnu/libcuda.so.1", in the root's own terms
    flags: int

    def is_arch(self, arch: str) -> bool:
        wanted = ARCH_FLAGS.get(arch)
        return (
            wanted is not None
            and self.flags & FLAG_TYPE_MASK & FLAG_ELF != 0
            and self.flags & FLAG_ARCH_MASK == wanted
        )


def parse(data: bytes) -> list[CacheEntry]:
    """The entries of an ld.so.cache file's content, in file order; raises `LdCacheError`."""
    start = 0
    if data.startswith(_OLD_MAGIC):
        if len(data) < 16:
            raise LdCacheError("truncated old-format header")
        (old_count,) = struct.unpack_from("<I", data, 12)
        start = 16 + old_count * _OLD_ENTRY_SIZE
        start = (start + 7) & ~7  # the new header is aligned as its 8-byte hwcap field
    if len(data) < start + _NEW_HEADER_SIZE or data[start : start + len(_NEW_MAGIC)] != _NEW_MAGIC:
        raise LdCacheError("no glibc-ld.so.cache1.1 header")
    _, count, _ = _NEW_HEADER.unpack_from(data, start)
    table = start + _NEW_HEADER_SIZE
    if table + count * _NEW_ENTRY.size > len(data):
        raise LdCacheError(f"{count} entries do not fit in {len(data)} bytes")
    strings = data[start:]
    entries = []
    for i in range(count):
        flags, key, value, _, _ = _NEW_ENTRY.unpack_from(data, table + i * _NEW_ENTRY.size)
        name, path = _string(strings, key), _string(strings, value)
        if name and path:
            entries.append(CacheEntry(name, path, flags))
    return entries


def _string(strings: bytes, offset: int) -> str:
    end = strings.find(b"\0", offset)
    if offset >= len(strings) or end < 0:
        return ""
    return strings[offset:end].decode("utf-8", errors="replace")


def read_cache(root: Path) -> list[CacheEntry]:
    """The root's cache entries; none when it has no readable or valid cache (a driver container may not)."""
    try:
        return parse((root / CACHE_FILE).read_bytes())
    except (OSError, LdCacheError):
        return []


def conf_dirs(root: Path) -> list[str]:
    """The directories `etc/ld.so.conf` names, includes (`include ld.so.conf.d/*.conf`) followed, in order.

    Paths are the root's own; glob patterns of includes are expanded under the root.
    """
    return list(dict.fromkeys(_conf_lines(root, CONF_FILE, 0)))


def _conf_lines(root: Path, conf: PurePosixPath, depth: int) -> Iterator[str]:
    try:
        text = (root / conf).read_text(errors="replace")
    except OSError:
        return
    for raw in text.splitlines():
        line = raw.partition("#")[0].strip()
        if not line:
            continue
        if line.startswith("include") and line[len("include") :][:1].isspace():
            if depth >= _MAX_INCLUDE_DEPTH:
                continue
            for pattern in line[len("include") :].split():
                # Relative includes are relative to the including file's directory, as ldconfig has it.
                absolute = PurePosixPath("/") / conf.parent / pattern if not pattern.startswith("/") else None
                relative = (absolute or PurePosixPath(pattern)).relative_to("/")
                for match in sorted(glob.glob(glob.escape(str(root)) + "/" + str(relative))):
                    yield from _conf_lines(root, PurePosixPath(match).relative_to(root), depth + 1)
            continue
        if line.startswith("hwcap"):
            continue  # an obsolete directive; names no directory
        # "dir=TYPE" (libc5-era type suffix) still names the directory before '='.
        directory = line.split("=", 1)[0].strip()
        if directory.startswith("/"):
            yield directory
