"""Structured logging for the daemons: `key=value` text or one JSON object per line.

Callers use the standard `logging` module and pass structured fields through
`extra`, e.g. `log.info("claim prepared", extra={"claim": uid, "devices": 2})`.
Both formatters render every such field, so the same call site serves humans
(text) and log pipelines (json). The message is a constant: a `key=value` put in
its text would be no field in JSON (tests/unit/test_log_style.py refuses one).
"""

from __future__ import annotations

import datetime
import logging
import re
import sys
from typing import Any, Final, TextIO

LOG_FORMATS: Final = ("text", "json")
LOG_LEVELS: Final = ("debug", "info", "warning", "error")

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RESERVED: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a caller attached to `record` through `extra`."""
    return {key: value for key, value in vars(record).items() if key not in _RESERVED}


def _timestamp(record: logging.LogRecord) -> str:
    moment = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


# What makes a value need quotes: `\s` of a str pattern is exactly `str.isspace` (both are
# CPython's Py_UNICODE_ISSPACE; tests/unit/test_logs.py checks every code point). One regex
# search is a fraction of a generator over the characters, on every field of every line.
_NEEDS_QUOTES: Final = re.compile(r'[\s"=]')


def _text_value(value: Any) -> str:
    text = str(value)
    # Quote only when needed so the common case stays readable and the line stays parseable.
    if text == "" or _NEEDS_QUOTES.search(text):
        # Imported on the first quoted value: json's import is a millisecond of the kubelet
        # plugin's start before its sockets, whose first lines need no quotes.
        import json

        return json.dumps(text, ensure_ascii=False)
    return text


class KeyValueFormatter(logging.Formatter):
    """`time=... level=INFO logger=... msg="..." key=value ...` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **record_fields(record),
        }
        line = " ".join(f"{key}={_text_value(value)}" for key, value in parts.items())
        if record.exc_info:
            import json

            line += " exc=" + json.dumps(self.formatException(record.exc_info), ensure_ascii=False)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line; values that JSON cannot encode are rendered with str()."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **record_fields(record),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        import json

        return json.dumps(payload, default=str, ensure_ascii=False)


# urllib3 logs a warning for each retry inside one API call (three per failed call with the
# client's default), on top of the caller's own line, which names the call, the error and when
# it is tried again. Those lines are demoted to DEBUG: shown only when debug logs are on.
_URLLIB3_POOL: Final = "urllib3.connectionpool"
_URLLIB3_RETRY_PREFIX: Final = "Retrying ("
# urllib3 marks its retry warning with this `extra` key; it is not a field of ours.
_URLLIB3_RETRY_MARK: Final = "__urllib3-retry-warning"


class _DemoteUrllib3Retries(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith(_URLLIB3_RETRY_PREFIX)):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        vars(record).pop(_URLLIB3_RETRY_MARK, None)
        return logging.getLogger().isEnabledFor(logging.DEBUG)


_URLLIB3_FILTER: Final = _DemoteUrllib3Retries()


def make_formatter(log_format: str) -> logging.Formatter:
    if log_format == "text":
        return KeyValueFormatter()
    if log_format == "json":
        return JsonFormatter()
    raise ValueError(f"unknown log format {log_format!r}; expected one of {', '.join(LOG_FORMATS)}")


def setup_logging(log_format: str = "text", level: str = "info", stream: TextIO | None = None) -> None:
    """Route all logging to one handler on `stream` (stderr by default) in the chosen format."""
    if level not in LOG_LEVELS:
        raise ValueError(f"unknown log level {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(make_formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    pool = logging.getLogger(_URLLIB3_POOL)
    if _URLLIB3_FILTER not in pool.filters:
        pool.addFilter(_URLLIB3_FILTER)
