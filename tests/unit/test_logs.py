"""Structured log lines: key=value text and JSON carry the fields passed through `extra`."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from dracommon.logs import _text_value, setup_logging


def emit(log_format: str) -> str:
    stream = io.StringIO()
    setup_logging(log_format, "info", stream=stream)
    log = logging.getLogger("draplugin.test")
    log.debug("hidden")
    log.info("claim prepared", extra={"claim": "uid-1", "devices": 2, "path": "/a b"})
    return stream.getvalue()


@pytest.mark.usefixtures("restore_root_logger")
def test_text_lines_are_key_value_with_quoting_only_where_needed() -> None:
    (line,) = emit("text").splitlines()
    assert " level=INFO logger=draplugin.test " in line
    assert line.endswith('msg="claim prepared" claim=uid-1 devices=2 path="/a b"')
    assert line.startswith("time=") and "Z " in line


@pytest.mark.usefixtures("restore_root_logger")
def test_json_lines_carry_the_same_fields() -> None:
    (line,) = emit("json").splitlines()
    record = json.loads(line)
    assert {k: record[k] for k in ("level", "logger", "msg", "claim", "devices", "path")} == {
        "level": "INFO",
        "logger": "draplugin.test",
        "msg": "claim prepared",
        "claim": "uid-1",
        "devices": 2,
        "path": "/a b",
    }


@pytest.mark.usefixtures("restore_root_logger")
def test_exceptions_stay_on_one_line() -> None:
    stream = io.StringIO()
    setup_logging("json", "info", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("x").exception("failed")
    (line,) = stream.getvalue().splitlines()
    assert "RuntimeError: boom" in json.loads(line)["exc"]


def test_unknown_format_or_level_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown log format"):
        setup_logging("xml")
    with pytest.raises(ValueError, match="unknown log level"):
        setup_logging("text", "loud")


def test_a_value_is_quoted_exactly_when_it_holds_whitespace_a_quote_or_an_equals_sign() -> None:
    # Every code point, against the rule as the docstring states it (str.isspace, '"', '=').
    wrong = [
        hex(code)
        for code in range(sys.maxunicode + 1)
        if (_text_value(f"a{chr(code)}b") != f"a{chr(code)}b") != (chr(code).isspace() or chr(code) in '"=')
    ]
    assert not wrong, wrong[:10]
    assert _text_value("") == '""'
