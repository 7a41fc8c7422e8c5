"""Start, watch and stop the component processes of a test cluster.

Every process gets its own session (so a signal reaches it and any children it
spawns, and nothing else) and its own log file. Only processes started through a
`ProcessGroup` are ever signalled.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from devcluster.wait import past_deadline

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    """Runs in the child before exec: if the test process dies without
    stopping the cluster (crash, SIGKILL), the kernel kills the component
    too, so no orphaned etcd or kubelet outlives the session. The kernel
    ties this to the *thread* that started the child: start components from
    a thread that lives as long as the cluster (the main thread)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


LOG_TAIL_CHARS = 6000


class ComponentError(RuntimeError):
    """A component exited early or did not become ready in time."""


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as err:
            return f"<cannot read {self.log_path}: {err}>"
        return text[-chars:]


class ProcessGroup:
    """The processes of one cluster, stopped together in reverse start order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.components: list[Component] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Component:
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        log.info("starting component=%s log=%s", name, log_path)
        log.debug("argv component=%s argv=%s", name, " ".join(argv))
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        component = Component(name, process, log_path, log_file)
        self.components.append(component)
        return component

    def check_alive(self) -> None:
        """Raise with the log tail of the first component that has exited."""
        for component in self.components:
            if not component.alive():
                raise ComponentError(
                    f"{component.name} exited with status {component.process.returncode}; "
                    f"last lines of {component.log_path}:\n{component.log_tail()}"
                )

    def wait_until(
        self,
        what: str,
        ready: Callable[[], bool],
        timeout: float,
        interval: float = 0.25,
        blame: Component | None = None,
    ) -> float:
        """Poll `ready` until it returns True; fail early if a component dies.

        Returns the seconds waited. On timeout the message names what was
        awaited and shows the log tail of `blame` (the component that should
        have made `ready` true).
        """
        started = time.monotonic()
        next_progress = started + 10
        while True:
            self.check_alive()
            if ready():
                waited = time.monotonic() - started
                log.info("ready what=%r seconds=%.1f", what, waited)
                return waited
            now = time.monotonic()
            over, how_long = past_deadline(started, timeout)  # stretched while the machine is loaded
            if over:
                tail = f"\nlast lines of {blame.log_path}:\n{blame.log_tail()}" if blame else ""
                raise ComponentError(f"timed out after {how_long} waiting for {what}{tail}")
            if now >= next_progress:
                log.info("waiting what=%r seconds=%.0f timeout=%.0f", what, now - started, timeout)
                next_progress = now + 10
            time.sleep(interval)

    def stop(self, component: Component, grace: float = 10.0) -> None:
        """SIGTERM the component's session, then SIGKILL after `grace` seconds."""
        if component.alive():
            self._signal(component, signal.SIGTERM)
            try:
                component.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("component=%s ignored SIGTERM for %.0fs; killing", component.name, grace)
                self._signal(component, signal.SIGKILL)
                component.process.wait()
        component.log_file.close()
        if component in self.components:
            self.components.remove(component)

    def stop_all(self) -> None:
        for component in reversed(list(self.components)):
            self.stop(component)

    @staticmethod
    def _signal(component: Component, sig: signal.Signals) -> None:
        # The process leads its own session (start_new_session), so its pid is
        # also the group id of everything it started and nothing else.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(component.process.pid, sig)
