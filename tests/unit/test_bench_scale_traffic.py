"""bench.scale.traffic: kube-apiserver's request counters and the controller's pass histogram,
read from Prometheus text as the servers print it."""

from __future__ import annotations

from bench.scale.traffic import (
    RequestCounts,
    open_watches,
    pass_stats,
    process_rss_mib,
    request_counts,
)


def _request(code: str, group: str, resource: str, subresource: str, verb: str, value: int) -> str:
    labels = (
        f'code="{code}",component="apiserver",dry_run="",group="{group}",resource="{resource}",'
        f'scope="resource",subresource="{subresource}",verb="{verb}",version="v1"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


APISERVER = "\n".join([
    "# HELP apiserver_request_total [STABLE] Counter of apiserver requests",
    "# TYPE apiserver_request_total counter",
    _request("200", "", "", "/metrics", "GET", 7),
    _request("200", "coordination.k8s.io", "leases", "", "PUT", 12),
    _request("409", "coordination.k8s.io", "leases", "", "PUT", 3),
    _request("200", "resource.k8s.io", "resourceslices", "", "WATCH", 2),
    'apiserver_request_total_other{verb="GET",resource="pods"} 99',
])  # fmt: skip


def test_request_counts_sum_codes_by_verb_and_resource_and_leave_out_non_resource_paths() -> None:
    counts = request_counts(APISERVER)
    assert counts == {("PUT", "leases"): 15, ("WATCH", "resourceslices"): 2}


def test_the_window_is_what_grew_less_what_the_server_did_alone() -> None:
    before = RequestCounts({("PUT", "leases"): 15, ("WATCH", "pods"): 1})
    after = RequestCounts({("PUT", "leases"): 21, ("WATCH", "pods"): 1, ("GET", "nodes"): 4})
    grown = after - before
    assert grown == {("PUT", "leases"): 6, ("GET", "nodes"): 4}
    alone = RequestCounts({("PUT", "leases"): 2})
    assert (grown - alone) == {("PUT", "leases"): 4, ("GET", "nodes"): 4}
    assert (grown - alone).total() == 8


CONTROLLER = """\
dra_controller_reconcile_duration_seconds_bucket{le="0.1"} 3.0
dra_controller_reconcile_duration_seconds_count 4.0
dra_controller_reconcile_duration_seconds_sum 1.25
dra_controller_reconciles_total{result="success"} 4.0
"""


def test_pass_stats_read_the_histogram_count_and_sum() -> None:
    assert pass_stats(CONTROLLER) == (4, 1.25)
    assert pass_stats("dra_controller_reconciles_total 0\n") == (0, 0.0)


def test_rss_from_proc_status() -> None:
    status = "Name:\tpython\nVmPeak:\t  900000 kB\nVmRSS:\t  204800 kB\nThreads:\t9\n"
    assert process_rss_mib(status) == 200.0


def test_open_watches_count_the_long_running_watch_requests_by_resource() -> None:
    metrics = "\n".join([
        'apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",'
        'subresource="",verb="WATCH",version="v1"} 2',
        'apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",'
        'subresource="",verb="WATCH",version="v1"} 1',
        'apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",'
        'subresource="log",verb="CONNECT",version="v1"} 4',
    ])  # fmt: skip
    assert open_watches(metrics) == {"pods": 3}
