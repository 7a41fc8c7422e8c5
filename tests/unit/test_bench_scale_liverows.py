"""bench.scale.liverows: the live part's figures become rows, beside the offline commands of the
same run where they ran, and beside the API server's own traffic."""

from __future__ import annotations

from bench.scale.live import ControllerRun, Idle, LiveRun
from bench.scale.liverows import OFFLINE, SERVER_ALONE, live_rows
from bench.scale.rows import NO_PEER
from bench.scale.runs import Measured
from bench.scale.traffic import RequestCounts


def _measured(wall: float, cpu: float) -> Measured:
    return Measured(wall, 60.0, cpu, 0, "", "")


def _run() -> LiveRun:
    alone = Idle(60.0, RequestCounts({("PUT", "leases"): 6}))
    controller = ControllerRun(
        sync_s=4.0, sync_cpu_s=3.0, idle_cpu_s=1.2, passes=12, passes_s=0.6, rss_mib=150.0,
        idle=Idle(60.0, RequestCounts({("GET", "leases"): 12, ("PUT", "leases"): 12}), watches=5),
    )  # fmt: skip
    plugin = Idle(60.0, RequestCounts({("GET", "resourceslices"): 3}))
    return LiveRun(
        1000, 8, 2000, "v1.37.2", alone, controller, plugin, _measured(1.5, 1.2), _measured(1.8, 1.4)
    )


def test_controller_rows_take_the_pass_mean_and_idle_rates_per_second() -> None:
    rows = {row.figure.split(", ")[-1]: row for row in live_rows(_run(), None, None)}
    assert rows["time per reconcile pass (12 idle passes)"].ours == 50.0
    assert rows["CPU at idle (60 s idle window)"].ours == 0.02
    traffic = [
        r
        for r in live_rows(_run(), None, None)
        if r.figure.endswith("API requests at idle (60 s idle window)")
    ]
    assert [(r.ours, r.peer, r.peer_name) for r in traffic] == [
        (0.4, 0.1, SERVER_ALONE),
        (0.05, 0.1, SERVER_ALONE),
    ]


def test_live_commands_sit_beside_the_offline_ones_only_where_those_ran() -> None:
    offline = live_rows(_run(), _measured(0.35, 0.34), _measured(0.8, 0.7))
    explain = [r for r in offline if r.figure.startswith("explain")]
    assert [(r.ours, r.peer, r.peer_name) for r in explain] == [(1.5, 0.35, OFFLINE), (1.2, 0.34, OFFLINE)]
    alone = [r for r in live_rows(_run(), None, None) if r.figure.startswith("simulate")]
    assert [(r.peer, r.peer_name, r.ratio) for r in alone] == [(0.0, NO_PEER, None)] * 2
