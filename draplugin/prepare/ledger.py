"""The sharing ledger: what prepare did on the GPU for each claim, durable before and after each step.

The claim checkpoint (`draplugin.checkpoint`) says which claims are prepared;
this file, next to it in the state directory, says what exists on the GPU
because of them: MIG instances (IDs, UUIDs), MPS daemons (PID and start time),
the shares that hold a shared GPU's MPS daemon, compute modes set for a daemon
(and the mode to restore), time-slice settings. Each entry is written before the side effect (`creating`,
`starting`, `setting`) and again after it, atomically, so a kill -9 anywhere
leaves an entry that start-up can undo: an entry whose claim is not a
completed checkpoint record is an orphan. A separate file rather than new
checkpoint fields because it changes at a different rhythm (several writes
inside one prepare) and older plugin releases read the checkpoint unchanged.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draplugin.statefile import StateFormatError, atomic_write, decode_json, read_state

log = logging.getLogger(__name__)

FILE_NAME = "sharing-ledger.json"
VERSION = 1
WHAT = "sharing ledger"

# The fields each kind's undo reads without a default (`draplugin.prepare.mig`, `.mps`, `.mpsgpu`,
# `.computemode`, `.timeslice` own the kinds; named here because they import this module): an entry
# without them, or with another type, would make start-up's orphan release raise on it. Such a file
# is corrupt as a whole.
_REQUIRED: Mapping[str, Mapping[str, type]] = {
    "mig": {"parent": str, "minor": int, "profile": str, "start": int},
    "mps": {"pipe": str, "log": str},
    "timeslice": {"device": str, "level": int},
    "mpsshare": {"owner": str},
    "computemode": {"previous": str},
}
# Optional fields read with a default, by type: present means well-typed.
_OPTIONAL: Mapping[str, Mapping[str, type]] = {
    "mig": {"slices": list, "gi": int, "ci": int, "uuid": str},
}


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One thing on the GPU: `kind` (mig, mps, timeslice), `key` (device name, GPU UUID), its state."""

    claim_uid: str
    kind: str
    key: str
    state: str
    data: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"claim": self.claim_uid, "kind": self.kind, "key": self.key, "state": self.state, **self.data}


class SharingLedger:
    """Entries keyed by (claim UID, kind, key), re-read from disk on every call.

    Re-reading keeps two plugin processes (a rolling update) consistent: the
    protocol layer serializes their calls, and each sees what the other wrote.
    A corrupt file (any content: `draplugin.statefile.read_state`) is moved aside
    and treated as empty (logged): a daemon never crashes on its own state.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def entries(self, claim_uid: str | None = None, kind: str | None = None) -> list[LedgerEntry]:
        with self._lock:
            return [
                e
                for e in self._load()
                if (claim_uid is None or e.claim_uid == claim_uid) and (kind is None or e.kind == kind)
            ]

    def get(self, claim_uid: str, kind: str, key: str) -> LedgerEntry | None:
        return next((e for e in self.entries(claim_uid, kind) if e.key == key), None)

    def claim_uids(self) -> Iterator[str]:
        yield from sorted({e.claim_uid for e in self.entries()})

    def put(self, entry: LedgerEntry) -> None:
        with self._lock:
            entries = [e for e in self._load() if _ident(e) != _ident(entry)]
            entries.append(entry)
            self._save(entries)

    def drop(self, claim_uid: str, kind: str, key: str) -> None:
        with self._lock:
            entries = self._load()
            kept = [e for e in entries if _ident(e) != (claim_uid, kind, key)]
            if len(kept) != len(entries):
                self._save(kept)

    def _load(self) -> list[LedgerEntry]:
        return read_state(self.path, parse, what=WHAT).value or []

    def _save(self, entries: list[LedgerEntry]) -> None:
        ordered = sorted(entries, key=_ident)
        doc = {"version": VERSION, "entries": [e.to_json() for e in ordered]}
        atomic_write(self.path, (json.dumps(doc, indent=1) + "\n").encode(), 0o600)


def _ident(entry: LedgerEntry) -> tuple[str, str, str]:
    return (entry.claim_uid, entry.kind, entry.key)


def parse(raw: bytes) -> list[LedgerEntry]:
    """The entries of a ledger file; `StateFormatError` for anything this release did not write."""
    doc = decode_json(raw)
    if not isinstance(doc, dict):
        raise StateFormatError("top level is not an object")
    items = doc.get("entries")
    if not isinstance(items, list):
        raise StateFormatError("entries is missing or not a list")
    return [_parse(i, item) for i, item in enumerate(items)]


def _parse(i: int, item: Any) -> LedgerEntry:
    where = f"entries[{i}]"
    if not isinstance(item, dict):
        raise StateFormatError(f"{where} is not an object")
    fields = [item.get(k) for k in ("claim", "kind", "key", "state")]
    if not all(isinstance(f, str) and f for f in fields):
        raise StateFormatError(f"{where} lacks a string claim, kind, key or state")
    claim, kind, key, state = (str(f) for f in fields)
    data = {k: v for k, v in item.items() if k not in ("claim", "kind", "key", "state")}
    for name, wanted in _REQUIRED.get(kind, {}).items():
        if not _typed(data.get(name), wanted):
            raise StateFormatError(f"{where} ({kind}): {name} is missing or not a {wanted.__name__}")
    for name, wanted in _OPTIONAL.get(kind, {}).items():
        if name in data and not _typed(data[name], wanted):
            raise StateFormatError(f"{where} ({kind}): {name} is not a {wanted.__name__}")
    if kind == "mig" and not all(_typed(s, int) for s in data.get("slices", [])):
        raise StateFormatError(f"{where} (mig): slices is not a list of integers")
    return LedgerEntry(claim, kind, key, state, data)


def _typed(value: Any, wanted: type) -> bool:
    # bool is an int to isinstance; no field of ours is ever a boolean where a number is meant.
    return isinstance(value, wanted) and not (wanted is int and isinstance(value, bool))
