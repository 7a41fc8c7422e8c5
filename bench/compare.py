"""`python -m bench.compare A B` (`make bench-compare A B`): two `make bench` results side by side.

For each figure present in both: ours in A, ours in B and the change, with the peer's
figure from each run beside it (a change in the peer's figure says the machine, not our
code, moved). Figures in only one file are listed at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

from bench.summary import Row, format_number, load_results, row_key


def compare(before: list[Row], after: list[Row]) -> str:
    old = {row_key(r): r for r in before}
    new = {row_key(r): r for r in after}
    lines = [
        f"{'figure':<58} {'ours A':>10} {'ours B':>10} {'change':>8} {'peer A':>10} {'peer B':>10}  verdict"
    ]
    for key in [k for k in old if k in new]:
        a, b = old[key], new[key]
        change = (b.ours - a.ours) / a.ours if a.ours else 0.0
        better = change > 0 if a.higher_is_better else change < 0
        verdict = "same" if abs(change) < 0.05 else ("better" if better else "worse")
        name = f"{a.benchmark}: {a.figure} ({a.unit})"
        lines.append(
            f"{name:<58} {format_number(a.ours):>10} {format_number(b.ours):>10} {change:>+8.1%} "
            f"{format_number(a.peer):>10} {format_number(b.peer):>10}  {verdict}"
        )
    for label, only in (("only in A", old.keys() - new.keys()), ("only in B", new.keys() - old.keys())):
        for benchmark, figure, unit in sorted(only):
            lines.append(f"{label}: {benchmark}: {figure} ({unit})")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m bench.compare RESULTS_A.json RESULTS_B.json", file=sys.stderr)
        return 2
    print(compare(load_results(Path(argv[0])), load_results(Path(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
