"""A differential run: many random scenarios in batches, the agreement rate, shrunk disagreements."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from tests.differential.generator import generate
from tests.differential.play import Player, SchedulerCrashed, Verdict
from tests.differential.shrink import kind_of, pytest_case, shrink, tags

BATCH = 300
MAX_SHRUNK = 5  # per run: shrinking plays tens of variants per round


@dataclass
class Report:
    release: str
    played: int = 0
    agreed: int = 0
    seconds: float = 0.0
    disagreements: list[Verdict] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)  # shrunk, as pytest source
    upstream_crash: str | None = None

    @property
    def summary(self) -> str:
        rate = 100.0 * self.agreed / self.played if self.played else 0.0
        kinds: dict[str, int] = {}
        for v in self.disagreements:
            kinds[kind_of(v.problem)] = kinds.get(kind_of(v.problem), 0) + 1
        return (
            f"differential on {self.release}: {self.agreed}/{self.played} scenarios agree ({rate:.2f}%) "
            f"in {self.seconds:.0f}s; disagreements by kind: {kinds or 'none'}"
            + (f"; stopped: {self.upstream_crash}" if self.upstream_crash else "")
        )


def run(player: Player, seed: int, count: int, *, shrink_found: bool = True) -> Report:
    release = f"{player.release[0]}.{player.release[1]}"
    report = Report(release)
    rng = random.Random(f"{seed}-{release}")  # per release: their gates differ
    started = time.monotonic()
    minor = player.release[1]
    run_tag = f"{seed % 1000:03d}"
    for start in range(0, count, BATCH):
        scenarios = [
            generate(rng, f"d{run_tag}-{index:05d}", minor, player.features)
            for index in range(start, min(start + BATCH, count))
        ]
        try:
            verdicts = player.play(scenarios)
        except SchedulerCrashed as err:
            # The cluster has no scheduler left: stop, and say so (no scenario counts as played).
            report.upstream_crash = (
                f"{err} (in the batch of scenarios {start} to {start + len(scenarios) - 1})"
            )
            break
        for verdict in verdicts:
            report.played += 1
            if verdict.problem is None:
                report.agreed += 1
            else:
                report.disagreements.append(verdict)
    report.seconds = time.monotonic() - started
    if shrink_found and report.upstream_crash is None:
        retag = tags(f"s{run_tag}-")
        shown: set[str] = set()
        for verdict in report.disagreements:
            kind = kind_of(verdict.problem)
            # An invalid scenario is the generator's fault: the message says what to fix.
            if len(report.cases) >= MAX_SHRUNK or kind in shown or kind == "invalid":
                continue
            shown.add(kind)
            report.cases.append(pytest_case(shrink(player, verdict, retag), release))
    return report
