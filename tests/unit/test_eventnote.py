"""Event notes are cut at 1,024 UTF-8 bytes, the API server's limit, never inside a character:
by the plugin's Event writer and by the controller's."""

from __future__ import annotations

from typing import Any

import pytest

from controller.run.events import cannot_allocate_event
from dracommon.eventnote import NOTE_LIMIT_BYTES, event_note
from draplugin.events import KubeEvents
from draplugin.kubelet.interface import ClaimRef

# 2, 3 and 4 bytes per character, and ASCII: each cut lands inside a character somewhere.
NOTES = ["é" * 700, "設備" * 300, "🎮" * 300, "x" * 1023 + "é", "a" * 2000]
CLAIM = {"metadata": {"namespace": "ns", "name": "claim", "uid": "u"}}


class Recorder:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.created.append((path, body))
        return body


def plugin_note(note: str) -> str:
    api = Recorder()
    events = KubeEvents(api, "gpu.draplugin.dev", "node-a")  # type: ignore[arg-type]
    events.claim_event(ClaimRef("ns", "u", "claim"), "DeviceInUse", note)
    events.close()
    [(_, body)] = api.created
    return str(body["note"])


def controller_note(note: str) -> str:
    return str(cannot_allocate_event(CLAIM, note, "controller-0", "gpu.draplugin.dev")["note"])


@pytest.mark.parametrize("writer", [plugin_note, controller_note])
@pytest.mark.parametrize("note", NOTES, ids=["2-byte", "3-byte", "4-byte", "last-char-split", "ascii"])
def test_a_long_note_is_cut_to_the_apis_byte_limit_at_a_character(writer: Any, note: str) -> None:
    posted = writer(note)
    assert len(posted.encode()) <= NOTE_LIMIT_BYTES
    assert posted.endswith("...") and note.startswith(posted.removesuffix("..."))
    assert len(posted.encode()) > NOTE_LIMIT_BYTES - 4 - 3  # cut no more than one character short


@pytest.mark.parametrize("writer", [plugin_note, controller_note])
def test_a_note_that_fits_is_posted_whole(writer: Any) -> None:
    for note in ("", "short", "é" * 512, "a" * NOTE_LIMIT_BYTES):
        assert writer(note) == note


def test_the_cut_is_one_function() -> None:
    assert event_note("é" * 600) == "é" * 510 + "..."
    assert event_note("abcdef", limit=5) == "ab..."
