"""One MPS control daemon per shared GPU, started with its first share and stopped with its last.

NVIDIA documents one MPS control daemon per GPU: the contexts of different MPS
servers on one GPU are time-sliced against each other, so the active thread
percentage of a daemon per claim would hold only inside that daemon's slice,
not split the GPU. So every claim that takes a share of a shared GPU
(`--shared-gpus`, an allocation result with a `shareID`) and is prepared with
MPS is a client of the GPU's one daemon:

- the daemon's ledger name (its `owner`) is `gpu-<16 hex digits of the
  UUID's SHA-256>` (`owner_of`), its directory `<state>/mps/<owner>/` with `pipe/`, `log/` and
  `shm/` as a claim's daemon has them (`draplugin.prepare.mps` starts it,
  `--mps-daemon` says where it runs: its Pod is `mps-<owner>`), and every
  client claim's containers get that directory mounted;
- it runs with the GPU alone and no daemon-wide limits: each client's limits
  are in its own environment (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`,
  `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`, written into the claim's CDI spec by
  `draplugin.prepare.plan`), which NVIDIA's MPS documentation has the client
  read when it starts;
- the GPU is in EXCLUSIVE_PROCESS compute mode while it runs
  (`draplugin.prepare.computemode`, done by `MpsDaemons`).

Who holds the daemon is in the sharing ledger: one entry per client claim
(kind `mpsshare`, key: the GPU UUID), written as `joining` before the daemon
is started or found and `held` after. A claim's release drops its entry, and
the daemon stops (compute mode restored) when the entry dropped was the GPU's
last: every entry, `joining` too, holds the daemon, so a kill -9 at any point
leaves either a holder whose release stops it or a daemon no entry holds,
which start-up's sweep (`sweep`) stops. Joining and leaving take one lock:
the first/last decision and the start or stop that follows must not
interleave with another claim's.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from draplugin import crashpoints
from draplugin.prepare.ledger import LedgerEntry, SharingLedger
from draplugin.prepare.mps import KIND as DAEMON_KIND
from draplugin.prepare.mps import MpsDaemons, MpsSettings, release_shm
from draplugin.prepare.mpspaths import SHM_DIR

log = logging.getLogger(__name__)

KIND = "mpsshare"
JOINING, HELD = "joining", "held"
# Claim UIDs are UUIDs (hex digits and dashes): no claim's ledger name starts with this.
OWNER_PREFIX = "gpu-"


def owner_of(gpu: str) -> str:
    """The ledger name (and daemon Pod suffix) of the GPU's daemon: a DNS label, as a Pod name needs,
    and short: the daemon's sockets (`<pipe>/control_privileged`) must fit a socket path's 108 bytes,
    which `<state>/mps/<the GPU UUID>/pipe/...` under the kubelet's plugin directory does not."""
    return OWNER_PREFIX + hashlib.sha256(gpu.encode()).hexdigest()[:16]


def is_owner(name: str) -> bool:
    return name.startswith(OWNER_PREFIX)


class SharedGpuDaemons:
    """The daemons of shared GPUs, over `daemons`; `directory` maps an owner to its directory."""

    def __init__(self, daemons: MpsDaemons, directory: Callable[[str], Path]) -> None:
        self._daemons = daemons
        self._directory = directory
        self._lock = threading.Lock()

    def join(self, uid: str, gpu: str, ledger: SharingLedger) -> None:
        """The claim a client of the GPU's daemon: started if it is the first, found if not."""
        owner = owner_of(gpu)
        with self._lock:
            data = {"owner": owner}
            mine = ledger.get(uid, KIND, gpu)
            if mine is None or mine.state != HELD:
                ledger.put(LedgerEntry(uid, KIND, gpu, JOINING, data))
                crashpoints.reach(crashpoints.AFTER_MPS_SHARE_JOIN)
            # No daemon-wide limits: each client's are in its own environment (module docstring).
            settings = MpsSettings((gpu,), None, ())
            self._daemons.ensure_settings(owner, settings, self._directory(owner), ledger)
            if mine is None or mine.state != HELD:
                ledger.put(LedgerEntry(uid, KIND, gpu, HELD, data))
                log.info("MPS share joined its GPU's daemon", extra={"claim_uid": uid, "gpu": gpu})

    def leave(self, uid: str, ledger: SharingLedger) -> None:
        """Forget the claim's shares; stop the daemon of each GPU whose last share this was."""
        with self._lock:
            for entry in ledger.entries(uid, KIND):
                if not self.holders(ledger, entry.key, but=uid):
                    self._stop(owner_of(entry.key), ledger)
                ledger.drop(uid, KIND, entry.key)
                log.info("MPS share left its GPU's daemon", extra={"claim_uid": uid, "gpu": entry.key})

    def sweep(self, ledger: SharingLedger, seen: Iterable[str]) -> list[str]:
        """Stop every shared GPU's daemon that no share holds (the ledger's and `seen`, the runner's
        and the state directory's owners); the owners stopped."""
        with self._lock:
            held = {owner_of(e.key) for e in ledger.entries(kind=KIND)}
            recorded = {e.claim_uid for e in ledger.entries() if is_owner(e.claim_uid)}
            stopped = sorted((recorded | {o for o in seen if is_owner(o)}) - held)
            for owner in stopped:
                self._stop(owner, ledger)
            return stopped

    @staticmethod
    def holders(ledger: SharingLedger, gpu: str, *, but: str | None = None) -> list[str]:
        """Claims holding a share of the GPU's daemon (`joining` or `held`)."""
        return sorted({e.claim_uid for e in ledger.entries(kind=KIND) if e.key == gpu and e.claim_uid != but})

    def _stop(self, owner: str, ledger: SharingLedger) -> None:
        self._daemons.stop(owner, ledger)  # quit, compute mode restored, entries dropped
        directory = self._directory(owner)
        if directory.exists() and not ledger.entries(owner, DAEMON_KIND):
            release_shm(directory / SHM_DIR)
            shutil.rmtree(directory)
        log.info("shared GPU's MPS daemon stopped", extra={"owner": owner})
