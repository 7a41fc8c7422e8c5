"""Holders of devices: completed checkpoint claims, pods from reservedFor, container names, caching."""

from __future__ import annotations

from typing import Any

from dracommon.kubeapi import ApiError
from draplugin.checkpoint import ClaimRecord, ClaimState, DeviceRecord
from draplugin.usage.holders import HolderDirectory, PodRef, container_ids, reserved_pods

CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/train"


def record(state: ClaimState = ClaimState.PREPARE_COMPLETED, uid: str = "uid-claim") -> ClaimRecord:
    device = DeviceRecord(("gpu",), "node-1", "gpu-0", ("k8s.gpu.draplugin.dev/gpu=uid-claim-gpu-0",))
    return ClaimRecord(uid, "team-a", "train", state, (device,))


def claim_doc(*pods: tuple[str, str], uid: str = "uid-claim") -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "status": {"reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in pods]},
    }


def pod_doc(uid: str, *containers: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid},
        "status": {
            "containerStatuses": [{"name": n, "containerID": f"containerd://{c}"} for n, c in containers]
        },
    }


class FakeApi:
    def __init__(self, docs: dict[str, Any]) -> None:
        self.docs = docs
        self.gets: list[str] = []

    def get(self, path: str) -> Any:
        self.gets.append(path)
        doc = self.docs.get(path)
        if isinstance(doc, Exception):
            raise doc
        if doc is None:
            raise ApiError(404, "not found")
        return doc


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_pods_and_containers_of_a_prepared_claim() -> None:
    api = FakeApi({
        CLAIM_PATH: claim_doc(("train-a", "uid-a")),
        "/api/v1/namespaces/team-a/pods/train-a": pod_doc("uid-a", ("trainer", "c1")),
    })  # fmt: skip
    (holder,) = HolderDirectory(lambda: [record()], api).holders()
    assert holder.devices == ("gpu-0",)
    assert holder.pods == (PodRef("team-a", "train-a", "uid-a"),)
    assert holder.containers == {"c1": "trainer"}


def test_claims_still_being_prepared_hold_nothing_yet() -> None:
    assert HolderDirectory(lambda: [record(ClaimState.PREPARE_STARTED)], FakeApi({})).holders() == []


def test_reads_are_cached_until_the_refresh_interval() -> None:
    api, clock = FakeApi({CLAIM_PATH: claim_doc()}), Clock()
    directory = HolderDirectory(lambda: [record()], api, refresh_s=60.0, clock=clock)
    directory.holders()
    clock.now += 30
    directory.holders()
    assert api.gets == [CLAIM_PATH]
    clock.now += 31
    directory.holders()
    assert api.gets == [CLAIM_PATH, CLAIM_PATH]


def test_an_unknown_pod_rereads_the_claim_at_most_once_per_miss_interval() -> None:
    api, clock = FakeApi({CLAIM_PATH: claim_doc(("train-a", "uid-a"))}), Clock()
    directory = HolderDirectory(lambda: [record()], api, refresh_s=600.0, miss_s=10.0, clock=clock)
    holders = directory.holders()
    api.docs[CLAIM_PATH] = claim_doc(("train-a", "uid-a"), ("train-b", "uid-b"))
    directory.refresh_missing(holders, {"uid-b"}, ())
    assert api.gets.count(CLAIM_PATH) == 1  # the first read was just now
    clock.now += 11
    directory.refresh_missing(holders, {"uid-b"}, ())
    assert [p.name for p in directory.holders()[0].pods] == ["train-a", "train-b"]
    directory.refresh_missing(directory.holders(), {"uid-b"}, ())  # known now: no read
    assert api.gets.count(CLAIM_PATH) == 2


def test_api_errors_keep_the_last_pods_and_never_raise() -> None:
    api, clock = FakeApi({CLAIM_PATH: claim_doc(("train-a", "uid-a"))}), Clock()
    directory = HolderDirectory(lambda: [record()], api, refresh_s=1.0, clock=clock)
    directory.holders()
    api.docs[CLAIM_PATH] = ApiError(503, "unavailable")
    clock.now += 2
    assert [p.name for p in directory.holders()[0].pods] == ["train-a"]
    api.docs[CLAIM_PATH] = ConnectionError("refused")
    clock.now += 2
    assert [p.name for p in directory.holders()[0].pods] == ["train-a"]


def test_a_recreated_claim_of_the_same_name_is_not_ours() -> None:
    api = FakeApi({CLAIM_PATH: claim_doc(("impostor", "uid-x"), uid="uid-other")})
    assert HolderDirectory(lambda: [record()], api).holders()[0].pods == ()


def test_unprepared_claims_leave_the_cache() -> None:
    records = [record()]
    api = FakeApi({CLAIM_PATH: claim_doc()})
    directory = HolderDirectory(lambda: list(records), api)
    directory.holders()
    records.clear()
    assert directory.holders() == []
    records.append(record())
    directory.holders()
    assert api.gets == [CLAIM_PATH, CLAIM_PATH]  # read afresh, not from a stale entry


def test_reserved_for_lists_only_pods() -> None:
    claim = {"status": {"reservedFor": [
        {"resource": "pods", "name": "p", "uid": "u1"},
        {"apiGroup": "batch", "resource": "jobs", "name": "j", "uid": "u2"},
        {"resource": "pods", "name": 7},
    ]}}  # fmt: skip
    assert reserved_pods("ns", claim) == (PodRef("ns", "p", "u1"),)
    assert reserved_pods("ns", {}) == ()


def test_container_ids_cover_init_and_ephemeral_containers() -> None:
    pod = {"status": {
        "initContainerStatuses": [{"name": "init", "containerID": "containerd://i1"}],
        "containerStatuses": [{"name": "app", "containerID": "cri-o://a1"}, {"name": "waiting"}],
        "ephemeralContainerStatuses": [{"name": "debug", "containerID": "containerd://e1"}],
    }}  # fmt: skip
    assert container_ids(pod) == {"i1": "init", "a1": "app", "e1": "debug"}


def test_an_id_no_claim_knows_stops_causing_rereads_until_the_refresh_interval() -> None:
    api, clock = FakeApi({CLAIM_PATH: claim_doc(("train-a", "uid-a"))}), Clock()
    directory = HolderDirectory(lambda: [record()], api, refresh_s=300.0, miss_s=10.0, clock=clock)
    holders = directory.holders()
    for _ in range(10):  # a host process in a container of its own, on the GPU for a minute
        clock.now += 11
        directory.refresh_missing(holders, (), {"f" * 64})
    assert api.gets.count(CLAIM_PATH) == 2  # the first read, and one re-read for the stranger


def test_container_ids_map_to_their_pods_for_nodes_without_pod_cgroups() -> None:
    api = FakeApi({
        CLAIM_PATH: claim_doc(("train-a", "uid-a")),
        "/api/v1/namespaces/team-a/pods/train-a": pod_doc("uid-a", ("trainer", "c1")),
    })  # fmt: skip
    (holder,) = HolderDirectory(lambda: [record()], api).holders()
    assert holder.container_pods == {"c1": "uid-a"}
