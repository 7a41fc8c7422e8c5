"""Which Kubernetes release we talk to: parsing "1.34" / "v1.34.4" and asking the API server.

Both daemons adapt a few behaviours to the server's release (ResourceSlice layout
of shared counters, CEL libraries, allocator rules), so the parsing and the
`GET /version` call live here, in one place.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from dracommon.kubeapi import KubeApi

KubernetesVersion = tuple[int, int]

# The oldest release the product supports and the newest whose rules it knows.
OLDEST_SUPPORTED: Final[KubernetesVersion] = (1, 34)
NEWEST_KNOWN: Final[KubernetesVersion] = (1, 37)

_VERSION: Final = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$")


class VersionError(ValueError):
    """A Kubernetes version that cannot be parsed or is older than we support."""


def parse_kubernetes_version(text: str) -> KubernetesVersion:
    """(major, minor) from "1.34", "v1.34.4" or "1.34.4-gke.1"; VersionError otherwise."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise VersionError(f"{text!r} is not a Kubernetes version (expected MAJOR.MINOR, e.g. 1.34)")
    version = (int(match.group(1)), int(match.group(2)))
    if version < OLDEST_SUPPORTED:
        raise VersionError(
            f"Kubernetes {version[0]}.{version[1]} is not supported "
            f"(oldest: {OLDEST_SUPPORTED[0]}.{OLDEST_SUPPORTED[1]})"
        )
    return version


def version_from_info(info: Any) -> KubernetesVersion:
    """(major, minor) from a `GET /version` answer.

    gitVersion is preferred: some distributions report minor as "34+".
    """
    if not isinstance(info, dict):
        raise VersionError(f"unexpected /version answer: {info!r}")
    git_version = info.get("gitVersion")
    if isinstance(git_version, str) and _VERSION.match(git_version.strip()):
        return parse_kubernetes_version(git_version)
    major = re.sub(r"\D", "", str(info.get("major", "")))
    minor = re.sub(r"\D", "", str(info.get("minor", "")))
    if not major or not minor:
        raise VersionError(f"/version names no release: {info!r}")
    return parse_kubernetes_version(f"{major}.{minor}")


def server_version(api: KubeApi) -> KubernetesVersion:
    """The API server's release, read from `GET /version`; ApiError when the call fails,
    VersionError when the answer names no release we support."""
    return version_from_info(api.get("/version"))


def format_version(version: KubernetesVersion) -> str:
    return f"{version[0]}.{version[1]}"
