"""The scale rows (bench.summary.Row) and the issue's two targets, from measured figures."""

from __future__ import annotations

from bench.scale.offline import Case, ExplainCases, per_claim_ms
from bench.scale.phases import SchedulingRun
from bench.scale.runs import Measured
from bench.summary import Row

BENCHMARK = "scale"
FLOOR = "json.load of the same objects, JSON files (python -c)"
YAML_FLOOR = "PyYAML's libyaml loader on the same YAML files (python -c)"
NO_PEER = "none measured at this size"
EXPLAIN_TARGET = 3.0  # explain at most 3x the floor
SIMULATE_TARGET = 0.5  # simulate at least half of kube-scheduler's rate


def shape(nodes: int, gpus: int) -> str:
    return f"{nodes:,} nodes x {gpus} GPUs"


def scheduler_name(version: str) -> str:
    return f"kube-scheduler {version} (client QPS/burst 5000, as scheduler_perf)"


def explain_rows(cases: ExplainCases) -> list[Row]:
    case, on_json = cases.yaml, cases.json
    what = f"explain of one unfit claim, {shape(case.nodes, case.gpus)}"
    return [
        Row(BENCHMARK, f"{what}, YAML, wall", "s", case.ours.wall_s, case.floor.wall_s, FLOOR),
        Row(BENCHMARK, f"{what}, YAML, wall beside the YAML parse", "s", case.ours.wall_s,
            cases.yaml_floor.wall_s, YAML_FLOOR),
        Row(BENCHMARK, f"{what}, JSON, wall", "s", on_json.ours.wall_s, on_json.floor.wall_s, FLOOR),
        Row(BENCHMARK, "dra-controller explain start-up alone (--help), wall", "s", cases.startup.wall_s,
            case.floor.wall_s, f"{FLOOR} at {shape(case.nodes, case.gpus)}"),
        Row(BENCHMARK, f"{what}, YAML, peak RSS", "MiB", case.ours.peak_mib, case.floor.peak_mib, FLOOR),
    ]  # fmt: skip


def simulate_rows(case: Case) -> list[Row]:
    what = f"simulate of {case.claims:,} claims (pods), {shape(case.nodes, case.gpus)}, YAML"
    return [
        Row(BENCHMARK, f"{what}, wall", "s", case.ours.wall_s, case.floor.wall_s, FLOOR),
        Row(BENCHMARK, f"{what}, peak RSS", "MiB", case.ours.peak_mib, case.floor.peak_mib, FLOOR),
    ]


def per_claim_row(case: Case, single: Measured, scheduler: SchedulingRun | None, version: str) -> Row:
    """simulate's time per claim once loaded, beside kube-scheduler's per pod in its scheduling
    phase where it ran at this size (else no peer: the ratio reads n/a)."""
    ours = per_claim_ms(case.ours, single, case.claims)
    peer, name = (scheduler.ms_per_pod(), scheduler_name(version)) if scheduler else (0.0, NO_PEER)
    figure = f"simulate per claim, {shape(case.nodes, case.gpus)}, {case.claims:,} claims"
    return Row(BENCHMARK, figure, "ms", ours, peer, name)


def versus_scheduler_rows(case: Case, single: Measured, scheduler: SchedulingRun, version: str) -> list[Row]:
    """claims/s beside pods/s on the same objects, whole run and scheduling phase alone."""
    what = f"simulate claims/s vs kube-scheduler pods/s, {shape(case.nodes, case.gpus)}, {case.claims:,} pods"
    decisions = case.ours.wall_s - single.wall_s
    return [
        Row(
            BENCHMARK, f"{what}, start to last decision", "per s", case.claims / case.ours.wall_s,
            scheduler.pods_per_s(), scheduler_name(version), higher_is_better=True,
        ),
        Row(
            BENCHMARK, f"{what}, decisions only", "per s",
            (case.claims - 1) / decisions if decisions > 0 else 0.0,
            scheduler.phase_pods_per_s(), scheduler_name(version), higher_is_better=True,
        ),
    ]  # fmt: skip


def targets(rows: list[Row]) -> list[str]:
    """The issue's two targets, met or not, for each row that bears on one."""
    lines = []
    for row in rows:
        if row.ratio is None:
            continue
        if row.figure.startswith("explain") and row.figure.endswith("YAML, wall"):
            verdict = "met" if row.ratio <= EXPLAIN_TARGET else "MISSED"
            lines.append(f"{verdict}: {row.figure}: {row.ratio:.2f}x the floor (target <= 3x)")
        elif row.figure.startswith("simulate claims/s") and row.figure.endswith("start to last decision"):
            verdict = "met" if row.ratio >= SIMULATE_TARGET else "MISSED"
            lines.append(f"{verdict}: {row.figure}: {row.ratio:.2f}x kube-scheduler (target >= 0.5x)")
    return lines
