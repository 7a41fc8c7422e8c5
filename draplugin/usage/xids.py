"""XID error events per device, counted for `draplugin_device_xid_errors_total`.

Real GPUs: the NVML backend's event watch (draplugin.devices.nvml) calls
`record` for every XID event it sees, application XIDs included. Fake GPUs
have no events: `follow` counts each new `xid-N` fault the health tracker
gets (the fault file's injected XIDs), once per injection.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable

from draplugin.devices.health import HealthTracker

_XID_PREFIX = "xid-"


class XidCounter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: defaultdict[str, defaultdict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._seen: dict[str, tuple[str, int]] = {}

    def record(self, device_names: Iterable[str], xid: int) -> None:
        with self._lock:
            for name in device_names:
                self._counts[name][xid] += 1

    def counts(self) -> dict[str, dict[int, int]]:
        with self._lock:
            return {name: dict(per_xid) for name, per_xid in self._counts.items()}

    def follow(self, tracker: HealthTracker) -> None:
        """Count the tracker's new `xid-N` faults from now on (for backends without XID events)."""

        def changed() -> None:
            faults = tracker.faults()
            with self._lock:
                for name, fault in faults.items():
                    mark = (fault.reason, fault.since_unix)
                    if fault.reason.startswith(_XID_PREFIX) and self._seen.get(name) != mark:
                        xid = fault.reason.removeprefix(_XID_PREFIX)
                        if xid.isdigit():
                            self._counts[name][int(xid)] += 1
                    self._seen[name] = mark
                for name in set(self._seen) - set(faults):
                    del self._seen[name]

        changed()
        tracker.add_listener(changed)
