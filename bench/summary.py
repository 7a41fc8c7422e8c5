"""One row per side-by-side figure, shared by every benchmark and read back by `python -m bench`.

A benchmark process calls `record(...)` for each figure it measured against a peer; rows go,
as JSON lines, to the file named by $BENCH_ROWS (set by `python -m bench` for its children;
unset: rows are only printed by the benchmark itself). The parent then prints one summary
table and writes every row to bench/results.json, which `python -m bench.compare A B` reads.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROWS_ENV = "BENCH_ROWS"


@dataclass(frozen=True, slots=True)
class Row:
    benchmark: str
    figure: str
    unit: str
    ours: float
    peer: float
    peer_name: str
    # Whether a larger number is better (rates) or worse (latency, memory): it decides
    # which way `compare` calls a change an improvement.
    higher_is_better: bool = False

    @property
    def ratio(self) -> float | None:
        return self.ours / self.peer if self.peer else None


@dataclass(frozen=True, slots=True)
class Failure:
    """A part of a benchmark that measured nothing: which part, which side (ours, the peer's
    name, or "either" before the sides part) and why, for the summary to say after the rows."""

    benchmark: str
    part: str
    side: str
    why: str

    def line(self) -> str:
        return f"{self.benchmark}, {self.part}, {self.side}: {self.why}"


def _append(document: dict[str, Any]) -> None:
    target = os.environ.get(ROWS_ENV)
    if not target:
        return
    with open(target, "a", encoding="utf-8") as out:
        out.write(json.dumps(document) + "\n")


def record(row: Row) -> None:
    """Append the row for the parent's summary; a no-op when run on its own."""
    _append(asdict(row))


def record_failure(benchmark: str, part: str, side: str, why: str) -> None:
    """Append a failed part for the parent's summary (a no-op when run on its own)."""
    _append({"failure": asdict(Failure(benchmark, part, side, why))})


def read_records(path: Path) -> tuple[list[Row], list[Failure]]:
    """The rows and the failed parts the benchmarks appended, each in the order written."""
    rows: list[Row] = []
    failures: list[Failure] = []
    if not path.exists():
        return rows, failures
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        document = json.loads(line)
        if "failure" in document:
            failures.append(Failure(**document["failure"]))
        else:
            rows.append(Row(**document))
    return rows, failures


def read_rows(path: Path) -> list[Row]:
    return read_records(path)[0]


def load_results(path: Path) -> list[Row]:
    """Rows of a results file written by `write_results` (clear error for anything else)."""
    try:
        document: Any = json.loads(path.read_text(encoding="utf-8"))
        return [Row(**row) for row in document["rows"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"bench: {path} is not a results file written by `make bench`: {err}") from None


def write_results(path: Path, rows: list[Row], meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({"meta": meta, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


def row_key(row: Row) -> tuple[str, str, str]:
    """What names a figure across runs: the same key in a later run is the same figure, measured again."""
    return row.benchmark, row.figure, row.unit


def merge_results(path: Path, rows: list[Row], meta: dict[str, Any]) -> None:
    """Write `rows` into the results file, keeping the figures of earlier runs that these rows do
    not measure again (`make scale` and `make bench` share bench/results.json; neither wipes the
    other's rows). A file that is not a results file is replaced (said on stderr)."""
    earlier: list[Row] = []
    if path.exists():
        try:
            earlier = load_results(path)
        except SystemExit as err:
            print(f"{err}; writing a new one", file=sys.stderr)
    fresh = {row_key(r) for r in rows}
    kept = [r for r in earlier if row_key(r) not in fresh]
    by_key = {row_key(r): r for r in rows}
    # Figures measured again stay where they were in the file; new ones go after.
    merged = [by_key.pop(row_key(r), r) for r in earlier]
    merged += list(by_key.values())
    names = [f"{r.benchmark}: {r.figure} ({r.unit})" for r in kept]
    write_results(path, merged, {**meta, "kept_from_earlier_runs": names})


def format_number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def table(rows: list[Row]) -> str:
    """Both sides and the ratio ours/peer, one line per figure."""
    header = ("benchmark", "figure", "ours", "peer", "peer is", "ours/peer")
    body = [
        (
            r.benchmark,
            f"{r.figure} ({r.unit})",
            format_number(r.ours),
            format_number(r.peer),
            r.peer_name,
            "n/a" if r.ratio is None else f"{r.ratio:.2f}x",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in (header, *body)
    )
