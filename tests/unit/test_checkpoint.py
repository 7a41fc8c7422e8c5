"""Checkpoint formats (v1, v2, newer), corruption handling, boot-ID changes and grouped commits."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from draplugin import checkpoint as cp
from draplugin.cdi import spec as cdi
from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState, DeviceRecord

DEVICE = DeviceRecord(
    request_names=("gpu",),
    pool="node-a",
    device="gpu-0",
    cdi_ids=("gpu.draplugin.dev/gpu=u1-gpu-0",),
    config={
        "apiVersion": "gpu.draplugin.dev/v1alpha1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "Exclusive"},
    },
)
RECORD = ClaimRecord("u1", "ns", "claim", ClaimState.PREPARE_COMPLETED, (DEVICE,))


def test_v2_round_trip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    store.put(RECORD)
    store.save()
    doc = json.loads((tmp_path / "cp.json").read_text())
    assert doc["version"] == 2 and doc["bootId"] == "boot-1"
    again = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    result = again.load()
    assert result.version == 2 and result.claims == 1 and not result.new_boot
    assert again.get("u1") == RECORD
    assert oct((tmp_path / "cp.json").stat().st_mode & 0o777) == "0o600"


def test_missing_file_is_empty(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", boot_id="b")
    assert store.load() == cp.LoadResult()
    assert len(store) == 0


def test_v1_is_read_and_needs_fresh_prepare(tmp_path: Path) -> None:
    v1 = {
        "version": 1,
        "bootId": "boot-1",
        "preparedClaims": {
            "u1": {
                "namespace": "ns",
                "name": "claim",
                "devices": [
                    {
                        "requestNames": ["gpu"],
                        "poolName": "node-a",
                        "deviceName": "gpu-0",
                        "cdiDeviceIds": ["gpu.draplugin.dev/gpu=u1-gpu-0"],
                    }
                ],
            }
        },
    }
    (tmp_path / "cp.json").write_text(json.dumps(v1))
    store = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    assert store.load().version == 1
    record = store.get("u1")
    assert record is not None
    # v1 has no config, so it cannot be rebuilt offline: known (unprepare works) but redone on prepare.
    assert record.state is ClaimState.PREPARE_STARTED
    assert record.devices[0].device == "gpu-0" and record.devices[0].config is None


def test_newer_version_with_v2_core_is_read_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    store.put(RECORD)
    store.save()
    doc = json.loads((tmp_path / "cp.json").read_text())
    doc["version"] = 3
    doc["futureTopLevel"] = {"x": 1}
    doc["claims"][0]["futureField"] = True
    doc["claims"][0]["devices"][0]["futureDeviceField"] = [1]
    (tmp_path / "cp.json").write_text(json.dumps(doc))
    newer = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    with caplog.at_level(logging.WARNING):
        result = newer.load()
    assert result.newer_version and result.version == 3
    assert newer.get("u1") == RECORD
    assert "checkpoint written by a newer release" in caplog.text


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"{truncated", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "top level is not an object"),
        (b'{"claims": []}', "missing or invalid version"),
        (b'{"version": 2, "claims": {}}', "claims is not a list"),
        (
            b'{"version": 2, "claims": [{"uid": "u", "namespace": "n", "name": "c", "state": "Weird"}]}',
            "unknown state",
        ),
        (b'{"version": 4, "somethingElse": []}', "claims is not a list"),
        # Deep nesting makes the JSON parser recurse until RecursionError: corruption, not a crash.
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b'{"version": 2, "claims": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not JSON"),
        (b'{"version": 2, "claims": [], "x": ' + b"9" * 5000 + b"}", "not JSON"),
    ],
)
def test_corrupt_file_is_moved_aside_and_store_starts_empty(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    path = tmp_path / "cp.json"
    path.write_bytes(content)
    store = CheckpointStore(path, boot_id="b")
    result = store.load()
    assert result.corrupt_reason is not None and reason in result.corrupt_reason
    assert result.moved_to is not None and result.moved_to.read_bytes() == content
    assert not path.exists()
    assert len(store) == 0
    store.save()  # and it can be rebuilt in place
    assert json.loads(path.read_text())["claims"] == []


def test_new_boot_demotes_completed_claims_but_keeps_them(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    store.put(RECORD)
    store.save()
    rebooted = CheckpointStore(tmp_path / "cp.json", boot_id="boot-2")
    result = rebooted.load()
    assert result.new_boot
    record = rebooted.get("u1")
    assert (
        record is not None and record.state is ClaimState.PREPARE_STARTED and record.devices == RECORD.devices
    )
    rebooted.save()
    assert json.loads((tmp_path / "cp.json").read_text())["bootId"] == "boot-2"


def test_read_boot_id(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("abc-123\n")
    assert cp.read_boot_id(tmp_path / "boot_id") == "abc-123"
    assert cp.read_boot_id(tmp_path / "missing") == ""


async def test_concurrent_commits_are_grouped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    real = cdi.atomic_write

    def counting(path: Path, content: bytes, mode: int = 0o644, *, sync_dir: bool = True) -> None:
        writes.append(len(json.loads(content)["claims"]))
        real(path, content, mode, sync_dir=sync_dir)

    monkeypatch.setattr(cp, "atomic_write", counting)
    store = CheckpointStore(tmp_path / "cp.json", boot_id="b")

    async def one(i: int) -> None:
        store.put(ClaimRecord(f"u{i}", "ns", f"c{i}", ClaimState.PREPARE_STARTED))
        await store.commit()

    await asyncio.gather(*(one(i) for i in range(20)))
    assert len(writes) < 20  # grouped, not one write per change
    assert writes[-1] == 20  # the last write holds every change
    assert len(json.loads((tmp_path / "cp.json").read_text())["claims"]) == 20


def test_checkpoint_is_written_as_compact_json(tmp_path: Path) -> None:
    """One compact line: the C JSON encoder (indent forces the pure-Python one, ~10x slower at 64
    claims, and every commit renders every claim on the event loop); still a readable checkpoint."""
    store = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    for i in range(3):
        store.put(ClaimRecord(f"u{i}", "ns", f"claim-{i}", ClaimState.PREPARE_COMPLETED, (DEVICE,)))
    store.save()
    text = (tmp_path / "cp.json").read_text()
    assert text == json.dumps(json.loads(text)) + "\n"
    again = CheckpointStore(tmp_path / "cp.json", boot_id="boot-1")
    assert again.load().claims == 3
    assert again.get("u2") == ClaimRecord("u2", "ns", "claim-2", ClaimState.PREPARE_COMPLETED, (DEVICE,))


def test_reload_keeps_our_unwritten_changes_over_the_file(tmp_path: Path) -> None:
    """Two plugin processes share the file during a rolling update: re-reading it brings in the
    other's claims but must not drop ours that are held in memory only (a new claim's
    PrepareStarted), nor bring back one we forgot and have not written yet."""
    path = tmp_path / "cp.json"
    ours = CheckpointStore(path, boot_id="b")
    ours.put(RECORD)
    ours.put(ClaimRecord("u-gone", "ns", "gone", ClaimState.PREPARE_COMPLETED))
    ours.save()
    ours.forget("u-gone")  # not written yet
    started = ClaimRecord("u-new", "ns", "new", ClaimState.PREPARE_STARTED, (DEVICE,))
    ours.put(started)  # held in memory only
    other = CheckpointStore(path, boot_id="b")
    other.load()
    other.put(ClaimRecord("u-other", "ns", "theirs", ClaimState.PREPARE_COMPLETED))
    other.save()

    ours.load()
    assert {r.uid for r in ours.records()} == {"u1", "u-new", "u-other"}
    assert ours.get("u-new") == started


def test_written_changes_follow_the_file_on_reload(tmp_path: Path) -> None:
    path = tmp_path / "cp.json"
    ours = CheckpointStore(path, boot_id="b")
    ours.put(RECORD)
    ours.save()
    other = CheckpointStore(path, boot_id="b")
    other.load()
    other.forget("u1")  # the other process unprepared it after our write
    other.save()
    ours.load()
    assert ours.get("u1") is None


def test_each_write_holds_every_records_current_json_in_uid_order(tmp_path: Path) -> None:
    """Records' JSON is kept between writes (`_render`): the file must still be exactly what
    json.dumps makes of the whole document, after records were added, replaced and forgotten."""
    path = tmp_path / "cp.json"
    store = CheckpointStore(path, boot_id="boot-1")
    for i in (3, 1, 2):
        store.put(ClaimRecord(f"u{i}", "ns", f"claim-{i}", ClaimState.PREPARE_STARTED, (DEVICE,)))
    store.save()
    store.put(ClaimRecord("u2", "ns", "claim-2", ClaimState.PREPARE_COMPLETED, (DEVICE,)))  # replaced
    store.forget("u3")
    store.put(ClaimRecord("u0", "ns", "claim-0", ClaimState.PREPARE_COMPLETED))
    store.save()
    expected = {
        "version": cp.CURRENT_VERSION,
        "bootId": "boot-1",
        "claims": [r.to_json() for r in sorted(store.records(), key=lambda r: r.uid)],
    }
    assert path.read_text() == json.dumps(expected) + "\n"
    assert [c["state"] for c in json.loads(path.read_text())["claims"]] == [
        "PrepareCompleted",
        "PrepareStarted",
        "PrepareCompleted",
    ]
