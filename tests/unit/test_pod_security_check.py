"""The controller's report of the plugin's pods refused by Pod Security (controller/run/podsecurity.py).

The Events are shaped as the DaemonSet controller records a refused pod creation: reason FailedCreate
on the DaemonSet, the message `Error creating: pods "<name>" is forbidden: violates PodSecurity
"<level>:<version>": <what>`, the words PodSecurity admission uses; the real API server's own are
checked in tests/integration/test_chart_install.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from controller.run.podsecurity import REASON, PodSecurityCheck, refusals

NAMESPACE = "draplugin"
REFUSED = (
    'Error creating: pods "draplugin-kubelet-plugin-4xk2q" is forbidden: violates PodSecurity '
    '"baseline:latest": hostPath volumes (volumes "plugins-registry", "plugin-dir", "cdi")'
)


def failed_create(uid: str, message: str, name: str = "draplugin-kubelet-plugin") -> dict[str, Any]:
    return {
        "reason": "FailedCreate",
        "message": message,
        "involvedObject": {"kind": "DaemonSet", "namespace": NAMESPACE, "name": name, "uid": uid},
    }


class EventApi:
    """GET of the namespace's Events (the given ones) and POST of new ones (recorded)."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.posted: list[dict[str, Any]] = []

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        assert path == f"/api/v1/namespaces/{NAMESPACE}/events"
        assert query == {"fieldSelector": "involvedObject.kind=DaemonSet,reason=FailedCreate"}
        return {"items": self.events}

    def create(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        assert path == f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events"
        self.posted.append(dict(body))
        return dict(body)


def test_a_pod_security_refusal_is_read_from_the_daemonset_controllers_events() -> None:
    other = failed_create("u2", 'Error creating: pods "x" is forbidden: exceeded quota: compute')
    (refusal,) = refusals([failed_create("u1", REFUSED), other])
    assert (refusal.name, refusal.uid, refusal.level) == ("draplugin-kubelet-plugin", "u1", "baseline")
    assert refusal.detail.startswith("hostPath volumes")


def test_each_refused_daemonset_is_logged_and_gets_one_event_naming_the_fix(caplog: Any) -> None:
    api = EventApi([failed_create("u1", REFUSED), failed_create("u1", REFUSED)])
    controller = "gpu.draplugin.dev/dra-controller"
    check = PodSecurityCheck(api, NAMESPACE, controller=controller, instance="c-0")  # type: ignore[arg-type]
    assert [r.uid for r in check.check_once()] == ["u1"]
    (event,) = api.posted
    assert (event["reason"], event["type"]) == (REASON, "Warning")
    assert event["regarding"] == {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "namespace": NAMESPACE,
        "name": "draplugin-kubelet-plugin", "uid": "u1",
    }  # fmt: skip
    fix = f"kubectl label namespace {NAMESPACE} --overwrite pod-security.kubernetes.io/enforce=privileged"
    assert fix in event["note"] and '"baseline"' in event["note"]
    message = "Pod Security refuses the kubelet plugin's pods"
    (logged,) = [r for r in caplog.records if r.getMessage() == message]
    assert fix in getattr(logged, "detail", "")
    # Reported once: the DaemonSet controller repeats its Event, we do not.
    assert check.check_once() == [] and len(api.posted) == 1
