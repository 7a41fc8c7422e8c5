"""The live part's rows (bench.summary.Row): the controller at each size, idle traffic beside what
the API server does alone, and explain and simulate against the API server beside the same
commands offline where the offline part ran at that size in the same run."""

from __future__ import annotations

from bench.scale.live import LiveRun
from bench.scale.rows import BENCHMARK, NO_PEER, shape
from bench.scale.runs import Measured
from bench.summary import Row

SERVER_ALONE = "kube-apiserver's own requests, nothing of ours running (same window)"
OFFLINE = "the same command offline (--objects, YAML files), same run"


def live_rows(run: LiveRun, offline_explain: Measured | None, offline_simulate: Measured | None) -> list[Row]:
    at = f"{shape(run.nodes, run.gpus)}, {run.claims:,} pending claims"
    c = run.controller
    window = f"{run.server_alone.window_s:.0f} s idle window"
    alone = run.server_alone.per_s

    def beside(ours: Measured, offline: Measured | None, what: str) -> list[Row]:
        peer = offline.wall_s if offline else 0.0
        cpu_peer = offline.cpu_s if offline else 0.0
        name = OFFLINE if offline else NO_PEER
        return [
            Row(BENCHMARK, f"{what} against the API server, {at}, wall", "s", ours.wall_s, peer, name),
            Row(BENCHMARK, f"{what} against the API server, {at}, CPU", "s", ours.cpu_s, cpu_peer, name),
        ]

    return [
        Row(BENCHMARK, f"dra-controller run, {at}, start to first pass (sync)", "s", c.sync_s, 0.0, NO_PEER),
        Row(BENCHMARK, f"dra-controller run, {at}, CPU to first pass", "s", c.sync_cpu_s, 0.0, NO_PEER),
        Row(BENCHMARK, f"dra-controller run, {at}, RSS after sync", "MiB", c.rss_mib, 0.0, NO_PEER),
        Row(BENCHMARK, f"dra-controller run, {at}, time per reconcile pass ({c.passes} idle passes)", "ms",
            c.pass_ms, 0.0, NO_PEER),
        Row(BENCHMARK, f"dra-controller run, {at}, CPU at idle ({window})", "s per s",
            c.idle_cpu_s / c.idle.window_s, 0.0, NO_PEER),
        Row(BENCHMARK, f"dra-controller run, {at}, API requests at idle ({window})", "per s",
            c.idle.per_s, alone, SERVER_ALONE),
        Row(BENCHMARK, f"draplugin run (fake backend, one node), {at}, API requests at idle ({window})",
            "per s", run.plugin.per_s, alone, SERVER_ALONE),
        *beside(run.explain, offline_explain, "explain of one unfit pending pod"),
        *beside(run.simulate, offline_simulate, "simulate of one pending pod"),
    ]  # fmt: skip
