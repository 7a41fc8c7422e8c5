"""An Event's note, cut to what `events.k8s.io/v1` accepts: at most 1,024 bytes of UTF-8.

The API server measures the note with Go's `len`, in bytes, so a note of 1,024 characters with
any non-ASCII text in it is refused (422) and no Event is posted at all. Both daemons' Event
writers cut their notes here, at a character boundary, with "..." to say something was cut.
"""

from __future__ import annotations

from typing import Final

NOTE_LIMIT_BYTES: Final = 1024  # k8s.io/kubernetes pkg/apis/events/validation: NoteLengthLimit
_ELLIPSIS: Final = "..."


def event_note(note: str, limit: int = NOTE_LIMIT_BYTES) -> str:
    """`note` whole if its UTF-8 fits `limit` bytes, else its longest prefix that fits with "..."."""
    encoded = note.encode("utf-8", errors="replace")
    if len(encoded) <= limit:
        return note
    room = limit - len(_ELLIPSIS)
    # Dropping the bytes of a character the cut split leaves whole characters only.
    return encoded[:room].decode("utf-8", errors="ignore") + _ELLIPSIS
