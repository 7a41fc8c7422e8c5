"""`load_api_client`: kubeconfig file, in-cluster, default kubeconfig; no global state touched."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.config import incluster_config

from dracommon.kubeapi import KubeConfigError, load_api_client


def write_kubeconfig(path: Path, servers: dict[str, str], current: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": n, "cluster": {"server": s}} for n, s in servers.items()],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in servers],
                "current-context": current,
            }
        )
    )
    return path


@pytest.fixture(autouse=True)
def not_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-default-kubeconfig"))


def test_explicit_file_and_context(tmp_path: Path) -> None:
    servers = {"a": "https://a.example:6443", "b": "https://b.example:6443"}
    path = write_kubeconfig(tmp_path / "kc", servers, "a")
    default_host_before = client.Configuration.get_default_copy().host
    api = load_api_client(str(path))
    assert api.configuration.host == "https://a.example:6443"
    assert api.configuration.api_key["BearerToken"] == "Bearer secret-token"
    other = load_api_client(str(path), context="b")
    assert other.configuration.host == "https://b.example:6443"
    assert api.configuration.host == "https://a.example:6443", "clients must not share configuration"
    assert client.Configuration.get_default_copy().host == default_host_before


def test_missing_explicit_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError, match="does not exist"):
        load_api_client(str(tmp_path / "nope"))


def test_unknown_context_is_a_clear_error(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kc", {"a": "https://a.example:6443"}, "a")
    with pytest.raises(KubeConfigError, match="cannot load cluster credentials"):
        load_api_client(str(path), context="missing")


def test_in_cluster_credentials_come_before_the_default_kubeconfig(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_kubeconfig(Path(str(tmp_path / "default")), {"a": "https://kubeconfig.example"}, "a")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "default"))
    token = tmp_path / "token"
    token.write_text("sa-token")
    ca = tmp_path / "ca.crt"
    ca.write_text("not really a cert")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = load_api_client()
    assert api.configuration.host == "https://10.0.0.1:443"
    # Naming a context means a kubeconfig is wanted, even inside a cluster.
    assert load_api_client(context="a").configuration.host == "https://kubeconfig.example"


def test_outside_a_cluster_kubeconfig_env_is_read_at_call_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_kubeconfig(tmp_path / "default", {"a": "https://default.example"}, "a")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "default"))
    assert load_api_client().configuration.host == "https://default.example"


def test_no_credentials_anywhere_is_a_clear_error(tmp_path: Path) -> None:
    # Said as missing: the library would call a file it never read "Invalid kube-config file".
    missing = f"no kubeconfig: \\$KUBECONFIG names {tmp_path}/no-default-kubeconfig, which does not exist"
    with pytest.raises(KubeConfigError, match=missing):
        load_api_client()


def test_a_kubeconfig_list_with_one_file_present_is_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_kubeconfig(tmp_path / "present", {"a": "https://present.example"}, "a")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/absent:{tmp_path}/present")
    assert load_api_client().configuration.host == "https://present.example"
