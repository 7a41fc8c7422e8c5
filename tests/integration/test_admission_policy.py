"""The generated claim-config ValidatingAdmissionPolicy on a real kube-apiserver.

The chart's template (rendered by Helm) is applied as it ships; then every bad
config of the claimconfig test table is put into a ResourceClaim, a
ResourceClaimTemplate and a DeviceClass, and the API server must refuse each
at create with exactly prepare's message for that field (the path written for
where the config sits in that kind of object). Good configs, and configs of
other drivers, are accepted. Parameters that are not a JSON object are refused
by the API server's own validation before any policy runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster.controlplane import ControlPlane
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi
from tests.kube.chart import CHART, run_helm
from tests.unit.test_claimconfig import INVALID, PATH, doc

pytestmark = pytest.mark.cluster

RESOURCE = "/apis/resource.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
DRIVER = "gpu.draplugin.dev"
GOOD = doc({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
# Where config[1] sits in each kind, as prepare's PATH (spec.devices.config[1]) is written for a claim.
ROOTS = {
    "ResourceClaim": "spec.devices.config",
    "ResourceClaimTemplate": "spec.spec.devices.config",
    "DeviceClass": "spec.config",
}


@pytest.fixture(scope="module")
def api(kube_cluster: ControlPlane) -> Iterator[KubeApi]:
    with kube_cluster.api_client() as client:
        yield KubeApi(client)


@pytest.fixture(scope="module")
def policy(api: KubeApi, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The chart's policy and binding, rendered by Helm, applied; removed afterwards."""
    home = tmp_path_factory.mktemp("helm-home")
    rendered = run_helm(
        # A namespace of its own: the chart refuses `default` (allowDefaultNamespace).
        [
            "template",
            "t",
            str(CHART),
            "--namespace",
            "draplugin",
            "--show-only",
            "templates/claimconfig-policy.yaml",
        ],
        home,
    )
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    created = []
    for d in docs:
        plural = (
            "validatingadmissionpolicies"
            if d["kind"] == "ValidatingAdmissionPolicy"
            else ("validatingadmissionpolicybindings")
        )
        api.create(f"{ADMISSION}/{plural}", d)
        created.append(f"{ADMISSION}/{plural}/{d['metadata']['name']}")
    namespace = f"admission-{uuid.uuid4().hex[:8]}"
    api.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    # The policy is enforced once the API server's informers have it.
    wait_for(
        "the claim-config policy to be enforced",
        lambda: refusal(api, namespace, "ResourceClaim", INVALID[4][0]),
        30,
    )
    yield namespace
    api.delete(f"/api/v1/namespaces/{namespace}")
    for path in reversed(created):
        api.delete(path)


def configs(parameters: Any) -> list[dict[str, Any]]:
    """config[0]: another driver's (never looked at); config[1]: ours, the one under test."""
    return [
        {"opaque": {"driver": "other.example.com", "parameters": {"anything": ["goes"]}}},
        {"opaque": {"driver": DRIVER, "parameters": parameters}},
    ]


def manifest(kind: str, parameters: Any) -> tuple[str, dict[str, Any]]:
    name = f"cfg-{uuid.uuid4().hex[:10]}"
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.draplugin.dev"}}
    devices = {"requests": [request], "config": [dict(c, requests=["gpu"]) for c in configs(parameters)]}
    if kind == "ResourceClaim":
        return "resourceclaims", {"kind": kind, "metadata": {"name": name}, "spec": {"devices": devices}}
    if kind == "ResourceClaimTemplate":
        spec = {"spec": {"devices": devices}}
        return "resourceclaimtemplates", {"kind": kind, "metadata": {"name": name}, "spec": spec}
    return "deviceclasses", {
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"config": configs(parameters)},
    }


def refusal(api: KubeApi, namespace: str, kind: str, parameters: Any) -> str | None:
    """The API server's refusal of a dry-run create, or None when it accepts the object."""
    plural, body = manifest(kind, parameters)
    body["apiVersion"] = "resource.k8s.io/v1"
    collection = (
        f"{RESOURCE}/{plural}" if kind == "DeviceClass" else f"{RESOURCE}/namespaces/{namespace}/{plural}"
    )
    try:
        api.request("POST", collection, body, query={"dryRun": "All"})
    except ApiError as err:
        return str(err.body)
    return None


@pytest.mark.parametrize("kind", list(ROOTS))
@pytest.mark.parametrize(
    ("parameters", "message"), INVALID, ids=[m.split(": ")[0][len(PATH) :] for _, m in INVALID]
)
def test_every_bad_config_is_refused_at_create_with_prepares_message(
    api: KubeApi, policy: str, kind: str, parameters: Any, message: str
) -> None:
    refused = refusal(api, policy, kind, parameters)
    assert refused is not None, f"{kind} with {parameters!r} was accepted"
    expected = message.replace("spec.devices.config", ROOTS[kind], 1)
    if not isinstance(parameters, dict):
        # Parameters that are not an object never reach admission: the API server's own validation
        # refuses them, at the same field.
        assert f"{ROOTS[kind]}[1].opaque.parameters: Invalid value" in refused, refused
        assert "must be a valid JSON object" in refused, refused
        return
    assert expected in refused, refused


@pytest.mark.parametrize("kind", list(ROOTS))
def test_good_configs_are_accepted(api: KubeApi, policy: str, kind: str) -> None:
    for parameters in (
        doc(),
        GOOD,
        doc({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    ):
        assert refusal(api, policy, kind, parameters) is None
