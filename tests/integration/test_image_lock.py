"""Our image holds exactly the locked runtime set: every distribution in its venv at uv.lock's version.

Read from the image itself, the OCI archive tests/cluster/build_image.sh builds from
deploy/Dockerfile: each layer's `opt/draplugin/lib/python3.*/site-packages/*.dist-info/METADATA`
gives the name and version pip installed. The expectation is deploy/requirements.txt (uv.lock's
runtime export) with its environment markers evaluated for the image's Python and machine,
plus the package itself; pip, which the install stage removes, must be gone. The runtime stage
takes the venv in one COPY, so no later layer deletes from it (no whiteouts to follow).
"""

from __future__ import annotations

import io
import json
import platform
import re
import tarfile
from email.parser import HeaderParser
from functools import cache

from packaging.markers import Marker
from packaging.utils import canonicalize_name

from devcluster import images
from tools import lock

SITE_PACKAGES = re.compile(r"^opt/draplugin/lib/python(3\.\d+)/site-packages/[^/]+\.dist-info/METADATA$")


def _read(tar: tarfile.TarFile, member: str | tarfile.TarInfo) -> bytes:
    file = tar.extractfile(member)
    assert file is not None, f"{member} is not a file in the archive"
    return file.read()


def _blob(digest: str) -> str:
    algorithm, value = digest.split(":", 1)
    return f"blobs/{algorithm}/{value}"


@cache
def image_distributions() -> tuple[str, dict[str, str]]:
    """The image's Python (major.minor) and {canonical name: version} of its venv."""
    archive = images.our_image().archive
    found: dict[str, str] = {}
    python = ""
    with tarfile.open(archive) as oci:
        index = json.loads(_read(oci, "index.json"))
        (entry,) = index["manifests"]
        manifest = json.loads(_read(oci, _blob(entry["digest"])))
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(_read(oci, _blob(layer["digest"])))) as layer_tar:
                for member in layer_tar:
                    matched = SITE_PACKAGES.match(member.name.removeprefix("./"))
                    if not matched or not member.isfile():
                        continue
                    python = matched.group(1)
                    text = _read(layer_tar, member).decode()
                    headers = HeaderParser().parsestr(text)
                    found[canonicalize_name(headers["Name"])] = headers["Version"]
    return python, found


def expected_distributions(python: str) -> dict[str, str]:
    environment = {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": platform.machine(),
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    expected = {"draplugin": str(lock.pyproject()["project"]["version"])}
    for name, version, marker in lock.exported_pins("deploy/requirements.txt"):
        if not marker or Marker(marker).evaluate(environment):
            expected[canonicalize_name(name)] = version
    return expected


def test_the_image_venv_is_the_locked_runtime_set() -> None:
    python, installed = image_distributions()
    assert python, "no site-packages under /opt/draplugin in the image"
    expected = expected_distributions(python)
    missing = {name: v for name, v in expected.items() if name not in installed}
    extra = {name: v for name, v in installed.items() if name not in expected}
    moved = {
        name: (installed[name], v)
        for name, v in expected.items()
        if name in installed and installed[name] != v
    }
    assert (missing, extra, moved) == ({}, {}, {}), (
        f"image vs deploy/requirements.txt: missing {missing}, not locked {extra}, other version {moved}"
    )


def test_the_image_export_reaches_back_to_the_lock() -> None:
    """Every pin the image took is uv.lock's, so the image's set and the tests' set are one."""
    locked = lock.locked_versions()
    _, installed = image_distributions()
    for name, version in installed.items():
        assert locked.get(name) == version, f"{name} {version} in the image, {locked.get(name)} in uv.lock"
