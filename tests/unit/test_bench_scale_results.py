"""bench/results.json is merged, not rewritten: `make scale` and `make bench` replace only their own rows."""

from __future__ import annotations

import json
from pathlib import Path

from bench.summary import Row, load_results, merge_results, write_results


def _row(figure: str, ours: float, benchmark: str = "scale") -> Row:
    return Row(benchmark, figure, "s", ours, 1.0, "json.load of the same objects")


def test_a_later_run_replaces_its_own_figures_and_keeps_the_others(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    first = [_row("prepare p50", 3.0, "prepare"), _row("explain, 1,000 nodes", 9.0)]
    write_results(results, first, {"cpus": 2})
    again = [_row("explain, 1,000 nodes", 2.0), _row("simulate, 1,000 nodes", 5.0)]
    merge_results(results, again, {"cpus": 4})
    assert load_results(results) == [
        _row("prepare p50", 3.0, "prepare"),
        _row("explain, 1,000 nodes", 2.0),
        _row("simulate, 1,000 nodes", 5.0),
    ]
    meta = json.loads(results.read_text())["meta"]
    assert meta["cpus"] == 4, "the newest run's facts describe the file"
    assert meta["kept_from_earlier_runs"] == ["prepare: prepare p50 (s)"]


def test_merging_into_no_file_or_a_foreign_file_writes_the_new_rows_alone(tmp_path: Path) -> None:
    missing = tmp_path / "new.json"
    merge_results(missing, [_row("explain, 100 nodes", 1.0)], {})
    assert load_results(missing) == [_row("explain, 100 nodes", 1.0)]
    assert json.loads(missing.read_text())["meta"]["kept_from_earlier_runs"] == []
    foreign = tmp_path / "foreign.json"
    foreign.write_text("not json")
    merge_results(foreign, [_row("explain, 100 nodes", 1.0)], {})
    assert load_results(foreign) == [_row("explain, 100 nodes", 1.0)]
