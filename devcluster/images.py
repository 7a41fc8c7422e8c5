"""Container images for the local cluster, built here and imported into containerd: no registry.

No image registry is reachable from the test machines, so images are OCI
image layouts assembled in Python (the layout is a few JSON documents around
tar layers; no Debian tool writes one from a directory without a runtime of
its own) and imported with `ctr images import` into containerd's `k8s.io`
namespace, where the kubelet finds them; pods use `imagePullPolicy: Never`.

- The workload image holds Debian's static busybox, every applet on PATH, and
  a report script as its default command: it prints what the container
  received (environment, `/dev`, mounts) to the container's log, then sleeps
  (`args: ["/bin/draplugin-report", "0"]` exits instead). A pod's own command
  or args run instead, as with any busybox image.
- The pause image is the same layer running `sleep`: the CRI sandbox
  container only holds the pod's namespaces, containerd stops it with
  SIGKILL, and our pods do not share a PID namespace, so it needs neither the
  signal handling nor the zombie reaping of Kubernetes' pause binary.

Image names carry their content hash (`localhost/draplugin-workload:<hash>`),
so a changed input is a new name and a cached archive is never stale.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import platform
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devcluster.binaries import REPO_ROOT

BUSYBOX = Path("/bin/busybox")
INSTALL_COMMAND = "tests/cluster/install_debs.sh"
IMPORT_NAMESPACE = "k8s.io"
CACHE_DIR = Path.home() / ".cache" / "draplugin-kube" / "images"
WORKLOAD_REPOSITORY = "localhost/draplugin-workload"
PAUSE_REPOSITORY = "localhost/draplugin-pause"
REPORT_PATH = "/bin/draplugin-report"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Section markers let tests find each part of the report in a container's log.
REPORT_END = "== end"
REPORT_SCRIPT = f"""#!/bin/sh
# What this container received, for `kubectl logs`; then sleep (or exit: draplugin-report 0).
echo "== env"
env | sort
echo "== dev"
ls -l /dev
echo "== mounts"
cat /proc/self/mounts
echo "{REPORT_END}"
exec sleep "${{1:-infinity}}"
"""

_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
_CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
_MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
_INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
_GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


class ImageError(RuntimeError):
    """An image cannot be built or imported; the message names the command that fixes it."""


@dataclass(frozen=True)
class LocalImage:
    """An image archive (OCI layout as a tar) and the name it is imported under."""

    name: str
    archive: Path


def workload_image(cache_dir: Path = CACHE_DIR) -> LocalImage:
    """The workload image (entrypoint: the report script), built once per content."""
    return _image(WORKLOAD_REPOSITORY, [], [REPORT_PATH], cache_dir)


def pause_image(cache_dir: Path = CACHE_DIR) -> LocalImage:
    """The sandbox ("pause") image containerd starts first in every pod."""
    return _image(PAUSE_REPOSITORY, ["/bin/sleep", "infinity"], [], cache_dir)


def import_image(ctr: Path, socket: Path, archive: Path, namespace: str = IMPORT_NAMESPACE) -> None:
    """Import an image archive (OCI layout or `docker save` tar) into containerd and unpack it.

    The image name comes from the archive (`io.containerd.image.name`, or the
    tag a `docker save`/`buildah push docker-archive:` wrote). Raises
    ImageError with ctr's message and the command line that was run.
    """
    if not archive.is_file():
        raise ImageError(f"image archive {archive} does not exist; build it first")
    command = [str(ctr), "--address", str(socket), "--namespace", namespace, "images", "import", str(archive)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise ImageError(
            f"importing {archive} into containerd failed ({' '.join(command)}): "
            f"{(done.stderr or done.stdout).strip()}"
        )


def image_names(ctr: Path, socket: Path, namespace: str = IMPORT_NAMESPACE) -> set[str]:
    """The image names containerd holds in `namespace`."""
    command = [str(ctr), "--address", str(socket), "--namespace", namespace, "images", "list", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise ImageError(f"listing images failed ({' '.join(command)}): {done.stderr.strip()}")
    return set(done.stdout.split())


def use_local_image(doc: Mapping[str, Any], image: str) -> dict[str, Any]:
    """A copy of a manifest whose containers run `image`, never pulled.

    The examples name a public image (true on any cluster with a registry);
    the local cluster has none, so its harness swaps in the workload image.
    Objects without a pod spec come back unchanged.
    """
    out = copy.deepcopy(dict(doc))
    spec = out.get("spec") or {}
    pod_spec = spec.get("template", {}).get("spec") if doc.get("kind") != "Pod" else spec
    if not isinstance(pod_spec, dict):
        return out
    for key in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod_spec.get(key) or []:
            container["image"] = image
            container["imagePullPolicy"] = "Never"
    return out


# --- building ----------------------------------------------------------------------------------------


def rootfs_image(
    repository: str,
    layer: bytes,
    *,
    env: Sequence[str] = (PATH_ENV,),
    cmd: Sequence[str] = (),
    cache_dir: Path = CACHE_DIR,
) -> LocalImage:
    """An image of one root filesystem layer (an uncompressed tar) that a test assembled itself,
    named by its content like the others."""
    return _image(repository, [], cmd, cache_dir, layer=layer, env=env)


def _image(
    repository: str,
    entrypoint: Sequence[str],
    cmd: Sequence[str],
    cache_dir: Path,
    *,
    layer: bytes | None = None,
    env: Sequence[str] = (PATH_ENV,),
) -> LocalImage:
    layer = _busybox_layer() if layer is None else layer
    blobs, manifest_digest = _layout_blobs(layer, entrypoint, cmd, env)
    tag = manifest_digest.removeprefix("sha256:")[:16]
    name = f"{repository}:{tag}"
    archive = cache_dir / f"{repository.rsplit('/', 1)[-1]}-{tag}.tar"
    if not archive.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        index = {
            "schemaVersion": 2,
            "mediaType": _INDEX_TYPE,
            "manifests": [
                {
                    "mediaType": _MANIFEST_TYPE,
                    "digest": manifest_digest,
                    "size": len(blobs[manifest_digest]),
                    "platform": {"architecture": _arch(), "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
        files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": _json(index)}
        files.update({f"blobs/sha256/{d.removeprefix('sha256:')}": blob for d, blob in blobs.items()})
        # A temp file of its own: two sessions may build the same image at once
        # (same bytes); the rename means a reader never sees half an archive.
        fd, partial = tempfile.mkstemp(dir=cache_dir, prefix=f".{archive.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as out:
            out.write(_tar(files))
        os.replace(partial, archive)
    return LocalImage(name, archive)


def _layout_blobs(
    layer: bytes, entrypoint: Sequence[str], cmd: Sequence[str], env: Sequence[str] = (PATH_ENV,)
) -> tuple[dict[str, bytes], str]:
    layer_digest = _digest(layer)
    config = _json({
        "architecture": _arch(),
        "os": "linux",
        "config": {"Env": list(env), "Entrypoint": list(entrypoint), "Cmd": list(cmd), "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},  # an uncompressed layer is its own diff
    })  # fmt: skip
    manifest = _json({
        "schemaVersion": 2,
        "mediaType": _MANIFEST_TYPE,
        "config": {"mediaType": _CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": _LAYER_TYPE, "digest": layer_digest, "size": len(layer)}],
    })  # fmt: skip
    blobs = {layer_digest: layer, _digest(config): config, _digest(manifest): manifest}
    return blobs, _digest(manifest)


def _busybox_layer() -> bytes:
    """The root filesystem: busybox, a symlink per applet, the report script, empty mount points."""
    try:
        busybox = BUSYBOX.read_bytes()
        applets = subprocess.run(
            [str(BUSYBOX), "--list"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ImageError(
            f"the workload image needs Debian's static busybox at {BUSYBOX} ({err}); "
            f"install it with `{INSTALL_COMMAND}`"
        ) from err
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("bin", "dev", "etc", "proc", "root", "sys", "tmp", "usr", "usr/bin", "var"):
            _add(tar, directory, tarfile.DIRTYPE, mode=0o1777 if directory == "tmp" else 0o755)
        _add(tar, "bin/busybox", tarfile.REGTYPE, mode=0o755, data=busybox)
        for applet in sorted(set(applets) - {"busybox"}):
            _add(tar, f"bin/{applet}", tarfile.SYMTYPE, link="busybox")
        _add(tar, REPORT_PATH.lstrip("/"), tarfile.REGTYPE, mode=0o755, data=REPORT_SCRIPT.encode())
        _add(tar, "etc/passwd", tarfile.REGTYPE, mode=0o644, data=b"root:x:0:0:root:/root:/bin/sh\n")
        _add(tar, "etc/group", tarfile.REGTYPE, mode=0o644, data=b"root:x:0:\n")
    return buffer.getvalue()


def add_member(
    tar: tarfile.TarFile, name: str, kind: bytes, *, mode: int = 0o777, data: bytes = b"", link: str = ""
) -> None:
    """One file, directory or link of a layer, with a fixed owner and mtime (for test-made layers)."""
    _add(tar, name, kind, mode=mode, data=data, link=link)


def _add(
    tar: tarfile.TarFile, name: str, kind: bytes, *, mode: int = 0o777, data: bytes = b"", link: str = ""
) -> None:
    # Fixed owner and mtime: the same inputs give the same bytes, hence the same name.
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.linkname = kind, mode, 0, link
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def _tar(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            _add(tar, directory, tarfile.DIRTYPE, mode=0o755)
        for name, data in files.items():
            _add(tar, name, tarfile.REGTYPE, mode=0o644, data=data)
    return buffer.getvalue()


def _json(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _arch() -> str:
    machine = platform.machine()
    return _GO_ARCH.get(machine, machine)


# --- our image ---------------------------------------------------------------------------------------

OUR_IMAGE_BUILD_COMMAND = "tests/cluster/build_image.sh"


def our_image(build_timeout_s: float = 1800.0) -> LocalImage:
    """Our image, built from deploy/Dockerfile by buildah (tests/cluster/build_image.sh).

    Runs the script, a quick no-op when no input changed (it rebuilds only
    then), and reads the image name from the archive's OCI index, where
    `buildah push oci-archive:PATH:NAME` wrote it; ctr imports it under that name.
    """
    done = subprocess.run(
        [str(REPO_ROOT / OUR_IMAGE_BUILD_COMMAND)],
        capture_output=True, text=True, timeout=build_timeout_s, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise ImageError(
            f"building our image failed ({OUR_IMAGE_BUILD_COMMAND}, exit {done.returncode}); "
            f"its output ends:\n{done.stderr[-3000:]}"
        )
    archive = Path(done.stdout.strip().splitlines()[-1])
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        index = json.load(member) if member else {}
    names = [
        m.get("annotations", {}).get("org.opencontainers.image.ref.name", "")
        for m in index.get("manifests", [])
    ]
    if len(names) != 1 or "/" not in names[0]:
        raise ImageError(f"{archive} does not name one image (index.json ref.name: {names}); rebuild it")
    return LocalImage(names[0], archive)
