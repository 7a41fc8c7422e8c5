"""Where a prepare's spec is written: on the event loop for plain file work, in a worker thread
for anything that runs NVML or the driver's tools (MPS, time-slices, MIG) or searches the driver root.

The loop is the cheaper place for a few unsynced file writes (no GIL hand-over per syscall), but a
blocked loop holds up every other call of the kubelet, so the routing is what these cases pin.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from draplugin.cdi.driverlayout import DriverRootError
from draplugin.prepare.driver import GpuDriver
from draplugin.prepare.plan import plan_claim
from draplugin.prepare.sharing import SharingState
from tests.unit.test_prepare_driver import Node
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE, REF, claim_doc, config, gpu_config, result


def record_threads(driver: GpuDriver) -> list[int]:
    """The thread each materialization of `driver` runs on, in order."""
    seen: list[int] = []
    original = driver._materialize_with_metadata

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return original(*args, **kwargs)

    driver._materialize_with_metadata = recording  # type: ignore[method-assign]
    return seen


async def test_a_plain_claim_is_written_on_the_loop(tmp_path: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    seen = record_threads(driver)
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    assert await driver.prepare_claim(ref)
    # And again: the repeated prepare re-creates a missing spec the same way.
    assert await driver.prepare_claim(ref)
    assert seen == [threading.get_ident()] * 2
    assert node.spec_files()


async def test_an_mps_claim_is_prepared_in_a_worker_thread(tmp_path: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    seen = record_threads(driver)
    mps = config("FromClaim", gpu_config("MPS"))
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")], configs=[mps]))
    try:
        assert await driver.prepare_claim(ref)
    finally:
        await driver.unprepare_claim(ref)  # its stand-in daemon and shm mount go with it
    assert len(seen) == 1 and seen[0] != threading.get_ident()


class UndiscoveredFiles:
    """Driver files not found yet: the next `edits` searches the driver root."""

    discovered = False

    def edits(self) -> Any:
        raise DriverRootError("DriverRootNotFound", "no driver root here")


async def test_a_driver_root_not_searched_yet_is_searched_in_a_worker_thread(tmp_path: Path) -> None:
    node = Node(tmp_path)
    driver = node.driver()
    driver.driver_files = UndiscoveredFiles()  # type: ignore[assignment]
    seen = record_threads(driver)
    ref = node.claims.add(claim_doc(results=[result("gpu", "gpu-0")]))
    with pytest.raises(Exception, match="no driver root here"):
        await driver.prepare_claim(ref)
    assert len(seen) == 1 and seen[0] != threading.get_ident()


@pytest.mark.parametrize(
    ("configs", "device", "plain"),
    [
        ([], "gpu-0", True),
        ([config("FromClaim", gpu_config("Exclusive"))], "gpu-0", True),
        ([config("FromClaim", gpu_config("MPS"))], "gpu-0", False),
        (
            [config("FromClaim", gpu_config("TimeSlicing", timeSlicingConfig={"interval": "Long"}))],
            "gpu-0",
            False,
        ),
    ],
    ids=["exclusive-default", "exclusive", "mps", "time-slicing"],
)
def test_is_plain(tmp_path: Path, configs: list[dict[str, Any]], device: str, plain: bool) -> None:
    doc = claim_doc(results=[result("gpu", device)], configs=configs)
    plan = plan_claim(REF, doc, driver=DRIVER, pool=NODE, devices=DEVICES, kind="gpu")
    assert SharingState(tmp_path).is_plain(plan) is plain


def test_a_mig_device_created_at_prepare_is_not_plain(tmp_path: Path) -> None:
    # A partitionable MIG device: published without a UUID, created by NVML at prepare.
    from dataclasses import replace

    devices = {**DEVICES, "gpu-0-mig-1g5gb-0": replace(DEVICES["gpu-0-mig-1g5gb-0"], uuid="")}
    doc = claim_doc(results=[result("gpu", "gpu-0-mig-1g5gb-0")])
    plan = plan_claim(REF, doc, driver=DRIVER, pool=NODE, devices=devices, kind="gpu")
    assert SharingState(tmp_path).is_plain(plan) is False
