"""Durations in settings: plain seconds (`90`, `0.5`) or Go-style (`15s`, `1m30s`, `500ms`, `2h`).

Both daemons take durations the way Kubernetes components write them; one
parser so `1m30s` means the same on either side. Hand-written because the
grammar is five lines and no well-kept library parses Go durations.
"""

from __future__ import annotations

_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_HINT = "must be seconds or a duration such as 15s, 1m30s or 500ms"


def parse_duration(text: str, *, positive: bool = False) -> float:
    """Seconds. Raises ValueError for anything else, negative values, or 0 when `positive`."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        seconds = _go_duration(value)
    if not seconds >= 0 or seconds == float("inf") or (positive and seconds == 0):
        raise ValueError(_HINT if not positive else f"{_HINT}, greater than 0")
    return seconds


def _go_duration(value: str) -> float:
    total, number, rest = 0.0, "", value
    if not rest:
        raise ValueError(_HINT)
    while rest:
        if rest[0].isdigit() or rest[0] == ".":
            number, rest = number + rest[0], rest[1:]
            continue
        unit = "ms" if rest.startswith("ms") else rest[0]
        if unit not in _UNITS or not number:
            raise ValueError(_HINT)
        try:
            total += float(number) * _UNITS[unit]
        except ValueError:
            raise ValueError(_HINT) from None
        number, rest = "", rest[len(unit) :]
    if number:
        raise ValueError(_HINT)
    return total
