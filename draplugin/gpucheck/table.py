"""gpu-check's rows: each compares ours with what the driver's tools say, and the table that prints them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OK, MISMATCH, SKIPPED = "ok", "MISMATCH", "skipped"
# The node name the check's discovery and CDI specs carry.
NODE = "gpu-check"


@dataclass(frozen=True, slots=True)
class Row:
    check: str
    subject: str
    ours: str
    theirs: str
    status: str


def compared(check: str, subject: str, ours: str, theirs: str, ok: bool | None = None) -> Row:
    """A row that is ok when ours and theirs read the same (or when `ok` says so), else a mismatch."""
    same = ours == theirs if ok is None else ok
    return Row(check, subject, ours, theirs, OK if same else MISMATCH)


def format_table(rows: Sequence[Row]) -> str:
    header = Row("check", "subject", "ours", "driver's tools", "status")
    table = [header, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("check", "subject", "ours", "theirs")]
    lines = []
    for row in table:
        cells = (row.check, row.subject, row.ours, row.theirs)
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + "  " + row.status)
    return "\n".join(lines)
