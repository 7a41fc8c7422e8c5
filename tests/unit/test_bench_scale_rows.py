"""The scale rows: each figure beside its floor or kube-scheduler, kube-scheduler's rates from bind
times, and the issue's two targets called met or missed (figures here are made up, no timing)."""

from __future__ import annotations

import json
import os

import pytest

from bench.scale.offline import Case, ExplainCases, allocation_problems, per_claim_ms
from bench.scale.phases import SchedulingRun
from bench.scale.rows import explain_rows, per_claim_row, simulate_rows, targets, versus_scheduler_rows
from bench.scale.runs import Measured
from bench.scale.scheduler import process_cpu_seconds, schedule_attempts


def _run(wall_s: float, peak_mib: float = 100.0) -> Measured:
    return Measured(wall_s, peak_mib, wall_s, 0, "", "")


def _case(ours_s: float, floor_s: float, claims: int = 2000) -> Case:
    return Case(1000, 8, claims, 8000, 1002, 5_500_000, _run(ours_s, 120.0), _run(floor_s, 60.0))


def test_kube_scheduler_rates_come_from_its_start_and_the_bind_times() -> None:
    bound = {f"pod-{i}": 12.0 + i * 0.5 for i in range(5)}  # first at 12 s, last at 14 s
    run = SchedulingRun.from_events(1000, 5, started=10.0, bound_at=bound)
    assert run.complete
    assert run.until_first_s == 2.0 and run.start_to_last_s == 4.0 and run.first_to_last_s == 2.0
    assert run.pods_per_s() == 5 / 4.0
    assert run.phase_pods_per_s() == 4 / 2.0
    assert run.ms_per_pod() == 500.0
    assert not SchedulingRun.from_events(1000, 6, 10.0, bound).complete


def _explained(yaml_s: float, floor_s: float) -> ExplainCases:
    return ExplainCases(_case(yaml_s, floor_s, claims=1), _run(2.5), _case(0.9, floor_s, claims=1), _run(0.3))


def test_explain_and_simulate_rows_put_the_floors_beside_ours() -> None:
    wall, beside_yaml, on_json, startup, rss = explain_rows(_explained(3.0, 1.5))
    assert wall.figure == "explain of one unfit claim, 1,000 nodes x 8 GPUs, YAML, wall"
    assert (wall.unit, wall.ours, wall.peer, wall.ratio) == ("s", 3.0, 1.5, 2.0)
    assert "json.load" in wall.peer_name and not wall.higher_is_better
    assert (beside_yaml.ours, beside_yaml.peer) == (3.0, 2.5) and "libyaml" in beside_yaml.peer_name
    assert on_json.figure.endswith("JSON, wall") and (on_json.ours, on_json.peer) == (0.9, 1.5)
    assert (startup.ours, startup.peer) == (0.3, 1.5), "start-up alone beside the same floor"
    assert (rss.unit, rss.ours, rss.peer) == ("MiB", 120.0, 60.0)
    sim_wall, _ = simulate_rows(_case(10.0, 2.0))
    assert sim_wall.figure == "simulate of 2,000 claims (pods), 1,000 nodes x 8 GPUs, YAML, wall"


def test_simulate_beside_kube_scheduler_whole_run_and_decisions_only() -> None:
    run = SchedulingRun.from_events(1000, 2000, 0.0, {f"p{i}": 4.0 + i * 0.003 for i in range(2000)})
    whole, decisions = versus_scheduler_rows(_case(10.0, 1.0), _run(2.0), run, "v1.37.2")
    assert whole.ours == 2000 / 10.0 and whole.peer == pytest.approx(2000 / (4.0 + 1999 * 0.003))
    assert decisions.ours == 1999 / 8.0, "N claims minus one claim on the same fleet: loading cancels"
    assert decisions.peer == pytest.approx(1999 / (1999 * 0.003))
    assert whole.higher_is_better and "QPS/burst 5000" in whole.peer_name


def test_per_claim_rows_subtract_the_one_claim_run_and_say_when_no_scheduler_ran() -> None:
    assert per_claim_ms(_run(21.0), _run(1.0), 2001) == 10.0
    without = per_claim_row(_case(21.0, 1.0, claims=2001), _run(1.0), None, "v1.37.2")
    assert (
        without.ours == 10.0 and without.ratio is None and without.peer_name == "none measured at this size"
    )
    run = SchedulingRun.from_events(1000, 3, 0.0, {"a": 1.0, "b": 1.5, "c": 2.0})
    beside = per_claim_row(_case(21.0, 1.0, claims=2001), _run(1.0), run, "v1.37.2")
    assert beside.peer == 500.0 and beside.ratio == 10.0 / 500.0


def test_targets_call_explain_within_3x_and_simulate_at_half_the_scheduler_met() -> None:
    run = SchedulingRun.from_events(
        1000, 2000, 0.0, {f"p{i}": 1.0 + i * 0.002 for i in range(2000)}
    )  # ~400/s
    rows = [
        *explain_rows(_explained(3.0, 1.0)),
        *versus_scheduler_rows(_case(10.0, 1.0), _run(1.0), run, "v"),
    ]
    lines = targets(rows)
    assert len(lines) == 2
    assert lines[0].startswith("met: explain") and "3.00x the floor" in lines[0]
    assert lines[1].startswith("MISSED: simulate claims/s"), "200 claims/s is under half of ~400 pods/s"
    slow = targets(explain_rows(_explained(3.1, 1.0)))
    assert slow[0].startswith("MISSED: explain")


def test_simulate_answers_with_an_unallocated_claim_or_a_device_twice_are_refused() -> None:
    def entry(name: str, device: str, allocated: bool = True) -> dict[str, object]:
        result = {"request": "gpu", "driver": "gpu.draplugin.dev", "pool": "n1", "device": device}
        return {"name": name, "allocated": allocated, "results": [result] if allocated else [], "reason": "x"}

    good = json.dumps({"claims": [entry("a", "gpu-0"), entry("b", "gpu-1")]})
    assert allocation_problems(good, 2) == []
    twice = json.dumps({"claims": [entry("a", "gpu-0"), entry("b", "gpu-0")]})
    assert allocation_problems(twice, 2) == ["b: gpu.draplugin.dev/n1/gpu-0 allocated twice"]
    missing = json.dumps({"claims": [entry("a", "gpu-0", allocated=False)]})
    assert allocation_problems(missing, 2) == ["1 claims in the answer, expected 2", "a: not allocated: x"]


def test_scheduling_attempts_are_summed_by_result_over_profiles() -> None:
    metrics = "\n".join([
        "# HELP scheduler_schedule_attempts_total [STABLE] Number of attempts to schedule pods",
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="error"} 0',
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 398',
        'scheduler_schedule_attempts_total{profile="other",result="scheduled"} 2',
        'scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 5',
        'scheduler_pod_scheduling_attempts_bucket{le="1"} 400',
    ])  # fmt: skip
    assert schedule_attempts(metrics) == {"error": 0, "scheduled": 400, "unschedulable": 5}


def test_process_cpu_is_user_plus_system_time_from_proc_stat() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    # A command with a space and a parenthesis in it: fields are counted after the last ")".
    stat = f"4242 (kube (sched) R 1 4242 4242 0 -1 4194560 100 0 0 0 {3 * ticks} {ticks} 0 0 20 0 9 0"
    assert process_cpu_seconds(stat) == 4.0
