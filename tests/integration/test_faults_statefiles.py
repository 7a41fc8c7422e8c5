"""The fault suite, state files: `draplugin run` as its own process starting on state files in every
bad shape (the sharing ledger and the fake MIG state, beside the checkpoint of
test_faults_plugin.py) and on the temp files every atomic writer leaves after a kill -9.

Each start must come up and serve (a prepare and an unprepare answered), with the bad file set
aside as `<name>.corrupt-*` and every stale temp file gone. Before issue 36 a deeply nested
ledger crash-looped the plugin (RecursionError out of start-up's orphan release), and so did a
fake MIG state the orphan release had to read.

Size: the rig of test_faults_plugin.py (one plugin, its fault proxy idle), three restarts.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from draplugin import statefile
from tests.integration import test_faults_plugin as faults
from tests.integration.test_faults_plugin import KUBELET_DEADLINE_S, SPEC_PREFIX, Rig, prepare, unprepare

rig_parts = faults.rig_parts  # the fixtures: one fake node, its claims, the plugin behind a proxy
rig = faults.rig

pytestmark = pytest.mark.cluster

LEDGER = "sharing-ledger.json"
FAKE_MIG = "fake-mig.json"
DEEP = b"[" * 100_000 + b"]" * 100_000


def aged(path: Path, content: bytes = b'{"partial') -> Path:
    """A file last changed an hour ago: left by a process that is gone."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    old = time.time() - 3600
    os.utime(path, (old, old))
    return path


def set_aside(rig: Rig, name: str) -> list[Path]:
    return sorted(rig.plugin.state_dir.glob(f"{name}{statefile.CORRUPT_INFIX}*"))


async def serves(rig: Rig) -> None:
    """The plugin came up on this state: one claim prepared and unprepared, the node left clean."""
    a = rig.refs[0]
    channel = await rig.channel()
    try:
        assert (await prepare(channel, [a], KUBELET_DEADLINE_S))[a.uid] == ""
        assert (await unprepare(channel, [a], KUBELET_DEADLINE_S))[a.uid] == ""
    finally:
        await channel.close()


def restart(rig: Rig) -> None:
    if rig.plugin.running:
        rig.plugin.kill()
    rig.start()


async def test_bad_sharing_ledger_and_fake_mig_state_at_start_neither_crash_nor_hang(rig: Rig) -> None:
    state = rig.plugin.state_dir
    state.mkdir(parents=True, exist_ok=True)

    # 1. A ledger nested deeper than the JSON parser recurses.
    (state / LEDGER).write_bytes(b'{"version": 1, "entries": ' + DEEP + b"}")
    restart(rig)
    await serves(rig)
    assert len(set_aside(rig, LEDGER)) == 1

    # 2. A valid ledger naming an orphaned MIG device, so start-up must read the fake MIG state to
    #    destroy it, and that state is nested too deep, then of the wrong types.
    orphan = {"claim": "uid-orphan", "kind": "mig", "key": "gpu-0-mig-1g5gb-0", "state": "creating",
              "parent": "GPU-orphan", "minor": 0, "profile": "1g.5gb", "start": 0, "slices": [0]}  # fmt: skip
    for bad in (DEEP, b'{"instances": [{"parent": "GPU-orphan"}]}'):
        (state / LEDGER).write_text(json.dumps({"version": 1, "entries": [orphan]}))
        (state / FAKE_MIG).write_bytes(bad)
        restart(rig)
        await serves(rig)
        assert bad in [p.read_bytes() for p in set_aside(rig, FAKE_MIG)]

    # 3. A directory where the ledger should be.
    (state / LEDGER).unlink(missing_ok=True)
    (state / LEDGER).mkdir()
    restart(rig)
    await serves(rig)
    assert any(p.is_dir() for p in set_aside(rig, LEDGER))


async def test_temp_files_of_every_writer_are_gone_after_a_start(rig: Rig) -> None:
    state = rig.plugin.state_dir
    rig.start()
    await serves(rig)  # a node that has served: its state directory is the plugin's own
    rig.plugin.kill()
    left = [
        aged(state / ".checkpoint.json.a1b2c3d4.tmp"),
        aged(state / f".{LEDGER}.a1b2c3d4.tmp"),
        aged(state / f".{FAKE_MIG}.a1b2c3d4.tmp"),
        aged(state / "mps" / rig.refs[0].uid / ".mps.json.a1b2c3d4.tmp"),
        aged(rig.cdi_root / f".{SPEC_PREFIX}{rig.refs[0].uid}.json.a1b2c3d4.tmp"),
    ]
    foreign = aged(state / ".notes.json.a1b2c3d4.tmp")  # another program's: not ours to remove
    rig.start()
    await serves(rig)
    assert [p for p in left if p.exists()] == []
    assert foreign.exists()
