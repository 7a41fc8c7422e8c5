"""A small image whose dynamic loader searches what a RHEL-family (UBI, Rocky) loader searches.

There is no RHEL image and no registry here, so the image is assembled from this
machine's files: Debian's glibc 2.36 (its loader and the libraries NVIDIA's
`nvidia-smi` and the NVML double need) placed in `/lib64`, Debian's static busybox
for a shell, an `/etc/ld.so.conf` naming `/usr/lib64` only, no `/etc/ld.so.cache`
and no multiarch directory. Debian's loader has its system directories compiled in
(`/lib/x86_64-linux-gnu/`, `/usr/lib/x86_64-linux-gnu/`, `/lib/`, `/usr/lib/`), and
our spec's mounts create `/usr/lib/x86_64-linux-gnu` in every container, so that
loader would find the multiarch copies whatever the image holds. The loader here is
therefore Debian's with that compiled-in table rewritten, at the same lengths, to
RHEL's (`/lib64/`, `/usr/lib64/`, each padded with slashes, which the kernel ignores
in a path) and two directories that do not exist (`/nil/`, `/usr/nil/`). What it
searches is what `ld.so --help` prints and `LD_DEBUG=libs` shows. The environment is
the CUDA UBI images' (`LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64`,
which our spec does not fill).

It is not a UBI image: a RHEL glibc, its `ld.so.cache` and its hwcaps layout are not
tested, only the search order such a loader has.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from devcluster import images
from devcluster.kubelet import KubeletNode

REPOSITORY = "localhost/draplugin-rhel-loader"
HOST_LIB_DIR = Path("/lib/x86_64-linux-gnu")
LOADER = "ld-linux-x86-64.so.2"
# What nvidia-smi and the NVML double (a Go c-shared library) link against; busybox is static.
GLIBC_LIBRARIES = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")
# glibc's SYSTEM_DIRS table in Debian's ld.so, as it is stored: each entry NUL-terminated.
DEBIAN_SYSTEM_DIRS = b"/lib/x86_64-linux-gnu/\0/usr/lib/x86_64-linux-gnu/\0/lib/\0/usr/lib/\0"
# The lengths of the entries are compiled in elsewhere, so each replacement keeps its entry's.
RHEL_SYSTEM_DIRS = (
    b"/lib64/".ljust(22, b"/") + b"\0" + b"/usr/lib64/".ljust(26, b"/") + b"\0/nil/\0/usr/nil/\0"
)
ABSENT_DIRS = ("/nil", "/usr/nil")
ENV = (
    images.PATH_ENV,
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
)


def rhel_loader() -> bytes:
    """Debian's loader with RHEL's system directories; fails if the table is not where expected."""
    loader = (HOST_LIB_DIR / LOADER).read_bytes()
    count = loader.count(DEBIAN_SYSTEM_DIRS)
    # Two copies in glibc 2.36 (the search table and --help's); another glibc may differ.
    assert count >= 1, f"{HOST_LIB_DIR / LOADER}: glibc's system directory table not found"
    assert len(RHEL_SYSTEM_DIRS) == len(DEBIAN_SYSTEM_DIRS)
    return loader.replace(DEBIAN_SYSTEM_DIRS, RHEL_SYSTEM_DIRS)


def layer() -> bytes:
    busybox = images.BUSYBOX.read_bytes()
    buffer = io.BytesIO()
    add = images.add_member
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in (
            "bin",
            "dev",
            "etc",
            "lib64",
            "proc",
            "root",
            "sys",
            "tmp",
            "usr",
            "usr/bin",
            "usr/lib64",
        ):
            add(tar, directory, tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755)
        add(tar, f"lib64/{LOADER}", tarfile.REGTYPE, mode=0o755, data=rhel_loader())
        for name in GLIBC_LIBRARIES:
            add(tar, f"lib64/{name}", tarfile.REGTYPE, mode=0o755, data=(HOST_LIB_DIR / name).read_bytes())
        add(tar, "bin/busybox", tarfile.REGTYPE, mode=0o755, data=busybox)
        for applet in ("sh", "ls", "cat", "grep", "sed", "sleep", "test", "echo", "stat", "md5sum", "sort"):
            add(tar, f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        add(tar, "etc/ld.so.conf", tarfile.REGTYPE, mode=0o644, data=b"/usr/lib64\n")
        add(tar, "etc/passwd", tarfile.REGTYPE, mode=0o644, data=b"root:x:0:0:root:/root:/bin/sh\n")
        add(tar, "etc/group", tarfile.REGTYPE, mode=0o644, data=b"root:x:0:\n")
    return buffer.getvalue()


def import_rhel_image(node: KubeletNode) -> images.LocalImage:
    """The image built (cached by content) and present in the node's containerd."""
    assert node.containerd is not None, f"node {node.name} runs the fake CRI, not containerd"
    image = images.rootfs_image(REPOSITORY, layer(), env=ENV)
    if image.name not in images.image_names(node.containerd.ctr, node.containerd.socket):
        images.import_image(node.containerd.ctr, node.containerd.socket, image.archive)
    return image
