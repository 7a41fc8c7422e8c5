"""Watch streams: newline-delimited JSON events (`{"type": ..., "object": ...}`), ERROR events raised.

The API server ends a watch by closing the stream (its `timeoutSeconds`, a
restart) or by sending one ERROR event whose object is a metav1.Status; code
410 ("too old resource version") means the caller must list again. Both the
node plugin and the controller watch through `watch_events`, so that rule is
applied in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from dracommon.kubeapi.errors import ApiError, error_from_status

JSON = dict[str, Any]


def raise_for_error_event(event: Mapping[str, Any]) -> None:
    """Raise what an ERROR event stands for (`Gone` for 410, else `ApiError`); other events pass."""
    if event.get("type") != "ERROR":
        return
    status = event.get("object")
    raise error_from_status(status if isinstance(status, Mapping) else {"message": repr(status)})


def watch_events(lines: Iterable[str | bytes]) -> Iterator[JSON]:
    """Decode one event per non-empty line; raises `ApiError` (status 0) for a line that is not an
    event object and the error an ERROR event carries."""
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as err:
            raise ApiError(0, f"malformed watch event {line[:200]!r}: {err}") from err
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise ApiError(0, f"malformed watch event {line[:200]!r}: not an event object")
        raise_for_error_event(event)
        yield event
