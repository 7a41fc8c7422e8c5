"""`load_api_client`: kubeconfig file, in-cluster, default kubeconfig; no global state touched; the
credentials read without the kubernetes package, which serves only what they do not cover."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from dracommon.kubeapi import KubeConfigError, context_namespace, credentials, load_api_client
from dracommon.kubeapi.rest import RestClient


def server_of(api: object) -> str:
    assert isinstance(api, RestClient)
    return api.server


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
    assert server_of(api) == "https://a.example:6443"
    assert isinstance(api, RestClient) and api.headers() == {"Authorization": "Bearer secret-token"}
    other = load_api_client(str(path), context="b")
    assert server_of(other) == "https://b.example:6443"
    assert server_of(api) == "https://a.example:6443", "clients must not share configuration"
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
    ca.write_text("not really a cert")  # not read until a request is made
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    api = load_api_client()
    assert server_of(api) == "https://10.0.0.1:443"
    assert isinstance(api, RestClient) and api.headers() == {"Authorization": "Bearer sa-token"}
    # Naming a context means a kubeconfig is wanted, even inside a cluster.
    assert server_of(load_api_client(context="a")) == "https://kubeconfig.example"


def test_outside_a_cluster_kubeconfig_env_is_read_at_call_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    write_kubeconfig(tmp_path / "default", {"a": "https://default.example"}, "a")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "default"))
    assert server_of(load_api_client()) == "https://default.example"


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
    assert server_of(load_api_client()) == "https://present.example"


def test_the_service_account_token_is_read_again_after_a_rotation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setattr(credentials, "SERVICE_ACCOUNT_DIR", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    api = load_api_client()
    assert isinstance(api, RestClient) and api.server == "https://[fd00::1]:6443"
    assert api.headers() == {"Authorization": "Bearer first"}
    token.write_text("second")
    assert api.headers() == {"Authorization": "Bearer first"}, "read at most once a minute"
    api._token_read_at -= 61
    assert api.headers() == {"Authorization": "Bearer second"}


def test_merged_kubeconfigs_the_first_file_wins_and_paths_are_the_files_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "one").mkdir()
    first = tmp_path / "one" / "config"
    first.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://first.example/",
                                               "certificate-authority": "ca.pem",
                                               "tls-server-name": "api.internal"}}],
        "users": [{"name": "u", "user": {"tokenFile": "token",
                                         "client-certificate-data": "Y2VydA==", "client-key-data": "a2V5"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
    }))  # fmt: skip
    second = tmp_path / "second"
    second.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://second.example"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c"}}],
        "current-context": "x",
    }))  # fmt: skip
    paths = f"{first}:{second}"
    creds = credentials.from_kubeconfig(paths)
    assert creds.server == "https://first.example"
    assert creds.ca_file == str(tmp_path / "one" / "ca.pem")
    assert creds.token_file == str(tmp_path / "one" / "token")
    assert (creds.cert_data, creds.key_data, creds.tls_server_name) == (b"cert", b"key", "api.internal")
    monkeypatch.setenv("KUBECONFIG", paths)
    assert context_namespace() == "team"


@pytest.mark.parametrize(
    "user",
    [
        {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token"}},
        {"username": "admin", "password": "secret"},
    ],
)
def test_a_user_only_the_kubernetes_package_serves_gets_its_client(
    tmp_path: Path, user: dict[str, object]
) -> None:
    path = tmp_path / "kc"
    path.write_text(yaml.safe_dump({
        "clusters": [{"name": "c", "cluster": {"server": "https://lib.example"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }))  # fmt: skip
    api = load_api_client(str(path))
    assert isinstance(api, client.ApiClient) and api.configuration.host == "https://lib.example"


def test_a_kubeconfig_whose_context_names_no_cluster_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "kc"
    path.write_text(
        yaml.safe_dump({"contexts": [{"name": "x", "context": {"cluster": "gone"}}], "current-context": "x"})
    )
    with pytest.raises(KubeConfigError, match="names missing cluster 'gone'"):
        load_api_client(str(path))
