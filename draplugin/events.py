"""Kubernetes Events about claims and the node, posted without ever blocking or failing the caller.

A failed prepare shows up as the kubelet's `FailedPrepareDynamicResources`
on the pod; our Event on the ResourceClaim adds the specific reason
(`ClaimReplaced`, `InvalidConfig`, `DeviceInUse`, ...). Events are best
effort: posting happens on a worker thread, errors are logged, and repeats of
the same message within a window are dropped so kubelet retries do not flood
the API server.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Final, Protocol
from urllib.parse import quote

from dracommon.eventnote import event_note
from dracommon.kubeapi import ApiError, KubeApi
from dracommon.kubenames import DNS_SUBDOMAIN_MAX
from draplugin.kubelet.interface import ClaimRef

log = logging.getLogger(__name__)

REPEAT_WINDOW_S = 300.0
# Reasons of Events on the Node posted by more than one part of the plugin, or tested by name.
# Two machines (or two plugins with their own state directories) publish under one node name.
DUPLICATE_NODE_NAME: Final = "DuplicateNodeName"
# Event names are `<object name>.<16 hex>` like the kubelet's; the object part is cut to fit the
# DNS subdomain limit (a claim name may use all 253 characters).
_NAME_SUFFIX_HEX: Final = 16
_NAME_PREFIX_MAX: Final = DNS_SUBDOMAIN_MAX - 1 - _NAME_SUFFIX_HEX


def event_name(object_name: str) -> str:
    """A fresh valid Event name for an object whose name is a DNS subdomain."""
    # A cut may end on '.' or '-', which no DNS subdomain part may end with.
    prefix = object_name[:_NAME_PREFIX_MAX].rstrip(".-") or "object"
    return f"{prefix}.{secrets.token_hex(_NAME_SUFFIX_HEX // 2)}"


class EventSink(Protocol):
    def claim_event(self, claim: ClaimRef, reason: str, note: str, *, warning: bool = True) -> None: ...

    def node_event(self, reason: str, note: str, *, warning: bool = True) -> None: ...


class PodLike(Protocol):
    namespace: str
    name: str
    uid: str


class NullEvents:
    """For runs without an API server: events go to the log only."""

    def claim_event(
        self,
        claim: ClaimRef,
        reason: str,
        note: str,
        *,
        warning: bool = True,
        action: str = "PrepareResources",
    ) -> None:
        log.info("event not posted (no API server)", extra={"claim": str(claim), "reason": reason})

    def pod_event(
        self, pod: PodLike, reason: str, note: str, *, warning: bool = True, action: str = "Usage"
    ) -> None:
        log.info("event not posted (no API server)", extra={"pod": pod.name, "reason": reason})

    def node_event(self, reason: str, note: str, *, warning: bool = True, action: str = "Startup") -> None:
        log.info("event not posted (no API server)", extra={"object": "node", "reason": reason})


class KubeEvents:
    """Posts `events.k8s.io/v1` Events as `reportingController=<driver>`, `reportingInstance=<node>`."""

    def __init__(
        self,
        api: KubeApi,
        driver_name: str,
        node_name: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._driver = driver_name
        self._node = node_name
        self._clock = clock
        self._recent: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        # One worker keeps events in order and bounds what a flood of failures can cost.
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k8s-events")

    def claim_event(
        self,
        claim: ClaimRef,
        reason: str,
        note: str,
        *,
        warning: bool = True,
        action: str = "PrepareResources",
    ) -> None:
        regarding = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": claim.namespace,
            "name": claim.name,
            "uid": claim.uid,
        }
        self._submit(claim.namespace, claim.name, regarding, reason, note, action, warning)

    def pod_event(
        self, pod: PodLike, reason: str, note: str, *, warning: bool = True, action: str = "Usage"
    ) -> None:
        """An Event on a pod (idle claims: the pods that hold the claim)."""
        regarding = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": pod.namespace,
            "name": pod.name,
            "uid": pod.uid,
        }
        self._submit(pod.namespace, pod.name, regarding, reason, note, action, warning)

    def node_event(self, reason: str, note: str, *, warning: bool = True, action: str = "Startup") -> None:
        # Nodes are cluster-scoped; their events live in "default", as the kubelet's do.
        regarding = {"apiVersion": "v1", "kind": "Node", "name": self._node, "uid": self._node}
        self._submit("default", self._node, regarding, reason, note, action, warning)

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _submit(
        self,
        namespace: str,
        object_name: str,
        regarding: dict[str, Any],
        reason: str,
        note: str,
        action: str,
        warning: bool,
    ) -> None:
        key = (str(regarding.get("uid", object_name)), reason, note)
        now = self._clock()
        with self._lock:
            last = self._recent.get(key)
            if last is not None and now - last < REPEAT_WINDOW_S:
                return
            self._recent[key] = now
            if len(self._recent) > 4096:
                self._recent = {k: t for k, t in self._recent.items() if now - t < REPEAT_WINDOW_S}
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(object_name), "namespace": namespace},
            "eventTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "reportingController": self._driver,
            "reportingInstance": self._node,
            "action": action,
            "reason": reason,
            "type": "Warning" if warning else "Normal",
            "regarding": regarding,
            "note": event_note(note),  # cut at the API's 1,024 bytes, not characters
        }
        try:
            self._pool.submit(self._post, namespace, body)
        except RuntimeError:
            log.warning("event dropped: sender stopped", extra={"reason": reason})

    def _post(self, namespace: str, body: dict[str, Any]) -> None:
        try:
            self._api.create(f"/apis/events.k8s.io/v1/namespaces/{quote(namespace, safe='')}/events", body)
        except ApiError as err:
            log.warning(
                "posting event failed",
                extra={"reason": body["reason"], "status": err.status, "body": err.message[:200]},
            )
        except Exception as err:  # an event must never take anything down with it
            log.warning("posting event failed", extra={"reason": body["reason"], "error": str(err)})
