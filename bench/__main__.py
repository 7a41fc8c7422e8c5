"""`python -m bench [NAME ...]`: run the benchmarks one after another (all by default).

Each benchmark is its own process so one's memory high-water mark or leftover
threads never colour the next one's figures.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS = ("cel", "slices", "prepare", "allocate")


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
    for name in chosen:
        print(f"\n=== bench.{name} ===", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=here.parent)
        print(f"=== bench.{name}: exit {rc} after {time.monotonic() - started:.1f}s ===", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
