"""What the live part reads from servers' Prometheus text: kube-apiserver's request counters (by
verb and resource, every response code together), the controller's reconcile-pass histogram, and
a process's resident memory from /proc."""

from __future__ import annotations

from collections import Counter

REQUESTS = "apiserver_request_total{"
PASSES = "dra_controller_reconcile_duration_seconds"


class RequestCounts(Counter[tuple[str, str]]):
    """Requests by (verb, resource). `a - b` keeps what grew (Counter's subtraction drops the rest)."""

    def __sub__(self, other: Counter[tuple[str, str]]) -> RequestCounts:
        return RequestCounts(super().__sub__(other))


def _label(labels: str, name: str) -> str:
    marker = f'{name}="'
    if marker not in labels:
        return ""
    return labels.split(marker, 1)[1].split('"', 1)[0]


def request_counts(metrics: str) -> RequestCounts:
    """kube-apiserver's /metrics -> requests by (verb, resource). Non-resource paths (/metrics,
    /healthz, /version: resource="") are left out, so the harness's own scrapes do not count."""
    counts = RequestCounts()
    for line in metrics.splitlines():
        if not line.startswith(REQUESTS):
            continue
        labels, value = line.rsplit(" ", 1)
        resource = _label(labels, "resource")
        if not resource:
            continue
        counts[(_label(labels, "verb"), resource)] += int(float(value))
    return counts


def pass_stats(metrics: str) -> tuple[int, float]:
    """The controller's /metrics -> (reconcile passes, their seconds in all), from the histogram."""
    count, total = 0, 0.0
    for line in metrics.splitlines():
        if line.startswith(f"{PASSES}_count "):
            count = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith(f"{PASSES}_sum "):
            total = float(line.rsplit(" ", 1)[1])
    return count, total


def process_rss_mib(status: str) -> float:
    """/proc/<pid>/status -> VmRSS in MiB (0 when the line is missing: the process is gone)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_watches(metrics: str) -> Counter[str]:
    """kube-apiserver's /metrics -> the watches open now, by resource (`apiserver_longrunning_requests`):
    a watch is counted in apiserver_request_total only when it ends, minutes after it opened."""
    watches: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            labels, value = line.rsplit(" ", 1)
            watches[_label(labels, "resource")] += int(float(value))
    return watches
