"""The local workload and pause images (OCI layouts built in Python) and the runtime set-up checks."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from devcluster import containerd, images


def read_layout(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_workload_image_is_a_valid_oci_layout_named_by_its_content(tmp_path: Path) -> None:
    image = images.workload_image(tmp_path)
    files = read_layout(image.archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = json.loads(files["index.json"])["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == image.name
    assert image.name == f"{images.WORKLOAD_REPOSITORY}:{entry['digest'].removeprefix('sha256:')[:16]}"
    # Every blob is stored under its digest.
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'].removeprefix('sha256:')}"])
    assert (config["config"]["Entrypoint"], config["config"]["Cmd"]) == ([], [images.REPORT_PATH])
    (layer,) = manifest["layers"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]  # an uncompressed layer
    layer_bytes = files[f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}"]
    (tmp_path / "layer.tar").write_bytes(layer_bytes)
    with tarfile.open(tmp_path / "layer.tar") as tar:
        names = set(tar.getnames())
        assert {"bin/busybox", "bin/sh", "bin/sleep", images.REPORT_PATH.lstrip("/")} <= names
        assert tar.getmember("bin/sh").linkname == "busybox"


def test_images_are_rebuilt_only_when_the_content_changes(tmp_path: Path) -> None:
    first = images.workload_image(tmp_path)
    stamp = first.archive.stat().st_mtime_ns
    again = images.workload_image(tmp_path)
    assert again == first and again.archive.stat().st_mtime_ns == stamp  # cached, not rewritten
    pause = images.pause_image(tmp_path)
    assert pause.name.startswith(images.PAUSE_REPOSITORY + ":") and pause.archive != first.archive


def test_missing_busybox_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(images, "BUSYBOX", tmp_path / "no-busybox")
    with pytest.raises(images.ImageError, match=r"tests/cluster/install_debs\.sh"):
        images.workload_image(tmp_path)


def test_importing_a_missing_archive_fails_before_running_ctr(tmp_path: Path) -> None:
    with pytest.raises(images.ImageError, match="does not exist"):
        images.import_image(tmp_path / "ctr", tmp_path / "sock", tmp_path / "missing.tar")


def test_use_local_image_swaps_every_container_of_pods_and_templates() -> None:
    pod: dict[str, Any] = {
        "kind": "Pod",
        "spec": {
            "initContainers": [{"name": "i", "image": "a"}],
            "containers": [{"name": "c", "image": "b"}],
        },
    }
    swapped = images.use_local_image(pod, "localhost/x:1")
    containers = swapped["spec"]["initContainers"] + swapped["spec"]["containers"]
    assert all(c["image"] == "localhost/x:1" and c["imagePullPolicy"] == "Never" for c in containers)
    assert pod["spec"]["containers"][0]["image"] == "b"  # the input is left as it was
    deployment: dict[str, Any] = {
        "kind": "Deployment",
        "spec": {"template": {"spec": {"containers": [{"image": "b"}]}}},
    }
    assert (
        images.use_local_image(deployment, "l")["spec"]["template"]["spec"]["containers"][0]["image"] == "l"
    )
    claim = {"kind": "ResourceClaim", "spec": {"devices": {}}}
    assert images.use_local_image(claim, "l") == claim


def test_runtime_binaries_missing_names_the_build_command(tmp_path: Path) -> None:
    with pytest.raises(containerd.RuntimeSetupError, match=r"tests/cluster/build_runtime\.sh"):
        containerd.require_runtime(tmp_path)


def test_missing_runc_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in containerd.RUNTIME_BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setattr(containerd, "RUNC", tmp_path / "no-runc")
    with pytest.raises(containerd.RuntimeSetupError, match=r"no-runc.*tests/cluster/install_debs\.sh"):
        containerd.require_runtime(tmp_path)


def test_the_pinned_containerd_version_comes_from_the_runtime_module() -> None:
    assert containerd.pinned_containerd_version().startswith("v2.")
