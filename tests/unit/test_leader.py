"""Leader election state machine on a fake Lease API and a fake clock."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest

from controller.run.leader import LeaderConfig, LeaderElector, LeaseConflict

JSON = dict[str, Any]


class FakeLeaseApi:
    """One Lease with resourceVersion checks, like the API server's optimistic concurrency."""

    def __init__(self) -> None:
        self.lease: JSON | None = None
        self.version = 0
        self.down = False
        self.writes: list[JSON] = []

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("apiserver unreachable")

    def get(self) -> JSON | None:
        self._check()
        return copy.deepcopy(self.lease)

    def create(self, lease: Mapping[str, Any]) -> JSON:
        self._check()
        if self.lease is not None:
            raise LeaseConflict("already exists")
        return self._store(lease)

    def replace(self, lease: Mapping[str, Any]) -> JSON:
        self._check()
        assert self.lease is not None
        if lease["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise LeaseConflict("the object has been modified")
        return self._store(lease)

    def _store(self, lease: Mapping[str, Any]) -> JSON:
        self.version += 1
        stored = copy.deepcopy(dict(lease))
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.lease = stored
        self.writes.append(copy.deepcopy(stored))
        return copy.deepcopy(stored)

    @property
    def spec(self) -> JSON:
        assert self.lease is not None
        spec: JSON = self.lease["spec"]
        return spec


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def elector(
    api: FakeLeaseApi, clock: Clock, identity: str, changes: list[bool] | None = None
) -> LeaderElector:
    return LeaderElector(
        api,
        namespace="kube-system",
        name="dra-controller",
        identity=identity,
        clock=clock,
        wall_clock=lambda: datetime(2026, 1, 1, tzinfo=UTC),
        on_change=changes.append if changes is not None else None,
    )


def test_first_replica_creates_the_lease_and_leads() -> None:
    api, clock, changes = FakeLeaseApi(), Clock(), list[bool]()
    a = elector(api, clock, "a", changes)
    assert a.step() is True
    assert a.is_leader()
    assert api.spec["holderIdentity"] == "a"
    assert api.spec["leaseDurationSeconds"] == 15
    assert api.spec["leaseTransitions"] == 0
    assert api.spec["renewTime"] == api.spec["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    assert changes == [True]


def test_follower_waits_while_the_leader_renews() -> None:
    api, clock = FakeLeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    for _ in range(10):  # 50 s of renewals every 5 s: b never sees the lease expire
        assert b.step() is False
        clock.now += 5
        assert a.step() is True
    assert not b.is_leader()
    assert api.spec["holderIdentity"] == "a"


def test_follower_takes_an_expired_lease_and_counts_the_transition() -> None:
    api, clock = FakeLeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    assert b.step() is False  # b observes the record now
    clock.now += 14.9
    assert b.step() is False  # not yet expired (15 s since b saw it change)
    clock.now += 0.2
    assert b.step() is True
    assert api.spec["holderIdentity"] == "b"
    assert api.spec["leaseTransitions"] == 1
    # a's renewal deadline (10 s) passed long ago: it no longer considers itself leader.
    assert not a.is_leader()
    assert a.step() is False


def test_leader_steps_down_when_renewal_fails_past_the_deadline() -> None:
    api, clock, changes = FakeLeaseApi(), Clock(), list[bool]()
    a = elector(api, clock, "a", changes)
    a.step()
    api.down = True
    clock.now += 5
    assert a.step() is True  # renewal failed, still within the 10 s deadline
    assert a.last_attempt_ok is False
    clock.now += 4.9
    assert a.is_leader()
    clock.now += 0.2
    assert not a.is_leader()  # stops acting even before the next attempt
    assert a.step() is False
    assert changes == [True, False]
    api.down = False
    assert a.step() is True  # still our lease: renewed without a transition
    assert api.spec["leaseTransitions"] == 0
    assert changes == [True, False, True]


def test_racing_replicas_one_wins_by_resource_version() -> None:
    api, clock = FakeLeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    api.spec["holderIdentity"] = ""  # free lease, both will try to take it
    stale = api.get()
    assert a.step() is True
    # b writes on the version it read before a's write: 409, stays follower.
    api_get = api.get
    api.get = lambda: copy.deepcopy(stale)  # type: ignore[method-assign]
    try:
        assert b.step() is False
    finally:
        api.get = api_get  # type: ignore[method-assign]
    assert api.spec["holderIdentity"] == "a"


def test_release_hands_over_at_once() -> None:
    api, clock = FakeLeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    assert b.step() is False
    assert a.release() is True
    assert not a.is_leader()
    assert api.spec["holderIdentity"] == ""
    assert api.spec["leaseDurationSeconds"] == 1
    assert b.step() is True  # an empty holder is free: no waiting for expiry
    assert api.spec["holderIdentity"] == "b"
    assert api.spec["leaseTransitions"] == 1


def test_release_of_a_lease_held_by_another_writes_nothing() -> None:
    api, clock = FakeLeaseApi(), Clock()
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    writes = len(api.writes)
    assert b.release() is False
    assert len(api.writes) == writes
    assert api.spec["holderIdentity"] == "a"


def test_config_must_renew_before_the_lease_expires() -> None:
    with pytest.raises(ValueError, match="renew interval < renew deadline < lease duration"):
        LeaderConfig(lease_duration_s=10, renew_deadline_s=12)
