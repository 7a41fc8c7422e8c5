"""The Helm chart: `helm lint`, rendering with default and non-default values,
schema checks, and every rendered object accepted by the real API server
(server-side dry run).

Helm is built from its Go module by tests/cluster/build_helm.sh into a
directory shared by every Kubernetes release; a missing binary fails the tests. The
chart running for real (our image, the plugin as its DaemonSet pod) is
tests/e2e/test_chart_live.py.

Size: one file for the chart, whose renders are shared fixtures.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from devcluster.binaries import REPO_ROOT, pinned_kubernetes_version
from devcluster.controlplane import ControlPlane
from tests.kube.chart import CHART, FAKE_GPU_VALUES, HelmError, run_helm

DRIVER = "gpu.draplugin.dev"

# Values that move every knob away from its default.
NON_DEFAULT_VALUES: dict[str, Any] = {
    "driverName": "gpu.example.com",
    "fullnameOverride": "gpudra",
    "image": {"repository": "registry.example.com/gpudra", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "logFormat": "json",
    "logLevel": "debug",
    "kubeletPlugin": {
        "backend": "fake",
        "fakeGpus": {"gpus": [{"model": "L4", "count": 2}]},
        "kubeletRootDir": "/data/kubelet",
        "cdiRoot": "/etc/cdi",
        "stateDir": "/data/gpudra",
        "privileged": False,
        "hostNetwork": True,
        "gpuNodeAffinity": False,
        "nodeSelector": {"example.com/gpu": "yes"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}],
        "livenessProbe": {"enabled": False},
        "extraEnv": [{"name": "EXTRA", "value": "1"}],
        "extraArgs": ["--rediscover-interval=30s"],
        "podAnnotations": {"example.com/team": "ml"},
        "deviceStatus": True,
        "devicePluginCoexistence": "split:1",
        "devicePluginDir": "/data/device-plugins",
    },
    "controller": {
        "replicas": 2,
        "hostNetwork": True,
        "leaderElection": {"leaseDuration": "30s"},
        "priorityClassName": "system-cluster-critical",
        "featureGates": {"DRAPrioritizedList": False},
        "extraArgs": ["--event-after-seconds=30"],
    },
    "metrics": {"port": 9400, "service": {"enabled": True}},
    "deviceClasses": {
        "mig": False,
        "byModel": [
            {
                "name": "a100.gpu.example.com",
                "productName": "NVIDIA A100-SXM4-40GB",
                "extendedResourceName": "example.com/a100",
            },
            {
                "name": "shared-l4.gpu.example.com",
                "productName": "NVIDIA L4",
                "config": {
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
                },
            },
        ],
    },
}


def render_chart(
    home: Path,
    values: Mapping[str, Any] | None = None,
    *,
    release: str = "draplugin",
    namespace: str = "draplugin-system",
    show_only: Sequence[str] = (),
    kube_version: str | None = None,
) -> list[dict[str, Any]]:
    """`helm template` the chart and return its objects (empty documents dropped)."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    args += ["--kube-version", kube_version or pinned_kubernetes_version()]
    if values:
        values_file = home / f"values-{uuid.uuid4().hex[:8]}.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        args += ["--values", str(values_file)]
    for template in show_only:
        args += ["--show-only", template]
    return [doc for doc in yaml.safe_load_all(run_helm(args, home)) if doc]


def by_kind(objects: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def only(objects: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def container_env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container.get("env", [])}


def dry_run_apply(dynamic: DynamicClient, obj: Mapping[str, Any], namespace: str) -> None:
    """Ask the API server to admit `obj` without persisting it (dryRun=All).

    A create is the plain test; an object that already exists in the shared
    cluster (a DeviceClass another test installed) is checked as a
    server-side apply instead, which validates and admits it just the same.
    """
    resource = dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    target_ns = namespace if resource.namespaced else None
    try:
        resource.create(body=dict(obj), namespace=target_ns, dry_run="All")
    except ApiException as err:  # the dynamic client's errors subclass it
        if err.status != 409:
            raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} rejected: {err.body}") from err
        resource.server_side_apply(
            body=dict(obj),
            name=obj["metadata"]["name"],
            namespace=target_ns,
            field_manager="chart-test",
            force_conflicts=True,
            dry_run="All",
        )


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path


