"""What a failed API call means: the HTTP code and the server's metav1.Status, as one exception type.

The API server answers every failure (and a watch's ERROR event) with a
metav1.Status: `code`, a machine-readable `reason` (NotFound, Conflict,
AlreadyExists, Expired, ...) and a human `message`. Callers decide their own
policy from `status` and `reason`; the message is what they log or report.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

# Enough of a non-Status body (an HTML error page of a proxy, say) to recognise it in a log.
BODY_EXCERPT: Final = 500


class ApiError(Exception):
    """A failed API call: HTTP status (0 when no answer came: connection, TLS, timeout, broken stream),
    the metav1.Status `reason` ("" when the server sent none) and `message`; `body` is the raw answer."""

    def __init__(self, status: int, message: str, *, reason: str = "", body: str = "") -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


class Gone(ApiError):
    """410: the resourceVersion asked for is too old (compacted away); list again."""


def error_from_status(status: Mapping[str, Any], http_status: int = 0) -> ApiError:
    """The exception a metav1.Status stands for (`Gone` for 410). The HTTP status of the answer wins
    when there is one; a watch's ERROR event has only the Status's `code`."""
    code = status.get("code")
    if http_status or not isinstance(code, int):
        code = http_status
    message, reason = status.get("message"), status.get("reason")
    reason = reason if isinstance(reason, str) else ""
    error = Gone if code == 410 else ApiError
    return error(
        code,
        message if isinstance(message, str) and message else f"{reason or 'error'} (no message)",
        reason=reason,
        body=json.dumps(dict(status)),
    )


def error_from_response(http_status: int, data: bytes, http_reason: str = "") -> ApiError:
    """The exception for a non-2xx answer: from its metav1.Status body, else from the body's text,
    else from the HTTP reason phrase."""
    text = data.decode(errors="replace")
    try:
        doc = json.loads(data) if data else None
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("message"), str) and doc["message"]:
        error = error_from_status(doc, http_status)
        error.body = text
        return error
    message = text[:BODY_EXCERPT].strip() or http_reason or "no message"
    error_type = Gone if http_status == 410 else ApiError
    return error_type(http_status, message, body=text)
