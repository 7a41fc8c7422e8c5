"""Claims in flight across calls are bounded too: work past the bound is answered at once, retriable.

The per-call bound (test_kubelet_call_bound.py) caps one pod's call; 60 concurrent calls of 128
claims each still queued 7,680 claims, so a well-behaved caller's one claim waited behind all of
them (p50 28.5 s, at most 44.5 s, against the kubelet's 45 s deadline) and the plugin's RSS grew
from 43 to 117 MiB. Claims past `MAX_CLAIMS_IN_FLIGHT` (per operation) are answered at once with
an error saying the node is busy; the kubelet retries a failed call, and gets the work done then.
"""

from __future__ import annotations

import asyncio

import pytest

from draplugin.kubelet.dra import BUSY, MAX_CLAIMS_IN_FLIGHT, MAX_CLAIMS_PER_CALL, ClaimOutcome, ClaimRunner
from tests.unit.test_kubelet_call_bound import WAIT, CountingDriver, claims

FLOOD_CALLS = 60


Answers = dict[str, ClaimOutcome]


async def flood(runner: ClaimRunner, driver: CountingDriver) -> list[asyncio.Task[Answers]]:
    """FLOOD_CALLS calls of MAX_CLAIMS_PER_CALL claims each, all stuck in the driver at the gate."""
    driver.gate = asyncio.Event()
    calls = [
        asyncio.create_task(runner.prepare(claims(MAX_CLAIMS_PER_CALL, prefix=f"flood{n}")))
        for n in range(FLOOD_CALLS)
    ]
    async with asyncio.timeout(WAIT):
        await driver.waiting.wait()
    return calls


def errors(answers: Answers) -> list[str]:
    return [outcome.error for outcome in answers.values()]


def test_the_bound_admits_a_nodes_burst_and_is_far_below_the_flood() -> None:
    assert MAX_CLAIMS_IN_FLIGHT >= 2 * MAX_CLAIMS_PER_CALL  # a node's burst of pods starting at once
    assert MAX_CLAIMS_IN_FLIGHT < FLOOD_CALLS * MAX_CLAIMS_PER_CALL
    assert "retr" in BUSY and str(MAX_CLAIMS_IN_FLIGHT) in BUSY


async def test_a_well_behaved_call_during_a_flood_is_answered_at_once() -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver)
    calls = await flood(runner, driver)
    await asyncio.sleep(0)  # every flood call has been admitted or refused
    async with asyncio.timeout(WAIT):  # before the fix: stuck behind the flood until the gate opens
        answer = await runner.prepare(claims(1, prefix="pod"))
    assert answer["pod-00000"].error == BUSY
    refused = [call for call in calls if call.done()]
    assert len(refused) == FLOOD_CALLS - MAX_CLAIMS_IN_FLIGHT // MAX_CLAIMS_PER_CALL
    for call in refused:
        assert set(errors(call.result())) == {BUSY}
    assert driver.gate is not None
    driver.gate.set()
    async with asyncio.timeout(WAIT):
        results = await asyncio.gather(*calls)
    ran = sum(errors(result).count("") for result in results)
    assert ran == MAX_CLAIMS_IN_FLIGHT and driver.prepares == MAX_CLAIMS_IN_FLIGHT


async def test_the_retry_after_the_flood_runs() -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver)
    calls = await flood(runner, driver)
    assert driver.gate is not None
    driver.gate.set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*calls)
    driver.gate = None
    answer = await runner.prepare(claims(1, prefix="pod"))
    assert answer["pod-00000"].error == ""


async def test_a_call_that_reaches_the_bound_runs_what_fits_and_refuses_the_rest() -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver, max_claims_in_flight=3)
    driver.gate = asyncio.Event()
    first = asyncio.create_task(runner.prepare(claims(2, prefix="a")))
    async with asyncio.timeout(WAIT):
        await driver.waiting.wait()
    second = asyncio.create_task(runner.prepare(claims(2, prefix="b")))
    await asyncio.sleep(0)
    driver.gate.set()
    async with asyncio.timeout(WAIT):
        assert errors(await first) == ["", ""]
        answers = await second
    assert (answers["b-00000"].error, answers["b-00001"].error) == ("", BUSY)


async def test_a_prepare_flood_leaves_unprepares_their_own_room() -> None:
    driver = CountingDriver()
    runner = ClaimRunner(driver)
    calls = await flood(runner, driver)
    async with asyncio.timeout(WAIT):
        answer = await runner.unprepare(claims(4, prefix="gone"))
    assert errors(answer) == [""] * 4
    assert driver.gate is not None
    driver.gate.set()
    async with asyncio.timeout(WAIT):
        await asyncio.gather(*calls)


def test_the_in_flight_bound_must_hold_a_call() -> None:
    with pytest.raises(ValueError, match="max_claims_in_flight must be at least 1"):
        ClaimRunner(CountingDriver(), max_claims_in_flight=0)
