"""MPS daemons as Pods (`--mps-daemon=pod`): created at prepare, found again, deleted at unprepare and start.

The API is an in-memory stand-in that "runs" each created Pod the way a
kubelet would for this one container: it starts the Pod's command with the
Pod's environment as a local process (the stand-in `nvidia-cuda-mps-control
-f` of a fake driver root), reports it Running while it runs and Succeeded or
Failed once it exits, and kills it when the Pod is deleted. The plugin talks
to the daemon through the pipe directory exactly as it would under the chart.
The chart-level proof (a plugin pod deleted, the daemon Pod still serving) is
tests/e2e/test_chart_mps.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from dracommon.kubeapi import ApiError
from draplugin import config, crashpoints
from draplugin.cdi.driverfiles import DriverFiles
from draplugin.cdi.driverlayout import DriverRoot
from draplugin.kubelet.interface import ClaimRef
from draplugin.prepare import mps, mpspod
from draplugin.prepare.drivertools import DriverTools
from draplugin.prepare.mps import MpsDaemons
from draplugin.prepare.mpspod import PodRunner, PodSettings
from draplugin.prepare.plan import ClaimPlan, PlanError, plan_claim
from draplugin.prepare.sharing import SharingState
from tests.driverroot_layout import debian_layout
from tests.unit.sharing_fixtures import shm_bytes
from tests.unit.test_mps import Killed, mps_plan
from tests.unit.test_prepare_plan import DEVICES, claim_doc, result

# Module-level: inside PodApi, `list` is its method.
JsonList = list[dict[str, Any]]
Names = list[str]
NAMESPACE = "draplugin"
NODE = "node-a"
DRIVER = "gpu.draplugin.dev"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
PLUGIN_POD_UID = "3f1d5a6e-0000-4000-8000-000000000001"
# The plugin's own Pod as the DaemonSet controller makes it: a controller reference to its DaemonSet.
DAEMONSET_REF = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "name": "draplugin-kubelet-plugin",
    "uid": "9c0e7b1a-0000-4000-8000-000000000002",
    "controller": True,
    "blockOwnerDeletion": True,
}
PLUGIN_POD: dict[str, Any] = {
    "metadata": {
        "name": "draplugin-kubelet-plugin-x7k2p",
        "uid": PLUGIN_POD_UID,
        "ownerReferences": [DAEMONSET_REF],
    },
    "spec": {"nodeName": NODE},
}


class PodApi:
    """The four pod verbs of KubeApi, with each Pod's container run as a process; the plugin's own
    Pod (`others`: Pods of this node that run no process here) is listed too."""

    def __init__(self, fail_image: str | None = None, log_dir: Path | None = None) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.others: list[dict[str, Any]] = [PLUGIN_POD]
        # Where each container's output goes (what `kubectl logs` shows); None: this test's output.
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.created: list[dict[str, Any]] = []
        self.fail_image = fail_image

    def _status(self, name: str) -> dict[str, Any]:
        pod = self.pods[name]
        container = pod["spec"]["containers"][0]
        if container["image"] == self.fail_image:
            waiting = {"reason": "ErrImageNeverPull", "message": f"image {container['image']} is not present"}
            return {
                "phase": "Pending",
                "containerStatuses": [{"name": container["name"], "state": {"waiting": waiting}}],
            }
        code = self.processes[name].poll()
        if code is None:
            state: dict[str, Any] = {"running": {}}
            phase = "Running"
        else:
            state, phase = {"terminated": {"exitCode": code}}, "Succeeded" if code == 0 else "Failed"
        return {"phase": phase, "containerStatuses": [{"name": container["name"], "state": state}]}

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        name = path.removeprefix(PODS + "/")
        if name not in self.pods:
            raise ApiError(404, f'pods "{name}" not found', reason="NotFound")
        return {**self.pods[name], "status": self._status(name)}

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        assert path == PODS
        name = body["metadata"]["name"]
        if name in self.pods:
            raise ApiError(409, f'pods "{name}" already exists', reason="AlreadyExists")
        pod = {**body, "metadata": {**body["metadata"], "uid": str(uuid.uuid4())}}
        self.pods[name] = pod
        self.created.append(pod)
        container = body["spec"]["containers"][0]
        if container["image"] != self.fail_image:
            env = {e["name"]: e["value"] for e in container["env"]}
            out = open(self.log_dir / f"{name}.log", "ab") if self.log_dir is not None else None  # noqa: SIM115
            try:
                self.processes[name] = subprocess.Popen(
                    container["command"], env=env, start_new_session=True, stdout=out, stderr=out
                )
            finally:
                if out is not None:
                    out.close()
        return pod

    def delete(self, path: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        name = path.removeprefix(PODS + "/")
        pod = self.pods.get(name)
        if pod is None:
            raise ApiError(404, "not found", reason="NotFound")
        wanted = ((options or {}).get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != pod["metadata"]["uid"]:
            raise ApiError(409, "precondition failed", reason="Conflict")
        self._kill(name)
        del self.pods[name]
        return {}

    def list(self, path: str, *, query: Mapping[str, str]) -> tuple[JsonList, str]:
        assert path == PODS and query["fieldSelector"] == f"spec.nodeName={NODE}"
        if "labelSelector" not in query:  # every Pod of the node: the plugin's own among them
            return [*self.others, *self.pods.values()], "1"
        label, _, value = query["labelSelector"].partition(",")[0].partition("=")
        exists = query["labelSelector"].partition(",")[2]
        items = [
            p
            for p in self.pods.values()
            if p["metadata"]["labels"].get(label) == value and exists in p["metadata"]["labels"]
        ]
        return items, "1"

    def _kill(self, name: str) -> None:
        process = self.processes.pop(name, None)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)

    def running(self) -> Names:
        return sorted(n for n, p in self.processes.items() if p.poll() is None)

    def close(self) -> None:
        for name in list(self.processes):
            self._kill(name)


class PodNode:
    """A state dir, a stand-in driver root and the API: `sharing()` is one plugin process in pod mode."""

    def __init__(self, tmp_path: Path, api: PodApi) -> None:
        self.state = tmp_path / "state"
        # Stand-in tools: the tests assert the recorded commands; the real daemon Pod: test_drivertools.py.
        self.driver_root = debian_layout().build(tmp_path / "driver-root")
        self.api = api

    def sharing(self, image: str = "draplugin:test") -> SharingState:
        tools = DriverTools(DriverFiles(DriverRoot.at(str(self.driver_root))), self.state / "driver-libs")
        settings = PodSettings(
            namespace=NAMESPACE,
            node_name=NODE,
            driver_name=DRIVER,
            image=image,
            driver_root=str(self.driver_root),
            library_views=tools.views,
            image_pull_secrets=("regcred",),
            plugin_pod_uid=PLUGIN_POD_UID,
        )
        runner = PodRunner(self.api, settings, quit_timeout_s=5)  # type: ignore[arg-type]
        return SharingState(self.state, mps_daemons=MpsDaemons(tools, runner=runner, shm_bytes=shm_bytes()))

    def ask(self, sharing: SharingState, command: str, uid: str = "uid-a") -> str:
        assert sharing.mps is not None
        return sharing.mps.ask(uid, command, sharing.ledger)


@pytest.fixture
def api() -> Iterator[PodApi]:
    fake = PodApi()
    yield fake
    fake.close()  # a failing test must not leave daemons running


@pytest.fixture
def node(tmp_path: Path, api: PodApi) -> Iterator[PodNode]:
    node = PodNode(tmp_path, api)
    yield node
    api.close()
    for shm in node.state.glob("mps/*/shm"):  # nor a claim's tmpfs mounted
        mps.release_shm(shm)


def test_prepare_creates_a_daemon_pod_on_this_node_that_answers_with_the_limits(node: PodNode) -> None:
    sharing = node.sharing()
    sharing.apply(mps_plan())
    (pod,) = node.api.created
    claim_dir = sharing.mps_dir("uid-a")
    control = node.driver_root / "usr/bin" / mps.CONTROL
    spec = pod["spec"]
    assert pod["metadata"]["name"] == "mps-uid-a"
    assert pod["metadata"]["labels"][f"{DRIVER}/claim-uid"] == "uid-a"
    # Owned by the plugin's DaemonSet (helm uninstall takes it along; a plugin pod restart does not),
    # not as its controller (the DaemonSet controller would count it as one of its pods).
    assert pod["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": DAEMONSET_REF["name"],
            "uid": DAEMONSET_REF["uid"],
        }
    ]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert (spec["nodeName"], spec["restartPolicy"], spec["automountServiceAccountToken"]) == (
        NODE,
        "Never",
        False,
    )
    (container,) = spec["containers"]
    assert container["command"] == [str(control), "-f"]  # in the foreground: the container is the daemon
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(claim_dir / "pipe")
    # The environment DriverTools.env builds for the process mode: the root's binaries on PATH, the
    # library view (links to the driver's libraries only) as LD_LIBRARY_PATH, mounted read only.
    assert env["CUDA_VISIBLE_DEVICES"]
    assert env["PATH"].split(":")[0] == str(control.parent)
    views = node.state / "driver-libs"
    assert Path(env["LD_LIBRARY_PATH"]).parent == views
    assert (Path(env["LD_LIBRARY_PATH"]) / "libcuda.so.1").resolve().is_relative_to(node.driver_root)
    mounts = {m["mountPath"]: m.get("readOnly", False) for m in container["volumeMounts"]}
    assert mounts == {
        str(claim_dir): False,
        str(node.driver_root): True,
        "/dev/shm": False,
        str(views): True,
    }
    # The daemon's /dev/shm is the claim's shm directory, the one its containers get too.
    (shm,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert (shm["name"], shm["subPath"]) == ("claim", "shm")
    assert (claim_dir / "shm").is_dir() and (claim_dir / "shm").stat().st_mode & 0o7777 == 0o1777
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # Prepare returned once it answered, with the limits set through the control interface.
    assert node.ask(sharing, "get_default_active_thread_percentage") == "50.0"
    assert node.ask(sharing, "get_default_device_pinned_mem_limit 0") == "10240M"
    (entry,) = sharing.ledger.entries("uid-a", mps.KIND)
    assert (entry.state, entry.data["pod"], entry.data["podUid"]) == (
        "running",
        "mps-uid-a",
        pod["metadata"]["uid"],
    )


@pytest.mark.parametrize("plugin_pod", ["not found", "not a DaemonSet's"])
def test_a_plugin_outside_a_daemonset_still_runs_the_daemon_without_an_owner(
    node: PodNode, plugin_pod: str
) -> None:
    if plugin_pod == "not a DaemonSet's":
        node.api.others = [{**PLUGIN_POD, "metadata": {**PLUGIN_POD["metadata"], "ownerReferences": []}}]
    else:
        node.api.others = []
    sharing = node.sharing()
    sharing.apply(mps_plan())
    (pod,) = node.api.created
    assert "ownerReferences" not in pod["metadata"]
    assert node.ask(sharing, "get_default_active_thread_percentage") == "50.0"


def test_a_restarted_plugin_finds_the_daemon_pod_and_keeps_it(node: PodNode) -> None:
    node.sharing().apply(mps_plan())
    restarted = node.sharing()  # a new plugin process, the Pod untouched
    assert restarted.release_orphans(prepared={"uid-a"}) == []
    restarted.apply(mps_plan())  # start-up restores the prepared claim
    assert len(node.api.created) == 1 and node.api.running() == ["mps-uid-a"]
    assert node.ask(restarted, "get_default_active_thread_percentage") == "50.0"


def test_other_limits_replace_the_daemon_pod(node: PodNode) -> None:
    sharing = node.sharing()
    sharing.apply(mps_plan())
    sharing.apply(mps_plan(defaultActiveThreadPercentage=20))
    first, second = node.api.created
    assert first["metadata"]["uid"] != second["metadata"]["uid"] and node.api.running() == ["mps-uid-a"]
    assert node.ask(sharing, "get_default_active_thread_percentage") == "20.0"


def test_unprepare_quits_the_daemon_and_deletes_its_pod(node: PodNode) -> None:
    sharing = node.sharing()
    sharing.apply(mps_plan())
    sharing.release("uid-a")
    assert node.api.pods == {} and node.api.running() == []
    assert sharing.ledger.entries() == [] and not sharing.mps_dir("uid-a").exists()
    sharing.release("uid-a")  # repeated: nothing left to do


def test_kill_after_the_pod_is_created_leaves_a_pod_that_start_up_deletes(
    node: PodNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    def reach(at: str) -> None:
        if at == crashpoints.AFTER_MPS_START:
            raise Killed(at)

    monkeypatch.setattr(crashpoints, "reach", reach)
    with pytest.raises(Killed):
        node.sharing().apply(mps_plan())
    monkeypatch.undo()
    (entry,) = node.sharing().ledger.entries("uid-a", mps.KIND)
    assert entry.state == "starting" and entry.data["pod"] == "mps-uid-a"  # recorded before the wait
    restarted = node.sharing()
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert node.api.pods == {} and restarted.ledger.entries() == []
    restarted.apply(mps_plan())  # the kubelet's retry: one daemon Pod again
    assert node.api.running() == ["mps-uid-a"]


def test_kill_between_the_create_and_its_record_leaves_a_pod_that_start_up_deletes(
    node: PodNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed as the create returns, before the ledger has the Pod's UID: the name finds it."""
    create = node.api.create

    def create_then_die(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        create(path, body)
        raise Killed("after the pod create")

    monkeypatch.setattr(node.api, "create", create_then_die)
    with pytest.raises(Killed):
        node.sharing().apply(mps_plan())
    monkeypatch.undo()
    (entry,) = node.sharing().ledger.entries("uid-a", mps.KIND)
    assert entry.state == "starting" and "podUid" not in entry.data and node.api.running() == ["mps-uid-a"]
    restarted = node.sharing()
    assert restarted.release_orphans(prepared=set()) == ["uid-a"]
    assert node.api.pods == {} and restarted.ledger.entries() == []


def test_start_up_deletes_daemon_pods_of_claims_the_checkpoint_does_not_hold(node: PodNode) -> None:
    sharing = node.sharing()
    sharing.apply(mps_plan("uid-a"))
    sharing.apply(mps_plan("uid-b"))
    for shm in node.state.glob("mps/*/shm"):  # its tmpfs mounts stay with the old path
        mps.release_shm(shm)
    shutil.rmtree(node.state)  # the state dir lost (a new host path, say): only the Pods say
    restarted = node.sharing()
    assert restarted.release_orphans(prepared={"uid-a"}) == ["uid-b"]
    assert sorted(node.api.pods) == ["mps-uid-a"] and node.api.running() == ["mps-uid-a"]


def test_a_daemon_pod_that_cannot_start_fails_prepare_at_once_and_leaves_nothing(tmp_path: Path) -> None:
    api = PodApi(fail_image="missing:latest")
    node = PodNode(tmp_path, api)
    sharing = node.sharing(image="missing:latest")
    with pytest.raises(PlanError) as err:
        sharing.apply(mps_plan())
    assert err.value.reason == "MpsStartFailed" and "ErrImageNeverPull" in str(err.value)
    assert api.pods == {} and sharing.ledger.entries() == []


def test_a_daemon_that_exits_fails_prepare_with_its_exit_code(node: PodNode) -> None:
    control = node.driver_root / "usr/bin" / mps.CONTROL
    control.write_text('#!/bin/sh\n[ "$1" = -f ] && exit 3\nexit 1\n')
    sharing = node.sharing()
    with pytest.raises(PlanError) as err:
        sharing.apply(mps_plan())
    assert err.value.reason == "MpsStartFailed" and "exited with 3" in str(err.value)
    assert node.api.pods == {} and sharing.ledger.entries() == []


def test_pod_name_and_mode_settings() -> None:
    assert mpspod.pod_name("0f6e") == "mps-0f6e"
    base = {"node_name": NODE, "mps_daemon": "pod", "mps_daemon_image": "img:1", "pod_namespace": NAMESPACE}
    settings = config.load(
        {}, {"NODE_NAME": NODE, "MPS_DAEMON": "pod", "MPS_DAEMON_IMAGE": "img:1", "POD_NAMESPACE": NAMESPACE}
    )
    assert (settings.mps_daemon, settings.mps_daemon_image, settings.pod_namespace) == (
        "pod",
        "img:1",
        NAMESPACE,
    )
    assert config.load({"node_name": NODE}, {}).mps_daemon == "process"
    with pytest.raises(config.ConfigError, match=r"--mps-daemon \(MPS_DAEMON\)=pod needs --mps-daemon-image"):
        config.load({**base, "mps_daemon_image": None}, {})
    with pytest.raises(config.ConfigError, match="--pod-namespace"):
        config.load({**base, "pod_namespace": None}, {})
    with pytest.raises(config.ConfigError, match="is not one of process, pod"):
        config.load({**base, "mps_daemon": "deployment"}, {})
    with pytest.raises(config.ConfigError, match="is not one of Always, IfNotPresent, Never"):
        config.load({**base, "mps_daemon_image_pull_policy": "Sometimes"}, {})


class UnreachableApi:
    """An API server that is down: each call fails as KubeApi does once its retries are spent, and is
    counted (the real client spends about 20 s retrying before it fails so)."""

    def __init__(self) -> None:
        self.calls: Names = []

    def _down(self, verb: str, path: str) -> ApiError:
        self.calls.append(f"{verb} {path}")
        return ApiError(0, "connection refused", reason="Unreachable")

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        raise self._down("get", path)

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        raise self._down("create", path)

    def delete(self, path: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        raise self._down("delete", path)

    def list(self, path: str, *, query: Mapping[str, str]) -> tuple[JsonList, str]:
        raise self._down("list", path)


def exclusive_plan(uid: str) -> ClaimPlan:
    doc = claim_doc(uid, [result("r0", "gpu-0")], [])
    return plan_claim(ClaimRef("ns", uid, "claim"), doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def test_unprepare_of_a_claim_that_never_had_a_daemon_asks_no_api(tmp_path: Path) -> None:
    """A plain exclusive claim, or one this node never prepared: nothing of MPS on disk or in the
    ledger, so no daemon Pod of it can exist (prepare records the claim before it creates one) and
    unprepare must not wait on a stopped API server for it."""
    down = UnreachableApi()
    node = PodNode(tmp_path, down)  # type: ignore[arg-type]
    sharing = node.sharing()
    sharing.apply(exclusive_plan("uid-x"))
    sharing.release("uid-x")
    sharing.release("uid-never-seen")
    assert down.calls == []


def test_unprepare_still_finds_a_daemon_pod_whose_ledger_entry_was_lost(node: PodNode) -> None:
    """The claim's MPS directory says a daemon was started for it: the Pod is looked up by name."""
    sharing = node.sharing()
    sharing.apply(mps_plan())
    sharing.ledger.drop("uid-a", mps.KIND, mps.KEY)
    assert sharing.ledger.entries("uid-a", mps.KIND) == []
    sharing.release("uid-a")
    assert node.api.pods == {} and node.api.running() == []
