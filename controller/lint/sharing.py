"""Sharing mechanisms that prepare refuses, as far as allocated ResourceClaims show them.

The node plugin (`draplugin.prepare.sharing`) defines which mechanisms may meet on one GPU
between different claims: MPS shares with MPS shares (clients of the GPU's one MPS daemon) and
time-slices with time-slices of one interval. It refuses the rest at prepare (`SharingConflict`,
`TimeSliceConflict`), and a claim whose MPS shares are on more than one GPU (a process reaches one
MPS daemon). From the objects alone lint sees the allocation results (device, `shareID`) and the
opaque configs the allocation carries: each result's strategy is the last config of the driver's
`GpuConfig` kind naming its request (or all), MPS for a share without one (prepare derives the
share's MPS limits from what it consumed). Findings (errors):

* sharing-conflict: a device allocated to claims whose strategies may not meet, or a claim's MPS
  shares on more than one device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from controller.lint.model import Finding

JSON = Mapping[str, Any]
CONFIG_KIND = "GpuConfig"
MPS, TIME_SLICING, EXCLUSIVE = "MPS", "TimeSlicing", "Exclusive"


def sharing_findings(claims: Sequence[JSON]) -> list[Finding]:
    findings: list[Finding] = []
    users: dict[tuple[str, str, str], list[tuple[str, str, str]]] = {}
    for claim in claims:
        subject = _subject(claim)
        allocation = (claim.get("status") or {}).get("allocation") or {}
        devices = allocation.get("devices") or {}
        configs = devices.get("config") or []
        mps_shared: set[tuple[str, str, str]] = set()
        for result in devices.get("results") or []:
            key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
            strategy = _strategy(configs, str(result.get("driver")), str(result.get("request", "")))
            if strategy is None:
                strategy = MPS if result.get("shareID") else EXCLUSIVE
            if strategy == MPS and result.get("shareID"):
                mps_shared.add(key)
            users.setdefault(key, []).append((subject, strategy, str(result.get("shareID") or "")))
        if len(mps_shared) > 1:
            names = ", ".join(sorted(f"{pool}/{device}" for _, pool, device in mps_shared))
            findings.append(
                Finding(
                    "error",
                    "sharing-conflict",
                    subject,
                    "allocation",
                    f"MPS shares of {len(mps_shared)} GPUs ({names}): each shared GPU has its own MPS "
                    "daemon and a process reaches one, so prepare refuses the claim; take MPS shares of "
                    "one GPU per claim",
                )
            )
    for (driver, pool, device), holders in sorted(users.items()):
        claims_of = {subject for subject, _, _ in holders}
        if len(claims_of) < 2:
            continue
        problem = _conflict(holders)
        if problem:
            findings.append(
                Finding(
                    "error",
                    "sharing-conflict",
                    holders[-1][0],
                    f"device {pool}/{device} of {driver}",
                    f"allocated to {', '.join(sorted(claims_of))}: {problem}; prepare refuses the claim "
                    "that comes second",
                )
            )
    return findings


def _conflict(holders: Sequence[tuple[str, str, str]]) -> str:
    strategies = {strategy for _, strategy, _ in holders}
    if any(not share_id for _, _, share_id in holders):
        return "a claim holds it without a share (exclusively)"
    if MPS in strategies and len(strategies) > 1:
        return "MPS shares and " + " and ".join(sorted(strategies - {MPS})) + " cannot meet on one GPU"
    if EXCLUSIVE in strategies and len(strategies) > 1:
        return "an exclusive share and a " + " and ".join(sorted(strategies - {EXCLUSIVE})) + " one"
    return ""


def _strategy(configs: Sequence[JSON], driver: str, request: str) -> str | None:
    """The sharing strategy the last of the driver's GpuConfigs for the request sets; None if none."""
    base = request.split("/", 1)[0]
    found = None
    for entry in configs:
        opaque = entry.get("opaque") or {}
        parameters = opaque.get("parameters") or {}
        if opaque.get("driver") != driver or parameters.get("kind") != CONFIG_KIND:
            continue
        requests = entry.get("requests") or []
        if requests and request not in requests and base not in requests:
            continue
        strategy = (parameters.get("sharing") or {}).get("strategy")
        if isinstance(strategy, str):
            found = strategy
    return found


def _subject(claim: JSON) -> str:
    meta = claim.get("metadata") or {}
    return f"ResourceClaim/{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
