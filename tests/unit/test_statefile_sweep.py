"""Temp files of every atomic writer, left by a kill -9 between create and rename, go at start-up.

Each writer runs for real in a forked child whose `os.replace` ends the process on the spot
(`os._exit`: no handler runs, like SIGKILL), so the temp file is exactly what the writer leaves.
Then a fresh plugin process recovers on that node: every one of them is gone, removed by the
sweep (listed in the recovery report, not swept up by a later `rmtree`), and another program's
temp file and a write in flight are left alone.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from draplugin import statefile
from draplugin.cdi.spec import SpecStore
from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from draplugin.devices.fakemig import STATE_FILE as FAKE_MIG_FILE
from draplugin.devices.fakemig import FakeMigHardware
from draplugin.devices.mig import MigPlacement
from draplugin.kubelet.interface import ClaimRef
from draplugin.metrics import ClaimMetrics
from draplugin.prepare import wiring
from draplugin.prepare.driver import GpuDriver, RecoveryReport
from draplugin.prepare.ledger import FILE_NAME as LEDGER_FILE
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from draplugin.prepare.plan import ClaimPlan, plan_claim, render_spec
from tests.unit import sharing_fixtures
from tests.unit.sharing_fixtures import ToolNode
from tests.unit.test_prepare_driver import FakeClaims, RecordingEvents
from tests.unit.test_prepare_plan import DEVICES, DRIVER, NODE
from tests.unit.test_sharing_driver import MPS, claim

tool_node = sharing_fixtures.tool_node
KILLED = 137


def _plan(uid: str, strategy: str, **settings: Any) -> ClaimPlan:
    doc = claim(uid, strategy, **settings)
    return plan_claim(ClaimRef("ns", uid, f"claim-{uid}"), doc, driver=DRIVER, pool=NODE, devices=DEVICES)


def killed_at_rename(write: Callable[[], None]) -> None:
    """Run `write` in a child that dies at its first rename, as a kill -9 there would."""

    def child() -> None:
        def die(src: object, dst: object) -> None:
            os._exit(KILLED)

        os.replace = die  # type: ignore[assignment]  # the child's own copy of the module
        write()
        os._exit(0)  # the write never renamed: the test is wrong

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join()
    assert process.exitcode == KILLED


def writers(node: ToolNode) -> dict[str, Callable[[], None]]:
    state = node.state

    def checkpoint() -> None:
        store = CheckpointStore(state / wiring.CHECKPOINT_FILE, "boot-1")
        store.put(ClaimRecord("uid-c", "ns", "c", ClaimState.PREPARE_COMPLETED))
        store.save()

    def ledger() -> None:
        entry = LedgerEntry("uid-l", "timeslice", "GPU-x", "set", {"device": "gpu-0", "level": 1})
        SharingLedger(state / LEDGER_FILE).put(entry)

    def fake_mig() -> None:
        FakeMigHardware(state / FAKE_MIG_FILE).mig_create(MigPlacement("GPU-x", 0, "1g.5gb", 0, (0,)))

    def mps_json() -> None:
        node.sharing().apply(_plan("uid-m", "MPS", **MPS))  # mps.json comes before the daemon

    def cdi_spec() -> None:
        SpecStore(state.parent / "cdi", DRIVER).write("uid-s", render_spec(_plan("uid-s", "Exclusive")))

    return {
        "checkpoint": checkpoint,
        "sharing ledger": ledger,
        "fake MIG state": fake_mig,
        "mps.json": mps_json,
        "CDI spec": cdi_spec,
    }


def restart(node: ToolNode) -> RecoveryReport:
    """A fresh plugin process on the node, and what its start-up recovery did."""
    process = GpuDriver(
        driver_name=DRIVER,
        node_name=NODE,
        devices=list(DEVICES.values()),
        claims=FakeClaims(),
        cdi_store=SpecStore(node.state.parent / "cdi", DRIVER),
        checkpoint=CheckpointStore(node.state / wiring.CHECKPOINT_FILE, "boot-1"),
        sharing=node.sharing(),
        events=RecordingEvents(),
        metrics=ClaimMetrics(CollectorRegistry()),
    )
    return process.recover()


def temp_files(root: Path) -> set[Path]:
    return {p for p in root.rglob(f".*{statefile.TEMP_SUFFIX}") if statefile.temp_target(p.name)}


def age(path: Path) -> None:
    old = time.time() - 3600
    os.utime(path, (old, old))


def test_temp_files_of_every_writer_killed_mid_write_are_gone_after_start(tool_node: ToolNode) -> None:
    root = tool_node.state.parent
    left: dict[str, Path] = {}
    for name, write in writers(tool_node).items():
        before = temp_files(root)
        killed_at_rename(write)
        (new,) = temp_files(root) - before
        left[name] = new
    assert left["mps.json"].parent == tool_node.state / "mps" / "uid-m"
    for path in left.values():
        age(path)  # older than the restarted process, as a dead process's writes are
    foreign = tool_node.state / ".notes.json.abc12345.tmp"  # not a file of ours
    foreign.write_text("{")
    age(foreign)
    in_flight = tool_node.state / f".{LEDGER_FILE}.zzzzzzzz.tmp"  # the other plugin process, now
    in_flight.write_text("{")

    report = restart(tool_node)

    assert {name: path for name, path in left.items() if path.exists()} == {}
    assert sorted(report.temp_files_removed) == sorted(str(p) for p in left.values())
    assert foreign.exists() and in_flight.exists()


def test_the_sweep_names_every_file_of_ours(tool_node: ToolNode) -> None:
    """STATE_FILE_NAMES is a literal (its modules import statefile): it must follow their names."""
    killed_at_rename(writers(tool_node)["mps.json"])
    (mps_temp,) = temp_files(tool_node.state / "mps")
    assert {
        wiring.CHECKPOINT_FILE,
        LEDGER_FILE,
        FAKE_MIG_FILE,
        statefile.temp_target(mps_temp.name),
    } == statefile.STATE_FILE_NAMES


def test_the_sweep_never_enters_a_mount_or_goes_past_its_depth(tmp_path: Path) -> None:
    deep = tmp_path / "mps" / "uid" / "shm"
    deep.mkdir(parents=True)
    inside = deep / ".mps.json.abcdefgh.tmp"  # three levels down: a daemon's files, not ours
    inside.write_text("{")
    age(inside)
    assert (
        statefile.remove_stale_temp_files(tmp_path, time.time(), names=statefile.STATE_FILE_NAMES, depth=2)
        == []
    )
    assert inside.exists()


@pytest.mark.parametrize("name", [".checkpoint.json.abcdefgh.tmp", ".checkpoint.json.k2j3h4.tmp"])
def test_temp_names_of_this_and_older_releases_are_recognised(name: str) -> None:
    assert statefile.temp_target(name) == "checkpoint.json"
