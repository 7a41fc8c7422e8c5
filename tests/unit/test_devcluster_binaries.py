"""Where devcluster finds the binaries: per-release Kubernetes, shared Helm."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import binaries


def test_module_version_is_read_from_require_lines(tmp_path: Path) -> None:
    go_mod = tmp_path / "go.mod"
    go_mod.write_text(
        "module x\n\nrequire (\n\thelm.sh/helm/v4 v4.3.2 // indirect\n\tk8s.io/kubernetes v1.34.4\n)\n"
    )
    assert binaries.pinned_module_version(go_mod, "helm.sh/helm/v4") == "v4.3.2"
    assert binaries.pinned_kubernetes_version(go_mod) == "v1.34.4"


def test_missing_module_names_the_file_and_module(tmp_path: Path) -> None:
    go_mod = tmp_path / "go.mod"
    go_mod.write_text("module x\n")
    with pytest.raises(binaries.MissingBinariesError, match=r"go\.mod does not require helm\.sh/helm/v4"):
        binaries.pinned_module_version(go_mod, "helm.sh/helm/v4")


def test_helm_is_shared_by_every_release(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A compatibility run points DRA_KUBE_BIN_DIR at another release; helm stays where it was built."""
    monkeypatch.delenv("DRA_HELM_BIN_DIR", raising=False)
    default = binaries.helm_path()
    monkeypatch.setenv("DRA_KUBE_BIN_DIR", str(tmp_path / "v1.34.4"))
    assert binaries.helm_path() == default
    version = binaries.pinned_module_version(binaries.HELM_MODULE / "go.mod", "helm.sh/helm/v4")
    assert default == binaries.CACHE_ROOT / f"helm-{version}" / "helm"
    assert binaries.bin_dir() == tmp_path / "v1.34.4"


def test_helm_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DRA_HELM_BIN_DIR", str(tmp_path))
    assert binaries.helm_path() == tmp_path / "helm"
