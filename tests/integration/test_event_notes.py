"""A long non-ASCII Event note is accepted by the real API server, from both daemons' Event writers.

`events.k8s.io/v1` refuses a note over 1,024 bytes (422); cut at 1,024 characters, a note of
two-byte characters was twice that, and no Event was posted at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from controller.run.events import cannot_allocate_event
from devcluster.controlplane import ControlPlane
from devcluster.objects import create_namespace, delete_namespace
from devcluster.wait import wait_for
from dracommon.kubeapi import KubeApi
from draplugin.events import KubeEvents
from draplugin.kubelet.interface import ClaimRef

pytestmark = pytest.mark.cluster

NOTE = "GPU défaillant: périphérique réservé, réessayez — 设备不可用。" * 40  # far over 1,024 bytes


@pytest.fixture
def namespace(kube_cluster: ControlPlane) -> Iterator[tuple[KubeApi, str]]:
    with kube_cluster.api_client() as client:
        name = create_namespace(client)
        try:
            yield KubeApi(client), name
        finally:
            delete_namespace(client, name)


def test_a_long_non_ascii_note_is_posted_by_the_plugin_and_the_controller(
    namespace: tuple[KubeApi, str],
) -> None:
    api, ns = namespace
    assert len(NOTE.encode()) > 2 * 1024
    events = KubeEvents(api, "gpu.draplugin.dev", "node-a")
    events.claim_event(ClaimRef(ns, "uid-1", "claim"), "DeviceInUse", NOTE)
    events.close()  # waits for the post; a refusal would only be logged
    claim = {"metadata": {"namespace": ns, "name": "claim", "uid": "uid-1", "resourceVersion": "1"}}
    api.create(
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
        cannot_allocate_event(claim, NOTE, "controller-0", "gpu.draplugin.dev"),
    )  # raises ApiError on a 422

    def posted() -> list[dict[str, Any]] | None:
        items = api.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events").get("items", [])
        found = [e for e in items if e.get("reason") in ("DeviceInUse", "CannotAllocate")]
        return found if len(found) == 2 else None

    for event in wait_for("both Events", posted, 30):
        assert event["note"].endswith("...") and NOTE.startswith(event["note"][:-3])
        assert len(event["note"].encode()) <= 1024
