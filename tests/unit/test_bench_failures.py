"""A benchmark part that fails names its side and why, and `python -m bench` still prints every row."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

import bench.__main__ as bench_main
from bench.summary import ROWS_ENV, Failure, Row, read_records, record, record_failure

ROW = Row("prepare", "prepare 64 concurrent p99", "ms", 300.0, 400.0, "dra-example-driver v0.4.0")


def test_failures_and_rows_come_back_apart_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows_file = tmp_path / "rows.jsonl"
    monkeypatch.setenv(ROWS_ENV, str(rows_file))
    record(ROW)
    record_failure("prepare", "one blocked claim", "ours", "prepare of c-1: no answer")
    record(ROW)
    rows, failures = read_records(rows_file)
    assert rows == [ROW, ROW]
    assert failures == [Failure("prepare", "one blocked claim", "ours", "prepare of c-1: no answer")]
    assert failures[0].line() == "prepare, one blocked claim, ours: prepare of c-1: no answer"


def test_the_summary_keeps_every_row_and_names_the_failed_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One benchmark records a row and a failed part and exits 1, another dies without a word."""

    def child(command: list[str], *, cwd: Path, env: dict[str, str]) -> int:
        name = command[-1].removeprefix("bench.")
        monkeypatch.setattr(os, "environ", env)  # the child's environment: $BENCH_ROWS set
        if name == "prepare":
            record(ROW)
            record_failure("prepare", "one blocked claim", "ours", "the API server did not answer in time")
            return 1
        return 2

    monkeypatch.setattr("bench.__main__.subprocess.call", child)
    written: dict[str, Any] = {}
    monkeypatch.setattr(
        bench_main, "merge_results", lambda path, rows, meta: written.update(rows=rows, meta=meta)
    )
    assert bench_main.main(["prepare", "cel"]) == 1
    out, err = capsys.readouterr()
    assert "prepare 64 concurrent p99 (ms)" in out, "the row is in the summary table"
    assert "prepare, one blocked claim, ours: the API server did not answer in time" in err
    assert "cel: exited non-zero" in err
    assert written["rows"] == [ROW]
    assert written["meta"]["failed"] == ["prepare", "cel"]
    assert written["meta"]["failed_parts"] == [
        "prepare, one blocked claim, ours: the API server did not answer in time"
    ]
    assert json.dumps(written["meta"])  # results.json can hold it
