"""The settings that name Kubernetes objects are checked by the API server's own rules
(`dracommon.kubenames`): the namespace MPS daemon pods go to is a DNS label, image pull Secret
names are DNS subdomains, and the plugin's pod UID is a safe file-name part. Each is refused
with the flag, the value and the rule it breaks, before anything is created with it."""

from __future__ import annotations

import pytest

from draplugin import config

NODE = "node-1"
MPS_POD = {"node_name": NODE, "mps_daemon": "pod", "mps_daemon_image": "img:1"}


def test_the_mps_pod_namespace_is_a_dns_label() -> None:
    assert config.load({**MPS_POD, "pod_namespace": "gpu-system"}, {}).pod_namespace == "gpu-system"
    # A dot makes a valid subdomain, which no namespace can be.
    with pytest.raises(
        config.ConfigError, match=r"--pod-namespace \(POD_NAMESPACE\): 'gpu.system' is not a DNS label"
    ):
        config.load({**MPS_POD, "pod_namespace": "gpu.system"}, {})
    with pytest.raises(config.ConfigError, match="more than 63"):
        config.load({**MPS_POD, "pod_namespace": "a" * 64}, {})


def test_a_trailing_newline_is_not_part_of_a_valid_name() -> None:
    # A `$`-anchored pattern with re.match accepts "name\n"; the rules here use fullmatch.
    with pytest.raises(config.ConfigError, match="is not a DNS label"):
        config.load({**MPS_POD, "pod_namespace": "gpu-system\n"}, {})
    with pytest.raises(config.ConfigError, match="is not a valid pod UID"):
        config.load({"node_name": NODE, "pod_uid": "3f1d5a6e-0000-4000-8000-000000000001\n"}, {})


def test_image_pull_secret_names_are_dns_subdomains() -> None:
    settings = config.load(
        {"node_name": NODE}, {"MPS_DAEMON_IMAGE_PULL_SECRETS": "regcred, registry.example-creds"}
    )
    assert settings.mps_daemon_image_pull_secrets == ("regcred", "registry.example-creds")
    with pytest.raises(config.ConfigError, match=r"'Bad_Name' is not a DNS subdomain"):
        config.load({"node_name": NODE}, {"MPS_DAEMON_IMAGE_PULL_SECRETS": "regcred,Bad_Name"})


def test_the_pod_uid_is_checked_as_a_file_name_part() -> None:
    uid = "3f1d5a6e-0000-4000-8000-000000000001"
    assert config.load({"node_name": NODE, "pod_uid": uid}, {}).pod_uid == uid
    with pytest.raises(config.ConfigError, match=r"'\.\./x' is not a valid pod UID: it holds characters"):
        config.load({"node_name": NODE, "pod_uid": "../x"}, {})
    with pytest.raises(config.ConfigError, match="more than 128"):
        config.load({"node_name": NODE, "pod_uid": "a" * 129}, {})
