"""`python -m bench.scale`: explain and simulate at fleet size beside the JSON-parse floor, and
simulate beside kube-scheduler on the same objects (issue 34; docs/scale.md says what each
figure is and how it was measured).

Parts (--parts, comma-separated):
- offline (the default, and what `make bench` runs): explain of one claim that fits nowhere and
  simulate of --claims claims with their pods, at --nodes x --gpus, each beside the floor.
- per-claim: simulate's time per claim at each of --per-claim-nodes (the 1,000-node figure is
  the offline part's when both run).
- scheduler: kube-scheduler on the same objects at each of --scheduler-nodes (a control plane
  of its own: run it alone on a small machine); with offline at the same size, the rows of
  claims/s beside pods/s.
- live: at each of --live-nodes, a control plane of its own with the fleet and its pending pods:
  `dra-controller run`'s sync, RSS, CPU and time per reconcile pass, the API requests/s it and
  one draplugin make at idle (--idle-window seconds, counted by kube-apiserver), and explain and
  simulate of one pending pod against the API server (beside the offline commands where offline
  ran at that size).

Run by `python -m bench`, its rows go to the parent's summary; run on its own (`make scale`),
it prints the table and merges its rows into bench/results.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from bench.scale.fixtures import FleetPair
from bench.scale.offline import Case, measure_explain, measure_simulate
from bench.scale.phases import SchedulingRun
from bench.scale.rows import (
    BENCHMARK,
    explain_rows,
    per_claim_row,
    shape,
    simulate_rows,
    targets,
    versus_scheduler_rows,
)
from bench.scale.runs import Measured
from bench.summary import ROWS_ENV, Row, merge_results, record, record_failure, table

if TYPE_CHECKING:  # the live part's imports (the control plane's) only when it runs
    from bench.scale.live import LiveRun

PARTS = ("offline", "per-claim", "scheduler", "live")
RESULTS = Path(__file__).resolve().parent.parent / "results.json"


def sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def claims_at(nodes: int, gpus: int, wanted: int) -> int:
    """--claims, or half the fleet's GPUs where that is fewer, so every claim fits."""
    return max(1, min(wanted, nodes * gpus // 2))


def _print_case(label: str, case: Case) -> None:
    ratio = case.ours.wall_s / case.floor.wall_s
    print(
        f"{label}, {shape(case.nodes, case.gpus)} ({case.devices:,} devices, {case.files:,} files, "
        f"{case.yaml_bytes / 1e6:.1f} MB): {case.ours.wall_s:.2f} s ({case.ours.cpu_s:.2f} s CPU), "
        f"peak {case.ours.peak_mib:.0f} MiB; JSON floor {case.floor.wall_s:.2f} s "
        f"({case.floor.cpu_s:.2f} s CPU), {case.floor.peak_mib:.0f} MiB; ours/floor {ratio:.2f}x",
        flush=True,
    )


def _print_run(run: SchedulingRun, version: str, setup: dict[str, float]) -> None:
    attempts = ", ".join(
        f"{k.removeprefix('attempts_')} {v:,.0f}" for k, v in setup.items() if k.startswith("attempts_")
    )
    cpu = ", ".join(f"{k.removeprefix('cpu_')} {v:.1f} s" for k, v in setup.items() if k.startswith("cpu_"))
    print(
        f"kube-scheduler {version}, {run.nodes:,} nodes, {run.pods:,} pods (created beforehand at "
        f"{setup['pods_created_per_s']:,.0f}/s): first bound {run.until_first_s:.2f} s after its start, "
        f"last {run.start_to_last_s:.2f} s; {run.pods_per_s():,.0f} pods/s start to last, "
        f"{run.phase_pods_per_s():,.0f} pods/s first to last; scheduling attempts: "
        f"{attempts or 'not read'}; CPU from its start to the last bind: {cpu}",
        flush=True,
    )


def _print_live(live: LiveRun) -> None:
    c = live.controller
    print(
        f"live, {shape(live.nodes, live.gpus)}, {live.claims:,} pending pods, Kubernetes {live.version}: "
        f"dra-controller run synced in {c.sync_s:.1f} s ({c.sync_cpu_s:.1f} s CPU), RSS {c.rss_mib:.0f} MiB; "
        f"{c.passes} idle passes, {c.pass_ms:.0f} ms each; idle CPU {c.idle_cpu_s:.2f} s over "
        f"{c.idle.window_s:.0f} s; API requests/s at idle: controller {c.idle.per_s:.2f} "
        f"({c.idle.busiest()}; {c.idle.watches} watches open), "
        f"draplugin {live.plugin.per_s:.2f} ({live.plugin.busiest()}; {live.plugin.watches} watches open), "
        "the server alone "
        f"{live.server_alone.per_s:.2f} ({live.server_alone.busiest()}); "
        f"live explain {live.explain.wall_s:.2f} s "
        f"({live.explain.cpu_s:.2f} s CPU, {live.explain.peak_mib:.0f} MiB), live simulate of one pod "
        f"{live.simulate.wall_s:.2f} s ({live.simulate.cpu_s:.2f} s CPU, {live.simulate.peak_mib:.0f} MiB)",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--parts", default="offline", help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--claims", type=int, default=2000, help="pending claims (one pod each)")
    parser.add_argument("--per-claim-nodes", type=sizes, default=[100, 1000, 5000])
    parser.add_argument("--scheduler-nodes", type=sizes, default=None, help="default: --nodes")
    parser.add_argument("--live-nodes", type=sizes, default=[100, 1000])
    parser.add_argument("--idle-window", type=float, default=60.0, help="seconds of each idle window (live)")
    parser.add_argument("--keep", action="store_true", help="keep the scheduler runs' clusters (logs, data)")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    rows: list[Row] = []
    failed: list[str] = []

    def keep(new: list[Row]) -> None:
        for row in new:
            record(row)
        rows.extend(new)

    def fail(part: str, side: str, err: Exception) -> None:
        print(f"bench.scale: {part}: {err}", file=sys.stderr, flush=True)
        record_failure(BENCHMARK, part, side, str(err))
        failed.append(part)

    simulated: dict[int, tuple[Case, Measured]] = {}
    explained: dict[int, Measured] = {}
    offline_sizes = [args.nodes] if "offline" in parts else []
    if "per-claim" in parts:
        offline_sizes += [n for n in args.per_claim_nodes if n not in offline_sizes]
    for nodes in offline_sizes:
        with tempfile.TemporaryDirectory(prefix=f"scale-{nodes}-") as tmp:
            fleet = FleetPair(Path(tmp), nodes, args.gpus)
            if "offline" in parts and nodes == args.nodes:
                try:
                    cases = measure_explain(fleet)
                    _print_case("explain of one unfit claim", cases.yaml)
                    print(
                        f"  YAML floor (libyaml): {cases.yaml_floor.wall_s:.2f} s; dra-controller start-up "
                        f"alone (explain --help): {cases.startup.wall_s:.2f} s",
                        flush=True,
                    )
                    _print_case("explain of one unfit claim, JSON files", cases.json)
                    keep(explain_rows(cases))
                    explained[nodes] = cases.yaml.ours
                except Exception as err:
                    fail("explain", "ours", err)
            try:
                claims = claims_at(nodes, args.gpus, args.claims)
                simulated[nodes] = measure_simulate(fleet, claims)
                _print_case(f"simulate of {claims:,} claims", simulated[nodes][0])
                if "offline" in parts and nodes == args.nodes:
                    keep(simulate_rows(simulated[nodes][0]))
            except Exception as err:
                fail(f"simulate at {nodes} nodes", "ours", err)
    runs: dict[int, SchedulingRun] = {}
    version = ""
    if "scheduler" in parts:
        from bench.scale.scheduler import measure  # the control plane's imports only when it runs

        for nodes in args.scheduler_nodes or [args.nodes]:
            try:
                claims = claims_at(nodes, args.gpus, args.claims)
                runs[nodes], version, setup = measure(nodes, args.gpus, claims, keep=args.keep)
                _print_run(runs[nodes], version, setup)
            except Exception as err:
                fail(f"kube-scheduler at {nodes} nodes", "kube-scheduler", err)
    if "live" in parts:
        from bench.scale.live import measure_live  # the control plane's imports only when it runs
        from bench.scale.liverows import live_rows

        for nodes in args.live_nodes:
            try:
                claims = claims_at(nodes, args.gpus, args.claims)
                live = measure_live(nodes, args.gpus, claims, args.idle_window, keep=args.keep)
                _print_live(live)
                one = simulated[nodes][1] if nodes in simulated else None
                keep(live_rows(live, explained.get(nodes), one))
            except Exception as err:
                fail(f"live cluster at {nodes} nodes", "ours", err)
    if args.nodes in simulated and args.nodes in runs:
        keep(versus_scheduler_rows(*simulated[args.nodes], runs[args.nodes], version))
    if "per-claim" in parts:
        keep([per_claim_row(c, one, runs.get(n), version) for n, (c, one) in sorted(simulated.items())])
    print("\n".join(targets(rows)))
    if rows and not os.environ.get(ROWS_ENV):
        meta = {"benchmarks": [BENCHMARK], "parts": parts, "failed": failed, "machine": platform.node(),
                "cpus": os.cpu_count()}  # fmt: skip
        merge_results(RESULTS, rows, meta)
        print(f"\n=== bench.scale ({RESULTS}, merged) ===\n{table(rows)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
