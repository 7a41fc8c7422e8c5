"""Where the binaries the tests and the demo run live.

The Kubernetes components (tests/cluster/build.sh) are per release, one
directory each; tools that do not depend on the release under test (Helm
here, containerd in devcluster/containerd.py) are built once and shared by
every release, so a compatibility run builds only what differs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_MODULE = REPO_ROOT / "tests" / "cluster"
HELM_MODULE = CLUSTER_MODULE / "helm"
CACHE_ROOT = Path.home() / ".cache" / "draplugin-kube"
BUILD_COMMAND = "tests/cluster/build.sh"
HELM_BUILD_COMMAND = "tests/cluster/build_helm.sh"

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
NODE_BINARIES = ("kubelet", "fakecri")
ALL_BINARIES = (*CONTROL_PLANE_BINARIES, *NODE_BINARIES, "cdicheck", "kubectl")


class MissingBinariesError(RuntimeError):
    """The binaries were not built; the message says how to build them."""


def pinned_module_version(go_mod: Path, module: str) -> str:
    """The version of `module` that `go_mod` requires, e.g. v1.37.2 for k8s.io/kubernetes."""
    pattern = rf"^\s*{re.escape(module)}\s+(v\d+\.\d+\.\d+\S*)"
    match = re.search(pattern, go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise MissingBinariesError(f"{go_mod} does not require {module}")
    return match.group(1)


def pinned_kubernetes_version(go_mod: Path = CLUSTER_MODULE / "go.mod") -> str:
    """The k8s.io/kubernetes version tests/cluster/go.mod requires, e.g. v1.37.2."""
    return pinned_module_version(go_mod, "k8s.io/kubernetes")


def built_version(directory: Path) -> str:
    """The release the binaries in `directory` were built from: the VERSION file
    build.sh writes there, else the pin in tests/cluster/go.mod."""
    version_file = directory / "VERSION"
    if version_file.is_file():
        return version_file.read_text().strip()
    return pinned_kubernetes_version()


def bin_dir() -> Path:
    """$DRA_KUBE_BIN_DIR, else the cache directory build.sh writes to."""
    override = os.environ.get("DRA_KUBE_BIN_DIR")
    if override:
        return Path(override)
    return CACHE_ROOT / pinned_kubernetes_version()


def helm_path() -> Path:
    """The helm build_helm.sh builds: one for every release ($DRA_HELM_BIN_DIR overrides the directory)."""
    override = os.environ.get("DRA_HELM_BIN_DIR")
    directory = (
        Path(override)
        if override
        else CACHE_ROOT / f"helm-{pinned_module_version(HELM_MODULE / 'go.mod', 'helm.sh/helm/v4')}"
    )
    return directory / "helm"


def require_binaries(directory: Path, names: tuple[str, ...] = ALL_BINARIES) -> None:
    missing = [name for name in names if not os.access(directory / name, os.X_OK)]
    if missing:
        raise MissingBinariesError(
            f"Kubernetes test binaries missing from {directory}: {', '.join(missing)}. "
            f"Build them with `{BUILD_COMMAND}` (or `make kube`), then run the tests with "
            f'DRA_KUBE_BIN_DIR="$({BUILD_COMMAND})" if you build elsewhere.'
        )
