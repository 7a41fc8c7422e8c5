"""Sort (most waste first), filter and render the claimed-device rows of `top`.

Waste order: claims flagged idle first, then the longest idle time, then the lowest
utilization, then the most memory held (the device's framebuffer, which no one else can
use while the claim holds it). A device with no utilization reading yet sorts as busy:
`top` must not accuse a claim on a sample it does not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controller.top.snapshot import ClaimedDevice

HEADERS = ("NODE", "DEVICE", "MODEL", "CLAIM", "PODS", "UTIL", "MEMORY", "IDLE FOR")
# `-o wide`, as kubectl's: the same columns and then more, the device's UUID and the metrics
# endpoint (or file) the row was read from.
WIDE_HEADERS = (*HEADERS, "UUID", "SOURCE")
_BINARY_UNITS = ("Ki", "Mi", "Gi", "Ti", "Pi")


def waste_key(row: ClaimedDevice) -> tuple[bool, float, float, float, str, str, str, str]:
    """Sorts ascending into most-wasteful-first."""
    utilization = row.utilization if row.utilization is not None else 1.0
    return (
        not row.idle,
        -(row.idle_seconds or 0.0),
        utilization,
        -(row.memory_total_bytes or 0.0),
        row.node,
        row.device,
        row.namespace,
        row.claim,
    )


def by_waste(rows: Iterable[ClaimedDevice]) -> list[ClaimedDevice]:
    return sorted(rows, key=waste_key)


def select(
    rows: Iterable[ClaimedDevice],
    *,
    namespace: str | None = None,
    node: str | None = None,
    idle_only: bool = False,
) -> list[ClaimedDevice]:
    """The rows of one claim namespace, one node, flagged idle claims only; None: any."""
    return [
        r
        for r in rows
        if (namespace is None or r.namespace == namespace)
        and (node is None or r.node == node)
        and (not idle_only or r.idle)
    ]


def format_bytes(value: float | None) -> str:
    """Binary units as Kubernetes writes quantities (`80Gi`, `1.5Gi`, `512Mi`); '?' when unknown."""
    if value is None:
        return "?"
    if value < 1024:
        return f"{value:.0f}"
    for unit in _BINARY_UNITS:
        value /= 1024
        if value < 1024 or unit == _BINARY_UNITS[-1]:
            break
    return f"{value:.1f}".removesuffix(".0") + unit


def format_duration(seconds: float | None) -> str:
    """`45m`, `2h5m`, `1m30s`, `12s`: the two largest units, as kubectl prints ages; '-' for busy."""
    if not seconds or seconds <= 0:
        return "-"
    total = int(seconds)
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (secs, "s")]
    while parts and parts[0][0] == 0:
        parts.pop(0)
    shown = [f"{n}{unit}" for n, unit in parts[:2] if n]
    return "".join(shown) or "0s"


def format_utilization(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio * 100:.0f}%"


def cells(row: ClaimedDevice, wide: bool = False) -> tuple[str, ...]:
    idle_for = format_duration(row.idle_seconds)
    if row.idle:
        idle_for = f"{idle_for} IDLE"
    more = (row.uuid or "?", row.source or "?") if wide else ()
    return (
        row.node,
        row.device,
        row.model or "?",
        f"{row.namespace}/{row.claim}",
        ",".join(row.pods) or "<none>",
        format_utilization(row.utilization),
        f"{format_bytes(row.memory_used_bytes)}/{format_bytes(row.memory_total_bytes)}",
        idle_for,
        *more,
    )


def render(rows: Sequence[ClaimedDevice], wide: bool = False) -> str:
    """A kubectl-style table: upper-case headers, columns three spaces apart, no borders."""
    headers = WIDE_HEADERS if wide else HEADERS
    table = [headers, *(cells(r, wide) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(headers))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table
    )
