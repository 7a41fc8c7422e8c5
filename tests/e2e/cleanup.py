"""Leaving the node as a test found it: no pods, no claims, nothing prepared in the plugin.

Every end-to-end test shares one kubelet and its GPUs. A test that fails
half-way must not leave a claim holding a device, or a prepared claim in the
plugin, for the tests after it.

An upstream difference the clean-up models: kube-controller-manager 1.34's
resourceclaim controller ignores events of pods without
`spec.resourceClaims` (pkg/controller/resourceclaim/controller.go at v1.34.4,
enqueuePod returns at once), so the implicit claim of an extended-resource
pod (named only in `status.extendedResourceClaimStatus`) is looked at again
only on an event of the claim itself. When the claim's deletion (by the
garbage collector, or by us) reaches the controller while its pod informer
still has the pod, the reservation is kept, and the pod's later removal
never brings the claim back: it stays allocated and reserved for a pod that
is gone until the next resync (hours). 1.35 and later enqueue the claims of
`status.extendedResourceClaimStatus` too (v1.37.2: resourceclaim.PodClaims).
On 1.34 the clean-up therefore touches such a claim (an annotation) once its
pods are gone from the API, which is the claim event the controller waits
for; on newer releases it does not, so a controller that fails to release a
claim still fails the clean-up there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from devcluster.plugin import PluginProcess
from devcluster.wait import wait_for
from dracommon.kubeapi import ApiError, KubeApi

RESOURCE = "/apis/resource.k8s.io/v1"
POLL_SECONDS = 0.1
EXTENDED_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
# Set on a claim to give kube-controller-manager 1.34 the claim event it needs (module docstring).
RESYNC_ANNOTATION = "e2e.draplugin.dev/resync"
RESYNC_EVERY_S = 2.0


def release_namespace(api: KubeApi, plugin: PluginProcess, namespace: str, timeout_s: float) -> None:
    """Delete the namespace's pods and claims and wait until the plugin has unprepared its claims.

    Pods go at once (grace period 0: no caller asserts on graceful shutdown
    here), then standalone claims; then we wait until the claims are gone
    (deallocated) and the plugin's checkpoint holds no claim of the
    namespace. Each step runs even when an earlier one failed, so one broken
    test cannot hold devices that later tests need; the failures are raised
    together at the end. The plugin must be running (the kubelet unprepares
    through it).
    """
    pods = f"/api/v1/namespaces/{namespace}/pods"
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    failures: list[str] = []

    def step(what: str, action: Callable[[], object]) -> None:
        try:
            action()
        except (AssertionError, ApiError) as err:
            failures.append(f"{what}: {err}")

    def delete_all(collection: str, query: dict[str, str]) -> None:
        for item in api.get(collection)["items"]:
            try:
                api.request("DELETE", f"{collection}/{item['metadata']['name']}", query=query)
            except ApiError as err:
                if err.status != 404:  # a template's claim, deleted with its pod meanwhile
                    raise

    def wait_empty(collection: str) -> None:
        try:
            wait_for(
                f"{collection} to be empty", lambda: not api.get(collection)["items"], timeout_s, POLL_SECONDS
            )
        except AssertionError as err:
            raise AssertionError(f"{err}; left: {describe(api.get(collection)['items'])}") from None

    def force_claims_away() -> None:
        """Last resort for claims stuck in deletion: drop their finalizers so their devices are free."""
        for claim in api.get(claims)["items"]:
            if claim["metadata"].get("deletionTimestamp"):
                merge_patch(api, f"{claims}/{claim['metadata']['name']}", {"metadata": {"finalizers": None}})
        wait_for(f"{claims} to be empty", lambda: not api.get(claims)["items"], timeout_s, POLL_SECONDS)

    step("deleting pods", lambda: delete_all(pods, {"gracePeriodSeconds": "0"}))
    step("waiting for the pods", lambda: wait_empty(pods))
    step("deleting claims", lambda: delete_all(claims, {}))  # standalone claims outlive their pods
    step("waiting for the claims", lambda: wait_claims_gone(api, namespace, timeout_s))
    if failures:  # the failure is reported below; the next test still finds the devices free
        step("removing the finalizers of claims stuck in deletion", force_claims_away)
    step("waiting for unprepare", lambda: wait_unprepared(plugin, namespace, timeout_s))
    if failures:
        raise AssertionError(f"cleaning up namespace {namespace} failed: " + "; ".join(failures))


def wait_claims_gone(api: KubeApi, namespace: str, timeout_s: float) -> None:
    """Wait until the namespace has no claims; on 1.34, touch those reserved for gone pods meanwhile.

    The touch is repeated (every RESYNC_EVERY_S of waiting) because the
    controller's pod informer may still hold a pod the API has removed when
    the first touch arrives; each touch is one more claim event, never a
    change of the claim's status, so a claim the controller will not release
    still times out here.
    """
    claims = f"{RESOURCE}/namespaces/{namespace}/resourceclaims"
    resync = needs_claim_resync(api)
    last_touch = [0.0]

    def gone() -> bool:
        if not api.get(claims)["items"]:
            return True
        if resync and time.monotonic() - last_touch[0] >= RESYNC_EVERY_S:
            last_touch[0] = time.monotonic()
            resync_orphaned_claims(api, namespace)
        return False

    try:
        wait_for(f"{claims} to be empty", gone, timeout_s, POLL_SECONDS)
    except AssertionError as err:
        raise AssertionError(f"{err}; left: {describe(api.get(claims)['items'])}") from None


def needs_claim_resync(api: KubeApi) -> bool:
    """Whether the cluster's controller-manager misses extended-resource pods' removal (1.34 and older)."""
    version = api.get("/version")
    minor = int("".join(ch for ch in str(version["minor"]) if ch.isdigit()))
    return int(version["major"]) == 1 and minor <= 34


def resync_orphaned_claims(api: KubeApi, namespace: str) -> list[str]:
    """Annotate the namespace's extended-resource claims still reserved for pods that no longer exist.

    Only claims whose every reserving pod is gone from the API (by UID) are
    touched: one still reserved for a live pod is the controller's business.
    Returns the names of the claims touched.
    """
    live = {p["metadata"]["uid"] for p in api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]}
    touched = []
    for claim in api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims")["items"]:
        meta, reserved = claim["metadata"], (claim.get("status") or {}).get("reservedFor") or []
        extended = (meta.get("annotations") or {}).get(EXTENDED_CLAIM_ANNOTATION) == "true"
        if extended and reserved and not {r["uid"] for r in reserved} & live:
            patch = {"metadata": {"annotations": {RESYNC_ANNOTATION: meta["resourceVersion"]}}}
            merge_patch(api, f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{meta['name']}", patch)
            touched.append(meta["name"])
    return touched


def describe(items: list[dict[str, Any]]) -> list[str]:
    """What keeps objects around: their finalizers, and for claims allocation and reservations."""
    out = []
    for item in items:
        meta, status = item["metadata"], item.get("status") or {}
        out.append(
            f"{meta['name']} (deleting={bool(meta.get('deletionTimestamp'))}, "
            f"finalizers={meta.get('finalizers') or []}, allocated={bool(status.get('allocation'))}, "
            f"reservedFor={[r.get('name') for r in status.get('reservedFor') or []]}, "
            f"phase={status.get('phase')})"
        )
    return out


def merge_patch(api: KubeApi, path: str, patch: dict[str, Any]) -> None:
    try:
        api.merge_patch(path, patch)
    except ApiError as err:
        assert err.status == 404, f"PATCH {path}: {err}"


def prepared_claims(plugin: PluginProcess, namespace: str) -> list[str]:
    """Claims of the namespace the plugin still has prepared, as its checkpoint records them."""
    if not plugin.checkpoint_path.exists():
        return []
    saved = json.loads(plugin.checkpoint_path.read_text())
    return [f"{c['name']} ({c['uid']})" for c in saved["claims"] if c["namespace"] == namespace]


def wait_unprepared(plugin: PluginProcess, namespace: str, timeout_s: float) -> None:
    """The kubelet unprepares a claim once the containers of its last pod on the node are gone."""

    def unprepared() -> bool:
        if not plugin.running:
            raise AssertionError(f"the plugin is not running:\n{plugin.log_tail()}")
        return not prepared_claims(plugin, namespace)

    wait_for(f"the plugin to unprepare the claims of {namespace}", unprepared, timeout_s, POLL_SECONDS)
