"""The MPS control daemon of a claim as a Pod of its own, pinned to this node (`--mps-daemon=pod`).

Why a Pod (the design is in `draplugin.prepare.mps`): the plugin's container
takes every process in it down when it stops, so the daemon must live in
another unit the kubelet keeps running. One bare Pod per claim, created by the
plugin at prepare in the plugin's namespace:

- `nodeName` is this node (no scheduler round trip; tolerates every taint, as
  the plugin's DaemonSet does), `restartPolicy: Never` (a restarted daemon
  would serve none of the old one's clients);
- owned by the plugin's DaemonSet (the controller owner of the plugin's own
  Pod, found by `--pod-uid` among this node's Pods): the DaemonSet outlives a
  restart, crash or rolling update of the plugin pod, so the daemon does too,
  and `helm uninstall` deletes the DaemonSet, whose dependents the garbage
  collector then deletes, so no daemon Pod is left behind. Not a controller
  reference (the DaemonSet controller would then count the Pod as one of its
  own) and no blockOwnerDeletion. One owner only: the collector deletes a
  Pod only once all its owners are gone, so the Node is not a second one (a
  Pod bound to a deleted Node is deleted by the Pod garbage collector anyway);
- the chart's image pull secrets (`--mps-daemon-image-pull-secrets`), for the
  image the plugin itself was pulled with;
- it runs our own image (`--mps-daemon-image`, the chart passes the plugin's)
  with the driver root's `nvidia-cuda-mps-control -f` as its command, in the
  foreground, so the container lives exactly as long as the daemon;
- it mounts the claim's directory (`<state>/mps/<uid>`, pipe and log) at the
  same host path the plugin uses, its `shm` (the claim's tmpfs) as
  `/dev/shm`, the driver root where the plugin sees it, and the plugin's
  library views (`draplugin.prepare.drivertools.library_view`, links to the
  driver's libraries, read only) at their path, so the binary path, the pipe
  directory and the environment are the same in both: the container runs
  with exactly the environment `DriverTools.env` builds for the process mode
  (PATH with the root's binary directories, where the control daemon finds
  `nvidia-cuda-mps-server`; LD_LIBRARY_PATH the view, where the server finds
  libcuda and nothing else of the root, since our image's loader must not pick
  up the root's C library), and the plugin's control commands (readiness,
  limits, `quit`) reach the daemon through the named pipes on the host exactly
  as in the process mode;
- labels: `app.kubernetes.io/component=mps-control-daemon` and
  `<driver>/claim-uid=<uid>`; its name is `mps-<claim uid>`, so a plugin
  killed between the create and the ledger record still knows what to delete.

Prepare returns once the daemon answers; a Pod that fails (image, mount, a
crashing daemon) ends the wait at once with the kubelet's reason. Unprepare
sends `quit`, waits for the container to exit, then deletes the Pod (with its
UID as a precondition, so a newer Pod of the same name is never deleted).
Start-up deletes every daemon Pod on this node whose claim UID no prepared
claim of the checkpoint has.

RBAC: pods get, list, create, delete in the plugin's namespace only (a Role
of the chart: `kubeletplugin-rbac.yaml`; the list also finds the plugin's
own Pod). RBAC cannot say which Pods, so the chart's
ValidatingAdmissionPolicy (`kubeletplugin-pod-policy.yaml`) admits only Pods
of the shape `PodRunner.pod` builds, on the node the plugin's token is bound
to, owned by the release's DaemonSet, and deletes of those only: a change of
that shape here needs the same change there
(tests/integration/test_faults_plugin_powers.py applies the policy to the Pod
this module builds).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, cast

from dracommon.kubeapi import ApiError, KubeApi
from draplugin.prepare.mps import QUIT_TIMEOUT_S, MpsError
from draplugin.prepare.mpspaths import SHM_CONTAINER_PATH, SHM_DIR

log = logging.getLogger(__name__)

COMPONENT: Final = "mps-control-daemon"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
CONTAINER: Final = "mps-control-daemon"
# A Pod is scheduled onto this node directly, but the runtime still has to start the container.
READY_TIMEOUT_S: Final = 30.0
TERMINATION_GRACE_S: Final = 5
PULL_POLICIES: Final = ("Always", "IfNotPresent", "Never")
# Waiting reasons after which the kubelet only retries the same failure: stop waiting at once.
_STUCK: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)


def pod_name(claim_uid: str) -> str:
    return f"mps-{claim_uid}"


@dataclass(frozen=True, slots=True)
class PodSettings:
    """What every daemon Pod of this plugin gets."""

    namespace: str
    node_name: str
    driver_name: str
    image: str
    pull_policy: str = "IfNotPresent"
    # The driver root on the host and where this process (and so the Pod) sees it; None: not mounted.
    driver_root: str | None = None
    driver_root_mount: Path | None = None
    # Where the plugin keeps its library views (DriverTools.views, in the state dir): the daemon's
    # LD_LIBRARY_PATH is one of them. None: not mounted.
    library_views: Path | None = None
    # Real GPUs: the daemon opens the claim's device nodes (the plugin's DaemonSet is privileged too).
    privileged: bool = False
    priority_class: str | None = "system-node-critical"
    # The chart's imagePullSecrets: the daemon runs the image the plugin was pulled with.
    image_pull_secrets: tuple[str, ...] = ()
    # The plugin's own Pod (--pod-uid): its DaemonSet owns the daemon Pods. None: no owner.
    plugin_pod_uid: str | None = None

    @property
    def claim_label(self) -> str:
        return f"{self.driver_name}/claim-uid"


class PodRunner:
    """`DaemonRunner` (draplugin.prepare.mps) that runs each claim's daemon as a Pod on this node."""

    ready_timeout_s = READY_TIMEOUT_S

    def __init__(
        self,
        api: KubeApi,
        settings: PodSettings,
        *,
        quit_timeout_s: float = QUIT_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._settings = settings
        self._quit_timeout_s = quit_timeout_s
        self._owner: dict[str, Any] | None = None

    @property
    def _pods(self) -> str:
        return f"/api/v1/namespaces/{self._settings.namespace}/pods"

    # --- DaemonRunner ----------------------------------------------------------------------------

    def launch(self, uid: str, control: Path, env: Mapping[str, str], pipe: Path) -> dict[str, object]:
        name = pod_name(uid)
        # A Pod of the same name left by a plugin killed before it recorded the Pod: it is ours.
        self._delete(name, None, uid, wait=True)
        try:
            created = self._api.create(
                self._pods, self.pod(uid, control, env, pipe.parent, self._daemonset())
            )
        except ApiError as err:
            raise MpsError("MpsStartFailed", f"cannot create the MPS daemon pod {name}: {err}") from None
        log.info("MPS daemon pod created", extra={"claim_uid": uid, "pod": name})
        return {"pod": name, "podUid": created["metadata"]["uid"]}

    def failed(self, launched: Mapping[str, object]) -> str | None:
        pod = self._get(str(launched["pod"]))
        if pod is None or pod["metadata"]["uid"] != launched.get("podUid"):
            return f"its pod {launched['pod']} was deleted"
        return _failure(pod)

    def identity(self, pipe: Path, launched: Mapping[str, object]) -> dict[str, object]:
        return dict(launched)

    def alive(self, data: Mapping[str, object]) -> bool:
        name, pod_uid = data.get("pod"), data.get("podUid")
        if not isinstance(name, str) or not isinstance(pod_uid, str):
            return False
        try:
            pod = self._get(name)
        except MpsError:
            return False
        return pod is not None and pod["metadata"]["uid"] == pod_uid and _running(pod)

    def find(self, uid: str, state: str, data: Mapping[str, object], pipe: Path) -> object | None:
        pod = self._get(pod_name(uid))
        if pod is None or not self._ours(pod, uid):
            return None
        recorded = data.get("podUid")
        if state == "running" and recorded is not None and pod["metadata"]["uid"] != recorded:
            return None
        return (pod["metadata"]["name"], pod["metadata"]["uid"])

    def end(self, uid: str, found: object) -> None:
        name, pod_uid = cast(tuple[str, str], found)  # what `find` returned
        deadline = time.monotonic() + self._quit_timeout_s
        while time.monotonic() < deadline:
            pod = self._get(name)
            if pod is None or pod["metadata"]["uid"] != pod_uid:
                return
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                break  # `quit` ended the daemon, and with it the container
            time.sleep(0.2)
        self._delete(name, pod_uid, uid, wait=False)

    def end_unrecorded(self, uid: str) -> None:
        try:
            self._delete(pod_name(uid), None, uid, wait=False)
        except MpsError as err:  # unprepare must not fail on it: start-up's sweep deletes it later
            log.warning(
                "cannot look for an unrecorded MPS daemon pod", extra={"claim_uid": uid, "error": str(err)}
            )

    def claim_uids(self) -> set[str]:
        query = {
            "labelSelector": f"{COMPONENT_LABEL}={COMPONENT},{self._settings.claim_label}",
            "fieldSelector": f"spec.nodeName={self._settings.node_name}",
        }
        try:
            pods, _ = self._api.list(self._pods, query=query)
        except ApiError as err:  # start-up goes on; the next start sweeps again
            log.error("cannot list MPS daemon pods", extra={"error": str(err)})
            return set()
        return {str(p["metadata"]["labels"][self._settings.claim_label]) for p in pods}

    # --- the Pod -----------------------------------------------------------------------------------

    def pod(
        self,
        uid: str,
        control: Path,
        env: Mapping[str, str],
        claim_dir: Path,
        owner: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The daemon Pod of a claim (module docstring), owned by `owner` (`daemonset_owner`) if any."""
        s = self._settings
        # DriverTools.env, as the process mode has it: valid here because the Pod mounts the driver
        # root and the library views where this process sees them.
        environment = dict(env)
        mounts: list[dict[str, Any]] = [
            {"name": "claim", "mountPath": str(claim_dir)},
            # The server and its clients share memory segments: the same directory the claim's
            # containers get as /dev/shm through the CDI spec.
            {"name": "claim", "mountPath": SHM_CONTAINER_PATH, "subPath": SHM_DIR},
        ]
        volumes: list[dict[str, Any]] = [
            {"name": "claim", "hostPath": {"path": str(claim_dir), "type": "Directory"}}
        ]
        if s.driver_root is not None:
            mount: dict[str, Any] = {
                "name": "driver-root",
                "mountPath": str(s.driver_root_mount or s.driver_root),
            }
            mount["readOnly"] = True
            if s.privileged:  # real GPUs: the GPU operator mounts its root after pods start (as the chart)
                mount["mountPropagation"] = "HostToContainer"
            mounts.append(mount)
            volumes.append({"name": "driver-root", "hostPath": {"path": s.driver_root, "type": "Directory"}})
        if s.library_views is not None:
            mounts.append({"name": "driver-libs", "mountPath": str(s.library_views), "readOnly": True})
            volumes.append(
                {"name": "driver-libs", "hostPath": {"path": str(s.library_views), "type": "Directory"}}
            )
        if s.privileged:
            security: dict[str, Any] = {"privileged": True}
        else:
            security = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "readOnlyRootFilesystem": True,
            }
        spec: dict[str, Any] = {
            "nodeName": s.node_name,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
            "tolerations": [{"operator": "Exists"}],
            # The runtime's default syscall filter (a privileged container runs without one anyway);
            # the chart's admission policy (kubeletplugin-pod-policy.yaml) admits no other.
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": CONTAINER,
                    "image": s.image,
                    "imagePullPolicy": s.pull_policy,
                    "command": [str(control), "-f"],
                    "env": [{"name": k, "value": v} for k, v in sorted(environment.items())],
                    "volumeMounts": mounts,
                    "securityContext": security,
                }
            ],
            "volumes": volumes,
        }
        if s.priority_class:
            spec["priorityClassName"] = s.priority_class
        if s.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": name} for name in s.image_pull_secrets]
        metadata: dict[str, Any] = {
            "name": pod_name(uid),
            "namespace": s.namespace,
            "labels": {COMPONENT_LABEL: COMPONENT, "app.kubernetes.io/name": "draplugin", s.claim_label: uid},
        }
        if owner is not None:
            metadata["ownerReferences"] = [dict(owner)]
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}

    def _daemonset(self) -> dict[str, Any] | None:
        """The plugin's DaemonSet as owner, read once from the plugin's own Pod; None (with a warning,
        tried again at the next launch) when it cannot be found: the daemon still runs, but an
        uninstall would leave its Pod behind."""
        if self._owner is None and self._settings.plugin_pod_uid is not None:
            query = {"fieldSelector": f"spec.nodeName={self._settings.node_name}"}
            try:
                found, _ = self._api.list(self._pods, query=query)
            except ApiError as err:
                log.warning("MPS daemon pod without an owner", extra={"error": str(err)})
                return None
            mine = [p for p in found if p["metadata"].get("uid") == self._settings.plugin_pod_uid]
            self._owner = daemonset_owner(mine[0]) if mine else None
            if self._owner is None:
                log.warning(
                    "MPS daemon pod without an owner: the plugin's pod is not a DaemonSet's",
                    extra={"pod_uid": self._settings.plugin_pod_uid},
                )
        return self._owner

    # --- API -----------------------------------------------------------------------------------------

    def _ours(self, pod: Mapping[str, Any], uid: str) -> bool:
        labels = pod["metadata"].get("labels") or {}
        return bool(
            labels.get(COMPONENT_LABEL) == COMPONENT and labels.get(self._settings.claim_label) == uid
        )

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._api.get(f"{self._pods}/{name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise MpsError("MpsPodFailed", f"cannot read the MPS daemon pod {name}: {err}") from None

    def _delete(self, name: str, pod_uid: str | None, uid: str, *, wait: bool) -> None:
        """Delete the claim's daemon Pod (only that UID, when given; only a Pod labelled for the claim)."""
        pod = self._get(name)
        if (
            pod is None
            or not self._ours(pod, uid)
            or (pod_uid is not None and pod["metadata"]["uid"] != pod_uid)
        ):
            return
        options: dict[str, Any] = {"preconditions": {"uid": pod["metadata"]["uid"]}}
        if _running(pod):
            options["gracePeriodSeconds"] = 0  # `quit` already failed or was not possible
        try:
            self._api.delete(f"{self._pods}/{name}", options)
        except ApiError as err:
            if err.status not in (404, 409):  # gone, or another Pod of that name now: not ours to delete
                raise MpsError("MpsPodFailed", f"cannot delete the MPS daemon pod {name}: {err}") from None
        log.info("MPS daemon pod deleted", extra={"claim_uid": uid, "pod": name})
        deadline = time.monotonic() + self._quit_timeout_s
        while wait and time.monotonic() < deadline and self._get(name) is not None:
            time.sleep(0.2)


def daemonset_owner(plugin_pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The owner reference of the daemon Pods: the plugin Pod's controlling DaemonSet, neither as
    their controller nor blocking its deletion (module docstring); None when no DaemonSet controls it."""
    for ref in plugin_pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "DaemonSet" and ref.get("apiVersion") == "apps/v1":
            return {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ref["name"], "uid": ref["uid"]}
    return None


def _running(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    containers = status.get("containerStatuses") or []
    return any(c.get("name") == CONTAINER and "running" in (c.get("state") or {}) for c in containers)


def _failure(pod: Mapping[str, Any]) -> str | None:
    """Why the daemon Pod can no longer come up, from its status; None while it may still."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated") or {}
        if waiting.get("reason") in _STUCK:
            return f"{waiting['reason']}: {waiting.get('message', '')}".strip()
        if terminated:
            return (
                f"the daemon exited with {terminated.get('exitCode')} ({terminated.get('reason', '')}): "
                f"{terminated.get('message', '')}"
            ).strip()
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"pod {status['phase']}: {status.get('reason', '')} {status.get('message', '')}".strip()
    if pod["metadata"].get("deletionTimestamp"):
        return "its pod is being deleted"
    return None
