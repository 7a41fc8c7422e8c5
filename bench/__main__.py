"""`python -m bench [NAME ...]`: run the benchmarks one after another (all by default).

Each benchmark is its own process so one's memory high-water mark or leftover
threads never colour the next one's figures. Every side-by-side figure they record
(bench.summary) is printed in one table at the end and merged into bench/results.json
(a figure measured again replaces its old row; the figures of other runs, `make scale`'s, stay).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.summary import ROWS_ENV, merge_results, read_records, table

BENCHMARKS = ("cel", "slices", "prepare", "allocate", "usage", "scale")


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    chosen = argv or [name for name in BENCHMARKS if (here / name / "__main__.py").exists()]
    unknown = [name for name in chosen if name not in BENCHMARKS]
    if unknown:
        print(
            f"bench: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}",
            file=sys.stderr,
        )
        return 2
    failed: list[str] = []
    rows_file = Path(tempfile.mkstemp(prefix="bench-rows-", suffix=".jsonl")[1])
    environ = {**os.environ, ROWS_ENV: str(rows_file)}
    for name in chosen:
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=here.parent, env=environ)
        print(f"=== bench.{name}: exit {rc} after {time.monotonic() - started:.1f}s ===", flush=True)
        if rc != 0:
            failed.append(name)
    rows, failed_parts = read_records(rows_file)
    rows_file.unlink(missing_ok=True)
    if rows:
        results = here / "results.json"
        meta = {
            "benchmarks": chosen,
            "failed": failed,
            "failed_parts": [f.line() for f in failed_parts],
            "machine": platform.node(),
            "cpus": os.cpu_count(),
        }
        merge_results(results, rows, meta)
        print(f"\n=== summary: ours and the peer, same run ({results}) ===\n{table(rows)}")
    if failed:
        # Each part a benchmark said failed (which side, why); a benchmark that died before it
        # could say is named alone, its own output above tells why.
        said = {f.benchmark for f in failed_parts}
        lines = [f.line() for f in failed_parts] + [
            f"{name}: exited non-zero" for name in failed if name not in said
        ]
        print("bench: failed:\n" + "\n".join(f"  {line}" for line in lines), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
