"""When to post a `CannotAllocate` Event on a claim, and what it looks like.

A claim qualifies while it is unallocated and a pending pod references it.
The first Event comes once it has qualified for `after_s` seconds (the
scheduler usually allocates within a second; a claim still waiting after that
is stuck); repeats are at most one per claim per `interval_s`, whatever its
message, so a stuck claim never floods the API server.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.run.leader import micro_time
from dracommon.eventnote import event_note

REASON = "CannotAllocate"


@dataclass
class EventLimiter:
    after_s: float
    interval_s: float
    _waiting_since: dict[str, float] = field(default_factory=dict)
    _last_posted: dict[str, float] = field(default_factory=dict)

    def due(self, waiting: Iterable[str], now: float) -> list[str]:
        """Of the claim UIDs waiting now, those that should get an Event now.

        Claims that stopped waiting are forgotten: if one waits again later,
        its clock starts over (but the per-claim interval still holds).
        """
        current = set(waiting)
        for uid in list(self._waiting_since):
            if uid not in current:
                del self._waiting_since[uid]
        for uid in list(self._last_posted):
            if uid not in current and now - self._last_posted[uid] >= self.interval_s:
                del self._last_posted[uid]
        result: list[str] = []
        for uid in sorted(current):
            since = self._waiting_since.setdefault(uid, now)
            if now - since < self.after_s:
                continue
            last = self._last_posted.get(uid)
            if last is not None and now - last < self.interval_s:
                continue
            result.append(uid)
        return result

    def posted(self, uid: str, now: float) -> None:
        self._last_posted[uid] = now


def cannot_allocate_event(claim: dict[str, Any], note: str, instance: str, controller: str) -> dict[str, Any]:
    """An events.k8s.io/v1 Warning about `claim`; `controller` is `drivername.reporting_controller(...)`."""
    meta = claim.get("metadata") or {}
    namespace, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{secrets.token_hex(8)}", "namespace": namespace},
        "eventTime": micro_time(),
        "reportingController": controller,
        "reportingInstance": instance[:128],
        "action": "Allocate",
        "reason": REASON,
        "type": "Warning",
        "regarding": {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "namespace": namespace,
            "name": name,
            "uid": str(meta.get("uid", "")),
            "resourceVersion": str(meta.get("resourceVersion", "")),
        },
        "note": event_note(note),  # cut at the API's 1,024 bytes, not characters
    }
