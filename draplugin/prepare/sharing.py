"""Node-side state behind the sharing strategies, created on prepare and released on unprepare.

MPS: each claim that uses MPS gets a directory `<root>/<claim uid>/` with the
`pipe/` and `log/` directories its containers share (mounted through CDI at
`/var/run/draplugin/mps`) and a `mps.json` with the limits, which is what an
MPS control daemon for the claim is started from. Time-slicing and exclusive
use need no files: the scheduler's allocation and the checkpoint's device
holders are the whole state.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from draplugin.cdi.spec import atomic_write
from draplugin.prepare.claimconfig import SharingStrategy
from draplugin.prepare.plan import ClaimPlan

log = logging.getLogger(__name__)

_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class SharingState:
    def __init__(self, root: Path) -> None:
        self.root = root

    def mps_dir(self, claim_uid: str) -> Path:
        if not _UID.match(claim_uid):
            raise ValueError(f"claim UID {claim_uid!r} cannot be used in a path")
        return self.root / "mps" / claim_uid

    def host_dir_for(self, plan: ClaimPlan) -> PurePosixPath | None:
        return PurePosixPath(self.mps_dir(plan.claim.uid)) if plan.uses_mps else None

    def apply(self, plan: ClaimPlan) -> None:
        """Create what the plan's sharing needs. Idempotent: a re-prepare rewrites the same state."""
        if not plan.uses_mps:
            return
        directory = self.mps_dir(plan.claim.uid)
        (directory / "pipe").mkdir(parents=True, exist_ok=True)
        (directory / "log").mkdir(parents=True, exist_ok=True)
        devices = [d for d in plan.devices if d.config.sharing.strategy is SharingStrategy.MPS]
        doc = {
            "claim": {"namespace": plan.claim.namespace, "name": plan.claim.name, "uid": plan.claim.uid},
            "devices": sorted({d.device.uuid for d in devices}),
            "config": devices[0].config.to_json()["sharing"],
        }
        atomic_write(directory / "mps.json", (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())

    def release(self, claim_uid: str) -> None:
        directory = self.mps_dir(claim_uid)
        if directory.exists():
            shutil.rmtree(directory)
            log.info("sharing state released", extra={"claim_uid": claim_uid, "strategy": "MPS"})

    def claim_uids(self) -> Iterator[str]:
        """Claims that have sharing state on disk (to clean up what no record explains)."""
        try:
            yield from (entry.name for entry in (self.root / "mps").iterdir() if entry.is_dir())
        except FileNotFoundError:
            return
