"""The sharing ledger: what prepare did on the GPU for each claim, durable before and after each step.

The claim checkpoint (`draplugin.checkpoint`) says which claims are prepared;
this file, next to it in the state directory, says what exists on the GPU
because of them: MIG instances (IDs, UUIDs), MPS daemons (PID and start time),
time-slice settings. Each entry is written before the side effect (`creating`,
`starting`, `setting`) and again after it, atomically, so a kill -9 anywhere
leaves an entry that start-up can undo: an entry whose claim is not a
completed checkpoint record is an orphan. A separate file rather than new
checkpoint fields because it changes at a different rhythm (several writes
inside one prepare) and older plugin releases read the checkpoint unchanged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draplugin.cdi.spec import atomic_write

log = logging.getLogger(__name__)

FILE_NAME = "sharing-ledger.json"
VERSION = 1


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
    A corrupt file is moved aside and treated as empty (logged): a daemon never
    crashes on its own state.
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
        try:
            doc = json.loads(self.path.read_bytes())
            return [_parse(item) for item in doc["entries"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as err:
            aside = self.path.with_name(self.path.name + ".corrupt")
            log.error(
                "sharing ledger unreadable: moved aside, starting empty",
                extra={"path": str(self.path), "error": str(err), "moved_to": str(aside)},
            )
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            return []

    def _save(self, entries: list[LedgerEntry]) -> None:
        ordered = sorted(entries, key=_ident)
        doc = {"version": VERSION, "entries": [e.to_json() for e in ordered]}
        atomic_write(self.path, (json.dumps(doc, indent=1) + "\n").encode(), 0o600)


def _ident(entry: LedgerEntry) -> tuple[str, str, str]:
    return (entry.claim_uid, entry.kind, entry.key)


def _parse(item: Any) -> LedgerEntry:
    if not isinstance(item, dict):
        raise ValueError("entry is not an object")
    data = {k: v for k, v in item.items() if k not in ("claim", "kind", "key", "state")}
    fields = [item.get(k) for k in ("claim", "kind", "key", "state")]
    if not all(isinstance(f, str) and f for f in fields):
        raise ValueError(f"entry lacks claim/kind/key/state: {item!r}")
    claim, kind, key, state = (str(f) for f in fields)
    return LedgerEntry(claim, kind, key, state, data)