# --- helm lint and schema -----------------------------------------------------------------------------


def test_helm_lint_strict_with_default_and_non_default_values(helm_home: Path) -> None:
    out = run_helm(["lint", "--strict", str(CHART)], helm_home)
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    values_file = helm_home / "values.yaml"
    values_file.write_text(yaml.safe_dump(NON_DEFAULT_VALUES))
    out = run_helm(["lint", "--strict", str(CHART), "--values", str(values_file)], helm_home)
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"kubeletPlugin": {"backend": "cuda"}}, "backend"),
        ({"driverName": "Not_A_DNS_Name"}, "driverName"),
        ({"kubeletPlugin": {"kubeletRootDir": "var/lib/kubelet"}}, "kubeletRootDir"),
        ({"logFormat": "xml"}, "logFormat"),
        ({"kubeletPlugin": {"backend": "fake", "unknownKnob": 1}}, "unknownKnob"),
        ({"deviceClasses": {"byModel": [{"name": "x.gpu.draplugin.dev"}]}}, "productName"),
        ({"kubeletPlugin": {"gpuNodeAffinity": "yes"}}, "gpuNodeAffinity"),
        ({"metrics": {"port": -1}}, "port"),
    ],
)
def test_schema_rejects_bad_values(helm_home: Path, values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(HelmError, match=complaint):
        render_chart(helm_home, values)


def test_several_controller_replicas_need_leader_election(helm_home: Path) -> None:
    with pytest.raises(HelmError, match="leaderElection"):
        render_chart(helm_home, {"controller": {"replicas": 2, "leaderElection": {"enabled": False}}})


# --- rendering ----------------------------------------------------------------------------------------


def test_default_render_has_every_component(helm_home: Path) -> None:
    objects = render_chart(helm_home)
    kinds = sorted({obj["kind"] for obj in objects})
    assert kinds == sorted([
        "ClusterRole", "ClusterRoleBinding", "DaemonSet", "Deployment", "DeviceClass", "Role",
        "RoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])  # fmt: skip
    assert sorted(dc["metadata"]["name"] for dc in by_kind(objects, "DeviceClass")) == [
        DRIVER,
        f"mig.{DRIVER}",
    ]
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment", "ServiceAccount", "Role", "RoleBinding"):
            assert obj["metadata"]["namespace"] == "draplugin-system", obj["metadata"]["name"]


def test_daemonset_defaults(helm_home: Path) -> None:
    ds = only(render_chart(helm_home), "DaemonSet")
    spec = ds["spec"]
    # New plugin pod up before the old one goes: the node never lacks a driver.
    assert spec["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["draplugin", "run"]
    env = container_env(container)
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["DRIVER_NAME"] == DRIVER
    assert env["KUBELET_ROOT_DIR"] == "/var/lib/kubelet"
    assert env["CDI_ROOT"] == "/var/run/cdi"
    assert env["STATE_DIR"] == "/var/lib/draplugin"
    assert env["BACKEND"] == "nvml"
    assert env["METRICS_PORT"] == "8080"
    assert env["NVML_LIB_PATH"] == "/driver-root"
    # Driver files: CDI specs name host paths; the plugin reads them through its mount.
    assert env["DRIVER_ROOT"] == "/"
    assert env["DRIVER_ROOT_MOUNT"] == "/driver-root"
    # Kubelet gRPC probes on the plugin's TCP health port (they cannot dial unix sockets).
    assert env["HEALTHCHECK_PORT"] == "51515"
    assert container["livenessProbe"]["grpc"] == {"port": 51515}
    assert container["startupProbe"]["grpc"] == {"port": 51515}
    assert container["securityContext"]["privileged"] is True
    # The pod network by default; ports declared for the probes and scraping.
    assert "hostNetwork" not in pod
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "metrics": 8080,
        "healthcheck": 51515,
    }
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Sockets and CDI specs live at the same path inside and outside the pod.
    for name, path in [
        ("plugins-registry", "/var/lib/kubelet/plugins_registry"),
        ("plugin-dir", f"/var/lib/kubelet/plugins/{DRIVER}"),
        ("cdi", "/var/run/cdi"),
        ("state", "/var/lib/draplugin"),
    ]:
        assert mounts[name]["mountPath"] == path
        assert volumes[name]["hostPath"]["path"] == path
    assert volumes["driver-root"]["hostPath"]["path"] == "/"
    assert mounts["driver-root"] == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    # gpuNodeAffinity (default true): NVIDIA's GPU node labels (test_chart_install.py), no nodeSelector.
    assert "nodeSelector" not in pod
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]


@pytest.mark.parametrize("host_network", [False, True], ids=["pod-network", "host-network"])
def test_plugin_listeners_bind_the_pods_ip_and_roll_with_surge(helm_home: Path, host_network: bool) -> None:
    """Health and metrics bind the pod's IP (the node's under host networking: where the kubelet
    probes and scrapers connect), not every address; the rollout keeps its surge pod on any node: no
    host port is declared for the scheduler to refuse it, and the listeners share their ports."""
    values = {"kubeletPlugin": {"hostNetwork": host_network}, "metrics": {"port": 8080}}
    ds = only(render_chart(helm_home, values), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = container_env(container)
    assert env["HEALTHCHECK_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["METRICS_ADDRESS"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert ds["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    ports = container.get("ports") or []
    assert not [p for p in ports if "hostPort" in p]
    if host_network:
        assert pod["hostNetwork"] is True
        assert ports == []


def test_controller_on_the_host_network_rolls_without_two_pods_on_one_port(helm_home: Path) -> None:
    """The controller's metrics port is the node's under host networking, and its listener is not
    shared: a surge pod on the same node would crash-loop on it, so the old pod goes first there."""
    on_host = only(render_chart(helm_home, {"controller": {"hostNetwork": True}}), "Deployment")
    assert on_host["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    without_port = render_chart(helm_home, {"controller": {"hostNetwork": True}, "metrics": {"port": 0}})
    assert "strategy" not in only(without_port, "Deployment")["spec"]
    assert "strategy" not in only(render_chart(helm_home), "Deployment")["spec"]  # the Deployment's default


@pytest.mark.parametrize("values_file", [None, FAKE_GPU_VALUES], ids=["defaults", "values-fake-gpus"])
def test_plugin_pod_has_the_runtime_default_seccomp_profile(
    helm_home: Path, values_file: Path | None
) -> None:
    values = yaml.safe_load(values_file.read_text()) if values_file else None
    pod = only(render_chart(helm_home, values), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    assert "seccompProfile" not in container["securityContext"]


def test_non_default_values_reach_every_object(helm_home: Path) -> None:
    objects = render_chart(helm_home, NON_DEFAULT_VALUES)
    ds = only(objects, "DaemonSet")
    assert ds["metadata"]["name"] == "gpudra-kubelet-plugin"
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "registry.example.com/gpudra:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == ["--log-format=json", "--log-level=debug", "--rediscover-interval=30s"]
    env = container_env(container)
    assert env["DRIVER_NAME"] == "gpu.example.com"
    assert env["BACKEND"] == "fake"
    assert env["KUBELET_ROOT_DIR"] == "/data/kubelet"
    assert env["EXTRA"] == "1"
    assert env["DEVICE_PLUGIN_COEXISTENCE"] == "split:1"
    assert env["DEVICE_PLUGIN_DIR"] == "/data/device-plugins"
    assert "NVML_LIB_PATH" not in env
    assert "livenessProbe" not in container
    assert "startupProbe" not in container
    assert "HEALTHCHECK_PORT" not in env
    # Fake GPUs get real device nodes: mknod is the one capability the fake backend keeps.
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["MKNOD"]}
    assert "privileged" not in container["securityContext"]
    # Host network: no containerPorts (each would be a hostPort, blocking the surge pod).
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "ports" not in container
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths == {
        "plugins-registry": "/data/kubelet/plugins_registry",
        "plugin-dir": "/data/kubelet/plugins/gpu.example.com",
        "cdi": "/etc/cdi",
        "state": "/data/gpudra",
        "device-plugins": "/data/device-plugins",
        "host-proc": "/proc",  # usage metrics: GPU processes to pods (test_chart_usage.py)
    }
    assert pod["nodeSelector"] == {"example.com/gpu": "yes"}
    assert "affinity" not in pod
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "ml"
    assert "checksum/fake-gpus" in annotations
    assert env["DRAPLUGIN_FAKE_CONFIG"] == "/etc/draplugin/fake-gpus.yaml"
    fake = only(objects, "ConfigMap")
    assert yaml.safe_load(fake["data"]["fake-gpus.yaml"]) == {"gpus": [{"model": "L4", "count": 2}]}
    assert {"name": "fake-gpus", "configMap": {"name": fake["metadata"]["name"]}} in pod["volumes"]

    deployment = only(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    assert "--leader-election-lease-duration=30s" in args
    assert "--driver-name=gpu.example.com" in args
    controller_pod = deployment["spec"]["template"]["spec"]
    assert controller_pod["hostNetwork"] is True
    assert "ports" not in controller_pod["containers"][0]
    assert controller_pod["containers"][0]["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 9400}

    service = only(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"][0]["port"] == 9400
    assert service["spec"]["ports"][0]["targetPort"] == 9400

    classes = {dc["metadata"]["name"]: dc for dc in by_kind(objects, "DeviceClass")}
    assert sorted(classes) == ["a100.gpu.example.com", "gpu.example.com", "shared-l4.gpu.example.com"]
    l4 = classes["shared-l4.gpu.example.com"]["spec"]
    assert 'productName == "NVIDIA L4"' in l4["selectors"][0]["cel"]["expression"]
    assert l4["config"] == [{
        "opaque": {
            "driver": "gpu.example.com",
            "parameters": {
                "apiVersion": "gpu.example.com/v1alpha1",
                "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Short"}},
            },
        },
    }]  # fmt: skip

    roles = by_kind(objects, "ClusterRole")
    plugin_role = next(r for r in roles if r["metadata"]["name"].endswith("kubelet-plugin"))
    # deviceStatus on (1.36+): status writes, narrowed to this driver's claims on the plugin's node.
    driver_rule = next(rule for rule in plugin_role["rules"] if "resourceclaims/driver" in rule["resources"])
    assert driver_rule["resourceNames"] == ["gpu.example.com"]
    assert sorted(driver_rule["verbs"]) == ["associated-node:patch", "associated-node:update"]
    assert any("resourceclaims/status" in rule["resources"] for rule in plugin_role["rules"])
    policies = {
        p["metadata"]["name"].rsplit("-", 1)[-1]: p for p in by_kind(objects, "ValidatingAdmissionPolicy")
    }
    assert any(
        '"gpu.example.com"' in v["expression"] for v in policies["resourceslices"]["spec"]["validations"]
    )
    # The claim-config policy checks this driver's configs and its apiVersion.
    problems = policies["config"]["spec"]["variables"][2]["expression"]
    assert 'c.opaque.driver == "gpu.example.com"' in problems and '"gpu.example.com/v1alpha1"' in problems


@pytest.mark.parametrize(
    ("kube_version", "values", "expected"),
    [
        ("v1.34.4", {}, "off"),
        ("v1.35.2", {}, "off"),
        ("v1.36.0", {}, "on"),
        ("v1.37.2", {}, "on"),
        ("v1.37.2", {"kubeletPlugin": {"deviceStatus": False}}, "off"),
    ],
)
def test_device_status_defaults_on_only_where_the_server_narrows_the_grant(
    helm_home: Path, kube_version: str, values: dict[str, Any], expected: str
) -> None:
    """`auto`: the plugin writes status.devices, and may, only on 1.36+; its setting follows the RBAC."""
    objects = render_chart(helm_home, values, kube_version=kube_version)
    plugin_role = next(
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("kubelet-plugin")
    )
    resources = {res for rule in plugin_role["rules"] for res in rule["resources"]}
    granted = {"resourceclaims/status", "resourceclaims/driver"} <= resources
    assert granted is (expected == "on")
    if expected == "off":
        assert not resources & {"resourceclaims/status", "resourceclaims/driver"}
    (container,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container_env(container)["DEVICE_STATUS"] == expected


def test_mps_daemon_pods_get_pods_of_the_release_namespace_only(helm_home: Path) -> None:
    """MPS daemons as Pods (the default): the plugin may get/list/create/delete pods of its own
    namespace, nothing more; the daemon Pods run this image; process mode grants nothing."""
    objects = render_chart(helm_home)
    (role,) = [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("kubelet-plugin-mps")]
    assert role["metadata"]["namespace"] == "draplugin-system"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]}
    ]
    (binding,) = [
        b for b in by_kind(objects, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]
    ]
    (subject,) = binding["subjects"]
    ds = only(objects, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert subject["name"] == pod["serviceAccountName"] and subject["namespace"] == "draplugin-system"
    plugin_role = next(
        r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"].endswith("kubelet-plugin")
    )
    assert all("pods" not in rule["resources"] for rule in plugin_role["rules"])  # nothing cluster-wide
    env = container_env(pod["containers"][0])
    assert env["MPS_DAEMON"] == "pod" and env["MPS_DAEMON_IMAGE"] == pod["containers"][0]["image"]
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    process = render_chart(helm_home, {"kubeletPlugin": {"mpsDaemon": "process"}})
    assert not [r for r in by_kind(process, "Role") if r["metadata"]["name"].endswith("kubelet-plugin-mps")]
    assert (
        container_env(only(process, "DaemonSet")["spec"]["template"]["spec"]["containers"][0])["MPS_DAEMON"]
        == "process"
    )


def test_fake_gpus_mount_a_stand_in_driver_root_only_when_named(helm_home: Path) -> None:
    fake = {"kubeletPlugin": {"backend": "fake", "privileged": False}}
    none = only(render_chart(helm_home, fake), "DaemonSet")["spec"]["template"]["spec"]
    assert "DRIVER_ROOT" not in container_env(none["containers"][0])
    named = {"kubeletPlugin": {**fake["kubeletPlugin"], "fakeDriverRoot": "/opt/stand-in"}}
    pod = only(render_chart(helm_home, named), "DaemonSet")["spec"]["template"]["spec"]
    env = container_env(pod["containers"][0])
    assert (env["DRIVER_ROOT"], env["DRIVER_ROOT_MOUNT"]) == ("/opt/stand-in", "/driver-root")
    assert "NVML_LIB_PATH" not in env
    volume = next(v for v in pod["volumes"] if v["name"] == "driver-root")
    assert volume["hostPath"]["path"] == "/opt/stand-in"


@pytest.mark.parametrize("kube_version", ["v1.34.4", "v1.35.2"])
def test_device_status_is_refused_where_the_server_cannot_narrow_it(
    helm_home: Path, kube_version: str
) -> None:
    """Before 1.36 a resourceclaims/status grant is cluster-wide: the chart refuses it, naming the release."""
    with pytest.raises(HelmError, match=r"deviceStatus needs Kubernetes 1\.36"):
        render_chart(helm_home, {"kubeletPlugin": {"deviceStatus": True}}, kube_version=kube_version)
    # The default (auto: off there) renders on the same release.
    assert render_chart(helm_home, kube_version=kube_version)


def test_the_users_node_selector_is_added_to_the_gpu_node_affinity(helm_home: Path) -> None:
    off = {"kubeletPlugin": {"gpuNodeAffinity": False}}
    pod = only(render_chart(helm_home, off), "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "affinity" not in pod
    both = {"kubeletPlugin": {"nodeSelector": {"example.com/gpu": "yes"}}}
    pod = only(render_chart(helm_home, both), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"example.com/gpu": "yes"}
    assert "nodeAffinity" in pod["affinity"]


def test_metrics_port_zero_turns_the_endpoints_off(helm_home: Path) -> None:
    objects = render_chart(helm_home, {"metrics": {"port": 0}})
    (plugin,) = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert container_env(plugin)["METRICS_PORT"] == "0"
    assert [p["name"] for p in plugin["ports"]] == ["healthcheck"]
    (controller,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-port=0" in controller["args"]
    assert "ports" not in controller
    assert "livenessProbe" not in controller
    with pytest.raises(HelmError, match=r"metrics\.service\.enabled needs a metrics\.port"):
        render_chart(helm_home, {"metrics": {"port": 0, "service": {"enabled": True}}})


def test_fake_gpu_values_file_matches_the_examples_inventory(helm_home: Path) -> None:
    """deploy/helm/values-fake-gpus.yaml runs the inventory the examples' READMEs describe."""
    objects = render_chart(helm_home, yaml.safe_load(FAKE_GPU_VALUES.read_text()))
    inventory = yaml.safe_load(only(objects, "ConfigMap")["data"]["fake-gpus.yaml"])
    assert inventory == yaml.safe_load((REPO_ROOT / "examples" / "fake-gpus.yaml").read_text())
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "affinity" not in pod  # every node
    assert container_env(pod["containers"][0])["BACKEND"] == "fake"


def test_examples_deviceclasses_file_is_what_the_chart_installs(helm_home: Path) -> None:
    """examples/deviceclasses.yaml (used offline by dra-controller and by the e2e tests) is current."""
    rendered = render_chart(helm_home, show_only=["templates/deviceclasses.yaml"])
    for obj in rendered:
        obj["metadata"].pop("labels", None)
    text = (REPO_ROOT / "examples" / "deviceclasses.yaml").read_text()
    committed = [doc for doc in yaml.safe_load_all(text) if doc]
    assert committed == rendered


def test_components_can_be_switched_off(helm_home: Path) -> None:
    objects = render_chart(
        helm_home,
        {
            "controller": {"enabled": False},
            "resourceSlicePolicy": {"enabled": False},
            "mpsDaemonPodPolicy": {"enabled": False},
            "claimConfigPolicy": {"enabled": False},
            "deviceClasses": {"enabled": False},
        },
    )
    kinds = {obj["kind"] for obj in objects}
    assert "Deployment" not in kinds
    assert "ValidatingAdmissionPolicy" not in kinds
    assert "DeviceClass" not in kinds
    assert "DaemonSet" in kinds


# --- the real API server accepts every object ---------------------------------------------------------


@pytest.fixture
def dynamic_client(kube_cluster: ControlPlane) -> Iterator[DynamicClient]:
    with kube_cluster.api_client() as api:
        yield DynamicClient(api)  # type: ignore[no-untyped-call]


@pytest.mark.cluster
@pytest.mark.parametrize(
    "values",
    [None, NON_DEFAULT_VALUES, yaml.safe_load(FAKE_GPU_VALUES.read_text())],
    ids=["default", "non-default", "values-fake-gpus"],
)
def test_api_server_accepts_every_rendered_object(
    helm_home: Path, dynamic_client: DynamicClient, test_namespace: str, values: dict[str, Any] | None
) -> None:
    release = f"chart-{uuid.uuid4().hex[:6]}"
    objects = render_chart(helm_home, values, release=release, namespace=test_namespace)
    assert objects
    for obj in objects:
        dry_run_apply(dynamic_client, obj, test_namespace)


@pytest.mark.cluster
def test_api_server_rejects_a_broken_object(dynamic_client: DynamicClient, test_namespace: str) -> None:
    """The dry run really validates: a DeviceClass with a CEL syntax error is refused."""
    bad: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"broken-{uuid.uuid4().hex[:6]}"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == "}}]},
    }
    with pytest.raises(AssertionError, match=r"compilation failed|[Ss]yntax error"):
        dry_run_apply(dynamic_client, bad, test_namespace)
    with pytest.raises(k8s.ApiException):
        # Nothing was stored by the dry runs.
        k8s.ResourceV1Api(dynamic_client.client).read_device_class(bad["metadata"]["name"])


@pytest.mark.parametrize(
    ("values", "expected"), [({}, "auto"), ({"kubeletPlugin": {"deviceMetadata": "off"}}, "off")]
)
def test_device_metadata_setting_reaches_the_plugin(
    helm_home: Path, values: dict[str, Any], expected: str
) -> None:
    """kubeletPlugin.deviceMetadata is the plugin's DEVICE_METADATA (docs/device-metadata.md)."""
    (container,) = only(render_chart(helm_home, values), "DaemonSet")["spec"]["template"]["spec"][
        "containers"
    ]
    assert container_env(container)["DEVICE_METADATA"] == expected
