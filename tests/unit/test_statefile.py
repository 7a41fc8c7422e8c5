"""The one reader of the plugin's state files: any content, for every file kind, is survived.

Each kind is read the way the plugin reads it at start (the checkpoint's load, the ledger's
entries, the fake MIG hardware's lookups); every bad shape must leave the reader answering
"nothing recorded", the bad file kept aside as `<name>.corrupt-*`, a log line that says so, and
the file writable again in place. `mps.json` is written for the claim's containers and never
read back by the plugin, so it has no reader; its temp files are swept (test_statefile_sweep).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from draplugin import statefile
from draplugin.checkpoint import CheckpointStore, ClaimRecord, ClaimState
from draplugin.devices.fakemig import STATE_FILE as FAKE_MIG_FILE
from draplugin.devices.fakemig import FakeMigHardware
from draplugin.devices.mig import MigPlacement
from draplugin.prepare.ledger import FILE_NAME as LEDGER_FILE
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from draplugin.statefile import StateFormatError, read_state

PLACEMENT = MigPlacement("GPU-0", 0, "1g.5gb", 0, (0,))
DEEP = b"[" * 100_000 + b"]" * 100_000


@dataclass(frozen=True)
class Kind:
    """One state file: its name, how the plugin reads it (empty: what a fresh node reads), a
    write that must work after a bad file was set aside, and shapes of the wrong types."""

    name: str
    read: Callable[[Path], object]
    empty: object
    write: Callable[[Path], None]
    wrong_types: tuple[bytes, ...]


def _read_checkpoint(path: Path) -> object:
    store = CheckpointStore(path, boot_id="b")
    store.load()
    return len(store)


def _write_checkpoint(path: Path) -> None:
    store = CheckpointStore(path, boot_id="b")
    store.put(ClaimRecord("u", "ns", "claim", ClaimState.PREPARE_COMPLETED))
    store.save()


def _read_ledger(path: Path) -> object:
    return SharingLedger(path).entries()


def _write_ledger(path: Path) -> None:
    SharingLedger(path).put(LedgerEntry("u", "timeslice", "GPU-0", "set", {"device": "gpu-0", "level": 1}))


def _read_fake_mig(path: Path) -> object:
    hardware = FakeMigHardware(path)
    return (hardware.instances(), hardware.mig_find(PLACEMENT))


def _write_fake_mig(path: Path) -> None:
    FakeMigHardware(path).mig_create(PLACEMENT)


KINDS = {
    "checkpoint": Kind(
        "checkpoint.json",
        _read_checkpoint,
        0,
        _write_checkpoint,
        (b'{"version": 2, "claims": {}}', b'{"version": "2", "claims": []}'),
    ),
    "ledger": Kind(
        LEDGER_FILE,
        _read_ledger,
        [],
        _write_ledger,
        (
            b'{"version": 1, "entries": {}}',
            b'{"version": 1, "entries": [["claim", "kind"]]}',
            b'{"version": 1, "entries": [{"claim": "u", "kind": "mps", "key": "daemon", '
            b'"state": "running"}]}',
            b'{"version": 1, "entries": [{"claim": "u", "kind": "mig", "key": "d", "state": "created", '
            b'"parent": "GPU-0", "minor": "0", "profile": "1g.5gb", "start": 0}]}',
            b'{"version": 1, "entries": [{"claim": "u", "kind": "timeslice", "key": "GPU-0", "state": "set", '
            b'"device": "gpu-0", "level": true}]}',
        ),
    ),
    "fake MIG state": Kind(
        FAKE_MIG_FILE,
        _read_fake_mig,
        ([], None),
        _write_fake_mig,
        (
            b'{"instances": {}}',
            b'{"instances": [{"parent": "GPU-0"}]}',
            b'{"instances": [{"parent": "GPU-0", "profile": "1g.5gb", "start": 0, "gi": 1, "ci": 0, '
            b'"uuid": "MIG-1", "slices": ["0"]}]}',
            b'{"migModeOff": "GPU-0"}',
        ),
    ),
}

# Shapes every kind must survive, as bytes written to the file.
CONTENTS = {
    "garbage": b"{truncated",
    "binary": b"\xff\xfe\x00\x01",
    "empty": b"",
    "top-level list": b"[]",
    "deep nesting": DEEP,
    "deep nesting inside an object": b'{"version": 1, "entries": ' + DEEP + b', "claims": []}',
    "too many digits": b'{"version": 1, "x": ' + b"9" * 5000 + b"}",
}


def _shapes() -> list[tuple[str, str, bytes]]:
    cases = [(kind, shape, content) for kind in KINDS for shape, content in CONTENTS.items()]
    for kind, spec in KINDS.items():
        cases += [(kind, f"wrong types {i}", content) for i, content in enumerate(spec.wrong_types)]
    return cases


def _set_aside(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}{statefile.CORRUPT_INFIX}*"))


def _reasons(caplog: pytest.LogCaptureFixture) -> str:
    """The reasons the reader logged (structured: the `reason` field of its records)."""
    return " | ".join(str(getattr(r, "reason", "")) for r in caplog.records)


def _survived(kind: Kind, path: Path, caplog: pytest.LogCaptureFixture) -> Path:
    """Read as the plugin does: nothing recorded, the bad thing set aside and logged; then writable."""
    with caplog.at_level(logging.ERROR):
        assert kind.read(path) == kind.empty
    (aside,) = _set_aside(path)
    assert not os.path.lexists(path)
    assert "unreadable: moved aside, starting empty" in caplog.text
    kind.write(path)
    assert kind.read(path) != kind.empty  # the plugin goes on writing its state in place
    return aside


@pytest.mark.parametrize(("kind", "shape", "content"), _shapes())
def test_bad_content_is_set_aside_and_read_as_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str, shape: str, content: bytes
) -> None:
    path = tmp_path / KINDS[kind].name
    path.write_bytes(content)
    aside = _survived(KINDS[kind], path, caplog)
    assert aside.read_bytes() == content  # kept for a person to look at


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_past_the_size_limit_is_set_aside_unread(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / KINDS[kind].name
    with path.open("wb") as f:
        f.truncate(statefile.MAX_STATE_BYTES + 1)  # sparse: no disk, and never read into memory
    aside = _survived(KINDS[kind], path, caplog)
    assert aside.stat().st_size == statefile.MAX_STATE_BYTES + 1
    assert "more than the" in _reasons(caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_a_directory_in_the_files_place_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / KINDS[kind].name
    path.mkdir()
    (path / "inside").write_text("kept")
    aside = _survived(KINDS[kind], path, caplog)
    assert (aside / "inside").read_text() == "kept"


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_in_the_files_place_does_not_hang_start_up(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / KINDS[kind].name
    os.mkfifo(path)  # no writer: a plain open() for reading would block forever
    _survived(KINDS[kind], path, caplog)
    assert "not a regular file" in _reasons(caplog)


@pytest.mark.parametrize("kind", KINDS)
def test_a_link_to_an_endless_device_is_set_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    path = tmp_path / KINDS[kind].name
    path.symlink_to("/dev/zero")
    aside = _survived(KINDS[kind], path, caplog)
    assert aside.is_symlink() and Path("/dev/zero").exists()  # the link moved, not its target


def test_a_missing_file_is_nothing_recorded_and_nothing_is_set_aside(tmp_path: Path) -> None:
    for kind in KINDS.values():
        assert kind.read(tmp_path / kind.name) == kind.empty
    assert list(tmp_path.iterdir()) == []


def test_the_ledgers_deep_nesting_used_to_crash_its_reader(tmp_path: Path) -> None:
    """Issue 36 item 6, as found: a deeply nested ledger raised RecursionError out of `entries()`."""
    path = tmp_path / LEDGER_FILE
    path.write_bytes(b'{"version": 1, "entries": ' + DEEP + b"}")
    assert SharingLedger(path).entries() == []
    assert len(_set_aside(path)) == 1


def test_a_second_bad_file_in_the_same_second_keeps_the_first(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for content in (b"first", b"second"):
        path.write_bytes(content)
        assert read_state(path, statefile.decode_json, what="state").problem is not None
    assert sorted(p.read_bytes() for p in _set_aside(path)) == [b"first", b"second"]


def test_a_parser_that_trusts_a_shape_too_far_cannot_crash_the_reader(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"entries": "not a list"}))

    def trusting(raw: bytes) -> int:
        doc = statefile.decode_json(raw)
        return int(doc["entries"][0]["n"])  # TypeError on the string index

    found = read_state(path, trusting, what="state")
    assert found.value is None and found.problem is not None and "TypeError" in found.problem


def test_a_good_file_is_read_and_left_in_place(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"a": 1}')
    found = read_state(path, statefile.decode_json, what="state")
    assert found.value == {"a": 1} and found.problem is None and path.exists()


def test_decode_json_names_what_was_wrong() -> None:
    with pytest.raises(StateFormatError, match="not JSON: RecursionError"):
        statefile.decode_json(DEEP)


@pytest.mark.parametrize(("sync_dir", "synced"), [(True, ["file", "dir"]), (False, ["file"])])
def test_a_durable_write_syncs_its_directory_unless_told_not_to(
    tmp_path: Path, sync_dir: bool, synced: list[str]
) -> None:
    kinds: list[str] = []

    def fsync(fd: int) -> None:
        kinds.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        os.fsync(fd)

    statefile.atomic_write(tmp_path / "state.json", b"{}", sync_dir=sync_dir, fsync=fsync)
    assert kinds == synced and (tmp_path / "state.json").read_bytes() == b"{}"
