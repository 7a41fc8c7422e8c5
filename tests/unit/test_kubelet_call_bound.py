"""One call runs at most MAX_CLAIMS_PER_CALL claims; each claim past them gets a short, clear error.

The kubelet sends one pod's claims per call: a call of 40,000 (2.2 MiB, under the 4 MiB message
cap) must neither start 40,000 claim operations nor hold up other callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from draplugin.kubelet._proto.dra.v1 import api_pb2 as v1
from draplugin.kubelet.dra import MAX_CLAIMS_PER_CALL, TOO_MANY_CLAIMS, ClaimRunner
from draplugin.kubelet.interface import ClaimRef, PreparedDevice
from tests.kubelet_client import StaticDriver

WAIT = 10.0  # a guard against a hang, never a measure
HUGE = 40_000


class CountingDriver(StaticDriver):
    """Counts the claim calls that reach the driver; prepares wait at `gate` if one is set."""

    def __init__(self) -> None:
        super().__init__()
        self.prepares = 0
        self.unprepares = 0
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()

    async def prepare_claim(self, claim: ClaimRef) -> Sequence[PreparedDevice]:
        self.prepares += 1
        if self.gate is not None:
            self.waiting.set()
            await self.gate.wait()
        return await super().prepare_claim(claim)

    async def unprepare_claim(self, claim: ClaimRef) -> None:
        self.unprepares += 1
        await super().unprepare_claim(claim)


def claims(count: int, prefix: str = "c") -> list[v1.Claim]:
    return [v1.Claim(namespace="ns", uid=f"{prefix}-{i:05d}", name=f"{prefix}-{i}") for i in range(count)]


def test_the_bound_covers_a_pod_and_its_error_fits_the_kubelets_message_cap() -> None:
    assert 56 <= MAX_CLAIMS_PER_CALL <= 256  # a node's MIG devices in one pod; not a flood
    # 40,000 answers of a 36-character UID and this error, with protobuf's framing, stay under 4 MiB.
    response = v1.NodePrepareResourcesResponse()
    for i in range(HUGE):
        response.claims[f"{i:036d}"].error = TOO_MANY_CLAIMS
    assert response.ByteSize() < 4 * 1024 * 1024
    assert str(MAX_CLAIMS_PER_CALL) in TOO_MANY_CLAIMS


@pytest.mark.parametrize("operation", ["prepare", "unprepare"])
async def test_only_the_first_claims_of_a_huge_call_run_and_every_other_is_answered(operation: str) -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver)
    request = claims(HUGE)
    answers = await (runner.prepare(request) if operation == "prepare" else runner.unprepare(request))
    assert set(answers) == {c.uid for c in request}
    ran = [c.uid for c in request[:MAX_CLAIMS_PER_CALL]]
    assert all(answers[uid].error == "" for uid in ran)
    assert all(answers[c.uid].error == TOO_MANY_CLAIMS for c in request[MAX_CLAIMS_PER_CALL:])
    assert (driver.prepares if operation == "prepare" else driver.unprepares) == MAX_CLAIMS_PER_CALL


async def test_a_call_at_the_bound_runs_in_full() -> None:
    driver = CountingDriver()
    answers = await ClaimRunner(driver).prepare(claims(MAX_CLAIMS_PER_CALL))
    assert all(a.error == "" for a in answers.values()) and driver.prepares == MAX_CLAIMS_PER_CALL


async def test_a_uid_within_and_past_the_bound_keeps_the_answer_of_the_one_within() -> None:
    driver = CountingDriver()
    request = claims(MAX_CLAIMS_PER_CALL + 5)
    request.append(request[0])
    answers = await ClaimRunner(driver).prepare(request)
    assert answers[request[0].uid].error == ""
    assert answers[request[-2].uid].error == TOO_MANY_CLAIMS


async def test_other_callers_are_served_while_a_huge_call_is_in_flight() -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver)
    driver.gate = asyncio.Event()
    huge = asyncio.create_task(runner.prepare(claims(HUGE)))
    async with asyncio.timeout(WAIT):
        await driver.waiting.wait()
        answers = await runner.unprepare(claims(4, prefix="other"))
    assert all(a.error == "" for a in answers.values())
    assert not huge.done()
    driver.gate.set()
    async with asyncio.timeout(WAIT):
        assert len(await huge) == HUGE
    assert driver.prepares == MAX_CLAIMS_PER_CALL


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_claims_per_call must be at least 1"):
        ClaimRunner(CountingDriver(), max_claims_per_call=0)
