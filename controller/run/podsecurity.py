"""The kubelet plugin's pods refused by Pod Security admission: say so, and what fixes it.

Every mode of the plugin needs its namespace's Pod Security level to be
`privileged`: host paths in every mode (kubelet sockets, CDI specs, state),
a privileged container for real GPUs, the MPS daemon Pods the same. Where the
namespace, or the cluster's default (an AdmissionConfiguration), enforces
`baseline` or `restricted`, the API server refuses each pod the DaemonSet
controller creates, and the DaemonSet controller records that only as
`FailedCreate` Events on the DaemonSet ("... violates PodSecurity
"baseline:latest": hostPath volumes ..."): the DaemonSet shows 0 pods and
nothing else says why. `helm install --create-namespace` makes an unlabelled
namespace, which the cluster's default then governs, so the install notes
cannot see it coming.

The controller's own pod passes `restricted` (non-root, no privilege, every
capability dropped, the runtime's seccomp profile) and so runs there. With
`--plugin-namespace` (the chart passes its release namespace) the leader
reads those Events every CHECK_INTERVAL_S and, once per DaemonSet, logs an
error and records a `PodSecurityRefused` Warning Event on the DaemonSet that
names the level and the `kubectl label` command that fixes it.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from controller.run.leader import micro_time
from dracommon.eventnote import event_note
from dracommon.kubeapi import ApiError, KubeApi

log = logging.getLogger(__name__)

REASON: Final = "PodSecurityRefused"
CHECK_INTERVAL_S: Final = 30.0
ENFORCE_LABEL: Final = "pod-security.kubernetes.io/enforce"
# How PodSecurity admission words a refusal: `violates PodSecurity "baseline:latest": ...`.
_VIOLATION: Final = re.compile(r'violates PodSecurity "([a-z]+)(?::[^"]*)?"')


@dataclass(frozen=True)
class Refusal:
    """A DaemonSet whose pods Pod Security refused, at `level`; `detail` is what it objected to."""

    namespace: str
    name: str
    uid: str
    level: str
    detail: str


def refusals(events: Iterable[Mapping[str, Any]]) -> list[Refusal]:
    """The DaemonSets that FailedCreate Events (core/v1, the DaemonSet controller's) show refused by
    Pod Security, one per DaemonSet UID, the latest Event's words."""
    found: dict[str, Refusal] = {}
    for event in events:
        if event.get("reason") != "FailedCreate":
            continue
        target = event.get("involvedObject") or {}
        message = str(event.get("message") or "")
        match = _VIOLATION.search(message)
        if target.get("kind") != "DaemonSet" or match is None:
            continue
        uid = str(target.get("uid") or "")
        found[uid] = Refusal(
            namespace=str(target.get("namespace") or ""),
            name=str(target.get("name") or ""),
            uid=uid,
            level=match.group(1),
            detail=message[match.end() :].lstrip(": ").strip(),
        )
    return list(found.values())


def explain(refusal: Refusal) -> str:
    """What is wrong and the command that fixes it (docs/troubleshooting.md has the same)."""
    return (
        f"Pod Security refuses the kubelet plugin's pods: namespace {refusal.namespace} enforces level "
        f'"{refusal.level}", and the plugin needs "privileged" (host paths in every mode, a privileged '
        f"container for real GPUs). Fix: kubectl label namespace {refusal.namespace} --overwrite "
        f"{ENFORCE_LABEL}=privileged. Refused for: {refusal.detail}"
    )


def refusal_event(refusal: Refusal, controller: str, instance: str) -> dict[str, Any]:
    """An events.k8s.io/v1 Warning on the DaemonSet; `controller` is `drivername.reporting_controller`."""
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{refusal.name}.{secrets.token_hex(8)}", "namespace": refusal.namespace},
        "eventTime": micro_time(),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": "CreatePods",
        "reason": REASON,
        "type": "Warning",
        "regarding": {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "namespace": refusal.namespace,
            "name": refusal.name,
            "uid": refusal.uid,
        },
        "note": event_note(explain(refusal)),
    }


class PodSecurityCheck:
    """Reads the plugin namespace's FailedCreate Events; reports each refused DaemonSet once."""

    def __init__(
        self,
        api: KubeApi,
        namespace: str,
        *,
        controller: str,
        instance: str,
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._controller = controller
        self._instance = instance
        self._is_leader = is_leader
        self._reported: set[str] = set()

    def check_once(self) -> list[Refusal]:
        """The refusals newly reported by this call (logged, and an Event on each DaemonSet)."""
        query = {"fieldSelector": "involvedObject.kind=DaemonSet,reason=FailedCreate"}
        found = self._api.get(f"/api/v1/namespaces/{self._namespace}/events", query)
        new = [r for r in refusals(found.get("items") or []) if r.uid not in self._reported]
        for refusal in new:
            log.error(
                "Pod Security refuses the kubelet plugin's pods",
                extra={"daemonset": f"{refusal.namespace}/{refusal.name}", "detail": explain(refusal)},
            )
            try:
                path = f"/apis/events.k8s.io/v1/namespaces/{refusal.namespace}/events"
                self._api.create(path, refusal_event(refusal, self._controller, self._instance))
            except ApiError as err:  # the log line above still says it
                log.warning("cannot record the Pod Security Event", extra={"error": str(err)})
            self._reported.add(refusal.uid)
        return new

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if self._is_leader():
                try:
                    self.check_once()
                except ApiError as err:
                    if err.status == 403:  # a chart older than this controller grants no events list
                        log.warning("cannot read Events for Pod Security refusals", extra={"error": str(err)})
                        return
                    log.warning("Pod Security check failed; trying again", extra={"error": str(err)})
            stop.wait(CHECK_INTERVAL_S)
