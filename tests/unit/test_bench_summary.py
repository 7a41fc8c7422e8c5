"""The bench summary: rows recorded by benchmark processes, the table, and bench-compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.compare import compare
from bench.compare import main as compare_main
from bench.summary import ROWS_ENV, Row, load_results, read_rows, record, table, write_results


def _row(ours: float, peer: float, *, higher: bool = False, figure: str = "prepare p50") -> Row:
    return Row("prepare", figure, "ms", ours, peer, "dra-example-driver v0.4.0", higher)


def test_recorded_rows_reach_the_parent_through_the_rows_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows_file = tmp_path / "rows.jsonl"
    monkeypatch.setenv(ROWS_ENV, str(rows_file))
    record(_row(6.0, 3.0))
    record(_row(300, 400, higher=True, figure="claims/s"))
    assert read_rows(rows_file) == [_row(6.0, 3.0), _row(300, 400, higher=True, figure="claims/s")]


def test_record_without_a_parent_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROWS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    record(_row(1, 1))
    assert list(tmp_path.iterdir()) == []


def test_table_names_both_sides_and_the_ratio() -> None:
    text = table([_row(6.0, 3.0)])
    header, line = text.splitlines()
    assert "ours" in header and "peer" in header and "ours/peer" in header
    assert "dra-example-driver v0.4.0" in line and "2.00x" in line and "6" in line and "3" in line


def test_a_zero_peer_figure_has_no_ratio() -> None:
    assert _row(1, 0).ratio is None
    assert "n/a" in table([_row(1, 0)])


def test_compare_calls_lower_latency_better_and_lower_rate_worse() -> None:
    before = [_row(6.0, 3.0), _row(300, 400, higher=True, figure="claims/s")]
    after = [_row(3.0, 3.0), _row(200, 400, higher=True, figure="claims/s")]
    lines = compare(before, after).splitlines()
    latency = next(line for line in lines if "prepare p50" in line)
    rate = next(line for line in lines if "claims/s" in line)
    assert latency.endswith("better") and "-50.0%" in latency
    assert rate.endswith("worse")


def test_compare_lists_figures_found_in_one_run_only() -> None:
    text = compare([_row(1, 1)], [_row(1, 1, figure="start-up")])
    assert "only in A: prepare: prepare p50 (ms)" in text
    assert "only in B: prepare: start-up (ms)" in text


def test_results_round_trip_and_bad_files_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "a.json"
    write_results(good, [_row(6.0, 3.0)], {"cpus": 2})
    assert load_results(good) == [_row(6.0, 3.0)]
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps({"something": "else"}))
    with pytest.raises(SystemExit, match="not a results file"):
        load_results(bad)


def test_compare_command_needs_two_files(capsys: pytest.CaptureFixture[str]) -> None:
    assert compare_main(["only-one.json"]) == 2
    assert "usage" in capsys.readouterr().err
